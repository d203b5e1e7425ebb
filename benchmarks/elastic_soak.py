"""Elastic fault soak: one elastic job trained for minutes while faults are injected at random.

    sudo .venv/bin/python benchmarks/elastic_soak.py --minutes 30 --json benchmarks/results/elastic_soak.json
    sudo .venv/bin/python benchmarks/elastic_soak.py --minutes 1.5 --each-kind-once --settle 0.5 1   # the CI form

Hosts: this machine plus three simulated hosts (tests/fixtures/netns.py: network namespaces on a
bridge, real sshd, keys from `appliance keys`), one slot each. The job is `python -m appliance
launch -np 3 --min-np 2 --max-np 4 --host-discovery-script S --blacklist-cooldown-range 1 4` of
tests/ranks/elastic_soak.py (PyTorch, `hvd.elastic.run`, `TorchState`, a commit every COMMIT
steps, every step logged with a digest of its state); S prints the file this script rewrites.
It starts with localhost and two hosts listed; the third is the "new host".

Faults, from ``--seed``: kinds come in shuffled cycles (every kind once per cycle, when it can
apply), one fault at a time, each after the job is back at the size of the listed hosts and has
trained there for a random 1-3 s (``--settle LO HI``: LO-HI s):
- kill: a random rank's process SIGKILLed;
- stop: a random remote host's ranks SIGSTOPped for the heartbeat timeout + 1.5 s, then SIGCONT;
- cut: a random remote host's switch port down for the heartbeat timeout + 1.5 s, then up;
- remove: a listed remote host taken out of the discovery output (added back by a later ``add``);
- add: an unlisted host (the new one, or one removed before) put into the discovery output.
Recovery of a fault: from its injection to the first step of a round formed after it (the
survivors' next step at the new size). A fault not recovered within the heartbeat timeout + 60 s
is recorded as such; if the job has ended, a new one is started while time is left.

Checks, from the ranks' logs: every round starts from a committed state (its digest equals the
digest logged at that commit, or the initial one); no committed step is lost (a round starts at
no earlier step than the last commit of any worker that lives on into it); every rank of a round
logs the same digest at each step; the final model equals a one-process replay of the sizes its
committed steps ran at. Resources at the end against the start, taken with the same hosts listed
and the job at full size: processes (the launcher's descendants and everything in the hosts'
namespaces but sshd), the launcher's fds and threads and RSS (RSS may grow 10 %: allocator
slack), segments in /dev/shm; after the job: no worker, no process in a namespace, no segment left.
Prints markdown tables, writes every number with ``--json``; exits 1 when a check failed (a fault
not recovered, a committed step lost, a leak), 0 otherwise; the long form's targets (>= 50 faults,
p95 recovery <= 3 s, a silent host's <= heartbeat + 3 s) are reported as met or missed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fixtures import RANKS, netns  # noqa: E402
from fixtures.elastic import alive  # noqa: E402
from elastic_soak_checks import RES_KEYS, Logs, check_job, pct, verdicts  # noqa: E402

RANK = RANKS / "elastic_soak.py"
KINDS = ("kill", "stop", "cut", "remove", "add")
SILENT = ("stop", "cut")  # found by the heartbeat
MIN_NP, MAX_NP, START_NP = 2, 4, 3
STEP_S, COMMIT = 0.05, 4


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def shm_segments() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("appliance."))


class Soak:
    """One soak: its jobs (one at a time), the discovery listing, the faults and the samples. A
    context manager: on exit every process it started is killed, a stopped one continued and a cut
    port brought up, whatever happened."""

    def __init__(self, args, cluster, home: Path, shared: Path, out: Path):
        self.args, self.cluster, self.home, self.shared, self.base_out = args, cluster, home, shared, out
        self.rng = random.Random(args.seed)
        self.remote = {h.address: h for h in cluster.hosts}
        self.by_name = {h.hostname: h for h in cluster.hosts}
        self.initial = ["localhost"] + [h.address for h in cluster.hosts[:2]]
        self.listed = list(self.initial)
        self.faults: list[dict] = []
        self.jobs: list[dict] = []
        self.proc: subprocess.Popen | None = None
        self.stopped: list[int] = []
        self.cut_ports: set[str] = set()
        self.queue: list[str] = []
        self.resources: dict = {}
        self.last_fault_at = 0.0
        self.shm_before = shm_segments()

    # -- the job ---------------------------------------------------------------------------------
    def write_hosts(self) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text("".join(f"{h}:1\n" for h in self.listed))
        os.replace(tmp, self.hosts_file)

    def start_job(self) -> None:
        self.out = self.base_out / f"job{len(self.jobs)}"
        self.out.mkdir()
        self.hosts_file = self.out / "hosts"
        self.listed = list(self.initial)
        self.write_hosts()
        script = self.out / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        script.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "APPLIANCE_"))}
        env.update(HOME=str(self.home), APPLIANCE_SHARED=str(self.shared), PYTHONPATH=str(ROOT),
                   APPLIANCE_HEARTBEAT_TIMEOUT=str(self.args.heartbeat), APPLIANCE_DISCOVERY_INTERVAL="1",
                   APPLIANCE_STOP_GRACE="1", APPLIANCE_FAILURE_GRACE="1")
        cmd = [sys.executable, "-m", "appliance", "launch", "-np", str(START_NP), "--min-np", str(MIN_NP),
               "--max-np", str(MAX_NP), "--host-discovery-script", str(script), "--elastic-timeout", "60",
               "--blacklist-cooldown-range", "1", "4", "-p", str(netns.PORT), "--",
               sys.executable, str(RANK), str(self.out), str(STEP_S), str(COMMIT)]
        self.launcher_log = open(self.out / "launcher.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(self.out), stdin=subprocess.DEVNULL,
                                     stdout=self.launcher_log, stderr=subprocess.STDOUT, start_new_session=True)
        self.logs = Logs(self.out)
        self.jobs.append({"dir": str(self.out), "started": time.time(), "ended": None, "exit": None})

    def job_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launcher_tail(self, n: int = 6) -> list[str]:
        try:
            return (self.out / "launcher.log").read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []

    def end_job(self, limit: float = 90.0) -> None:
        """Stop it cleanly (every worker after the same step), or kill it after ``limit``."""
        job = self.jobs[-1]
        if self.job_alive():
            (self.out / "stop").write_text(str(self.logs.max_step() + 10))
            try:
                self.proc.wait(limit)
            except subprocess.TimeoutExpired:
                job["note"] = f"the launcher did not end within {limit} s of the stop; killed"
        self.kill_all()
        job.update(ended=time.time(), exit=self.proc.returncode)

    def kill_all(self) -> None:
        for pid in self.stopped:
            self._signal(pid, signal.SIGCONT)
        self.stopped.clear()
        for port in list(self.cut_ports):
            self.link(port, "up")
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        if self.proc is not None:
            for e in Logs(self.out).of("born"):
                if self.is_worker(e["pid"]):
                    self._signal(e["pid"], signal.SIGKILL)
            self.launcher_log.close()

    def is_worker(self, pid: int) -> bool:
        """Whether ``pid`` is still one of this soak's workers (not a later process given its pid)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return str(self.base_out).encode() in f.read() and alive(pid)
        except OSError:
            return False

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def link(self, port: str, state: str) -> None:
        netns.sh("ip", "-n", self.cluster.switch, "link", "set", port, state, check=False)
        (self.cut_ports.add if state == "down" else self.cut_ports.discard)(port)

    # -- state of the job ------------------------------------------------------------------------
    def size_now(self) -> int:
        m = self.logs.members(self.logs.round_now())
        return next(iter(m.values()))["size"] if m else 0

    def steady(self, settle: float, limit: float) -> bool:
        """Wait until the job runs at the listed hosts' size and its round has stepped for ``settle`` s."""
        end = time.monotonic() + limit
        while time.monotonic() < end and self.job_alive():
            rnd = self.logs.round_now()
            steps = [e["t"] for e in self.logs.steps_in.get(rnd, [])]
            if self.size_now() == min(len(self.listed), MAX_NP) and steps and max(steps) - min(steps) >= settle:
                return True
            time.sleep(0.1)
        return False

    def wait_recovered(self, fault: dict, limit: float) -> None:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            self.logs.poll()
            later = [e for r, es in self.logs.steps_in.items() if r > fault["round_before"] for e in es
                     if e["t"] > fault["t0"]]
            if later:
                first = min(later, key=lambda e: e["t"])
                fault.update(recovered=True, recovery_s=round(first["t"] - fault["t0"], 3),
                             size_after=first["size"], round_after=first["round"])
                return
            if not self.job_alive():
                break
            time.sleep(0.05)
        fault.update(recovered=False, job_alive=self.job_alive(), launcher_tail=self.launcher_tail())

    def workers_on(self, rnd: int, host: str) -> list[dict]:
        """Members of round ``rnd`` on ``host`` (an address, or localhost), with their pids."""
        born, out = self.logs.born(), []
        for w in self.logs.members(rnd):
            b = born.get(w)
            if b is None:
                continue
            h = self.by_name.get(b["host"])
            if (h.address if h else "localhost") == host and alive(b["pid"]):
                out.append(b)
        return out

    # -- faults ----------------------------------------------------------------------------------
    def next_kind(self) -> str | None:
        size, rnd = self.size_now(), self.logs.round_now()
        in_job = [a for a in self.listed if a != "localhost" and self.workers_on(rnd, a)]
        ok = {"kill": size > MIN_NP, "stop": size > MIN_NP and bool(in_job), "cut": size > MIN_NP and bool(in_job),
              "remove": size > MIN_NP and len(self.listed) > MIN_NP,
              "add": any(a not in self.listed for a in self.remote)}
        if not self.queue:
            self.queue = list(KINDS)
            self.rng.shuffle(self.queue)
        for kind in self.queue:
            if ok[kind]:
                self.queue.remove(kind)
                return kind
        return next((k for k in KINDS if ok[k]), None)

    def each_kind_injected(self) -> bool:
        return {f["kind"] for f in self.faults} >= set(KINDS)

    def inject(self, kind: str) -> dict:
        rnd = self.logs.round_now()
        fault = {"kind": kind, "round_before": rnd, "size_before": self.size_now(), "job": len(self.jobs) - 1}
        hold = self.args.heartbeat + 1.5
        if kind == "kill":
            victim = self.rng.choice(sorted(self.logs.members(rnd)))
            b = self.logs.born()[victim]
            h = self.by_name.get(b["host"])
            fault.update(worker=victim, host=h.address if h else "localhost", t0=time.time())
            self._signal(b["pid"], signal.SIGKILL)
        elif kind in SILENT:
            host = self.rng.choice(sorted(a for a in self.listed if a != "localhost" and self.workers_on(rnd, a)))
            fault["host"] = host
            if kind == "stop":
                pids = [b["pid"] for b in self.workers_on(rnd, host)]
                fault["t0"] = time.time()
                for pid in pids:
                    self._signal(pid, signal.SIGSTOP)
                self.stopped.extend(pids)
            else:
                port = f"sw{self.remote[host].index}"
                fault["t0"] = time.time()
                self.link(port, "down")
            end = time.monotonic() + hold
            while time.monotonic() < end:
                self.logs.poll()
                time.sleep(0.05)
            if kind == "stop":
                for pid in self.stopped:
                    self._signal(pid, signal.SIGCONT)
                self.stopped.clear()
            else:
                self.link(port, "up")
            fault["held_s"] = round(hold, 2)
        elif kind == "remove":
            host = self.rng.choice([a for a in self.listed if a != "localhost"])
            self.listed.remove(host)
            fault.update(host=host, t0=time.time())
            self.write_hosts()
        else:
            host = self.rng.choice(sorted(a for a in self.remote if a not in self.listed))
            fault.update(host=host, first_time=not any(f.get("host") == host for f in self.faults), t0=time.time())
            self.listed.append(host)
            self.write_hosts()
        self.wait_recovered(fault, self.args.heartbeat + 60)
        if kind == "add" and fault.get("recovered"):
            own = [b["own_start"] for b in self.logs.born().values()
                   if b["t"] > fault["t0"] and self.by_name.get(b["host"]) is self.remote[fault["host"]]]
            fault["new_worker_own_start_s"] = round(min(own), 3) if own else None
        return fault

    # -- resources -------------------------------------------------------------------------------
    def sample(self) -> dict:
        pid = self.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        field = {k: (v.split() or [""])[0] for k, v in (line.split(":", 1) for line in status.splitlines() if ":" in line)}
        return {"processes": len(descendants(pid)) + sum(len(h.pids()) for h in self.cluster.hosts),
                "launcher_fds": len(os.listdir(f"/proc/{pid}/fd")), "launcher_threads": int(field["Threads"]),
                "launcher_rss_mib": round(int(field["VmRSS"]) / 1024, 1), "shm_segments": len(shm_segments())}

    def snapshot(self, n: int = 8) -> dict:
        """The least of ``n`` samples over ~2 s: a discovery run (its process, pipes, thread) comes
        and goes every second; what leaks stays in every sample."""
        samples = []
        for _ in range(n):
            samples.append(self.sample())
            time.sleep(0.25)
        snap = {k: min(x[k] for x in samples) for k in samples[0]}
        return {**snap, "size": self.size_now(), "t": time.time(), "process_list": self.process_list()}

    def process_list(self) -> list[str]:
        """Who the processes are (where, and the first words of the command line), to name a leak."""
        def cmd(pid: int) -> str:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
            except OSError:
                return "?"
            return " ".join(os.path.basename(w.decode(errors="replace")) if i == 0 else w.decode(errors="replace")
                            for i, w in enumerate(words[:4]) if w)[:100]
        out = [f"launcher: {cmd(p)}" for p in descendants(self.proc.pid)]
        for h in self.cluster.hosts:
            out += [f"{h.address}: {cmd(p)}" for p in h.pids()]
        return sorted(out)

    # -- the run ---------------------------------------------------------------------------------
    def __enter__(self) -> "Soak":
        return self

    def __exit__(self, *exc) -> None:
        self.kill_all()

    def run(self) -> None:
        deadline = time.monotonic() + self.args.minutes * 60
        self.start_job()
        if not self.steady(2.0, 120):
            raise SystemExit(f"the job did not reach {START_NP} ranks within 120 s: {self.launcher_tail(20)}")
        # The launcher makes its record's TensorBoard writer (a file and a thread, for the job's
        # life) as the job starts, off the ranks' path: the start is taken once it exists.
        until = time.monotonic() + 30
        while time.monotonic() < until and not list(Path(self.shared).glob("jobs/*/events.out.tfevents*")):
            time.sleep(0.2)
        self.resources["start"] = self.snapshot()
        while time.monotonic() < deadline and not (self.args.each_kind_once and self.each_kind_injected()):
            if not self.job_alive():
                self.end_job()
                if deadline - time.monotonic() < 30:
                    break
                self.start_job()
                if not self.steady(2.0, 120):
                    break
                continue
            settled = self.steady(self.rng.uniform(*self.args.settle), 45)
            kind = self.next_kind()
            if kind is None:
                time.sleep(0.5)
                continue
            fault = self.inject(kind)
            self.last_fault_at = time.monotonic()
            fault["settled_before"] = settled
            self.faults.append(fault)
            f = fault
            print(f"[soak] {len(self.faults):3d} {kind:<6} {f.get('host', ''):<12} size {f['size_before']}"
                  f" -> {f.get('size_after', '-')}: " + (f"{f['recovery_s']:.2f} s" if f.get("recovered")
                                                         else "NOT RECOVERED " + " | ".join(f["launcher_tail"][-2:])),
                  flush=True)
        if self.job_alive():
            self.listed = list(self.initial)
            self.write_hosts()
            end_ok = self.steady(3.0, 60)
            # The launcher holds a cut rank's metrics connection until it has been silent for the
            # collector's bound (then closes it, and its thread ends): not a leak, so the end is
            # taken after that bound has passed since the last fault.
            from appliance.launcher.observe.session import silent_bound_s

            time.sleep(max(0.0, silent_bound_s() + 2.0 - (time.monotonic() - self.last_fault_at)))
            self.resources["end"] = self.snapshot() if self.job_alive() else None
            if self.resources["end"] is not None:
                self.resources["end"]["at_full_size"] = end_ok
        self.end_job()
        time.sleep(1.0)
        self.resources["after"] = {
            "workers_alive": [b["pid"] for j in self.jobs for b in Logs(Path(j["dir"])).born().values()
                              if self.is_worker(b["pid"])],
            "namespace_processes": {h.ns: h.pids() for h in self.cluster.hosts if h.pids()},
            "shm_new": sorted(set(shm_segments()) - set(self.shm_before))}


