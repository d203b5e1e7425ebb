"""Multi-host launch over real OpenSSH: hosts are network namespaces with their own sshd (port 12345),
hostname and NIC names (see ``tests/fixtures/netns.py``); the primary is this machine.

Asserts effects: the environment and hostname each rank saw, files, exit codes, which processes exist
on which host (by network namespace), time bounds. Everything started is killed by the fixtures.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from appliance.launcher.binding import rank_cpus
from fixtures import RANKS
from fixtures.netns import PORT

pytestmark = [pytest.mark.ssh]

DUMP = '''
import socket
mark("env", json.dumps(dict(os.environ)))
mark("where", json.dumps({"host": socket.gethostname(), "cwd": os.getcwd(), "cpus": sorted(os.sched_getaffinity(0))}))
'''


def appliance(*args: str, env: dict, timeout: float = 60) -> tuple[int, str, str, float]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "appliance", *args], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=timeout)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - start


def finish(p, limit=20):
    out, err = p.communicate(timeout=limit)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def all_cmdlines() -> dict[int, str]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return found


@pytest.mark.timeout(60)
def test_check_reports_every_host_ready(ssh_cluster):
    h1, h2 = ssh_cluster.hosts
    rc, out, err, elapsed = appliance("check", "-H", f"localhost:1,{h1.address}:2,{h2.address}:1", "-p", str(PORT),
                                      "--shared", ssh_cluster.shared, env=ssh_cluster.env())
    assert rc == 0, out + err
    assert "all 3 hosts ready" in err
    for h in (h1, h2):
        row = next(line for line in out.splitlines() if h.address in line)
        assert h.hostname in row and h.nic in row and "ok" in row, row
    assert socket.gethostname() in out and ssh_cluster.c.primary_nic in out
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(120)
def test_env_layout_output_and_secret_across_hosts(ssh_cluster, job, tmp_path, monkeypatch):
    h1, h2 = ssh_cluster.hosts
    c = ssh_cluster.c
    outdir = tmp_path / "logs"
    body = DUMP + '''
print("out line one", RANK)
print("out line two", RANK, flush=True)
print("err line", RANK, file=sys.stderr, flush=True)
sys.stdout.write("partial last line"); sys.stdout.flush()
wait_for("go")
'''
    host_specific = {"HOSTNAME": "launcher-only-host", "DISPLAY": ":77", "SSH_AUTH_SOCK": "/launcher/agent.sock",
                     "PWD": "/launcher/pwd", "XDG_RUNTIME_DIR": "/run/user/launcher"}
    env = ssh_cluster.env(APPL_FWD="forwarded", FOO="1", HOROVOD_FUSION_THRESHOLD="12345",
                          NCCL_DEBUG="WARN", APPLIANCE_BIND="core", **host_specific)
    p = job.cli("-np", "4", "-H", f"localhost:1,{h1.address}:2,{h2.address}:1", "-p", str(PORT), "--verbose",
                "--output-filename", str(outdir), "-x", "APPL_FWD", "-x", "APPL_SET=a b=c", "--", *job.argv(body),
                env=env)
    envs = {int(r): json.loads(v) for r, v in job.wait_files("env", 4).items()}
    where = {int(r): json.loads(v) for r, v in job.wait_files("where", 4).items()}
    secret = envs[0]["APPLIANCE_JOB_SECRET"]
    # While the job runs: the secret is on no command line of any process on any "host" (one pid
    # namespace), and the remote stubs really run inside the hosts' namespaces.
    cmdlines = all_cmdlines()
    assert not [pid for pid, cmd in cmdlines.items() if secret in cmd]
    for h in (h1, h2):
        assert any("appliance.launcher.ssh.remote_stub" in cmdlines.get(pid, "") for pid in h.pids()), h.ns
    open(os.path.join(job.out, "go"), "w").close()
    rc, out, err = finish(p)
    assert rc == 0, err

    layout = {0: ("localhost", 0, 1, 0, 3), 1: (h1.address, 0, 2, 1, 3), 2: (h1.address, 1, 2, 0, 1),
              3: (h2.address, 0, 1, 2, 3)}
    machine = {0: socket.gethostname(), 1: h1.hostname, 2: h1.hostname, 3: h2.hostname}
    addr = {0: c.primary_addr, 1: h1.address, 2: h1.address, 3: h2.address}
    nic = {0: c.primary_nic, 1: h1.nic, 2: h1.nic, 3: h2.nic}
    store = envs[0]["APPLIANCE_STORE_ADDR"]
    assert store.rpartition(":")[0] == c.primary_addr  # rank 0 is local: routable, not 127.0.0.1
    for rank, e in envs.items():
        assert (e["HOROVOD_HOSTNAME"], int(e["HOROVOD_LOCAL_RANK"]), int(e["HOROVOD_LOCAL_SIZE"]),
                int(e["HOROVOD_CROSS_RANK"]), int(e["HOROVOD_CROSS_SIZE"])) == layout[rank]
        assert e["HOROVOD_RANK"] == str(rank) and e["HOROVOD_SIZE"] == "4"
        # APPLIANCE_BIND=core: the local rank and the remote stubs bind each rank to its host's share
        cpus = rank_cpus(layout[rank][1], layout[rank][2], os.sched_getaffinity(0))
        assert where[rank] == {"host": machine[rank], "cwd": os.getcwd(), "cpus": cpus}
        assert e["APPLIANCE_DATA_ADDR"] == addr[rank]
        assert e["HOROVOD_GLOO_IFACE"] == e["NCCL_SOCKET_IFNAME"] == nic[rank]
        assert e["APPLIANCE_STORE_ADDR"] == store and e["APPLIANCE_JOB_SECRET"] == secret
        assert e["MASTER_ADDR"] == c.primary_addr
        assert e["APPL_FWD"] == "forwarded" and e["APPL_SET"] == "a b=c"  # -x NAME and -x NAME=VALUE
        assert e["HOROVOD_FUSION_THRESHOLD"] == "12345" and e["NCCL_DEBUG"] == "WARN"
        assert e["PATH"] == os.environ["PATH"]
        assert e["FOO"] == "1"  # the launcher's environment reaches every rank, as with horovodrun
        for name, value in host_specific.items():  # ... but not what names the launcher's machine
            assert (e.get(name) == value) == (rank == 0), (rank, name, e.get(name))
        assert (e["HOME"] == ssh_cluster.home) == (rank == 0)  # the remote login's own HOME
    # Output: every worker line prefixed, on both streams; the launcher's own lines are its own.
    for stream, text in (("stdout", out), ("stderr", err)):
        for line in text.splitlines():
            assert re.match(rf"^\[\d\]<{stream}>:", line) or line.startswith(("appliance launch:", "  ")), line
    for rank in range(4):
        assert f"[{rank}]<stdout>:out line one {rank}" in out and f"[{rank}]<stdout>:partial last line" in out
        assert f"[{rank}]<stderr>:err line {rank}" in err
        assert (outdir / f"rank.{rank}" / "stdout").read_text() == (
            f"out line one {rank}\nout line two {rank}\npartial last line\n")
        assert (outdir / f"rank.{rank}" / "stderr").read_text() == f"err line {rank}\n"
    assert f"host {h2.address}: ssh, listen {h2.address} (interface {h2.nic})" in err
    assert f"host localhost: local, listen {c.primary_addr} (interface {c.primary_nic})" in err
    assert secret not in out + err
    for h in (h1, h2):
        with open(h.log, errors="replace") as f:
            assert secret not in f.read()
    assert ssh_cluster.wait_clean() == {}


def _stop_scenario(ssh_cluster, job, tmp_path, hosts: str, np_: int, remote_ranks: list[int]):
    """Start ranks that sleep (rank 1 ignores SIGTERM, the last rank has a grandchild); return what
    a test needs to kill and check them."""
    body = DUMP + '''
if RANK == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    mark("ignoring")
if RANK == SIZE - 1:
    grandchild()
time.sleep(60)
'''
    jobs = tmp_path / "jobs"
    p = job.cli("-np", str(np_), "-H", hosts, "-p", str(PORT), "--", *job.argv(body),
                env=ssh_cluster.env(APPLIANCE_JOB_DIR=str(jobs)))
    job.wait_files("pid", np_)
    job.wait_files("env", np_)  # written after pid: on a loaded machine it may trail the other marks
    job.wait_files("grandchild", 1)
    job.wait_files("ignoring", 1)
    job_id = json.loads(job.read("env", 0))["APPLIANCE_JOB_ID"]
    records = {}
    end = time.monotonic() + 10
    while len(records) < len(remote_ranks) and time.monotonic() < end:
        for r in remote_ranks:
            path = jobs / job_id / f"rank.{r}.json"
            if path.exists():
                records[r] = json.loads(path.read_text())
        time.sleep(0.05)
    assert sorted(records) == remote_ranks
    for r, rec in records.items():
        assert rec["pid"] == rec["pgid"] == int(job.read("pid", r))
    return p, records, jobs / job_id


def _assert_all_gone(ssh_cluster, job, records, job_dir):
    stubs = [rec["stub_pid"] for rec in records.values()]
    assert job.wait_dead(job.pids() + stubs, 3.0) == []
    assert ssh_cluster.wait_clean(3.0) == {}
    assert not job_dir.exists() or not list(job_dir.iterdir())  # records removed with their groups


@pytest.mark.timeout(60)
def test_killed_remote_rank_stops_every_host_within_seconds(ssh_cluster, job, tmp_path):
    h1, h2 = ssh_cluster.hosts
    p, records, job_dir = _stop_scenario(ssh_cluster, job, tmp_path, f"localhost:1,{h1.address}:1,{h2.address}:1",
                                         3, [1, 2])
    start = time.monotonic()
    os.kill(records[2]["pid"], signal.SIGKILL)  # from outside, on host 2
    rc, out, err = finish(p, 10)
    elapsed = time.monotonic() - start
    assert rc == 128 + signal.SIGKILL, err
    assert f"rank 2 (host {h2.address}) was killed by signal 9 (SIGKILL)" in err
    assert elapsed < 5.0, elapsed
    _assert_all_gone(ssh_cluster, job, records, job_dir)
    print(f"\nstop after a killed remote rank: {elapsed:.2f} s (rank 1 ignores SIGTERM: grace 1 s)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGKILL, None)])
def test_signal_to_launcher_stops_every_host(ssh_cluster, job, tmp_path, sig, code):
    h1, h2 = ssh_cluster.hosts
    p, records, job_dir = _stop_scenario(ssh_cluster, job, tmp_path, f"{h1.address}:2,{h2.address}:1", 3, [0, 1, 2])
    start = time.monotonic()
    os.kill(p.pid, sig)  # Ctrl-C; or the launcher dies outright and the stubs notice the closed channel
    rc, out, err = finish(p, 10)
    if code is not None:
        assert rc == code and "interrupted by SIGINT" in err, err
    assert job.wait_dead(job.pids(), 5.0) == []
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, elapsed
    _assert_all_gone(ssh_cluster, job, records, job_dir)


@pytest.mark.timeout(90)
def test_preflight_names_each_failure_within_the_start_timeout(ssh_cluster, job, tmp_path):
    h1, h2 = ssh_cluster.hosts
    other = tmp_path / "other"
    assert appliance("keys", "--shared", str(other), env=ssh_cluster.env())[0] == 0
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# cluster\n{h1.address} slots=2\n{h2.address} slots=two\n")
    argv = job.argv("print('must not run')")
    cases = [  # (args, expected exit code, words in stderr)
        (["-H", f"localhost:1,{h1.address}:1", "-p", str(PORT + 1)], 1,
         [f"{h1.address}:{PORT + 1} refused the connection", "no SSH server listens"]),
        (["-H", f"localhost:1,{h1.address}:1", "-p", str(PORT), "-i", str(other / "ssh" / "id_ed25519")], 1,
         [f"root@{h1.address}:{PORT} did not accept the key", "authorized_keys"]),
        (["-H", f"localhost:1,{ssh_cluster.c.down_addr}:1", "-p", str(PORT)], 1, [f"{ssh_cluster.c.down_addr}:{PORT}"]),
        (["--hostfile", str(hostfile), "-p", str(PORT)], 2, [f"{hostfile}:3", "slots must be a whole number"]),
        (["-H", f"localhost:1,{h1.address}:2", "-np", "5", "-p", str(PORT)], 2,
         ["-np 5 asks for more processes than there are slots: 3 slots on 2 hosts"]),
        (["-np", "1", "-H", f"{h1.address}:1", "-p", str(PORT), "--remote-python", "/nonexistent/bin/python3"], 1,
         [f"{h1.address}: Python /nonexistent/bin/python3 not found there", "--remote-python"]),
        (["-H", f"{h1.address}:1,{h2.address}:1", "-p", str(PORT), "--network-interface", h1.nic], 1,
         [f"{h2.address}: --network-interface {h1.nic}: no IPv4 address on {h1.nic} there", h2.nic]),
    ]
    timeout = 4.0
    errors = []
    for args, want_rc, words in cases:
        if "-np" not in args:
            args = ["-np", "2", *args]
        rc, out, err, elapsed = appliance("launch", "--start-timeout", str(timeout), *args, "--", *argv,
                                          env=ssh_cluster.env())
        assert rc == want_rc, (args, err)
        for w in words:
            assert w in err, (args, w, err)
        assert elapsed < timeout + 2.0, (args, elapsed)  # + interpreter start-up on a loaded machine
        assert "must not run" not in out and not job.files("pid")
        errors.append(err)
    assert "did not answer within" in errors[2] or "is unreachable" in errors[2], errors[2]
    # `appliance check`: the directory that host 2 sees as a private tmpfs is reported as not shared.
    rc, out, err, _ = appliance("check", "-H", f"{h1.address},{h2.address}", "-p", str(PORT), "-i", ssh_cluster.key,
                                "--shared", ssh_cluster.notshared, env=ssh_cluster.env())
    assert rc == 1
    assert f"{h2.address}: {ssh_cluster.notshared} there is not the primary's" in err
    assert f"{h1.address}:" not in err.replace(f"{h1.address}:{PORT}", "")  # host 1 passed
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_host_keys_trust_on_first_use_then_refuse_a_changed_key(ssh_cluster, tmp_path):
    h1, _ = ssh_cluster.hosts
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "APPLIANCE_SHARED": str(tmp_path / "no-share")}  # no cluster known_hosts
    args = ["check", "-H", h1.address, "-p", str(PORT), "-i", ssh_cluster.key]
    rc, _, err, _ = appliance(*args, env=env)
    assert rc == 0 and f"{h1.address}:{PORT} is a new host; trusted its key" in err, err
    known = (home / ".ssh" / "known_hosts").read_text()
    assert known.startswith(f"[{h1.address}]:{PORT} ssh-ed25519 ")
    rc, _, err, _ = appliance(*args, env=env)
    assert rc == 0 and "new host" not in err
    other = tmp_path / "other"
    assert appliance("keys", "--shared", str(other), env={"HOME": str(home)})[0] == 0
    wrong = (other / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    (home / ".ssh" / "known_hosts").write_text(f"[{h1.address}]:{PORT} {' '.join(wrong)}\n")
    rc, _, err, _ = appliance(*args, env=env)
    assert rc == 1 and "differs from the one in" in err and "ssh-keygen" in err, err
    # Strict mode: a cluster known_hosts whose `*` key is not the one the hosts present.
    rc, _, err, _ = appliance("check", "-H", h1.address, "-p", str(PORT), "-i", ssh_cluster.key, "--shared",
                              str(other), env={"HOME": str(tmp_path / "home2")})
    assert rc == 1 and "is not in the cluster's" in err and "ssh_host_ed25519_key" in err, err


@pytest.mark.timeout(60)
def test_slurm_allocation_gives_the_hosts(ssh_cluster, job):
    h1, h2 = ssh_cluster.hosts
    net = ssh_cluster.c.net
    p = job.cli("-np", "3", "-p", str(PORT), "--", *job.argv(DUMP), env=ssh_cluster.env(
        SLURM_JOB_NODELIST=f"{net}.[{h1.index + 1}-{h2.index + 1}]", SLURM_TASKS_PER_NODE="2,1"))
    rc, _, err = finish(p, 30)
    assert rc == 0, err
    seen = {r: (json.loads(job.read("env", r))["HOROVOD_HOSTNAME"], json.loads(job.read("where", r))["host"])
            for r in range(3)}
    assert seen == {0: (h1.address, h1.hostname), 1: (h1.address, h1.hostname), 2: (h2.address, h2.hostname)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("topology", ["primary+host", "two-hosts"])
def test_collectives_across_hosts_at_three_ranks(ssh_cluster, tmp_path, topology):
    """The collective runtime over SSH-launched ranks: every op/dtype/size against numpy, with the
    layout each rank's runtime reports (horovodrun's: hosts in order, local ranks within a host)."""
    h1, h2 = ssh_cluster.hosts
    first, second = ("localhost", h1) if topology == "primary+host" else (h1.address, h2)
    out = tmp_path / "reports"
    out.mkdir()
    worker = RANKS / "ssh_runtime.py"
    start = time.time()
    rc, stdout, err, _ = appliance("launch", "-np", "3", "-H", f"{first}:1,{second.address}:2", "-p", str(PORT),
                                   "--", sys.executable, str(worker), "ops", timeout=100,
                                   env=ssh_cluster.env(APPLIANCE_TEST_OUT=str(out), APPLIANCE_CHUNK_BYTES="4096"))
    assert rc == 0, err[-4000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(3)]
    machine = {0: socket.gethostname() if first == "localhost" else h1.hostname, 1: second.hostname, 2: second.hostname}
    layout = {0: (0, 1, 0, 2), 1: (0, 2, 1, 2), 2: (1, 2, 0, 1)}  # local_rank, local_size, cross_rank, cross_size
    for r, rep in enumerate(reports):
        assert rep["ok"] and rep["checked"] > 100 and rep["size"] == 3 and rep["rank"] == r
        assert (rep["local_rank"], rep["local_size"], rep["cross_rank"], rep["cross_size"]) == layout[r]
        assert rep["hostname"] == machine[r]
        assert rep["data_addr"] != "127.0.0.1"
    print(f"\n{topology}: launch -> all 3 ranks past init() in {max(r['init_done'] for r in reports) - start:.2f} s")
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_dropped_connection_stops_the_host_and_the_job(ssh_cluster, job, tmp_path):
    """The SSH connection to host 2 dies (its sshd session process is killed): the stubs there see
    their stdin close and stop their ranks; the launcher names the host and stops the rest."""
    h1, h2 = ssh_cluster.hosts
    p, records, job_dir = _stop_scenario(ssh_cluster, job, tmp_path, f"localhost:1,{h1.address}:1,{h2.address}:1",
                                         3, [1, 2])
    sessions = [pid for pid in h2.pids() if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sshd: ")]
    assert sessions
    start = time.monotonic()
    for pid in sessions:
        os.kill(pid, signal.SIGKILL)
    rc, out, err = finish(p, 10)
    assert rc == 255, err
    assert f"rank 2 (host {h2.address}) lost the SSH connection to {h2.address}" in err
    assert time.monotonic() - start < 5.0
    _assert_all_gone(ssh_cluster, job, records, job_dir)


@pytest.mark.timeout(90)
def test_more_ranks_on_one_host_than_sshd_sessions_per_connection(ssh_cluster, job):
    """sshd allows 10 sessions per connection (MaxSessions): 11 ranks on one host need a second one."""
    h1, _ = ssh_cluster.hosts

    def connections() -> int:
        with open(h1.log, errors="replace") as f:
            return f.read().count("Accepted publickey")

    before = connections()
    p = job.cli("-np", "11", "-H", f"{h1.address}:11", "-p", str(PORT), "--", *job.argv('print("up", RANK)'),
                env=ssh_cluster.env())
    rc, out, err = finish(p, 60)
    assert rc == 0, err
    assert sorted(int(line.split()[-1]) for line in out.splitlines()) == list(range(11))
    assert connections() - before == 2  # the preflight's connection carries 8 ranks, a second one the rest
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_own_hostname_resolving_to_loopback_still_gets_the_routable_address(ssh_cluster, job):
    """Debian maps the hostname to 127.0.x.1; rank 0 on it must still listen where host 1 can reach it."""
    h1, _ = ssh_cluster.hosts
    me = socket.gethostname()
    p = job.cli("-np", "2", "-H", f"{me}:1,{h1.address}:1", "-p", str(PORT), "--", *job.argv(DUMP),
                env=ssh_cluster.env())
    rc, _, err = finish(p, 30)
    assert rc == 0, err
    e0, e1 = (json.loads(job.read("env", r)) for r in (0, 1))
    assert e0["HOROVOD_HOSTNAME"] == me and e0["APPLIANCE_DATA_ADDR"] == ssh_cluster.c.primary_addr
    assert e1["APPLIANCE_STORE_ADDR"].rpartition(":")[0] == ssh_cluster.c.primary_addr
    assert e1["APPLIANCE_DATA_ADDR"] == h1.address


@pytest.mark.timeout(60)
def test_ssh_config_alias_port_user_and_key(ssh_cluster, tmp_path):
    """Without -p/-i: ~/.ssh/config's HostName, Port, User and IdentityFile are used."""
    h1, _ = ssh_cluster.hosts
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host worker-one\n  HostName {h1.address}\n  Port {PORT}\n  User root\n  IdentityFile {ssh_cluster.key}\n")
    env = {"HOME": str(home), "APPLIANCE_SHARED": str(tmp_path / "none")}
    rc, out, err, _ = appliance("check", "-H", "worker-one:2", env=env)
    assert rc == 0, err
    assert "worker-one:12345" in out and h1.hostname in out


