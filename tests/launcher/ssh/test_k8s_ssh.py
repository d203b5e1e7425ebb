"""The launcher as the MPI Operator runs it, over real sshd (the SSH tier's network-namespace hosts,
``tests/fixtures/netns.py``): each host runs a second sshd the way the operator's images do (port 2222,
the mounted ECDSA P-521 key named ``id_rsa`` as host key and authorized key, ``StrictModes no``), and
the launcher gets the operator's environment (``K_MPI_JOB_ROLE=launcher``, ``/etc/mpi`` moved to a
test directory with ``APPLIANCE_MPI_CONFIG_DIR``, a HOME whose read-only ``.ssh`` holds the key and an
ssh config giving port 2222; the real ``/root/.ssh`` and ``/etc/ssh`` are never touched).

Asserts: a fixed job on the mounted hostfile with no -p/-i, nothing written to the mount; the three
SSH failures told apart, naming the pod; a launcher whose own name resolves nowhere; elastic over
``discover_hosts.sh`` with a pod added, a listed pod that never answers (pending, not failing), a pod
removed, a rank ended by SIGTERM (it leaves, the job ends 0); and that nothing is left running.
"""
from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import pytest

from fixtures.elastic import ElasticJob, check_consistent
from fixtures.netns import SSHD

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]

POD_PORT = 2222
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")


class Pods:
    """The hosts as operator worker pods: sshd on 2222 with the job's key; the launcher pod's files."""

    def __init__(self, cluster, base):
        self.cluster, self.base = cluster, base
        self.hosts = cluster.hosts
        self.home = base / "home"
        self.ssh = self.home / ".ssh"
        self.etc = base / "etc-mpi"
        self.sshd: dict[int, subprocess.Popen] = {}  # host index -> its pod sshd
        self.ssh.mkdir(parents=True)
        self.etc.mkdir()
        key = self.ssh / "id_rsa"
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", str(key)],
                       check=True, capture_output=True, timeout=30)
        assert key.read_text().startswith("-----BEGIN EC PRIVATE KEY-----")  # as the operator's Secret
        (self.ssh / "authorized_keys").write_text((self.ssh / "id_rsa.pub").read_text())
        # the operator's images: Port 2222 and no host key checks in the ssh config (here ~/.ssh/config)
        (self.ssh / "config").write_text(f"Host *\n  Port {POD_PORT}\n  StrictHostKeyChecking no\n"
                                         "  UserKnownHostsFile /dev/null\n")
        for f in self.ssh.iterdir():
            f.chmod(0o600 if f.name == "id_rsa" else 0o444)
        self.ssh.chmod(0o555)  # the Secret mount is read-only
        for host in self.hosts:
            self.start_sshd(host)

    def start_sshd(self, host) -> None:
        conf = self.base / f"sshd_{host.index}.conf"
        conf.write_text(f"Port {POD_PORT}\nListenAddress {host.address}\nHostKey {self.ssh}/id_rsa\n"
                        f"AuthorizedKeysFile {self.ssh}/authorized_keys\nStrictModes no\nPidFile none\n"
                        "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                        "PermitRootLogin prohibit-password\nMaxStartups 64:30:128\nClientAliveInterval 1\n"
                        "ClientAliveCountMax 3\n")
        log = open(self.base / f"sshd_{host.index}.log", "wb")
        script = f"hostname {host.hostname} && exec {SSHD} -D -e -f {conf}"  # the pod's own hostname
        self.sshd[host.index] = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, "unshare", "--uts", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                with socket.create_connection((host.address, POD_PORT), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on {host.address}:{POD_PORT} did not come up")

    def mount_state(self) -> dict:
        return {f.name: (f.stat().st_mtime_ns, f.stat().st_size) for f in self.ssh.iterdir()}

    def env(self, **extra) -> dict:
        return {**self.cluster.env(), "HOME": str(self.home), "K_MPI_JOB_ROLE": "launcher",
                "APPLIANCE_MPI_CONFIG_DIR": str(self.etc), "OMPI_MCA_orte_set_default_slots": "1", **extra}

    def leftovers(self) -> dict:
        """Processes in the hosts' namespaces other than their sshd listeners (the cluster's and ours)."""
        ours = {p.pid for p in self.sshd.values()}
        end = time.monotonic() + 12
        while True:
            left = {h.ns: [p for p in h.pids() if p not in ours] for h in self.hosts}
            left = {ns: pids for ns, pids in left.items() if pids}
            if not left or time.monotonic() > end:
                return left
            time.sleep(0.1)

    def stop_sshd(self, host) -> None:
        p = self.sshd.pop(host.index)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=5)

    def close(self) -> None:
        for host in self.hosts:
            if host.index in self.sshd:
                self.stop_sshd(host)
        self.ssh.chmod(0o755)


