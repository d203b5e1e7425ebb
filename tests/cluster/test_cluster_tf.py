"""A TensorFlow job in the image across the simulated 2-host cluster (``appliance secondary`` +
``appliance primary -np 2 -H localhost:1,<node2>:1``), and the GPU image's TensorFlow as mpiuser.

The job is the image's own Keras example, ``python -m train_keras`` (docker/train_keras.py:
appliance/examples/train_keras.py, Keras 3 ``fit`` with horovod.tensorflow.keras's
``DistributedOptimizer``), each rank on its own half of the data, for two epochs. Asserted: the
ranks ran on different hosts, both end with the same weights (the digests rank 0 prints, one per
rank: different data, so only averaged gradients give one model), the loss falls, rank 0 wrote
the checkpoint and metrics.json into the share's ``models/digits-keras``, the job's record on the
share holds both ranks' steps (reported by the job's Keras callback) and a report.png, and no rank
process is left on the secondary. The image's op library is the one that ran: the runtime image
has no compiler to build another. Bounded by the primary's timeout; the cluster fixture removes
every container it made. The exact check that a gradient is the mean of the ranks' own
(tests/ranks/tf_average.py, ``reports`` and ``check_averaged``) runs in tests/k8s/test_k8s_tf.py and
tests/tensorflow.
"""
from __future__ import annotations

import json
import os
import secrets

import pytest

from fixtures.tf_image import TF_OPS_DIR

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture(scope="module")
def two_hosts(shared_cluster):
    shared_cluster.secondary("node2")
    return shared_cluster


def _stdout(out: str) -> list[str]:
    """The ranks' stdout lines, without the launcher's ``[r]<stdout>:`` prefix."""
    return [line.split("<stdout>:", 1)[1] for line in out.splitlines() if "<stdout>:" in line]


def test_the_keras_job_trains_across_two_hosts(two_hosts):
    c = two_hosts
    node2 = c.host("node2")
    jobs = os.path.join(c.shared, "jobs")
    before = set(os.listdir(jobs)) if os.path.isdir(jobs) else set()
    res = c.primary("-np", "2", "-H", f"localhost:1,{node2}:1", "--", "python", "-m", "train_keras", "--epochs", "2",
                    timeout=240)
    assert res.returncode == 0, res.stdout[-4000:]
    lines = _stdout(res.stdout)
    hosts = [t for t in lines if t.startswith("hosts: ")]
    assert len(hosts) == 1, res.stdout[-4000:]
    where = dict(part.split(" ")[1:] for part in hosts[0][len("hosts: "):].split(", "))
    assert where["1"] == node2 and where["0"] != node2, hosts
    digests = [t for t in lines if t.startswith("weights sha256: ")]
    assert len(digests) == 1, res.stdout[-4000:]
    per_rank = [part.split() for part in digests[0][len("weights sha256: "):].split(", ")]
    assert len(per_rank) == 2 and per_rank[0][2] == per_rank[1][2], f"the ranks' weights differ: {digests[0]}"

    run_dir = os.path.join(c.shared, "models", "digits-keras")
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["size"] == 2 and metrics["writer"]["rank"] == 0 and len(metrics["epochs"]) == 2, metrics
    assert metrics["epochs"][-1]["loss"] < metrics["epochs"][0]["loss"], metrics
    assert os.path.getsize(os.path.join(run_dir, "checkpoint.keras")) > 0

    (job,) = set(os.listdir(jobs)) - before
    ranks = {}
    with open(os.path.join(jobs, job, "metrics.jsonl")) as f:
        for row in map(json.loads, f):
            if row.get("kind") == "rank":
                ranks[row["rank"]] = row
    assert sorted(ranks) == [0, 1] and all(r["step"] == r["total_steps"] > 0 for r in ranks.values()), ranks
    assert os.path.getsize(os.path.join(jobs, job, "report.png")) > 0
    assert c.job_python("node2") == [], "rank processes left on the secondary"


def test_the_gpu_image_runs_horovod_tensorflow_as_mpiuser(engine, gpu_image):
    """The GPU image carries the same TensorFlow (tensorflow-cpu) and its op library, readable by
    mpiuser (uid 1000, as the operators' images run it): a lone process initialises and allreduces."""
    code = ("import os, tensorflow as tf, horovod.tensorflow as hvd, appliance.tensorflow as a\n"
            "from appliance.tensorflow import _library\n"
            "assert hvd is a\n"
            "hvd.init(); s = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)\n"
            "print('ok', tf.__version__, os.getuid(), _library.build(), s.numpy().tolist())\n")
    c = engine.containers.run(gpu_image, ["-c", code], entrypoint=["/opt/venv/bin/python"],
                              name=f"appliance-t{secrets.token_hex(3)}-gpu-tf", user="mpiuser", detach=True, network_mode="none", labels={"appliance.test": "gpu-tf"},
                              environment={"TF_CPP_MIN_LOG_LEVEL": "3"})
    try:
        rc = c.wait(timeout=120)["StatusCode"]
        out = c.logs().decode(errors="replace")
    finally:
        c.remove(force=True)
    assert rc == 0, out[-3000:]
    last = out.strip().splitlines()[-1].split()
    assert last[:3] == ["ok", "2.21.0", "1000"] and last[3].startswith(TF_OPS_DIR + "/"), out[-2000:]
    assert " ".join(last[4:]) == "[1.0, 2.0]", out[-2000:]
