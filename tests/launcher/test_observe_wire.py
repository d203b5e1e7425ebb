"""The metrics wire and the Prometheus endpoint under bad input: a real collector and a real
endpoint on loopback, attacked while a real TCP client speaking as rank 0 keeps reporting.

Every case checks the same three things: the attacker is refused (its connection closed, within
seconds), the job's numbers are unmoved (only rank 0, only its own samples), and the collector
still serves (rank 0's next sample is taken). Refusals say one line naming the peer, rate-limited
(the elastic driver's ``RefusalLog``). The ids are the bad-input probe's (surface 2). Every loop
is bounded in count and time.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from appliance.launcher.observe.collector import Collector
from appliance.launcher.observe.prometheus import PrometheusEndpoint
from appliance.launcher.observe.record import LIVE, RecordWriter
from appliance.launcher.observe.state import JobState

from test_observe_io import SECRET, auth, hello, sample, send, wait_for

pytestmark = pytest.mark.timeout(120)
HELLO_S = 1.0


class Wire:
    """A collector on loopback with rank 0 connected and reporting; ``lines``: what it said."""

    def __init__(self, hello_s: float = HELLO_S):
        self.lines: list[str] = []
        self.state = JobState("j1", 1)
        self.col = Collector(self.state, SECRET, host="127.0.0.1", hello_s=hello_s, say=self.lines.append)
        self.step = 0

    def __enter__(self) -> "Wire":
        self.col.__enter__()
        self.rank0 = send(self.col.port, hello(0, size=1))
        self.report()
        return self

    def report(self) -> None:
        """Rank 0 sends its next sample; it must reach the job."""
        self.step += 1
        self.rank0.sendall(json.dumps(sample(0, 1000.0 + self.step, self.step)).encode() + b"\n")
        wait_for(lambda: self.state.ranks.get(0) and self.state.ranks[0].samples
                 and self.state.ranks[0].samples[-1].step == self.step, timeout=5)

    def unmoved(self) -> None:
        assert sorted(self.state.ranks) == [0], self.state.ranks
        assert self.state.bad_messages == 0
        assert self.col.messages == 1 + self.step  # rank 0's hello and samples, nothing else
        snap = self.state.snapshot()
        assert snap.step == self.step and snap.reporting == 1

    def __exit__(self, *exc) -> None:
        self.rank0.close()
        self.col.close()


def closed_by_peer(s: socket.socket, within: float) -> float:
    """Seconds until the collector closed ``s`` (reads and discards); fails past ``within``."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < within:
        try:
            if s.recv(65536) == b"":
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
    raise AssertionError(f"still open after {within} s")


def nested(depth: int, open_: bytes, close: bytes) -> bytes:
    return open_ * depth + close * depth + b"\n"


def line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


rng = random.Random(5)
RANDOM_4K = bytes(rng.randrange(256) for _ in range(4096))
HALF_HELLO = line(hello(1))[:40]

# id, what the attacker sends (then holds the connection open), the refusal the line names
FIRST_LINES = [
    ("p01", RANDOM_4K.replace(b"\n", b" ") + b"\n", "does not decode"),
    ("p03", RANDOM_4K.replace(b"\n", b" "), f"no hello within {HELLO_S:g} s"),
    ("p04", HALF_HELLO, f"no hello within {HELLO_S:g} s"),
    ("p05", b"x" * (1 << 20) + b"\n", "a line over 64 KiB"),
    ("p06", (100 << 20).to_bytes(4, "big") + b"abc", f"no hello within {HELLO_S:g} s"),
    ("p07", nested(30000, b"[", b"]"), "does not decode (RecursionError)"),
    ("p11", line(hello(1, auth_="ab" * 32)), "auth does not match"),
    ("p12", line({k: v for k, v in hello(1).items() if k != "auth"}), "auth does not match"),
    ("p13", line(hello(1, auth_=12345)), "auth does not match"),
    ("p14", line(hello(1, auth_="éé")), "auth does not match"),
    ("p15b", line(sample(1, 1000.0, 5)), "not a hello"),
    ("p25", nested(7000, b'{"a":', b"}"), "does not decode (RecursionError)"),
    ("p25-100K", nested(20000, b'{"a":', b"}"), "a line over 64 KiB"),
    ("rank-text", line(hello(1) | {"rank": "abc"}), "rank is not a whole number"),
    ("rank-bool", line(hello(1) | {"rank": True}), "rank is not a whole number"),
    ("rank-huge", line(hello(1) | {"rank": 10 ** 30}), "rank is not a whole number"),
    ("host-list", line(hello(1) | {"host": ["a"]}), "host is"),
    ("list", b"[1, 2, 3]\n", "not a JSON object"),
    ("bad-utf8", b'{"kind": "hello", "auth": "\xff\xfe"}\n', "does not decode"),
]