@pytest.fixture(scope="module")
def pods(ssh_cluster, tmp_path_factory):
    p = Pods(ssh_cluster, tmp_path_factory.mktemp("pods"))
    try:
        yield p
    finally:
        p.close()


def horovodrun(pods, *args, env=None, timeout=120, uts_hostname=None):
    argv = [HOROVODRUN, *args]
    if uts_hostname:  # a launcher whose own name resolves nowhere (trainer#3783)
        argv = ["unshare", "--uts", "--", "sh", "-c", f'hostname {uts_hostname} && exec "$@"', "sh", *argv]
    return subprocess.run(argv, env={**os.environ, **pods.env(**(env or {}))}, capture_output=True, text=True,
                          timeout=timeout)


PRINT_HOST = "import os, socket; print(os.environ['HOROVOD_RANK'], socket.gethostname())"


def test_a_fixed_job_on_the_mounted_hostfile_and_key_writes_nothing_to_the_mount(pods):
    h1, h2 = pods.hosts
    (pods.etc / "hostfile").write_text(f"{h1.address} slots=1\n{h2.address} slots=1\n")
    before = pods.mount_state()
    r = horovodrun(pods, "-np", "2", sys.executable, "-c", PRINT_HOST)
    assert r.returncode == 0, r.stderr
    assert f"appliance launch: Kubernetes (MPI Operator, K_MPI_JOB_ROLE=launcher); hosts from {pods.etc}/hostfile; " \
           f"1 slot per host by default; SSH key {pods.ssh}/id_rsa" in r.stderr
    assert sorted(r.stdout.split("\n")[:-1]) == [f"[0]<stdout>:0 {h1.hostname}", f"[1]<stdout>:1 {h2.hostname}"]
    assert pods.mount_state() == before and not (pods.home / ".ssh" / "known_hosts").exists()
    assert pods.leftovers() == {}


