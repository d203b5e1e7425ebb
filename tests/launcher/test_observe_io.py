"""The launcher's metrics collector, record, report and Prometheus endpoint, over real sockets and files.

A fake rank here is a real TCP client speaking the wire (newline-delimited JSON, a hello with the
job secret's HMAC, then samples); the endpoint is scraped over HTTP and parsed with
prometheus_client's own parser; report.png is decoded and its panels checked.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import os
import socket
import time
import urllib.request

import pytest

from appliance.common.knobs import ConfigError
from appliance.launcher.observe.collector import Collector
from appliance.launcher.observe.follow import RecordFollower
from appliance.launcher.observe.prometheus import PrometheusEndpoint
from appliance.launcher.observe.record import RecordWriter, read_record
from appliance.launcher.observe.report import draw, figure, summarize
from appliance.launcher.observe.state import JobState

SECRET = "00112233445566778899aabbccddeeff"


def auth(secret: str = SECRET) -> str:
    return hmac.new(bytes.fromhex(secret), b"appliance-metrics", hashlib.sha256).hexdigest()


def hello(rank: int, size: int = 2, host: str = "node0", auth_=None) -> dict:
    return {"v": 1, "kind": "hello", "job": "j1", "rank": rank, "size": size, "local_rank": 0, "host": host,
            "round": 0, "pid": 4000 + rank, "auth": auth() if auth_ is None else auth_}


def sample(rank: int, t: float, step: int, late: float = 0.0, wait: float = 0.0) -> dict:
    return {"v": 1, "kind": "sample", "t": t, "rank": rank, "round": 0, "step": step, "step_src": "optimizer",
            "samples": step * 16, "total_steps": None, "busy_s": step * 0.01, "wall_s": step * 0.05,
            "ops": {"allreduce": {"n": step, "bytes": step * 1e6, "s": step * 0.002}},
            "wait_s": wait, "late_s": late, "rss": 1 << 28, "gpu_util": None, "gpu_mem": None}


def send(port: int, *messages: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    return s


def wait_for(cond, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_collector_takes_authentic_ranks_and_drops_the_rest():
    state = JobState("j1", 2)
    with Collector(state, SECRET) as col:
        good = send(col.port, hello(0), sample(0, 100.0, 10), sample(0, 101.0, 30))
        bad = send(col.port, hello(1, auth_="00" * 32), sample(1, 100.0, 99))
        none = send(col.port, hello(1, auth_=None) | {"auth": None}, sample(1, 100.0, 98))
        first_not_hello = send(col.port, sample(1, 100.0, 97))
        wait_for(lambda: col.rejected == 3 and state.ranks.get(0) and len(state.ranks[0].samples) == 2)
        for s in (bad, none, first_not_hello):  # the collector closed them
            s.settimeout(5)
            assert s.recv(1) == b""
        snap = state.snapshot()
        assert [r.rank for r in snap.ranks] == [0]
        assert snap.ranks[0].step == 30 and snap.ranks[0].rates.steps_per_s == pytest.approx(20.0)
        assert snap.ranks[0].alive
        good.close()  # gone without a bye: no longer alive
        wait_for(lambda: not state.snapshot().ranks[0].alive)
        again = send(col.port, hello(0), sample(0, 103.0, 40), {"v": 1, "kind": "bye", "rank": 0, "t": 104.0})
        again.close()  # ended with a bye: shown as done, not as lost
        wait_for(lambda: state.ranks[0].said_bye and not state.snapshot().ranks[0].connected)
        assert state.snapshot().ranks[0].step == 40 and state.snapshot().ranks[0].alive
        for s in (bad, none, first_not_hello):
            s.close()


def test_collector_without_a_secret_takes_any_hello_and_survives_garbage():
    state = JobState("j1", 1)
    with Collector(state, None, say=lambda line: None) as col:
        s = send(col.port, hello(0, auth_=None) | {"auth": None}, sample(0, 1.0, 1))
        wait_for(lambda: state.ranks.get(0) and len(state.ranks[0].samples) == 1)
        s.sendall(b"not json\n" + json.dumps(sample(0, 1.5, 5)).encode() + b"\n")  # garbage: refused
        s.settimeout(5)
        assert s.recv(1) == b""
        s.close()
        assert state.ranks[0].samples[-1].step == 1 and col.rejected == 1
        s = send(col.port, hello(0, auth_=None) | {"auth": None})
        s.sendall(b"x" * (70 << 10))  # a line that never ends: the connection goes, the collector stays
        s.settimeout(5)
        assert s.recv(1) == b""
        s.close()
        again = send(col.port, hello(0, auth_=None) | {"auth": None}, sample(0, 2.0, 2))
        wait_for(lambda: state.ranks[0].samples[-1].step == 2)
        again.close()


def test_collector_close_ends_its_connections():
    state = JobState("j1", 1)
    col = Collector(state, SECRET).__enter__()
    s = send(col.port, hello(0))
    wait_for(lambda: 0 in state.ranks)
    col.close()
    s.settimeout(5)
    assert s.recv(1) == b""
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", col.port), timeout=2).close()


def test_collector_closes_a_connection_silent_for_its_idle_bound():
    """A rank on a cut host sends nothing and never closes its end: the collector closes the
    connection after ``idle_s`` (it would hold a socket for the rest of the job), while a rank that
    keeps sending stays connected."""
    state = JobState("j1", 2)
    with Collector(state, SECRET, idle_s=1.5) as col:
        silent, talking = send(col.port, hello(0)), send(col.port, hello(1))
        wait_for(lambda: 0 in state.ranks and 1 in state.ranks)
        end = time.monotonic() + 4
        while time.monotonic() < end:
            talking.sendall(json.dumps(sample(1, time.time(), 1)).encode() + b"\n")
            time.sleep(0.3)
        silent.settimeout(5)
        assert silent.recv(1) == b""  # closed by the collector
        talking.sendall(json.dumps(sample(1, time.time(), 2)).encode() + b"\n")
        assert len(col._conns) == 1
        silent.close()
        talking.close()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def fill(state: JobState, clock: Clock, seconds: int, slow: int | None = None, ranks: int = 4, start: int = 0):
    for sec in range(start, start + seconds):
        clock.t = 1000.0 + sec + 1
        for r in range(ranks):
            steps = (sec + 1) * 8
            late = steps * 0.03 if r == slow else steps * 0.0002
            wait = steps * 0.0002 if r == slow else steps * 0.03 if slow is not None else steps * 0.0002
            if sec == 0:
                state.message(hello(r, ranks, f"node{r // 2}"))
            state.message(sample(r, clock.t, steps, late=late, wait=wait))


def test_record_and_report(tmp_path):
    clock = Clock()
    state = JobState("j1", 4, clock=clock)
    job_dir = str(tmp_path / "jobs" / "j1")
    with RecordWriter(job_dir, "j1", 4, every_s=1.0) as rec:
        for sec in range(6):
            fill(state, clock, 1, start=sec)
            rec.tick(state.snapshot())
        rec.round(clock.t, 1, 4)
        rec.event(clock.t, "round 1 formed: 4 ranks")
        for sec in range(6, 14):
            fill(state, clock, 1, slow=3, start=sec)
            rec.tick(state.snapshot())
        live = json.load(open(os.path.join(job_dir, "live.json")))
        assert live["job"] == "j1" and live["ended"] is None and live["hosts"] == ["node0", "node1"]
        rec.end(state.snapshot(), 0, "summary: done")
    record = read_record(job_dir)
    assert record["job"]["job"] == "j1" and record["end"]["returncode"] == 0
    assert len(record["ranks"]) >= 4 * 3 and record["rounds"][0]["round"] == 1
    assert json.load(open(os.path.join(job_dir, "live.json")))["ended"] is not None
    s = summarize(record)
    assert s["top"][0] == 3 and s["ranks"] == 4 and s["hosts"] == 2
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(job_dir))

    path = draw(job_dir)
    assert path == os.path.join(job_dir, "report.png")
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.shape[0] > 600 and img.shape[1] > 800   # three stacked panels at 90 dpi
    assert img[..., :3].std() > 0.05                   # not blank
    fig = figure(job_dir)
    speed, comm, late = fig.axes[:3]
    assert [a.get_title() for a in (speed, comm, late)] == [
        "steps/s per host", "communication share per host (time blocked in collectives)",
        "lateness: ms the others waited per step for each rank"]
    assert sorted(l.get_label() for l in speed.get_lines() if not l.get_label().startswith("_")) == ["node0", "node1"]
    assert any(t.get_text() == "round 1" for t in speed.texts)            # the round, marked
    heat = late.get_images()[0].get_array()
    assert heat.shape[0] == 4 and int(heat[:, -1].argmax()) == 3          # rank 3 is late at the end
    assert "top straggler: rank 3 on node1" in fig._suptitle.get_text()


def read_events(path: str) -> list:
    """TensorBoard's event file: TFRecords (u64 length, u32 crc, data, u32 crc) of Event protos."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out, data = [], open(path, "rb").read()
    i = 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        out.append(Event.FromString(data[i + 12:i + 12 + n]))
        i += 12 + n + 4
    return out