def report(soak: Soak, checks: list[dict], elapsed: float) -> dict:
    hb = soak.args.heartbeat
    kinds = {}
    for kind in KINDS:
        fs = [f for f in soak.faults if f["kind"] == kind]
        rec = [f["recovery_s"] for f in fs if f.get("recovered")]
        target = hb + 3.0 if kind in SILENT else 3.0
        p95 = pct(rec, 0.95)
        kinds[kind] = {"injected": len(fs), "recovered": len(rec), "p50_s": pct(rec, 0.5), "p95_s": p95,
                       "max_s": max(rec) if rec else None, "target_p95_s": target,
                       "met": bool(rec) and len(rec) == len(fs) and p95 <= target}
    lost = sum(c["committed_steps_lost"] for c in checks)
    res_ok = verdicts(soak.resources)
    unrecovered = [f for f in soak.faults if not f.get("recovered")]
    final_ok = all(c["final"] and c["final"]["equals_replay"] for c in checks)
    passed = (not unrecovered and lost == 0 and all(res_ok.values()) and final_ok
              and not any(c["not_from_a_commit"] or c["digest_disagree"] or c["start_disagree"] for c in checks))
    targets = {">= 50 faults": len(soak.faults) >= 50, "0 committed steps lost": lost == 0,
               "p95 recovery <= 3 s (silent host: <= heartbeat + 3 s)": all(k["met"] for k in kinds.values()),
               "nothing leaked": all(res_ok.values())}
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print(f"\n### Elastic soak: {len(soak.faults)} faults in {elapsed / 60:.1f} min, seed {soak.args.seed}, "
          f"heartbeat {hb:g} s, {len(soak.jobs)} job(s)\n")
    print("| fault | injected | recovered | p50 s | p95 s | max s | target p95 | met |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for kind, k in kinds.items():
        print(f"| {kind} | {k['injected']} | {k['recovered']} | {fmt(k['p50_s'])} | {fmt(k['p95_s'])} | "
              f"{fmt(k['max_s'])} | {k['target_p95_s']:g} s | {'yes' if k['met'] else 'NO'} |")
    all_rec = [f["recovery_s"] for f in soak.faults if f.get("recovered")]
    print(f"| all | {len(soak.faults)} | {len(all_rec)} | {fmt(pct(all_rec, 0.5))} | {fmt(pct(all_rec, 0.95))} | "
          f"{fmt(max(all_rec) if all_rec else None)} | | |")
    own = [(f["recovery_s"], f["new_worker_own_start_s"]) for f in soak.faults
           if f["kind"] == "add" and f.get("recovered") and f.get("new_worker_own_start_s") is not None]
    if own:
        print(f"\nadd: the new worker's own start (process start to imports done) p50 {fmt(pct([o for _, o in own], 0.5))}"
              f" s; the recovery less it p50 {fmt(pct([r - o for r, o in own], 0.5))} s, "
              f"p95 {fmt(pct([r - o for r, o in own], 0.95))} s")
    rounds = sum(c["rounds"] for c in checks)
    print("\n| check | result |\n|---|---|")
    print(f"| committed steps lost | {lost} |")
    print(f"| rounds that started from a committed state | {sum(c['rounds_from_a_commit'] for c in checks)} of {rounds} |")
    print(f"| steps whose ranks logged different states | {sum(c['digest_disagree'] for c in checks)} of "
          f"{sum(c['steps'] for c in checks)} step lines |")
    print(f"| uncommitted steps trained again after a fault | {sum(c['uncommitted_steps_redone'] for c in checks)} |")
    for c in checks:
        f = c["final"]
        print(f"| final model = one-process replay of its committed sizes ({Path(c['dir']).name}) | " +
              (f"{'yes' if f['equals_replay'] else 'NO'} ({f['step']} steps, max diff {f['max_abs_diff']:.1e})"
               if f else "NO (no result: the job did not finish)") + " |")
    start, end, after = soak.resources.get("start") or {}, soak.resources.get("end") or {}, soak.resources.get("after", {})
    print("\n| resource (job at full size) | start | end | grew? |\n|---|---:|---:|---|")
    for k in RES_KEYS:
        print(f"| {k} | {start.get(k, '-')} | {end.get(k, '-')} | {'no' if res_ok[k] else 'YES'} |")
    print(f"| after the job: workers alive, namespace processes, new /dev/shm segments | "
          f"{len(after.get('workers_alive', []))}, {sum(map(len, after.get('namespace_processes', {}).values()))}, "
          f"{len(after.get('shm_new', []))} | | {'no' if res_ok['nothing left after the job'] else 'YES'} |")
    if start and end:
        for k in ("process_list",):
            before, now = list(start.get(k, [])), list(end.get(k, []))
            for p in before:
                if p in now:
                    now.remove(p)
            for p in now:
                print(f"\nat the end, not at the start: {p}")
    print("\n| target (long form) | met |\n|---|---|")
    for name, ok in targets.items():
        print(f"| {name} | {'yes' if ok else 'NO'} |")
    for f in unrecovered:
        print(f"not recovered: {f['kind']} {f.get('host', '')} (job alive: {f.get('job_alive')}): "
              + " | ".join(f.get("launcher_tail", [])[-3:]))
    return {"seed": soak.args.seed, "minutes": soak.args.minutes, "heartbeat_s": hb, "elapsed_s": round(elapsed, 1),
            "step_s": STEP_S, "commit_every": COMMIT, "min_np": MIN_NP, "max_np": MAX_NP, "kinds": kinds,
            "faults": soak.faults, "jobs": soak.jobs, "checks": checks, "resources": soak.resources,
            "resource_ok": res_ok, "targets": targets, "passed": passed, "load_avg": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long faults are injected (default 10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--heartbeat", type=float, default=2.0,
                    help="APPLIANCE_HEARTBEAT_TIMEOUT of the job, seconds (default 2)")
    ap.add_argument("--each-kind-once", action="store_true",
                    help="stop injecting once every kind has been injected (within --minutes): the CI smoke")
    ap.add_argument("--settle", type=float, nargs=2, default=(1.0, 3.0), metavar=("LO", "HI"),
                    help="before each fault the job trains at full size for a random LO-HI s (default 1 3)")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args()
    why = netns.available()
    if why:
        print(f"elastic_soak: the simulated hosts need {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    with netns.keyed_cluster(3, "appliance-elastic-soak-") as (cluster, base, shared, out):
        print(f"[soak] work directory: {base}", flush=True)
        with Soak(args, cluster, base, shared, out) as soak:
            soak.run()
        checks = [check_job(Path(j["dir"])) for j in soak.jobs]
        result = report(soak, checks, time.monotonic() - t0)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