def test_a_fixed_job_waits_for_a_pod_whose_sshd_starts_after_the_launcher(pods):
    h1, h2 = pods.hosts
    (pods.etc / "hostfile").write_text(f"{h1.address} slots=1\n{h2.address} slots=1\n")
    pods.stop_sshd(h2)
    try:
        start = time.monotonic()
        launcher = subprocess.Popen([HOROVODRUN, "-np", "2", "--start-timeout", "30", sys.executable, "-c", PRINT_HOST],
                                    env={**os.environ, **pods.env()}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        time.sleep(3)
        assert launcher.poll() is None  # still waiting for the pod's sshd
    finally:
        pods.start_sshd(h2)
    try:
        out, err = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert time.monotonic() - start > 3 and f"[1]<stdout>:1 {h2.hostname}" in out
    assert pods.leftovers() == {}


def test_the_three_ssh_failures_are_told_apart_naming_the_pod(pods, tmp_path):
    h1, _ = pods.hosts
    other = tmp_path / "other-home" / ".ssh"  # a launcher holding another job's key
    other.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", str(other / "id_rsa")],
                   check=True, capture_output=True, timeout=30)
    (other / "config").write_text((pods.ssh / "config").read_text())
    cases = [("job-worker-7.job.default.svc.invalid", {}, "does not resolve"),
             ("refusing-pod", {}, "refused the connection"),
             # no appliance share in a pod: an unknown host key is accepted (StrictHostKeyChecking no), the
             # client key is what is refused
             (h1.address, {"HOME": str(other.parent), "APPLIANCE_SHARED": str(tmp_path / "no-share")},
              "did not accept the key")]
    for name, env, words in cases:
        (pods.etc / "hostfile").write_text(f"{name} slots=1\n")
        config = pods.ssh / "config"
        if name == "refusing-pod":  # a pod whose sshd is not listening (yet): port 2223 on host 1
            env = {"HOME": str(tmp_path / "refusing")}
            (tmp_path / "refusing" / ".ssh").mkdir(parents=True)
            (tmp_path / "refusing" / ".ssh" / "id_rsa").write_bytes((pods.ssh / "id_rsa").read_bytes())
            (tmp_path / "refusing" / ".ssh" / "id_rsa").chmod(0o600)
            (tmp_path / "refusing" / ".ssh" / "config").write_text(
                f"Host refusing-pod\n  HostName {h1.address}\n  Port 2223\n" + config.read_text())
        start = time.monotonic()
        r = horovodrun(pods, "-np", "1", "--start-timeout", "2", sys.executable, "-c", "print(1)", env=env)
        took = time.monotonic() - start
        errors = [line for line in r.stderr.splitlines() if name in line and words in line]
        assert r.returncode == 1 and errors, (name, r.stderr)
        assert took < 30, (name, took)  # bounded: the waits are --start-timeout's
    assert pods.leftovers() == {}


def test_workers_reach_the_launcher_by_address_when_its_name_resolves_nowhere(pods, tmp_path):
    h1, h2 = pods.hosts
    (pods.etc / "hostfile").write_text(f"{h1.address} slots=1\n{h2.address} slots=1\n")
    r = horovodrun(pods, "-np", "2", sys.executable, "-c", PRINT_HOST, uts_hostname="job-launcher.job.nowhere.invalid")
    assert r.returncode == 0, r.stderr
    # elastic: the workers call the launcher's rendezvous back (the elastic driver), by its address
    with ElasticJob(tmp_path, steps=12, commit=2, hosts=f"{h1.address}\n{h2.address}") as job:
        (pods.etc / "discover_hosts.sh").write_text(job.script.read_text())
        (pods.etc / "discover_hosts.sh").chmod(0o555)
        r = horovodrun(pods, "-np", "2", "--min-np", "1", "--max-np", "2", *job.command(),
                       uts_hostname="job-launcher.job.nowhere.invalid")
        assert r.returncode == 0, r.stderr
        assert f"hosts from {pods.etc}/discover_hosts.sh (discovery)" in r.stderr
        assert check_consistent(job.done(), 12) == [2] * 12
    (pods.etc / "discover_hosts.sh").unlink()
    assert pods.leftovers() == {}