def test_tensorboard_events_carry_the_scalars(tmp_path):
    clock = Clock()
    state = JobState("j1", 4, clock=clock)
    with RecordWriter(str(tmp_path), "j1", 4, every_s=0) as rec:
        for sec in range(5):
            fill(state, clock, 1, start=sec)
            rec.tick(state.snapshot())
    files = [n for n in os.listdir(tmp_path) if n.startswith("events.out.tfevents")]
    assert len(files) == 1
    tags = {v.tag: v.simple_value for e in read_events(str(tmp_path / files[0])) for v in e.summary.value}
    assert tags["job/steps_per_s"] == pytest.approx(8.0) and "host/node1/steps_per_s" in tags


def test_a_follower_sees_the_job_the_record_holds(tmp_path):
    # ``appliance primary`` draws its container's job on the user's terminal from the record on the
    # share: the same hosts, steps, rates, round and straggler as the launcher's own state, each
    # event once, and a line cut mid-write taken when it is whole.
    clock = Clock()
    job_dir = str(tmp_path)
    follower = RecordFollower(job_dir, clock=clock)
    assert follower.snapshot().ranks == () and follower.end is None          # no record yet
    with RecordWriter(job_dir, "j1", 4, every_s=1.0) as rec:
        state = JobState("j1", 4, clock=clock, on_event=lambda ev: rec.event(ev.t, ev.text, ev.source))
        for sec in range(6):
            fill(state, clock, 1, start=sec)
            rec.tick(state.snapshot())
        state.new_round(1, 4)
        rec.round(clock.t, 1, 4)
        first = follower.snapshot()
        assert first.size == 4 and [r.step for r in first.ranks] == [48] * 4 and first.round == 1
        for sec in range(6, 14):
            fill(state, clock, 1, slow=3, start=sec)
            rec.tick(state.snapshot())
        mine, seen = state.snapshot(), follower.snapshot()
        assert mine.straggler is not None and mine.straggler.rank == 3
        assert seen.job_id == "j1" and seen.size == 4 and seen.round == 1
        assert [(h.host, h.ranks) for h in seen.hosts] == [(h.host, h.ranks) for h in mine.hosts]
        assert [r.step for r in seen.ranks] == [r.step for r in mine.ranks] == [112] * 4
        assert seen.steps_per_s == pytest.approx(mine.steps_per_s)
        assert seen.comm_share == pytest.approx(mine.comm_share)
        assert seen.straggler is not None and (seen.straggler.rank, seen.straggler.host) == (3, "node1")
        texts = [e.text for e in seen.events]
        assert texts.count("round 1 formed: 4 ranks") == 1
        assert sum(t.startswith("straggler: rank 3") for t in texts) == 1
        rec.end(state.snapshot(), 0, "summary: done")
    with open(os.path.join(job_dir, "metrics.jsonl"), "a") as f:
        f.write('{"kind": "event", "t": 2000.0, "te')
        f.flush()
        follower.poll()
        assert follower.end == {"kind": "end", "t": clock.t, "returncode": 0, "summary": "summary: done"}
        assert "the last line" not in [e.text for e in follower.state.snapshot().events]
        f.write('xt": "the last line", "source": "launcher"}\n')
    assert follower.snapshot().events[-1].text == "the last line"


