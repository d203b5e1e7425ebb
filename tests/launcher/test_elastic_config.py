"""Horovod's elastic command line on ``appliance launch``, ``horovodrun`` and the cluster plane's
parser (``launcher.flags`` -> ``LaunchConfig.elastic``): the flags and their aliases, Horovod's
defaults (min defaults to -np, max to unbounded, 600 s from HOROVOD_ELASTIC_TIMEOUT), when a job is elastic,
and the combinations refused with a line naming the flag."""
from __future__ import annotations

import pytest

from appliance.common.knobs import ConfigError
from appliance.hvdcompat import horovodrun as hr
from appliance.launcher.flags import LaunchFlags, parse_launch_flags


def config(argv, environ=None):
    flags, command = parse_launch_flags(argv)
    return flags.launch_config(command, environ=environ or {})


def test_static_jobs_have_no_elastic_config():
    assert config(["-np", "2", "python", "x.py"]).elastic is None
    assert config(["-np", "2", "-H", "a:1,b:1", "python", "x.py"]).elastic is None


def test_each_of_min_max_and_a_discovery_script_makes_a_job_elastic_with_horovods_defaults():
    e = config(["-np", "4", "--min-np", "2", "-H", "a:2,b:2", "python", "x.py"]).elastic
    assert (e.min_np, e.max_np, e.discovery_script, e.timeout_s, e.reset_limit, e.cooldown_range) == (
        2, None, None, 600.0, None, None)
    e = config(["-np", "2", "--max-num-proc", "8", "python", "x.py"]).elastic
    assert (e.min_np, e.max_np) == (2, 8)
    e = config(["-np", "3", "--host-discovery-script", "./d.sh", "--slots", "4", "python", "x.py"],
               environ={"HOROVOD_ELASTIC_TIMEOUT": "30", "APPLIANCE_DISCOVERY_INTERVAL": "0.2"}).elastic
    assert (e.min_np, e.max_np, e.discovery_script, e.slots_per_host, e.timeout_s, e.discovery_interval_s) == (
        3, None, "./d.sh", 4, 30.0, 0.2)
    e = config(["-np", "2", "--min-num-proc", "1", "--elastic-timeout", "5", "--reset-limit", "3",
                "--blacklist-cooldown-range", "10", "100", "-H", "a:1,b:1", "python", "x.py"],
               environ={"HOROVOD_ELASTIC_TIMEOUT": "30"}).elastic
    assert (e.timeout_s, e.reset_limit, e.cooldown_range) == (5.0, 3, (10.0, 100.0))


def test_max_np_not_given_is_unbounded_as_horovodrun_and_given_is_checked():
    # horovodrun --help: "If not specified, then will be unbounded"; -np 2 --min-np 2 -H a:2,b:2 runs 4
    for argv in (["-np", "2", "--min-np", "2", "-H", "a:2,b:2"], ["-np", "2", "--host-discovery-script", "d.sh"]):
        assert config([*argv, "python", "x.py"]).elastic.max_np is None
        assert hr.parse([*argv, "python", "x.py"]).flags.launch_config(["python"], environ={}).elastic.max_np is None
    assert config(["-np", "2", "--max-np", "2", "python", "x.py"]).elastic.max_np == 2
    assert config(["-np", "2", "--min-np", "1", "--max-np", "1000000000", "python", "x.py"]).elastic.max_np == 10 ** 9
    with pytest.raises(ConfigError, match=r"expected --min-np <= -np <= --max-np, got 3 <= 2 <= \(unbounded\)"):
        config(["-np", "2", "--min-np", "3", "python", "x.py"])


