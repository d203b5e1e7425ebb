"""``python -m appliance.tensorflow.build``: compile the TensorFlow op library now, for the
installed TensorFlow (``appliance.tensorflow._library``), and print its path; the image and
tests/run.sh do it ahead of the first import. Exit 1 with the compiler's error on failure."""
import sys

from appliance.tensorflow import _library


def main() -> int:
    try:
        print(_library.build(verbose=True))
    except (RuntimeError, OSError) as e:
        print(f"appliance.tensorflow.build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
