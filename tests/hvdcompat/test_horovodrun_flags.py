"""horovodrun's flags (``appliance/hvdcompat/horovodrun.py``): which become knobs, which are ignored
with a warning or rejected, by name; COMMAND's own arguments are never read as flags."""
from __future__ import annotations

import pytest

from appliance.hvdcompat import horovodrun as hr


def test_knob_flags_become_x_after_the_users_own_so_the_flag_wins():
    p = hr.parse(["-np", "2", "-x", "HOROVOD_CACHE_CAPACITY=7", "--cache-capacity", "0", "--fusion-threshold-mb", "1.5",
                  "--cycle-time-ms", "2.5", "--no-stall-check", "--stall-check-warning-time-seconds", "9",
                  "--stall-check-shutdown-time-seconds", "30", "--gloo", "--tcp", "--disable-cache",
                  "--network-interfaces", "eth7", "python", "train.py"])
    assert p.flags.x == ("HOROVOD_CACHE_CAPACITY=7", "HOROVOD_CACHE_CAPACITY=0",
                         f"HOROVOD_FUSION_THRESHOLD={int(1.5 * (1 << 20))}", "HOROVOD_CYCLE_TIME=2.5",
                         "HOROVOD_STALL_CHECK_DISABLE=1", "HOROVOD_STALL_CHECK_TIME_SECONDS=9.0",
                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=30.0")
    assert p.command == ["python", "train.py"] and p.flags.np == 2 and p.flags.network_interface == "eth7"
    assert hr.parse(["-np", "1", "--stall-check", "python"]).flags.x == ("HOROVOD_STALL_CHECK_DISABLE=0",)
    assert hr.parse(["-np", "1", "--disable-cache", "python"]).flags.x == ()  # horovodrun's check cache: none here
    assert p.warnings == [] and p.errors == [] and not p.check_build
    # the knobs given are the knob table's, and the table accepts the values
    from appliance.common.knobs import read
    cfg = p.flags.launch_config(p.command, environ={})
    assert cfg.env["HOROVOD_CACHE_CAPACITY"] == "0"
    assert read("HOROVOD_FUSION_THRESHOLD", cfg.env) == int(1.5 * (1 << 20))
    assert read("HOROVOD_CYCLE_TIME", cfg.env) == 2.5


def test_ignored_flags_warn_by_name_and_rejected_ones_say_what_to_use():
    p = hr.parse(["-np", "2", "--log-level", "DEBUG", "--timeline-filename", "/tmp/t.json", "--autotune",
                  "--autotune-log-file", "a.csv", "--hierarchical-allreduce", "python", "x.py"])
    assert [w.split(":")[0] for w in p.warnings] == ["--log-level DEBUG", "--autotune", "--autotune-log-file a.csv"]
    assert p.errors == []  # declared knobs: honoured
    assert p.flags.x == ("HOROVOD_TIMELINE=/tmp/t.json", "HOROVOD_HIERARCHICAL_ALLREDUCE=1")
    for argv, flag in ((["--mpi"], "--mpi"), (["--network-interfaces", "eth0,eth1"], "--network-interfaces eth0,eth1"),
                       (["--mpi-args=-v"], "--mpi-args")):
        p = hr.parse(["-np", "2", *argv, "python", "x.py"])
        assert len(p.errors) == 1 and p.errors[0].startswith(flag + ": "), p.errors
    assert "--gloo" in hr.parse(["-np", "2", "--mpi", "python"]).errors[0]  # says what to use


def test_unknown_flags_are_rejected_by_name_and_command_arguments_stay_the_commands(capsys):
    with pytest.raises(SystemExit) as e:
        hr.parse(["-np", "2", "--no-such-flag", "python", "x.py"])
    assert e.value.code == 2 and "--no-such-flag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        hr.parse(["-np", "2", "--log-level", "LOUD", "python"])  # horovodrun's choices
    assert hr.parse(["-np", "2", "--gloo", "--mpi", "python"]).errors[0].startswith("--mpi: ")
    p = hr.parse(["-np", "2", "python", "train.py", "--log-level", "DEBUG", "--mpi", "-cb"])
    assert p.command == ["python", "train.py", "--log-level", "DEBUG", "--mpi", "-cb"]
    assert p.warnings == p.errors == [] and not p.check_build


def test_check_build_needs_no_np_but_a_launch_does():
    assert hr.parse(["--check-build"]).check_build and hr.parse(["-cb"]).check_build
    assert hr.main(["python", "x.py"]) == 2  # "-np is required", nothing started


def test_every_knob_flag_names_a_declared_knob_and_an_ignored_one_is_honoured_once_declared(monkeypatch):
    from appliance.common.knobs import KNOBS, Knob

    assert {knob for knob, _ in hr.KNOB_FLAGS.values()} <= set(KNOBS)
    ignored = {names[0] for names, _ in hr.IGNORED}
    assert set(hr.KNOB_WHEN_DECLARED) <= ignored
    monkeypatch.setitem(KNOBS, "HOROVOD_TIMELINE", Knob("HOROVOD_TIMELINE", str, "", "test"))
    p = hr.parse(["-np", "2", "--timeline-filename", "/tmp/t.json", "--log-level", "INFO", "python"])
    assert p.flags.x == ("HOROVOD_TIMELINE=/tmp/t.json",)
    assert [w.split(":")[0] for w in p.warnings] == ["--log-level INFO"]
