"""``RuntimeConfig.from_env`` for a task ``srun`` started itself, and the job's secret file.

Pure environment dicts (what srun sets, per task) plus real files in a temporary HOME: which
source wins (our launcher, mpirun, Slurm), the store at the step's first node on the derived
port, the secret (variable, explicit file, the job's default file with its 0600 check), the
one-line error without one, and ``appliance secret`` as a real process.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from appliance.common import jobsecret
from appliance.common.knobs import ConfigError
from appliance.runtime.config import RuntimeConfig
from appliance.common.slurm import SlurmTask, default_secret_file, store_port

SECRET = "ab" * 16


def task_env(home, rank=0, ntasks=4, tpn="2(x2)", nodes="node[1-2]", job=4242, step=0, **extra):
    counts = [2, 2] if tpn == "2(x2)" else [int(c) for c in tpn.split(",")]
    node, local = 0, rank
    while local >= counts[node]:
        local -= counts[node]
        node += 1
    names = ["node1", "node2"]
    env = {"HOME": str(home), "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": str(step), "SLURM_PROCID": str(rank),
           "SLURM_NTASKS": str(ntasks), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
           "SLURMD_NODENAME": names[node], "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": tpn,
           "SLURM_JOB_NODELIST": nodes, "SLURM_TASKS_PER_NODE": tpn}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def config(env):
    return RuntimeConfig.from_env(env, slurm=SlurmTask.from_env)


def write_secret(path, text=SECRET + "\n", mode=0o600):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


# --- layout and store --------------------------------------------------------------------------
@pytest.mark.parametrize("rank, node", [(0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")])
def test_a_task_takes_rank_size_node_and_the_store_from_slurm(tmp_path, rank, node):
    cfg = config(task_env(tmp_path, rank, APPLIANCE_JOB_SECRET=SECRET))
    assert (cfg.rank, cfg.size, cfg.host) == (rank, 4, node)
    assert (cfg.store_host, cfg.store_port) == ("node1", store_port(4242, 0))
    assert cfg.secret == bytes.fromhex(SECRET)
    assert cfg.job_id == "slurm-4242.0"
    assert "APPLIANCE_STORE_ADDR=node1:PORT" in cfg.store_note


def test_uneven_tasks_per_node(tmp_path):
    cfg = config(task_env(tmp_path, 2, ntasks=3, tpn="2,1", APPLIANCE_JOB_SECRET=SECRET))
    assert (cfg.rank, cfg.size, cfg.host) == (2, 3, "node2")


def test_each_step_of_a_job_gets_its_own_port_and_job_id(tmp_path):
    a = config(task_env(tmp_path, step=0, APPLIANCE_JOB_SECRET=SECRET))
    b = config(task_env(tmp_path, step=1, APPLIANCE_JOB_SECRET=SECRET))
    assert a.store_port != b.store_port and a.job_id != b.job_id


def test_explicit_store_addr_host_name_and_job_id_win(tmp_path):
    cfg = config(task_env(tmp_path, 1, APPLIANCE_JOB_SECRET=SECRET, APPLIANCE_STORE_ADDR="10.0.0.9:31000",
                          HOROVOD_HOSTNAME="gpu7", APPLIANCE_JOB_ID="mine"))
    assert (cfg.store_host, cfg.store_port, cfg.store_note) == ("10.0.0.9", 31000, "")
    assert (cfg.host, cfg.job_id) == ("gpu7", "mine")


def test_our_launcher_keeps_priority_over_slurm(tmp_path):
    env = task_env(tmp_path, 3, HOROVOD_RANK=1, HOROVOD_SIZE=2, APPLIANCE_STORE_ADDR="a:1234",
                   APPLIANCE_JOB_SECRET=SECRET, HOROVOD_HOSTNAME="a")
    cfg = config(env)
    assert (cfg.rank, cfg.size, cfg.store_host, cfg.store_port, cfg.host) == (1, 2, "a", 1234, "a")


def test_mpirun_keeps_priority_and_slurm_is_not_even_read(tmp_path):
    def boom(env):
        raise AssertionError("Slurm read although mpirun described the job")
    env = task_env(tmp_path, 3, OMPI_COMM_WORLD_RANK=0, OMPI_COMM_WORLD_SIZE=2, APPLIANCE_STORE_ADDR="a:1234",
                   APPLIANCE_JOB_SECRET=SECRET)
    cfg = RuntimeConfig.from_env(env, slurm=boom)
    assert (cfg.rank, cfg.size) == (0, 2)


def test_a_batch_script_is_not_a_task(tmp_path):
    env = task_env(tmp_path, 0)
    del env["SLURM_STEP_ID"]
    cfg = config(env)
    assert (cfg.rank, cfg.size, cfg.store_port, cfg.secret) == (0, 1, 0, b"")


def test_a_one_task_step_needs_no_store_and_no_secret(tmp_path):
    cfg = config(task_env(tmp_path, 0, ntasks=1, tpn="1", nodes="node1"))
    assert (cfg.rank, cfg.size, cfg.store_host, cfg.store_port, cfg.secret, cfg.host) == (0, 1, "", 0, b"", "node1")


def test_an_incomplete_slurm_environment_names_the_variable(tmp_path):
    env = task_env(tmp_path, 0, APPLIANCE_JOB_SECRET=SECRET)
    del env["SLURM_LOCALID"]
    with pytest.raises(ConfigError, match="SLURM_LOCALID"):
        config(env)


# --- the secret ----------------------------------------------------------------------------------
def test_the_jobs_default_file_is_read(tmp_path):
    path = default_secret_file(4242, {"HOME": str(tmp_path)})
    write_secret(path)
    assert config(task_env(tmp_path, 2)).secret == bytes.fromhex(SECRET)


def test_the_variable_wins_over_the_file(tmp_path):
    write_secret(default_secret_file(4242, {"HOME": str(tmp_path)}), "cd" * 16, mode=0o644)  # never read
    assert config(task_env(tmp_path, 1, APPLIANCE_JOB_SECRET=SECRET)).secret == bytes.fromhex(SECRET)


def test_an_explicit_file_wins_over_the_default_one(tmp_path):
    write_secret(default_secret_file(4242, {"HOME": str(tmp_path)}), "cd" * 16)
    mine = str(tmp_path / "elsewhere" / "s")
    write_secret(mine)
    assert config(task_env(tmp_path, 1, APPLIANCE_JOB_SECRET_FILE=mine)).secret == bytes.fromhex(SECRET)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620])
def test_a_file_open_to_group_or_others_is_refused_with_chmod(tmp_path, mode):
    path = default_secret_file(4242, {"HOME": str(tmp_path)})
    write_secret(path, mode=mode)
    with pytest.raises(ConfigError) as e:
        config(task_env(tmp_path, 1))
    assert f"chmod 600 {path}" in str(e.value) and "\n" not in str(e.value)


def test_a_file_without_hex_is_refused(tmp_path):
    path = default_secret_file(4242, {"HOME": str(tmp_path)})
    write_secret(path, "not hex\n")
    with pytest.raises(ConfigError, match="no hex secret"):
        config(task_env(tmp_path, 1))


def test_without_a_secret_init_fails_with_one_line_saying_how(tmp_path):
    with pytest.raises(ConfigError) as e:
        config(task_env(tmp_path, 3))
    msg = str(e.value)
    assert "\n" not in msg
    assert "appliance secret" in msg and "APPLIANCE_JOB_SECRET=" in msg
    assert default_secret_file(4242, {"HOME": str(tmp_path)}) in msg


def test_there_is_no_fixed_default_secret(tmp_path):
    """Two jobs' tasks never agree on a secret nobody made."""
    for job in (1, 2):
        with pytest.raises(ConfigError):
            config(task_env(tmp_path, 0, job=job))