def test_a_job_that_reported_once_per_rank_has_a_report(tmp_path):
    # A short job (or a slow launcher) records one row per rank: its counters began at zero
    # ``wall_s`` before, so the picture has that interval and the summary counts from there.
    job_dir = str(tmp_path)
    with RecordWriter(job_dir, "j1", 2, every_s=0) as rec:
        for rank, host in ((0, "node0"), (1, "node1")):
            rec._write({"kind": "rank", "rank": rank, "host": host, "t": 1000.0, "step": 40, "wall_s": 4.0,
                        "busy_s": 1.0, "late_s": 0.2 * rank})
        rec._write({"kind": "end", "t": 1000.5, "returncode": 0, "summary": ""})
    fig = figure(job_dir)
    speed = fig.axes[0]
    ys = [y for l in speed.get_lines() for y in l.get_ydata()]
    assert ys and max(ys) == pytest.approx(10.0)                           # 40 steps in 4 s
    s = summarize(read_record(job_dir))
    assert s["elapsed_s"] == pytest.approx(4.5) and s["top"][0] == 1
    assert os.path.getsize(draw(job_dir)) > 0


def test_report_of_an_empty_record_says_so(tmp_path):
    with RecordWriter(str(tmp_path), "j1", 2):
        pass
    with pytest.raises(ValueError, match="no sample of any rank"):
        draw(str(tmp_path))