def test_elastic_the_kubernetes_way_pending_added_removed_sigterm(pods, tmp_path, monkeypatch, capfd):
    """One pod, then a second listed that never answers (pending: the job goes on, one line), then
    a real one added (3 runs: lag to its first step), removed (lag to the survivors' first step at
    the new size), and a rank ended by SIGTERM (it leaves; the job ends 0, no step lost)."""
    h1, h2 = pods.hosts
    for k, v in pods.env(APPLIANCE_DISCOVERY_INTERVAL="0.2").items():
        monkeypatch.setenv(k, v)
    up, down = [], []
    with ElasticJob(tmp_path, steps=100000, commit=2, step_s=0.05, hosts=h1.address) as job:
        (pods.etc / "discover_hosts.sh").write_text(job.script.read_text())
        (pods.etc / "discover_hosts.sh").chmod(0o555)
        job.start(1, min_np=1, max_np=2, timeout=200)
        job.wait_for(lambda: job.max_step() >= 3, what="the first steps")
        job.set_hosts(f"{h1.address}\nnever-up-pod.job.default.svc.invalid")
        time.sleep(4)
        assert {p["size"] for p in job.progress().values()} == {1}
        for _ in range(3):
            job.set_hosts(f"{h1.address}\n{h2.address}")
            t0 = time.monotonic()
            job.wait_size(2, step_after=job.max_step(), limit=60)
            up.append(time.monotonic() - t0)
            job.set_hosts(h1.address)
            t0 = time.monotonic()
            job.wait_size(1, step_after=job.max_step(), limit=60)
            down.append(time.monotonic() - t0)
        job.set_hosts(f"{h1.address}\n{h2.address}")
        job.wait_size(2, step_after=job.max_step(), limit=60)
        on_h2 = [w for w, p in job.progress().items() if p["size"] == 2 and p.get("rank") == 1]
        pid = job.pids()[max(on_h2)]
        subprocess.run(["kill", "-TERM", str(pid)], check=True)  # the pod's rank gets SIGTERM
        job.wait_size(1, step_after=job.max_step(), limit=60)
        stop = job.max_step() + 4
        (tmp_path / "stop").write_text(str(stop))
        r = job.wait(120)
        assert r.returncode == 0, r.reason
        said = r.output(stream="stderr") + capfd.readouterr().err + "\n".join(t for _, _, t in r.lines)
        assert said.count("never-up-pod.job.default.svc.invalid is listed but does not answer yet") == 1, said
        # the rank's own handler asks to leave (APPLIANCE_ELASTIC_LEAVE_ON_TERM): it goes at its next commit
        assert "was sent SIGTERM: it leaves the job at its next commit" in said and "blacklisted" not in said, said
        sizes = check_consistent(job.done(), stop)
        assert sizes[-1] == 1
        assert job.leftovers() == []
    (pods.etc / "discover_hosts.sh").unlink()
    print(f"\nscale-up lag (listed -> first step at 2): {[round(x, 2) for x in up]} median "
          f"{statistics.median(up):.2f} s; scale-down lag (unlisted -> first step at 1): "
          f"{[round(x, 2) for x in down]} median {statistics.median(down):.2f} s")
    assert pods.leftovers() == {}


def test_elastic_a_crashed_pod_re_created_under_its_name_rejoins_after_the_cooldown(pods, tmp_path, monkeypatch):
    h1, h2 = pods.hosts
    for k, v in pods.env(APPLIANCE_DISCOVERY_INTERVAL="0.2").items():
        monkeypatch.setenv(k, v)
    with ElasticJob(tmp_path, steps=100000, commit=2, step_s=0.05, hosts=f"{h1.address}\n{h2.address}") as job:
        job.start(2, min_np=1, max_np=2, timeout=200)
        job.wait_size(2, step_after=2, limit=60)
        rank1 = [w for w, p in job.progress().items() if p["size"] == 2 and p.get("rank") == 1]
        subprocess.run(["kill", "-KILL", str(job.pids()[max(rank1)])], check=True)  # the pod's rank crashes
        pods.stop_sshd(h2)  # the pod is deleted (everything in it dies) and re-created under the same name
        for pid in h2.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pods.start_sshd(h2)
        job.wait_size(1, step_after=job.max_step(), limit=60)
        crashed = time.monotonic()
        job.wait_size(2, step_after=job.max_step(), limit=60)
        back_after = time.monotonic() - crashed
        stop = job.max_step() + 4
        (tmp_path / "stop").write_text(str(stop))
        r = job.wait(120)
        assert r.returncode == 0, r.reason
        assert 8.0 < back_after < 40.0, back_after  # the 10 s cool-down (from the crash), then checked afresh
        sizes = check_consistent(job.done(), stop)
        assert sizes[-1] == 2 and 1 in sizes
        assert job.leftovers() == []
    assert pods.leftovers() == {}
