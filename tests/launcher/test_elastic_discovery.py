"""Host discovery for elastic jobs (``appliance.launcher.elastic.discovery``): Horovod's output
format (``host:slots`` or ``host`` lines), the MPI Operator's generated script as it is, strict
line checks (nothing that could read as an SSH option or a shell word gets through), and running
the script as an argv with a timeout, with errors that name the script and the line."""
from __future__ import annotations

import os
import threading
import time

import pytest

from appliance.launcher.elastic.discovery import (DiscoveryError, FixedDiscovery, ScriptDiscovery,
                                                  parse_hosts_output)

# What the MPI Operator (v2) generates as /etc/mpi/discover_hosts.sh: one echo per running worker pod.
MPI_OPERATOR_SCRIPT = """#!/bin/sh
echo job-worker-0.job.default.svc
echo job-worker-1.job.default.svc
"""


def script(tmp_path, body: str, name: str = "discover.sh", mode: int = 0o755) -> str:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(mode)
    return str(path)


def test_lines_are_host_slots_or_host_with_the_default_slots():
    text = "a:2\n\n  b  \n# a comment\n10.0.0.7:4\n[fe80::1]:3\n[::1]\nb\n"
    assert parse_hosts_output(text, "s") == {"a": 2, "b": 1, "10.0.0.7": 4, "fe80::1": 3, "::1": 1}
    assert parse_hosts_output("x\ny:2\n", "s", default_slots=8) == {"x": 8, "y": 2}
    assert parse_hosts_output("", "s") == {}  # nothing available right now: not an error


@pytest.mark.parametrize("line, why", [
    ("-oProxyCommand=touch /tmp/x", "SSH option"),
    ("host;rm -rf /", "not a host name"),
    ("$(reboot)", "not a host name"),
    ("user@host", "not a host name"),
    ("two words", "not a host name"),
    ("a:0", "at least 1"),
    ("a:two", "whole number"),
    ("a:1 b:1", "not a host name"),
    ("[::1", "missing ']'"),
])
def test_a_malformed_line_names_the_script_the_line_and_why(line, why):
    with pytest.raises(DiscoveryError) as e:
        parse_hosts_output(f"good:1\n{line}\n", "host discovery script d.sh")
    assert "host discovery script d.sh, line 2" in str(e.value) and why in str(e.value), str(e.value)


def test_the_same_host_with_two_slot_counts_is_refused():
    assert parse_hosts_output("a:2\na:2\n", "s") == {"a": 2}
    with pytest.raises(DiscoveryError, match="listed again with 3 slots"):
        parse_hosts_output("a:2\na:3\n", "s")


def test_the_mpi_operators_script_works_as_it_is(tmp_path):
    d = ScriptDiscovery(script(tmp_path, MPI_OPERATOR_SCRIPT), None, 5.0, os.environ)
    assert d.find() == {"job-worker-0.job.default.svc": 1, "job-worker-1.job.default.svc": 1}
    assert ScriptDiscovery(d.script, 4, 5.0, os.environ).find() == {"job-worker-0.job.default.svc": 4,
                                                                     "job-worker-1.job.default.svc": 4}


def test_script_errors_name_the_script_and_what_went_wrong(tmp_path):
    env = dict(os.environ)
    cases = [
        (str(tmp_path / "absent.sh"), "no such file"),
        (script(tmp_path, "#!/bin/sh\necho a\n", "noexec.sh", 0o644), "not executable"),
        (script(tmp_path, "#!/bin/sh\necho 'no hosts today' >&2\nexit 3\n", "fails.sh"), "exited with code 3: no hosts today"),
        (script(tmp_path, "#!/bin/sh\necho 'a;b'\n", "bad.sh"), "line 1"),
    ]
    for path, why in cases:
        with pytest.raises(DiscoveryError) as e:
            ScriptDiscovery(path, None, 5.0, env).find()
        assert path in str(e.value) and why in str(e.value), str(e.value)


def test_a_script_that_hangs_is_stopped_with_what_it_started(tmp_path):
    marker = tmp_path / "child.pid"
    path = script(tmp_path, f"#!/bin/sh\nsleep 30 &\necho $! > {marker}\nsleep 30\n", "hangs.sh")
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match=r"did not finish within 0.5 s"):
        ScriptDiscovery(path, None, 0.5, os.environ).find()
    assert time.monotonic() - start < 4.0
    pid = int(marker.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the script's background child outlived it")


def test_the_script_runs_without_a_shell_from_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir, "#!/bin/sh\necho \"$0\" | grep -q 'find-hosts' && echo found:2\n", "find-hosts")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    assert ScriptDiscovery("find-hosts", None, 5.0, env).find() == {"found": 2}
    with pytest.raises(DiscoveryError, match="no such file"):
        ScriptDiscovery("find-hosts --flag", None, 5.0, env).find()  # one path, never a shell command