# --- making the file ----------------------------------------------------------------------------
def test_ensure_makes_a_private_file_in_private_directories(tmp_path):
    path = str(tmp_path / "home" / ".appliance" / "slurm" / "job-1.secret")
    assert jobsecret.ensure(path) is True
    assert os.stat(path).st_mode & 0o777 == 0o600
    for d in (tmp_path / "home", tmp_path / "home" / ".appliance", tmp_path / "home" / ".appliance" / "slurm"):
        assert os.stat(d).st_mode & 0o777 == 0o700, d
    secret = jobsecret.read(path)
    assert len(secret) == jobsecret.SECRET_BYTES
    assert jobsecret.ensure(path) is False and jobsecret.read(path) == secret  # idempotent
    assert [p for p in os.listdir(os.path.dirname(path))] == ["job-1.secret"]  # no temporary left


def test_ensure_refuses_an_existing_file_open_to_others(tmp_path):
    path = str(tmp_path / "s")
    write_secret(path, mode=0o644)
    with pytest.raises(jobsecret.SecretFileError, match=f"chmod 600 {path}"):
        jobsecret.ensure(path)


def _ensure_and_read(path):
    jobsecret.ensure(path)
    return jobsecret.read(path)


def test_concurrent_makers_end_with_one_secret(tmp_path):
    path = str(tmp_path / "h" / "job-9.secret")
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        secrets = pool.map(_ensure_and_read, [path] * 12)
    assert len(set(secrets)) == 1


def _cli(args, env):
    return subprocess.run([sys.executable, "-m", "appliance", "secret", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_secret_command_makes_the_jobs_file_and_prints_its_path(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "SLURM_JOB_ID": "31"}
    env.pop("APPLIANCE_JOB_SECRET_FILE", None)
    p = _cli([], env)
    assert p.returncode == 0, p.stderr
    path = default_secret_file(31, {"HOME": str(tmp_path)})
    assert p.stdout.strip() == path
    first = jobsecret.read(path)
    again = _cli(["--job", "31"], {**env, "SLURM_JOB_ID": ""})
    assert again.returncode == 0 and again.stdout.strip() == path and jobsecret.read(path) == first
    assert config(task_env(tmp_path, 1, job=31)).secret == first


def test_the_secret_command_without_a_job_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "APPLIANCE_JOB_SECRET_FILE")}
    p = _cli([], {**env, "HOME": str(tmp_path)})
    assert p.returncode == 2 and "--job" in p.stderr
    assert not (tmp_path / ".appliance").exists()
