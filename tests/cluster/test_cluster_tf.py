"""A TensorFlow job in the image across the simulated 2-host cluster (``appliance secondary`` +
``appliance primary -np 2 -H localhost:1,<node2>:1``), and the GPU image's TensorFlow as mpiuser.

The job (tests/ranks/tf_average.py, copied to the share, the ranks' working directory) trains a
linear model with ``hvd.DistributedGradientTape`` for a few steps, eagerly and in a ``tf.function``,
each rank on its own data from its own initial weights; every rank prints one JSON line: its host,
the op library it loaded, its local and averaged first gradients and its final weights. Asserted:
the ranks ran on different hosts, the averaged gradient is the mean of the two local ones, both end
with the same weights, the op library is the image's (``/opt/appliance/tf-ops``: no rank compiled
one), and no rank process is left on the secondary. Bounded by the primary's timeout; the cluster
fixture removes every container it made. ``reports`` and ``check_averaged`` serve
tests/k8s/test_k8s_tf.py too.
"""
from __future__ import annotations

import os
import secrets
import shutil

import pytest

from fixtures.tf_image import JOB, TF_OPS_DIR, check_averaged, reports

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture(scope="module")
def two_hosts(shared_cluster):
    shared_cluster.secondary("node2")
    return shared_cluster


def test_a_tensorflow_job_averages_across_two_hosts(two_hosts):
    c = two_hosts
    node2 = c.host("node2")
    shutil.copy(JOB, os.path.join(c.shared, "tf_average.py"))
    res = c.primary("-np", "2", "-H", f"localhost:1,{node2}:1", "--", "python", "tf_average.py", timeout=240)
    assert res.returncode == 0, res.stdout[-4000:]
    reps = reports(res.stdout)
    check_averaged(reps, res.stdout)
    assert reps[1]["host"] == node2 and reps[0]["host"] != node2, reps
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