@pytest.mark.parametrize("payload,why", [c[1:] for c in FIRST_LINES], ids=[c[0] for c in FIRST_LINES])
def test_a_bad_first_line_is_refused_and_the_job_goes_on(payload, why):
    with Wire() as w:
        bad = socket.create_connection(("127.0.0.1", w.col.port), timeout=5)
        try:
            try:
                bad.sendall(payload)
            except (ConnectionResetError, BrokenPipeError):
                pass  # refused while it still sent (the 1 MB line)
            assert closed_by_peer(bad, HELLO_S + 5) <= HELLO_S + 5
        finally:
            bad.close()
        w.report()
        w.unmoved()
        wait_for(lambda: w.lines, timeout=5)
        assert len(w.lines) == 1 and w.lines[0].startswith("appliance launch: metrics: refused 127.0.0.1: "), w.lines
        assert why in w.lines[0], w.lines
        assert w.col.rejected == 1


def test_p02_a_half_hello_then_close_is_refused():
    with Wire() as w:
        s = socket.create_connection(("127.0.0.1", w.col.port), timeout=5)
        s.sendall(HALF_HELLO)
        s.close()
        wait_for(lambda: w.col.rejected == 1, timeout=5)
        w.report()
        w.unmoved()
        assert w.lines == ["appliance launch: metrics: refused 127.0.0.1: closed before its hello"]


LATER_LINES = [
    ("garbage", b"not json\n"),
    ("nested", nested(30000, b"[", b"]")),
    ("ops-list", line(sample(0, 2000.0, 50) | {"ops": [1, 2]})),
    ("huge-total", line(sample(0, 2000.0, 50) | {"total_steps": 1e400})),
]


@pytest.mark.parametrize("payload", [c[1] for c in LATER_LINES], ids=[c[0] for c in LATER_LINES])
def test_a_bad_later_line_costs_its_connection_only(payload):
    """An authenticated connection (rank 1) that later sends a line that does not decode is refused
    (or the line is counted and dropped when it decodes to wrong types); rank 0 goes on."""
    with Wire() as w:
        r1 = send(w.col.port, hello(1, size=2))
        wait_for(lambda: 1 in w.state.ranks, timeout=5)
        r1.sendall(payload)
        w.report()
        w.state.snapshot()
        assert w.col._thread.is_alive()
        assert w.state.ranks[0].samples[-1].step == w.step
        if payload.startswith(b"{"):  # decodes: counted as a bad message or taken with its bad fields ignored
            assert all(s.step != 50 or s.total_steps is None for s in w.state.ranks[1].samples)
        else:
            closed_by_peer(r1, 5)
            assert w.col.rejected == 1 and "rank" not in w.lines[0]
        r1.close()


def test_p18_a_stream_without_newline_is_cut_early():
    with Wire() as w:
        s = socket.create_connection(("127.0.0.1", w.col.port), timeout=5)
        sent, chunk = 0, b"y" * 65536
        try:
            while sent < (100 << 20):  # up to 100 MB, as the probe sent
                s.sendall(chunk)
                sent += len(chunk)
        except (ConnectionResetError, BrokenPipeError, socket.timeout):
            pass
        s.close()
        assert sent < (8 << 20), sent  # cut after its first 64 KiB (plus what the socket buffers held)
        w.report()
        w.unmoved()


def test_p19_idle_sockets_are_closed_by_the_hello_bound():
    with Wire() as w:
        socks = [socket.create_connection(("127.0.0.1", w.col.port), timeout=5) for _ in range(300)]
        try:
            t0 = time.monotonic()
            wait_for(lambda: w.col.rejected == 300, timeout=HELLO_S + 10)
            assert time.monotonic() - t0 <= HELLO_S + 10
            assert len(w.col._conns) == 1                      # rank 0 only
        finally:
            for s in socks:
                s.close()
        w.report()
        w.unmoved()
        # rate-limited: 3 lines for the address in the interval, then the count of what was left out
        assert len(w.lines) == 3, w.lines


def test_p20_trickling_connections_are_closed_by_the_hello_bound():
    """A byte every 0.3 s keeps a connection busy but never says hello: closed at the bound."""
    with Wire() as w:
        socks = [socket.create_connection(("127.0.0.1", w.col.port), timeout=5) for _ in range(100)]
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < HELLO_S + 3:
                for s in socks:
                    try:
                        s.send(b"{")
                    except OSError:
                        pass
                time.sleep(0.3)
            assert w.col.rejected == 100
        finally:
            for s in socks:
                s.close()
        w.report()
        w.unmoved()