@pytest.mark.timeout(90)
def test_host_behind_a_bastion_through_proxyjump_in_ssh_config(ssh_cluster, job, tmp_path):
    """Host 2's sshd refuses the primary (a firewall in its namespace) but not host 1: with
    ``ProxyJump`` to host 1 in ``~/.ssh/config`` (a temporary HOME), check and launch go through it."""
    h1, h2 = ssh_cluster.hosts
    rule = ["-p", "tcp", "--dport", str(PORT), "-s", ssh_cluster.c.primary_addr, "-j", "REJECT",
            "--reject-with", "tcp-reset"]
    subprocess.run(["ip", "netns", "exec", h2.ns, "iptables", "-I", "INPUT", *rule], check=True, timeout=10)
    try:
        home = tmp_path / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(
            f"Host bastion\n  HostName {h1.address}\n  Port {PORT}\n  User root\n  IdentityFile {ssh_cluster.key}\n"
            f"Host hostb\n  HostName {h2.address}\n  Port {PORT}\n  User root\n  ProxyJump bastion\n")
        env = ssh_cluster.env(HOME=str(home))
        rc, _, err, _ = appliance("check", "-H", h2.address, "-p", str(PORT), "--start-timeout", "5", env=env)
        assert rc == 1 and "refused the connection" in err, err  # no direct way in
        rc, out, err, _ = appliance("check", "-H", "hostb", env=env)
        assert rc == 0 and f"hostb:{PORT} via root@bastion:{PORT}" in out, out + err
        with open(h2.log, errors="replace") as f:
            before = f.read().count(f"Accepted publickey for root from {h1.address}")
        p = job.cli("-np", "2", "-H", "localhost:1,hostb:1", "--", *job.argv(DUMP), env=env)
        rc, _, err = finish(p, 60)
        assert rc == 0, err
        e1, where1 = json.loads(job.read("env", 1)), json.loads(job.read("where", 1))
        assert where1["host"] == h2.hostname and e1["HOROVOD_HOSTNAME"] == "hostb"
        assert e1["APPLIANCE_DATA_ADDR"] == h2.address
        with open(h2.log, errors="replace") as f:  # host 2 saw the SSH logins coming from the bastion
            assert f.read().count(f"Accepted publickey for root from {h1.address}") > before
        (home / ".ssh" / "config").write_text((home / ".ssh" / "config").read_text() + (
            f"Host hostc\n  HostName {h2.address}\n  Port {PORT}\n  ProxyJump root@{h1.address}:{PORT + 1}\n"))
        rc, _, err, _ = appliance("check", "-H", "hostc", env=env)
        assert rc == 1 and f"hostc: through the jump host {h1.address} " in err and "refused the connection" in err, err
        # Host keys are as strict through the bastion: a cluster known_hosts that lists another key
        # refuses the bastion itself.
        other = tmp_path / "other"
        assert appliance("keys", "--shared", str(other), env=env)[0] == 0
        rc, _, err, _ = appliance("check", "-H", "hostb", "--shared", str(other), env=env)
        assert rc == 1 and "through the jump host bastion" in err and "is not in the cluster's" in err, err
    finally:
        subprocess.run(["ip", "netns", "exec", h2.ns, "iptables", "-D", "INPUT", *rule], timeout=10)
    assert ssh_cluster.wait_clean() == {}


@pytest.mark.timeout(60)
def test_agent_keys_are_offered(ssh_cluster, tmp_path):
    """No key file anywhere, only an ssh-agent holding the cluster key: the login uses the agent."""
    h1, _ = ssh_cluster.hosts
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < end:
            time.sleep(0.05)
        env = {"HOME": str(tmp_path / "home"), "APPLIANCE_SHARED": str(tmp_path / "none"), "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", ssh_cluster.key], env={**os.environ, **env}, check=True, capture_output=True,
                       timeout=10)
        rc, _, err, _ = appliance("check", "-H", h1.address, "-p", str(PORT), env=env)
        assert rc == 0, err
        rc, _, err, _ = appliance("check", "-H", h1.address, "-p", str(PORT), env={**env, "SSH_AUTH_SOCK": ""})
        assert rc == 1 and "no SSH key to offer" in err, err
    finally:
        agent.kill()
        agent.wait(5)
