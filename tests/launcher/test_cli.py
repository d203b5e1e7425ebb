"""``appliance launch`` / ``python -m appliance launch`` as a user runs it: real launcher processes."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

DUMP_ENV = 'mark("env", json.dumps(dict(os.environ)))\n'


def finish(p, limit=30):
    out, err = p.communicate(timeout=limit)
    return p.returncode, out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")


@pytest.mark.timeout(60)
def test_secret_is_in_no_command_line_and_no_log(job):
    body = DUMP_ENV + 'wait_for("go")\nprint("bye")\n'
    p = job.cli("-np", "2", "-H", "localhost:2", "--verbose", "--", *job.argv(body))
    job.wait_files("env", 2)
    secret = job.env(0)["APPLIANCE_JOB_SECRET"]
    assert len(secret) == 32
    pids = [int(v) for v in job.files("pid").values()]
    seen_workers = 0
    for entry in os.listdir("/proc"):  # every process of the machine, not only ours
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        assert secret.encode() not in cmdline, f"secret on the command line of pid {entry}"
        seen_workers += int(entry) in pids and job.out.encode() in cmdline
    assert seen_workers == 2  # we did read the workers' command lines
    open(os.path.join(job.out, "go"), "w").close()
    rc, out, err = finish(p)
    assert rc == 0, err
    assert "store 127.0.0.1:" in err  # --verbose printed the plan
    assert secret not in out and secret not in err


@pytest.mark.timeout(60)
def test_every_line_prefixed_on_both_streams_and_output_files(job, tmp_path):
    body = r'''
out, err = sys.stdout.buffer, sys.stderr.buffer
out.write(b"first\n"); out.write("\u00fcnicode\n".encode()); out.write(b"bad \xff\xfe bytes\n")
out.write(b"x" * 70000 + b"\n"); out.flush()
err.write(b"warn 1\nwarn 2\n"); err.write(b"err partial"); err.flush()
out.write(b"last partial"); out.flush()
'''
    logs = tmp_path / "logs"
    p = job.cli("-np", "3", "--output-filename", str(logs), *job.argv(body))
    rc, out, err = finish(p)
    assert rc == 0, err
    for stream, text in (("stdout", out), ("stderr", err)):
        lines = text.splitlines()
        assert lines, stream
        for line in lines:
            assert re.match(rf"\[[012]\]<{stream}>:", line), (stream, line[:80])
    for rank in range(3):
        mine = [line.split(":", 1)[1] for line in out.splitlines() if line.startswith(f"[{rank}]<stdout>:")]
        assert mine[:3] == ["first", "\u00fcnicode", "bad \ufffd\ufffd bytes"]
        assert "".join(mine[3:-1]) == "x" * 70000 and mine[-1] == "last partial"
        mine_err = [line.split(":", 1)[1] for line in err.splitlines() if line.startswith(f"[{rank}]<stderr>:")]
        assert mine_err == ["warn 1", "warn 2", "err partial"]
        raw = (logs / f"rank.{rank}" / "stdout").read_bytes()
        assert raw.startswith(b"first\n\xc3\xbcnicode\nbad \xff\xfe bytes\n") and raw.endswith(b"last partial\n")
        assert (logs / f"rank.{rank}" / "stderr").read_bytes() == b"warn 1\nwarn 2\nerr partial\n"


@pytest.mark.timeout(60)
def test_x_forwards_and_console_script(job):
    body = DUMP_ENV
    env = {"APPL_CLI_FWD": "from-launcher-env"}
    p = job.cli("-np", "2", "-x", "APPL_CLI_FWD", "-x", "APPL_CLI_SET=a=b", "-x", "HOROVOD_CYCLE_TIME=0.5",
                "--start-timeout", "7", "--", *job.argv(body), env=env)
    rc, out, err = finish(p)
    assert rc == 0, err
    for rank in range(2):
        e = job.env(rank)
        assert (e["APPL_CLI_FWD"], e["APPL_CLI_SET"], e["HOROVOD_CYCLE_TIME"]) == ("from-launcher-env", "a=b", "0.5")
        assert e["HOROVOD_START_TIMEOUT"] == "7.0"
    script = os.path.join(os.path.dirname(sys.executable), "appliance")
    if not os.path.exists(script):
        pytest.skip("console script not installed (pip install -e .)")
    r = subprocess.run([script, "launch", "--num-proc", "1", "--hosts", "localhost:1", sys.executable, "-c",
                        "print('via console script')"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == "[0]<stdout>:via console script\n", r


@pytest.mark.timeout(60)
def test_killed_rank_stops_the_job_and_is_named(job):
    body = 'if RANK == 0:\n    grandchild()\ntime.sleep(60)\n'
    p = job.cli("-np", "3", "-H", "localhost:3", *job.argv(body), env={"APPLIANCE_FAILURE_GRACE": "0.5"})
    pids = job.wait_files("pid", 3)
    job.wait_files("grandchild", 1)
    os.kill(int(pids[2]), signal.SIGKILL)
    start = time.monotonic()
    rc, out, err = finish(p)
    assert time.monotonic() - start < 5
    assert rc == 137, err
    summary = err.strip().splitlines()[-1]
    assert "rank 2" in summary and "localhost" in summary and "SIGKILL" in summary, summary
    assert job.wait_dead(job.pids(), 1.0) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_all(job, sig, code):
    body = 'if RANK == 1:\n    grandchild()\ntime.sleep(60)\n'
    p = job.cli("-np", "2", *job.argv(body))
    job.wait_files("pid", 2)
    job.wait_files("grandchild", 1)
    start = time.monotonic()
    os.kill(p.pid, sig)  # only the launcher: workers are in their own sessions
    rc, out, err = finish(p)
    assert rc == code and time.monotonic() - start < 5, (rc, err)
    assert signal.Signals(sig).name in err
    pids = job.pids()
    assert len(pids) == 3 and job.wait_dead(pids, 1.0) == []


@pytest.mark.timeout(60)
def test_sigint_to_a_python_api_caller_stops_all_then_raises(job):
    body = 'time.sleep(60)\n'
    caller = ("import sys\nfrom appliance.launcher import launch\n"
              "try:\n    launch(sys.argv[1:], np=2, timeout=50)\nexcept KeyboardInterrupt:\n    sys.exit(42)\n")
    p = subprocess.Popen([sys.executable, "-c", caller, *job.argv(body)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    job.launchers.append(p)
    job.wait_files("pid", 2)
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p)
    assert rc == 42, err
    assert job.wait_dead(job.pids(), 1.0) == []


@pytest.mark.timeout(60)
def test_usage_errors_are_one_clear_line(job, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# our cluster\nlocalhost slots=2\nnode2 slots=two\n")
    cases = [
        (["-np", "5", "-H", "localhost:2,127.0.0.1:1"], 2, ["-np 5", "3 slots"]),
        (["-np", "2", "--hostfile", str(hostfile)], 2, [f"{hostfile}:3", "'two'"]),
        (["-np", "2", "--hostfile", str(tmp_path / "missing")], 2, ["missing"]),
        (["-np", "2", "-H", "localhost:x"], 2, ["'localhost:x'"]),
        (["-np", "1", "-x", "APPL_SURELY_UNSET_VAR"], 2, ["APPL_SURELY_UNSET_VAR is not set"]),
        (["-np", "1", "-x", "HOROVOD_RANK=3"], 2, ["HOROVOD_RANK"]),
        (["-np", "2", "-H", "localhost:1,host.invalid:1"], 1, ["host.invalid does not resolve", "/etc/hosts"]),
        (["-np", "2", "--", str(tmp_path / "no-such-program")], 127, ["rank 0", "could not start", "no-such-program"]),
    ]
    for args, want_rc, words in cases:
        p = job.cli(*args, *job.argv("")) if args[-1] != str(tmp_path / "no-such-program") else job.cli(*args)
        rc, out, err = finish(p)
        assert rc == want_rc, (args, rc, err)
        last = err.strip().splitlines()[-1]
        if "preflight failed" in err:  # the preflight: a header, then one indented line per failure
            assert err.startswith("appliance launch: error: preflight failed"), (args, err)
            last = err
        assert last.startswith("appliance launch: "), (args, err)
        for w in words:
            assert w in last, (args, w, last)
    assert job.files("pid") == {}
    p = subprocess.run([sys.executable, "-m", "appliance", "launch", "-np", "2"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "no command" in p.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("elastic", [[], ["--min-np", "1"]], ids=["static", "elastic"])
def test_a_launcher_out_of_threads_names_it_and_leaves_no_rank(job, tmp_path, elastic, require_tool):
    # 300 ranks under a 600 MB address-space cap: the launcher's relay and wait threads (8 MiB of
    # stack each) run out long before the ranks do. One line naming the cause, no traceback, every
    # rank it started stopped.
    require_tool("prlimit", "caps the launcher's address space")
    marker = tmp_path / "started"
    body = f"open({str(marker)!r} + '.' + os.environ['HOROVOD_RANK'], 'w').close()\nimport time; time.sleep(30)\n"
    p = subprocess.Popen(["prlimit", "--as=600000000", sys.executable, "-m", "appliance", "launch", "-np", "300",
                          "-H", "localhost:300", *elastic, "--", *job.argv(body)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    job.launchers.append(p)
    code, out, err = finish(p, limit=100)
    assert code == 126, err[-2000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert "cannot start a thread" in err and "out of threads or memory" in err, err[-2000:]
    pids = [int(pid) for pid in subprocess.run(["pgrep", "-f", str(marker)], capture_output=True,
                                text=True).stdout.split()]
    assert job.wait_dead(pids, 5.0) == []