def test_more_waiting_connections_than_the_cap_drop_the_oldest():
    with Wire(hello_s=60) as w:
        w.col.max_pending = 20
        socks = [socket.create_connection(("127.0.0.1", w.col.port), timeout=5) for _ in range(50)]
        try:
            wait_for(lambda: w.col.rejected == 30, timeout=10)
            closed_by_peer(socks[0], 5)                      # the oldest went
            assert len(w.col._pending) == 20
        finally:
            for s in socks:
                s.close()
        w.report()
        w.unmoved()


# -- p22: the launcher's fds used up ----------------------------------------------------------------------
CHILD = r"""
import json, os, resource, sys, time
from appliance.launcher.observe.collector import Collector
from appliance.launcher.observe.record import RecordWriter
from appliance.launcher.observe.state import JobState
secret, job_dir = sys.argv[1], sys.argv[2]
lines = []
state = JobState("j1", 1)
with Collector(state, secret, host="127.0.0.1", say=lines.append) as col, \
        RecordWriter(job_dir, "j1", 1, every_s=0, warn=lines.append, tensorboard=False) as rec:
    print(col.port, flush=True)
    hog = []
    end = time.monotonic() + 60
    while time.monotonic() < end and not os.path.exists(os.path.join(job_dir, "stop")):
        if os.path.exists(os.path.join(job_dir, "exhaust")) and not hog:
            try:
                while True:
                    hog.append(open("/dev/null"))
            except OSError:
                pass
            print("exhausted", len(hog), flush=True)
        if os.path.exists(os.path.join(job_dir, "free")) and hog:
            for f in hog:
                f.close()
            hog = []
            print("freed", flush=True)
        rec.tick(state.snapshot(), force=True)
        time.sleep(0.2)
print(json.dumps({"lines": lines, "accept_errors": col.accept_errors,
                  "steps": [s.step for s in state.ranks[0].samples] if 0 in state.ranks else []}), flush=True)
"""


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_p22_fds_used_up_cost_a_tick_and_accepts_back_off(tmp_path):
    """The launcher's fds all taken: connections wait (accepts back off instead of spinning a
    core), live.json misses its writes, and once fds are free again the record goes on and a rank
    that connects is taken."""
    job_dir = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, SECRET, job_dir], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        port = int(child.stdout.readline())
        wait_for(lambda: os.path.exists(os.path.join(job_dir, LIVE)), timeout=10)
        open(os.path.join(job_dir, "exhaust"), "w").close()
        assert child.stdout.readline().startswith("exhausted")
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        before, t0 = cpu_s(child.pid), time.monotonic()
        time.sleep(3)
        spent = cpu_s(child.pid) - before
        print(f"\nfds used up: the collector's process used {spent:.2f} s of CPU in {time.monotonic() - t0:.1f} s")
        assert spent < 1.0, spent      # a spin takes a whole core
        stale = os.stat(os.path.join(job_dir, LIVE)).st_mtime
        open(os.path.join(job_dir, "free"), "w").close()
        assert child.stdout.readline().startswith("freed")
        for s in socks:
            s.close()
        rank = send(port, hello(0, size=1), sample(0, 1000.0, 7))
        wait_for(lambda: os.stat(os.path.join(job_dir, LIVE)).st_mtime > stale + 0.1, timeout=10)
        wait_for(lambda: json.load(open(os.path.join(job_dir, LIVE)))["step"] == 7, timeout=10)
        rank.close()
        open(os.path.join(job_dir, "stop"), "w").close()
        out, _ = child.communicate(timeout=20)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["accept_errors"] >= 1 and result["steps"] == [7]
        said = "\n".join(result["lines"])
        assert "cannot accept a connection: Too many open files" in said
        assert "misses a write" in said and "is written again" in said
        assert "Traceback" not in said
    finally:
        if child.poll() is None:
            os.killpg(child.pid, 9)
            child.wait(10)


def test_a_failed_record_write_costs_one_tick(tmp_path):
    """live.json cannot be written for a tick (a directory stands in its place): one warning; the
    next tick writes it again and the record keeps every row."""
    said: list[str] = []
    state = JobState("j1", 1)
    state.message(hello(0, size=1))
    state.message(sample(0, 1000.0, 1))
    with RecordWriter(str(tmp_path), "j1", 1, every_s=0, warn=said.append, tensorboard=False) as rec:
        os.mkdir(tmp_path / LIVE)
        os.mkdir(tmp_path / LIVE / "x")  # not even replaceable by rename
        rec.tick(state.snapshot(), force=True)
        assert len(said) == 1 and "misses a write" in said[0]
        os.rmdir(tmp_path / LIVE / "x")
        os.rmdir(tmp_path / LIVE)
        state.message(sample(0, 1001.0, 2))
        rec.tick(state.snapshot(), force=True)
        assert json.load(open(tmp_path / LIVE))["step"] == 2
        assert said[1].endswith("is written again")
    rows = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [(r["step"], r["job_step"]) for r in rows if r["kind"] == "rank"] == [(1, 1), (2, 2)]


