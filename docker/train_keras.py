"""``python -m train_keras`` in the appliance image: the Keras example job (``appliance.examples.train_keras``).

The twin of ``python -m train`` (docker/train.py), with its resolution rule: a ``train_keras.py``
(or a ``train_keras/`` package) in the working directory (the shared directory, under ``appliance
primary``) is the one that runs; this module, installed in /opt/venv's site-packages, is used only
when the working directory has none. Arguments are the Keras job's (``--epochs``, ``--batch-size``,
``--run``...: ``python -m train_keras --help``); it needs the image's TensorFlow (not in an image
built with ``--no-tensorflow``).
"""
from appliance.examples.train_keras import main

if __name__ == "__main__":
    raise SystemExit(main())