def test_fixed_hosts_are_always_the_same():
    d = FixedDiscovery({"a": 2, "b": 1})
    assert d.find() == {"a": 2, "b": 1} and d.find() is not d.find()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_close_from_another_thread_ends_a_run_in_flight_and_later_finds(tmp_path):
    marker = tmp_path / "child.pid"
    path = script(tmp_path, f"#!/bin/sh\nsleep 1000 &\necho $! > {marker}\nexec sleep 1000\n", "hangs.sh")
    d = ScriptDiscovery(path, None, 60.0, os.environ)
    outcome: list[BaseException | dict] = []

    def run():
        try:
            outcome.append(d.find())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    finder = threading.Thread(target=run, daemon=True)
    finder.start()
    for _ in range(200):  # the script has started its background child
        if marker.exists() and marker.read_text().strip():
            break
        time.sleep(0.05)
    child = int(marker.read_text())
    run_in_flight = d._run
    assert run_in_flight is not None
    script_pid = run_in_flight.proc.pid
    try:
        start = time.monotonic()
        d.close()
        finder.join(timeout=5)
        assert not finder.is_alive() and time.monotonic() - start < 3.0
        assert isinstance(outcome[0], DiscoveryError) and "closed" in str(outcome[0]), outcome
        for _ in range(100):
            if _gone(child) and _gone(script_pid):
                break
            time.sleep(0.05)
        assert _gone(script_pid), "the script outlived close()"
        assert _gone(child), "the script's background child outlived close()"
        with pytest.raises(DiscoveryError, match="closed"):
            d.find()
        d.close()  # again: nothing happens
    finally:
        for pid in (child, script_pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_close_before_a_run_and_on_the_fixed_list(tmp_path):
    d = ScriptDiscovery(script(tmp_path, "#!/bin/sh\necho a:1\n"), None, 5.0, os.environ)
    assert d.find() == {"a": 1}
    with d:
        pass
    with pytest.raises(DiscoveryError, match="closed"):
        d.find()
    f = FixedDiscovery({"a": 1})
    f.close()
    with pytest.raises(DiscoveryError, match="closed"):
        f.find()


def test_output_over_the_cap_fails_the_run_with_one_line_never_a_cut(tmp_path):
    from appliance.launcher.elastic.discovery import MAX_OUTPUT

    a, b = "localhost:2\n", "127.0.0.1:2\n"
    fits = tmp_path / "fits.txt"  # exactly MAX_OUTPUT bytes: both hosts are read
    fits.write_text(a + "#" + "x" * (MAX_OUTPUT - len(a) - len(b) - 2) + "\n" + b)
    assert fits.stat().st_size == MAX_OUTPUT
    path = script(tmp_path, f"#!/bin/sh\ncat {fits}\n", "fits.sh")
    assert ScriptDiscovery(path, None, 10.0, os.environ).find() == {"localhost": 2, "127.0.0.1": 2}
    over = tmp_path / "over.txt"  # the probe's case: one byte more used to cut "127.0.0.1:2" to "127.0.0.1"
    over.write_text(a + "#" + "x" * (MAX_OUTPUT - len(a) - len(b) - 1) + "\n" + b)
    path = script(tmp_path, f"#!/bin/sh\ncat {over}\n", "over.sh")
    with pytest.raises(DiscoveryError, match=f"output exceeded {MAX_OUTPUT} bytes"):
        ScriptDiscovery(path, None, 10.0, os.environ).find()


def test_endless_output_fails_at_the_cap_not_at_the_timeout(tmp_path):
    path = script(tmp_path, "#!/bin/sh\nexec yes localhost:1\n", "endless.sh")
    d = ScriptDiscovery(path, None, 60.0, os.environ)
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match="output exceeded"):
        d.find()
    assert time.monotonic() - start < 30.0  # far below the 60 s timeout
    assert d._run is None


def test_a_run_is_always_bounded():
    for bad in (0, 0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="must be positive"):
            ScriptDiscovery("d.sh", None, bad, os.environ)


def test_a_huge_malformed_line_makes_a_short_error():
    for text in ("x" * 1_000_000 + ";\n", "host:" + "1" * 500_000 + "\n", "a:b:" + "c" * 900_000 + "\n"):
        with pytest.raises(DiscoveryError) as e:
            parse_hosts_output(text, "host discovery script d.sh")
        assert "host discovery script d.sh, line 1" in str(e.value) and len(str(e.value)) < 600, len(str(e.value))
