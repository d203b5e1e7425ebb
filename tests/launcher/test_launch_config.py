"""LaunchConfig, -x parsing, the worker environment and CLI argument parsing (no processes)."""
import pytest

from appliance.cli import build_parser
from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig, parse_forwards
from appliance.launcher.env import CONTRACT_NAMES, JobPlan, check_explicit, worker_env
from appliance.launcher.hosts import Host, assign_ranks
from appliance.launcher.failures import describe_exit, exit_code
from appliance.launcher.output import rank_dir_name


def test_forwards_like_mpirun():
    env = {"A": "1", "EMPTY": ""}
    assert parse_forwards(["A", "B=2", "C=x=y", "EMPTY", "D="], env) == {"A": "1", "B": "2", "C": "x=y", "EMPTY": "", "D": ""}
    with pytest.raises(ConfigError, match="-x MISSING: MISSING is not set"):
        parse_forwards(["MISSING"], env)
    for bad in ["=1", "1A=2", "A B=1", ""]:
        with pytest.raises(ConfigError, match="NAME or NAME=VALUE"):
            parse_forwards([bad], env)


def test_launch_config_precedence_flag_env_environ_default():
    c = LaunchConfig.create(["--", "prog", "--flag"], 2, environ={})
    assert c.command == ("prog", "--flag") and c.start_timeout_s == 60.0 and not c.verbose and c.stop_grace_s == 3.0
    c = LaunchConfig.create(["p"], 2, environ={"HOROVOD_START_TIMEOUT": "7", "APPLIANCE_VERBOSE": "1",
                                                "APPLIANCE_STOP_GRACE": "0.5"})
    assert c.start_timeout_s == 7.0 and c.verbose and c.stop_grace_s == 0.5
    c = LaunchConfig.create(["p"], 2, environ={"HOROVOD_START_TIMEOUT": "7"}, forward=["HOROVOD_START_TIMEOUT=9"])
    assert c.start_timeout_s == 9.0 and c.env == {"HOROVOD_START_TIMEOUT": "9"}
    c = LaunchConfig.create(["p"], 2, environ={"HOROVOD_START_TIMEOUT": "7"}, start_timeout=3, verbose=False)
    assert c.start_timeout_s == 3.0 and not c.verbose
    c = LaunchConfig.create(["p"], 1, environ={"X": "1"}, env={"Y": 2}, forward=["X", "Z=3"])
    assert c.env == {"Y": "2", "X": "1", "Z": "3"}
    assert "X" not in repr(c).split("env=")[0]  # the launcher environment is not in the repr


@pytest.mark.parametrize("kwargs, words", [
    (dict(command=[], np=1), "no command"),
    (dict(command=["--"], np=1), "no command"),
    (dict(command=["p"], np=0), "-np must be a positive"),
    (dict(command=["p"], np=1, hosts="a:1", hostfile="f"), "not both"),
    (dict(command=["p"], np=1, timeout=0), "timeout must be positive"),
    (dict(command=["p"], np=1, start_timeout=-1), "--start-timeout must be positive"),
    (dict(command=["p"], np=1, environ={"APPLIANCE_STOP_GRACE": "soon"}), "APPLIANCE_STOP_GRACE='soon'"),
])
def test_launch_config_errors(kwargs, words):
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError, match=None) as e:
        LaunchConfig.create(**kwargs)
    assert words in str(e.value)


def test_worker_env_contract():
    slots = assign_ranks([Host("localhost", 2), Host("other", 2)], 3)
    plan = JobPlan(job_id="j1", secret="s" * 32, store_addr="10.0.0.1:20001", master_addr="10.0.0.1",
                   master_port=20002, data_addrs={"localhost": "10.0.0.1", "other": "10.0.0.2"}, start_timeout_s=5,
                   fault_dir="/tmp/faults")
    assert "s" * 32 not in repr(plan)
    base = {"PATH": "/bin", "HOROVOD_RANK": "99", "KEEP": "k", "X": "base"}
    env = worker_env(slots[2], plan, base, {"X": "explicit"})
    expect = {
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "other",
        "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "20002", "APPLIANCE_STORE_ADDR": "10.0.0.1:20001",
        "APPLIANCE_JOB_SECRET": "s" * 32, "APPLIANCE_JOB_ID": "j1", "APPLIANCE_DATA_ADDR": "10.0.0.2",
        "HOROVOD_START_TIMEOUT": "5.0", "PYTHONUNBUFFERED": "1", "PATH": "/bin", "KEEP": "k", "X": "explicit",
        "APPLIANCE_FAULT_FILE": "/tmp/faults/rank.2.json",
    }
    assert env == expect
    # without a fault directory the variable is empty (a stale value in the base never leaks through)
    assert worker_env(slots[2], dataclasses_replace(plan, fault_dir=""), {"APPLIANCE_FAULT_FILE": "/x"},
                      {})["APPLIANCE_FAULT_FILE"] == ""
    assert set(CONTRACT_NAMES) <= set(env)
    env1 = worker_env(slots[1], dataclasses_replace(plan, verbose=True), {}, {})
    assert env1["HOROVOD_LOCAL_RANK"] == "1" and env1["HOROVOD_CROSS_SIZE"] == "1" and env1["APPLIANCE_VERBOSE"] == "1"
    for name in CONTRACT_NAMES:
        with pytest.raises(ConfigError, match=name):
            check_explicit({name: "1"})
    check_explicit({"HOROVOD_FUSION_THRESHOLD": "0", "PYTHONUNBUFFERED": "0"})


def dataclasses_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


def test_exit_codes_and_rank_dirs():
    assert exit_code(3) == 3 and exit_code(-9) == 137 and exit_code(-15) == 143 and exit_code(0) == 0
    assert describe_exit(-9) == "was killed by signal 9 (SIGKILL)" and describe_exit(2) == "exited with code 2"
    assert rank_dir_name(0, 1) == "rank.0" and rank_dir_name(9, 10) == "rank.9"
    assert rank_dir_name(3, 11) == "rank.03" and rank_dir_name(10, 11) == "rank.10"


def test_cli_parses_horovodrun_flags():
    p = build_parser()
    a = p.parse_args(["launch", "-np", "3", "-H", "localhost:3", "--start-timeout", "5", "--output-filename", "d",
                      "--verbose", "-x", "A", "-x", "B=1", "--", "python", "-c", "x", "--verbose"])
    assert (a.np, a.hosts, a.start_timeout, a.output_filename, a.verbose, a.x) == (3, "localhost:3", 5.0, "d", True, ["A", "B=1"])
    assert [c for c in a.command if c != "--"] == ["python", "-c", "x", "--verbose"]
    a = p.parse_args(["launch", "--num-proc", "2", "--hosts", "a:1,b:1", "python", "-m", "train", "-x", "1"])
    assert (a.np, a.hosts, a.command) == (2, "a:1,b:1", ["python", "-m", "train", "-x", "1"])
    a = p.parse_args(["launch", "-np", "2", "--hostfile", "hf", "prog"])
    assert a.hostfile == "hf" and a.hosts is None
    with pytest.raises(SystemExit):
        p.parse_args(["launch", "-np", "2", "-H", "a:2", "--hostfile", "hf", "prog"])
    with pytest.raises(SystemExit):
        p.parse_args(["launch", "prog"])  # -np is required
