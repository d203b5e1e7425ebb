"""The one launch-flag parser (``appliance.launcher.flags``): the CLI and the cluster plane turn
the same flags into the same ``LaunchConfig``; pure logic, no ranks."""
from __future__ import annotations

import dataclasses
import json

import pytest

from appliance.cli import build_parser
from appliance.cluster.jobrun import create_job, job_config
from appliance.common.knobs import ConfigError
from appliance.launcher.flags import LaunchFlags, check_config, launch_config, parse_launch_flags

ENV = {"APPL_FWD": "from-env", "HOROVOD_START_TIMEOUT": "33"}

FLAG_SETS = [
    ["-np", "3", "-H", "localhost:2,n2:1"],
    ["--num-proc", "2", "--hosts", "a:1,b:1", "--start-timeout", "7.5", "--verbose", "-x", "APPL_FWD",
     "-x", "B=1 2", "-i", "/keys/id", "--remote-python", "/opt/py/bin/python3", "--network-interface", "eth1"],
    ["-np", "4", "-H", "a:4", "-p", "2222", "--output-filename", "/out", "--shared", "/share"],
]
COMMAND = ["python", "-m", "train", "-p", "3", "--verbose"]


@pytest.mark.parametrize("flags", FLAG_SETS)
def test_cli_and_cluster_jobrun_build_the_same_launch_config(flags, tmp_path):
    cli_args = build_parser().parse_args(["launch", *flags, "--", *COMMAND])
    cli_config = launch_config(cli_args, environ=ENV)

    # The cluster's path: the primary parses the flags, job.json keeps them, the job runner rebuilds.
    parsed, command = parse_launch_flags([*flags, "--", *COMMAND], prog="appliance primary")
    assert command == COMMAND
    job_dir = tmp_path / "jobs" / "j1"
    create_job(str(job_dir), parsed, command, ssh_port=12345, shared="/share", network="host", image="img",
               workdir=str(tmp_path), secondary_wait_s=4.0)
    job = json.loads((job_dir / "job.json").read_text())
    jobrun_config = job_config(job, str(job_dir), environ=ENV)

    # What the job runner adds on purpose: rankexec before the command, the wait for secondaries,
    # -p / --output-filename / --shared where the user gave none, and APPLIANCE_RECORD_DIR.
    assert jobrun_config.command[-len(COMMAND):] == tuple(COMMAND)
    assert jobrun_config.command[1:5] == ("-m", "appliance.cluster.rankexec", str(job_dir), "--")
    assert jobrun_config.remote.host_wait_s == 4.0 and cli_config.remote.host_wait_s == 0.0
    given = LaunchFlags.from_args(cli_args)
    assert jobrun_config.remote.port == (given.ssh_port or 12345)
    assert jobrun_config.output_dir == (given.output_filename or str(job_dir / "logs"))
    assert jobrun_config.remote.shared_dir == "/share" and jobrun_config.remote.shared_explicit
    # and the job's record (the launcher's observer) in the job directory
    assert jobrun_config.environ == {**ENV, "APPLIANCE_RECORD_DIR": str(job_dir)}
    # Everything else is the same configuration.
    same_as_cli = dataclasses.replace(
        jobrun_config, command=cli_config.command, output_dir=cli_config.output_dir, environ=cli_config.environ,
        remote=dataclasses.replace(jobrun_config.remote, host_wait_s=0.0, port=cli_config.remote.port,
                                   shared_dir=cli_config.remote.shared_dir,
                                   shared_explicit=cli_config.remote.shared_explicit))
    assert same_as_cli == cli_config
    assert tuple(cli_config.command) == tuple(COMMAND)


def test_flag_values_reach_the_config():
    args = build_parser().parse_args(["launch", *FLAG_SETS[1], "prog"])
    c = launch_config(args, environ=ENV)
    assert (c.np, c.hosts, c.start_timeout_s, c.verbose, c.command) == (2, "a:1,b:1", 7.5, True, ("prog",))
    assert c.env == {"APPL_FWD": "from-env", "B": "1 2"}
    r = c.remote
    assert (r.key, r.remote_python, r.network_interface, r.port) == ("/keys/id", "/opt/py/bin/python3", "eth1", None)
    c = launch_config(build_parser().parse_args(["launch", "-np", "1", "prog"]), environ=ENV)
    assert c.start_timeout_s == 33.0 and not c.verbose and c.output_dir is None  # the knobs, where no flag


def test_check_takes_the_same_flags_and_makes_the_same_remote_config():
    flags = ["-H", "a:1,b:2", "-np", "3", "-p", "2200", "-i", "/k", "--shared", "/s", "--start-timeout", "9"]
    chk = check_config(build_parser().parse_args(["check", *flags]), environ=ENV)
    launch = launch_config(build_parser().parse_args(["launch", *flags, "prog"]), environ=ENV)
    assert (chk.hosts, chk.np, chk.start_timeout_s) == ("a:1,b:2", 3, 9.0)
    assert chk.remote == launch.remote
    assert build_parser().parse_args(["check"]).np is None  # -np is optional for check


def test_json_round_trip_and_bad_input():
    flags, command = parse_launch_flags(["-np", "2", "-hostfile", "hf", "-x", "A", "-x", "B=2", "prog", "-x", "y"])
    assert command == ["prog", "-x", "y"] and flags.hostfile == "hf" and flags.x == ("A", "B=2")
    assert LaunchFlags.from_json(json.loads(json.dumps(flags.to_json()))) == flags
    with pytest.raises(ConfigError):
        LaunchFlags.from_json({"np": 1, "bogus": True})
    with pytest.raises(SystemExit):
        parse_launch_flags(["-np", "2", "-H", "a:1", "--hostfile", "hf", "prog"])  # exclusive
    with pytest.raises(SystemExit):
        parse_launch_flags(["prog"])  # -np is required
    with pytest.raises(SystemExit):
        parse_launch_flags(["-np", "2", "--num", "3", "prog"])  # no abbreviations
    with pytest.raises(ConfigError):
        LaunchFlags().launch_config(["prog"])  # no -np