@pytest.mark.parametrize("argv, words", [
    (["-np", "2", "--min-np", "3"], "--min-np <= -np <= --max-np"),
    (["-np", "4", "--max-np", "3"], "--min-np <= -np <= --max-np"),
    (["-np", "2", "--min-np", "0"], "--min-np must be at least 1"),
    (["-np", "2", "--host-discovery-script", "d.sh", "-H", "a:2"], "either with --host-discovery-script"),
    (["-np", "2", "--min-np", "1", "--slots-per-host", "2"], "--slots-per-host applies"),
    (["-np", "2", "--reset-limit", "1"], "--reset-limit applies to elastic jobs"),
    (["-np", "2", "--elastic-timeout", "9", "-H", "a:2"], "--elastic-timeout applies to elastic jobs"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "0.5", "10"], "--blacklist-cooldown-range 0.5 10"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "20", "10"], "MIN <= MAX"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "10", "7200"], "<= 3600"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1"], "--reset-limit must not be negative"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "0"], "--elastic-timeout must be positive"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_flag(argv, words):
    with pytest.raises(ConfigError) as e:
        config([*argv, "python", "x.py"])
    assert words in str(e.value), str(e.value)


def test_horovodrun_takes_horovods_elastic_flags_as_they_are():
    p = hr.parse(["-np", "4", "--min-np", "2", "--max-np", "8", "--slots-per-host", "2", "--host-discovery-script",
                  "./discover.sh", "--elastic-timeout", "60", "--reset-limit", "5", "--blacklist-cooldown-range",
                  "1", "30", "python", "train.py"])
    assert p.errors == [] and p.warnings == [] and p.command == ["python", "train.py"]
    e = p.flags.launch_config(p.command, environ={}).elastic
    assert (e.min_np, e.max_np, e.slots_per_host, e.discovery_script, e.timeout_s, e.reset_limit,
            e.cooldown_range) == (2, 8, 2, "./discover.sh", 60.0, 5, (1.0, 30.0))


def test_launch_flags_with_elastic_ones_survive_the_cluster_planes_json():
    flags, _ = parse_launch_flags(["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "2", "8",
                                   "-H", "a:1,b:1", "python"])
    assert flags.elastic and not parse_launch_flags(["-np", "2", "python"])[0].elastic
    again = LaunchFlags.from_json(flags.to_json())
    assert again == flags and again.blacklist_cooldown_range == (2.0, 8.0)


def test_inside_an_allocation_a_discovery_script_means_ssh_and_min_np_alone_means_srun():
    from appliance.launcher.slurm.step import launcher_of

    slurm = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert launcher_of(config(["-np", "2", "--min-np", "1", "python"], environ=slurm)) == "srun"
    assert launcher_of(config(["-np", "2", "--host-discovery-script", "d.sh", "python"], environ=slurm)) == "ssh"
    with pytest.raises(ConfigError, match="--host-discovery-script"):
        launcher_of(config(["-np", "2", "--host-discovery-script", "d.sh", "--launcher", "srun", "python"],
                           environ=slurm))


@pytest.mark.parametrize("name", ["HOROVOD_ELASTIC_TIMEOUT", "APPLIANCE_DISCOVERY_INTERVAL",
                                  "APPLIANCE_DISCOVERY_TIMEOUT"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_elastic_knobs_must_be_positive_and_are_refused_by_their_own_name(name, value):
    with pytest.raises(ConfigError) as e:
        config(["-np", "2", "--min-np", "1", "python", "x.py"], environ={name: value})
    msg = str(e.value)
    assert msg.startswith(f"{name}={value!r}: must be a positive number") and "--elastic-timeout" not in msg.split(
        "(")[0], msg
    # the flag given wins over the variable, and is the one named when it is wrong
    if name == "HOROVOD_ELASTIC_TIMEOUT":
        assert config(["-np", "2", "--min-np", "1", "--elastic-timeout", "5", "python", "x.py"],
                      environ={name: value}).elastic.timeout_s == 5.0
        with pytest.raises(ConfigError, match="--elastic-timeout must be positive"):
            config(["-np", "2", "--min-np", "1", "--elastic-timeout", value, "python", "x.py"], environ={})