def scrape(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_scrape():
    clock = Clock()
    state = JobState("j1", 4, clock=clock)
    for sec in range(6):
        fill(state, clock, 1, slow=2, start=sec)
        state.snapshot()
    with PrometheusEndpoint(0, state.snapshot, addr="127.0.0.1") as ep:
        m = scrape(ep.port)
    lab = lambda rank, host, **kw: tuple(sorted({"job": "j1", "host": host, "rank": str(rank), **kw}.items()))  # noqa: E731
    assert m[("appliance_rank_step", lab(2, "node1"))] == 48
    assert m[("appliance_rank_steps_per_second", lab(0, "node0"))] == pytest.approx(8.0)
    assert m[("appliance_rank_late_seconds_per_step", lab(2, "node1"))] == pytest.approx(0.03)
    assert m[("appliance_rank_collective_bytes_total", lab(1, "node0", op="allreduce"))] == 48e6
    assert m[("appliance_rank_up", lab(3, "node1"))] == 1
    assert m[("appliance_job_straggler_rank", (("job", "j1"),))] == 2
    assert m[("appliance_job_steps_per_second", (("job", "j1"),))] == pytest.approx(8.0)


def test_prometheus_port_in_use_is_one_clear_error():
    state = JobState("j1", 1)
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        with pytest.raises(ConfigError, match=rf"--metrics-port {s.getsockname()[1]}: cannot listen there"):
            PrometheusEndpoint(s.getsockname()[1], state.snapshot).__enter__()


def test_status_lists_running_jobs_only(tmp_path):
    from appliance.cluster.status import list_jobs, render

    now = 5000.0
    jobs = tmp_path / "jobs"
    for name, live in {"run1": {"ended": None, "updated": now - 2, "started": now - 300, "step": 120,
                                "total_steps": 1000, "steps_per_s": 2.5, "hosts": ["a", "b"], "ranks": 16,
                                "reporting": 16},
                       "done": {"ended": now - 10, "updated": now - 10, "started": now - 99, "hosts": ["a"], "ranks": 1},
                       "stale": {"ended": None, "updated": now - 600, "started": now - 900, "hosts": ["a"],
                                 "ranks": 1}}.items():
        (jobs / name).mkdir(parents=True)
        (jobs / name / "live.json").write_text(json.dumps(live))
    (jobs / "nofile").mkdir()
    rows = list_jobs([str(tmp_path)], now=now)
    assert [(r.job, r.hosts, r.ranks, r.step, r.steps_per_s, r.age_s) for r in rows] == [
        ("run1", ("a", "b"), 16, 120, 2.5, 300.0)]
    import io

    out = io.StringIO()
    render(None, out, [], [str(tmp_path)], rows)
    text = out.getvalue()
    assert re.search(r"run1\s*│\s*a, b\s*│\s*16\s*│\s*120/1000\s*│\s*2\.50\s*│\s*5m", text), text


def test_report_command_without_a_record_is_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "jobs").mkdir()
    r = subprocess.run([sys.executable, "-m", "appliance", "report", "nojob", "--shared", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"appliance report: no record of job nojob in {tmp_path}/jobs (--shared or APPLIANCE_SHARED " \
                       "to look elsewhere)\n"


def test_the_record_of_a_primary_job_goes_into_its_job_directory():
    from appliance.cluster.jobrun import job_config
    from appliance.launcher.flags import LaunchFlags
    from appliance.launcher.observe.session import record_dir_of

    job = {"launch": LaunchFlags(np=2, hosts="a:1,b:1").to_json(), "command": ["python", "-m", "train"],
           "ssh_port": 12345, "shared": "/s", "secondary_wait_s": 7.5}
    config = job_config(job, "/s/jobs/j1", environ={})
    assert record_dir_of("launcherid", {**config.environ, **config.env}, config.remote.shared_dir) == "/s/jobs/j1"
    # elsewhere: SHARED/jobs/<launcher's job id> when the share exists, nothing when it does not; "off": nothing
    assert record_dir_of("abc", {}, "/nonexistent") is None
    assert record_dir_of("abc", {"APPLIANCE_RECORD_DIR": "off"}, "/") is None
    assert record_dir_of("abc", {}, "/") == "/jobs/abc"


def test_the_reports_step_is_the_jobs_step_after_a_growth():
    # A job grown from 2 ranks to 3 at job step 50: the new rank's own counter says 30 when the job
    # ends at 80; rank 5 left in round 0 at step 20. The report counts the job's 80 steps, as the
    # closing summary does, from the newest round's job_step (the per-process step undercounts).
    def row(rank, t, step, job_step, rnd):
        return {"rank": rank, "host": "h", "t": t, "step": step, "job_step": job_step, "round": rnd,
                "busy_s": 1.0, "wall_s": t, "wait_s": 0.0, "late_s": 0.0}
    record = {"job": {"job": "grown", "t": 0.0}, "rounds": [], "events": [], "end": {"t": 10.0},
              "ranks": [row(5, 2.0, 20, 20, 0), row(0, 10.0, 80, 80, 1), row(1, 10.0, 80, 80, 1),
                        row(2, 10.0, 30, 80, 1)]}
    assert summarize(record)["steps"] == 80
    older = {**record, "ranks": [{k: v for k, v in r.items() if k != "job_step"} for r in record["ranks"]]}
    assert summarize(older)["steps"] == 30  # a record without job_step: the least step of the newest round
