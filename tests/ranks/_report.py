"""Helpers for worker scripts: write this rank's JSON report where the test asked."""
import json
import os


def report(data: dict) -> None:
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    out = os.environ["APPLIANCE_TEST_OUT"]
    tmp = os.path.join(out, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))
