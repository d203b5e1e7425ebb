"""The launcher in a Kubernetes launcher pod, given bad and odd input: the bad-input probe's cases
k01-k29 (its surface 4), each one real ``horovodrun`` on this machine. The pod's files are a
directory (``APPLIANCE_MPI_CONFIG_DIR``: ``hostfile``, ``discover_hosts.sh``) and a HOME; the
command is ``K_MPI_JOB_ROLE=launcher horovodrun -np 2 PROGRAM`` with no -H, as the MPI Operator
runs it. Bad input ends within seconds with one line naming the culprit (the file and line, the
variable, the script) and no traceback; odd but valid input trains. A listed pod that does not
answer yet never keeps a ready host out of the --max-np target (k20b, k20c).

Each run is bounded (``timeout``) and in its own process group, killed on the way out."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import RANKS

pytestmark = pytest.mark.timeout(120)

BIN = Path(sys.executable).parent
PROGRAM = [sys.executable, "-c", "import os; print('RANK', os.environ['HOROVOD_RANK'])"]


class Pod:
    def __init__(self, root: Path):
        self.etc, self.home, self.out = root / "etc-mpi", root / "home", root / "out"
        for d in (self.etc, self.home, self.out):
            d.mkdir()
        self.hostfile("localhost slots=2\n")
        self.env = {"K_MPI_JOB_ROLE": "launcher", "APPLIANCE_MPI_CONFIG_DIR": str(self.etc), "HOME": str(self.home),
                    "APPLIANCE_VIEW": "off"}

    def hostfile(self, text: str) -> None:
        (self.etc / "hostfile").write_text(text)

    def script(self, body: str, mode: int = 0o755) -> None:
        path = self.etc / "discover_hosts.sh"
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(mode)

    def run(self, *flags: str, program=None, env: dict | None = None, timeout: float = 60,
            wrap: list[str] | None = None) -> tuple[int, str, float]:
        argv = [*(wrap or []), str(BIN / "horovodrun"), "-np", "2", *flags, *(program or PROGRAM)]
        full = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **self.env, **(env or {})}
        for k in [k for k, v in full.items() if v is None]:
            del full[k]
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full,
                             cwd=self.out, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            pytest.fail(f"no end within {timeout} s:\n{out[-3000:]}")
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return p.returncode, out, time.monotonic() - t0


def elastic(pod: Pod, *flags: str) -> list[str]:
    return ["--min-np", "1", "--max-np", "2", *flags]


STEPS = [sys.executable, str(RANKS / "elastic_steps.py"), ".", "3", "1", "0.01"]


@pytest.fixture
def pod(tmp_path):
    return Pod(tmp_path)


# -- refused before anything starts: one line naming the culprit -----------------------------------
def _dir(pod):
    (pod.etc / "hostfile").unlink()
    (pod.etc / "hostfile").mkdir()


REFUSED = {
    "k02-empty": (lambda p: p.hostfile(""), {}, "{etc}/hostfile: no hosts in the file"),
    "k03-slots-abc": (lambda p: p.hostfile("localhost slots=abc\n"), {},
                      "{etc}/hostfile:1: slots must be a whole number, got 'abc' (line 'localhost slots=abc')"),
    "k03b-two-words": (lambda p: p.hostfile("local host slots=2\n"), {},
                       "expected 'host slots=N' or 'host:N', got 'local host slots=2'"),
    "k03c-max-slots-x": (lambda p: p.hostfile("localhost slots=2 max_slots=x extra=junk\n"), {},
                         "slots must be a whole number, got 'x'"),
    "k04-twice": (lambda p: p.hostfile("localhost slots=1\nlocalhost slots=1\n"), {},
                  "host 'localhost' is listed more than once (give it all its slots in one entry)"),
    "k04b-twice-other-slots": (lambda p: p.hostfile("localhost slots=1\nlocalhost slots=3\n"), {},
                               "host 'localhost' is listed more than once"),
    "k05-slots-0": (lambda p: p.hostfile("localhost slots=0\n"), {}, "slots must be at least 1, got 0"),
    "k07-no-hostfile": (lambda p: (p.etc / "hostfile").unlink(), {},
                        "hostfile '{etc}/hostfile': No such file or directory"),
    "k08-a-directory": (_dir, {}, "hostfile '{etc}/hostfile': not a regular file or a pipe"),
    "k09-variable-names-nothing": (lambda p: None, {"OMPI_MCA_orte_default_hostfile": "/nonexistent/hostfile"},
                                   "hostfile '/nonexistent/hostfile': No such file or directory"),
    "k10-default-slots-abc": (lambda p: None, {"OMPI_MCA_orte_set_default_slots": "abc"},
                              "OMPI_MCA_orte_set_default_slots='abc': expected the slots per host, a whole number >= 1"),
    "k10b-default-slots-0": (lambda p: None, {"OMPI_MCA_orte_set_default_slots": "0"},
                             "OMPI_MCA_orte_set_default_slots='0': expected the slots per host"),
    "k11b-no-slots-anywhere": (lambda p: p.hostfile("localhost\n"), {},
                               "-np 2 asks for more processes than there are slots: 1 slot on 1 host (localhost:1)"),
    "k15-option-as-host": (lambda p: p.hostfile("-oProxyCommand=touch_pwned slots=2\n"), {},
                           "'-oProxyCommand=touch_pwned' is not a host name"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_hostfile_or_variable_is_refused_naming_it(pod, case):
    arrange, env, line = REFUSED[case]
    arrange(pod)
    rc, out, took = pod.run(env=env, timeout=30)
    assert rc != 0 and line.format(etc=pod.etc) in out, out
    assert "Traceback" not in out and "RANK" not in out and took < 15, (took, out)
    assert not (pod.out / "touch_pwned").exists()


SCRIPT_REFUSED = {
    "k17-hangs": ("exec sleep 1017\n", 0o755, {"APPLIANCE_DISCOVERY_TIMEOUT": "2"},
                  "host discovery script {etc}/discover_hosts.sh: did not finish within 2 s (APPLIANCE_DISCOVERY_TIMEOUT)"),
    "k18-garbage": ("echo '!!garbage## host'\n", 0o755, {},
                    "line 1 ('!!garbage## host'): '!!garbage## host' is not a host name"),
    "k19-exits-3": ("echo localhost\nexit 3\n", 0o755, {}, "host discovery script {etc}/discover_hosts.sh exited with code 3"),
    "k21-not-executable": ("echo localhost\n", 0o644, {}, "not executable (chmod +x {etc}/discover_hosts.sh)"),
}


@pytest.mark.parametrize("case", sorted(SCRIPT_REFUSED))
def test_a_bad_discovery_script_is_refused_naming_it(pod, case):
    body, mode, env, line = SCRIPT_REFUSED[case]
    pod.script(body, mode)
    rc, out, took = pod.run(*elastic(pod), program=STEPS, env=env, timeout=40)
    assert rc != 0 and line.format(etc=pod.etc) in out, out
    assert "Traceback" not in out and took < 20, (took, out)
    if case == "k17-hangs":  # the script's whole session was killed
        assert subprocess.run(["pgrep", "-f", "sleep 1017"], capture_output=True).stdout.strip() == b""


def test_k14_a_host_that_never_resolves_fails_at_the_start_timeout_naming_it(pod):
    pod.hostfile("appliance-worker-9.nosuch.invalid slots=2\n")
    rc, out, took = pod.run("--start-timeout", "3", timeout=40)
    assert rc != 0 and "appliance-worker-9.nosuch.invalid does not resolve" in out, out
    assert "preflight failed (1 host" in out and "Traceback" not in out and took < 25, (took, out)


def test_k23_discovery_listing_nothing_ends_at_the_elastic_timeout(pod):
    pod.script("")
    rc, out, took = pod.run(*elastic(pod, "--elastic-timeout", "3"), program=STEPS, timeout=40)
    assert rc == 1 and "waiting for 2 slots (0 available; at most 3 s)" in out, out
    assert "fewer than -np 2 slots were available for 3 s (--elastic-timeout)" in out and took < 25, (took, out)


# -- odd but valid: the job runs ----------------------------------------------------------------
def _home_key(pod, how: str) -> None:
    ssh = pod.home / ".ssh"
    ssh.mkdir()
    key = ssh / "id_rsa"
    if how == "dir":
        key.mkdir()
    elif how == "dev-zero":
        key.symlink_to("/dev/zero")
    else:
        key.write_text("" if how == "empty" else "-----BEGIN EC PRIVATE KEY-----\n")
        key.chmod(0o600 if how == "empty" else 0o644)


RUNS = {
    "k01-baseline": (lambda p: None, {}, "Kubernetes (MPI Operator, K_MPI_JOB_ROLE=launcher); hosts from "
                     "{etc}/hostfile; SSH key: default search"),
    "k06-huge-slots": (lambda p: p.hostfile("localhost slots=1000000000000\n"), {}, "hosts from {etc}/hostfile"),
    "k11-default-slots": (lambda p: p.hostfile("localhost\n"), {"OMPI_MCA_orte_set_default_slots": "2"},
                          "; 2 slots per host by default;"),
    "k12-colon-dialect": (lambda p: p.hostfile("localhost:2\n"), {}, "hosts from {etc}/hostfile"),
    "k13-2mb-comment": (lambda p: p.hostfile("#" + "x" * (2 << 20) + "\nlocalhost slots=2\n"), {},
                        "hosts from {etc}/hostfile"),
    "k14b-intel-variable": (lambda p: None, {"K_MPI_JOB_ROLE": None, "I_MPI_HYDRA_HOST_FILE": "{etc}/hostfile",
                                              "I_MPI_PERHOST": "allcores"},
                            "Kubernetes (Kubernetes hostfile, I_MPI_HYDRA_HOST_FILE={etc}/hostfile)"),
    "k25-no-ssh-dir": (lambda p: None, {}, "SSH key: default search"),
    "k26-key-0644": (lambda p: _home_key(p, "0644"), {},
                     "warning: the SSH key {home}/.ssh/id_rsa has mode 0644 and is owned by you"),
    "k27-key-a-directory": (lambda p: _home_key(p, "dir"), {}, "SSH key: default search"),
    "k28-key-empty": (lambda p: _home_key(p, "empty"), {}, "SSH key {home}/.ssh/id_rsa"),
    "k29-key-dev-zero": (lambda p: _home_key(p, "dev-zero"), {}, "SSH key: default search"),
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_odd_but_valid_input_runs(pod, case):
    arrange, env, line = RUNS[case]
    arrange(pod)
    env = {k: v if v is None else v.format(etc=pod.etc) for k, v in env.items()}
    rc, out, _ = pod.run(env=env)
    assert rc == 0 and line.format(etc=pod.etc, home=pod.home) in out, out
    assert sorted(ln.split("RANK ")[1] for ln in out.splitlines() if "RANK " in ln) == ["0", "1"], out


ELASTIC_RUNS = {
    "k16-localhost": ("echo localhost\n", (), "hosts from {etc}/discover_hosts.sh (discovery)"),
    "k20-10000-names-after": ("echo localhost\n" + "".join(f"echo pod-{i}.x.default.svc\n" for i in range(10_000)),
                              (), "hosts from {etc}/discover_hosts.sh (discovery)"),
    "k20c-pending-pod-first": ("echo worker-0.nosuch.invalid\necho localhost\n", (),
                               "host worker-0.nosuch.invalid is listed but does not answer yet; pending"),
    "k20d-pending-pod-first-max-np-4": ("echo worker-0.nosuch.invalid\necho localhost\n", ("--max-np", "4"),
                                        "host worker-0.nosuch.invalid is listed but does not answer yet; pending"),
    "k22-slots-in-the-output": ("echo localhost:2\n", (), "(discovery)"),
}


@pytest.mark.parametrize("case", sorted(ELASTIC_RUNS))
def test_elastic_discovery_odd_but_valid_runs_at_once(pod, case):
    """k20c is the probe's N9: a pod listed first that does not resolve is pending and leaves its
    place in --max-np 2 to localhost (it waited --elastic-timeout, 600 s, before)."""
    body, flags, line = ELASTIC_RUNS[case]
    pod.script(body)
    if case == "k22-slots-in-the-output":
        pod.env["OMPI_MCA_orte_set_default_slots"] = "1"
    args = ["--min-np", "1", *(flags or ("--max-np", "2"))]
    rc, out, took = pod.run(*args, program=STEPS, timeout=60)
    assert rc == 0 and line.format(etc=pod.etc) in out, out
    assert "waiting for" not in out and took < 30, (took, out)
    done = sorted(p.name for p in pod.out.glob("done.*"))
    assert len(done) == 2, (done, out[-3000:])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root's unshare -m (a private /etc/resolv.conf)")
def test_k20b_thousands_of_pending_pods_listed_first_do_not_keep_localhost_out(pod, tmp_path):
    """The probe's k20b with 2000 listed pods that do not resolve, then localhost, under a private
    mount namespace whose resolver refuses at once (this machine's DNS server answers a burst of
    lookups in 5-10 s each; a cluster's answers in milliseconds)."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
    pod.script("cat <<EOF\n" + "".join(f"appliance-elastic-worker-{i}.appliance-elastic.default.svc\n"
                                       for i in range(2000)) + "localhost\nEOF\n")
    wrap = ["unshare", "-m", "sh", "-c", f'mount --bind {resolv} /etc/resolv.conf && exec "$@"', "sh"]
    rc, out, took = pod.run("--min-np", "1", "--max-np", "2", program=STEPS, timeout=100, wrap=wrap)
    assert rc == 0 and "appliance-elastic-worker-0.appliance-elastic.default.svc is listed but" in out, out[-3000:]
    assert "waiting for" not in out and len(list(pod.out.glob("done.*"))) == 2, out[-3000:]
    print(f"\n[k20b] 2000 pending pods listed first: {took:.1f} s to the end of a 3-step job")