# -- the Prometheus endpoint -----------------------------------------------------------------------------
class Endpoint:
    def __init__(self, request_s: float = 10.0):
        self.lines: list[str] = []
        self.state = JobState("j1", 1)
        self.state.message(hello(0, size=1))
        self.state.message(sample(0, 1000.0, 711))
        self.ep = PrometheusEndpoint(0, self.state.snapshot, addr="127.0.0.1", say=self.lines.append,
                                     request_s=request_s)

    def __enter__(self) -> "Endpoint":
        self.ep.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.ep.__exit__()

    def get(self, path: str = "/metrics", method: str = "GET", headers: dict | None = None, timeout=5):
        req = urllib.request.Request(f"http://127.0.0.1:{self.ep.port}{path}", method=method,
                                     headers=headers or {}, data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def raw(self, data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", self.ep.port), timeout=5) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out


def job_step(body: bytes) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == "appliance_job_step":
                return s.value
    raise AssertionError("no appliance_job_step")


@pytest.mark.parametrize("case", ["p08", "p09", "p10", "p23", "p24"])
def test_odd_requests_get_an_http_answer(case):
    with Endpoint() as e:
        if case == "p08":
            status, _, body = e.get("/nope")
            assert status == 200 and job_step(body) == 711  # prometheus_client serves every path
        elif case == "p09":
            assert e.get(method="POST")[0] == 405
        elif case == "p10":
            assert b"400 - Bad request" in e.raw(b"BREW /metrics HTCPCP/1.0\r\n\r\n")
        elif case == "p23":
            assert e.raw(b"GET /" + b"a" * 100_000 + b" HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 414")
        else:
            status, headers, body = e.get(headers={"Accept-Encoding": "gzip"})
            assert status == 200 and headers.get("Content-Encoding") == "gzip" and job_step(gzip.decompress(body)) == 711
        assert e.get()[0] == 200 and e.lines == []


def test_p16_fifty_parallel_scrapes_all_answered():
    with Endpoint() as e:
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(e.get()[0])) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == [200] * 50


def test_p21_slow_clients_are_cut_and_capped_while_scrapes_go_on():
    """Connections that trickle their request line: at most the cap are held (the oldest cut to
    make room), each for at most the deadline, and a scrape meanwhile is answered at once."""
    with Endpoint(request_s=2.0) as e:
        server = e.ep._server
        server.max_connections = 20
        threads_before = threading.active_count()
        socks = [socket.create_connection(("127.0.0.1", e.ep.port), timeout=5) for _ in range(60)]
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:  # a byte of a request line every 0.5 s, for twice the deadline
                for s in socks:
                    try:
                        s.send(b"G")
                    except OSError:
                        pass
                assert threading.active_count() <= threads_before + 20 + 2
                t1 = time.monotonic()
                assert e.get(timeout=5)[0] == 200 and time.monotonic() - t1 < 2.0
                time.sleep(0.5)
            for s in socks:
                closed_by_peer(s, 3)
        finally:
            for s in socks:
                s.close()
        assert server.cut >= 60
        assert e.lines and all(line.startswith("appliance launch: --metrics-port: ") for line in e.lines)
        assert len(e.lines) <= 3 + 1, e.lines  # rate-limited per address


def test_a_scrape_that_fails_is_a_500_and_one_line():
    """A snapshot that raises (as opening a file does with no fd left): 500, one line, no traceback."""
    def broken():
        raise OSError(24, "Too many open files")

    lines: list[str] = []
    with PrometheusEndpoint(0, broken, addr="127.0.0.1", say=lines.append) as ep:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{ep.port}/metrics", timeout=5)
        assert err.value.code == 500
    assert lines == ["appliance launch: --metrics-port: a scrape failed: OSError: [Errno 24] Too many open files"]


# -- p29-p31: the flag and the variable ------------------------------------------------------------------
def launch_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", "launch", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_p29_p30_p31_a_bad_metrics_port_is_one_line():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = launch_cli("-np", "1", "-H", "localhost:1", "--metrics-port", str(busy), "--", "true")
    assert r.returncode != 0 and f"--metrics-port {busy}: cannot listen there" in r.stderr, r.stderr
    r = launch_cli("-np", "1", "-H", "localhost:1", "--metrics-port", "99999", "--", "true")
    assert r.returncode != 0 and "--metrics-port 99999: expected a TCP port" in r.stderr, r.stderr
    r = launch_cli("-np", "1", "-H", "localhost:1", "--", "true", env={"APPLIANCE_METRICS_PORT": "abc"})
    assert r.returncode != 0 and "APPLIANCE_METRICS_PORT='abc'" in r.stderr, r.stderr
    for r_ in (r,):
        assert "Traceback" not in r_.stderr
