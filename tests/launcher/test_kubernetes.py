"""The launcher in a Kubernetes launcher pod (``appliance/launcher/kubernetes.py``): what the MPI
Operator and Kubeflow Trainer give it becomes the job's hosts, slots, discovery script, key and
elastic defaults; one line says so. Config logic, plus one real ``horovodrun`` on this machine."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from appliance.common.knobs import ConfigError
from appliance.launcher.config import LaunchConfig
from appliance.launcher.hosts import HostsError, hosts_from
from appliance.launcher.kubernetes import COOLDOWN_S, detect, key_mode_warning

CMD = ["python", "train.py"]


@pytest.fixture
def pod(tmp_path):
    """A launcher pod's files: /etc/mpi (hostfile 0444, discover_hosts.sh 0555) and ~/.ssh/id_rsa."""
    etc = tmp_path / "etc-mpi"
    etc.mkdir()
    (etc / "hostfile").write_text("pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n")
    (etc / "hostfile").chmod(0o444)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("key")
    (home / ".ssh" / "id_rsa").chmod(0o600)
    env = {"K_MPI_JOB_ROLE": "launcher", "APPLIANCE_MPI_CONFIG_DIR": str(etc), "HOME": str(home),
           "OMPI_MCA_orte_set_default_slots": "2"}
    return etc, home, env


def add_script(etc):
    script = etc / "discover_hosts.sh"
    script.write_text("#!/bin/sh\necho pi-worker-0.pi.default.svc\n")
    script.chmod(0o555)
    return str(script)


def test_nothing_detected_outside_a_launcher_pod(pod):
    _, _, env = pod
    assert detect({}) is None and detect({"K_MPI_JOB_ROLE": "worker"}) is None
    c = LaunchConfig.create(CMD, 2, environ={"HOME": env["HOME"]})
    assert c.kubernetes is None and c.hostfile is None and c.notice == "" and c.remote.record_hosts


def test_mpi_operator_launcher_takes_the_hostfile_the_key_and_says_so(pod):
    etc, home, env = pod
    c = LaunchConfig.create(CMD, 4, environ=env)
    assert c.hostfile == str(etc / "hostfile") and c.default_slots == 2 and c.elastic is None
    assert c.remote.key == str(home / ".ssh" / "id_rsa") and not c.remote.record_hosts and c.remote.wait_dns
    assert c.remote.host_wait_s == c.start_timeout_s
    assert c.notice.startswith("Kubernetes (MPI Operator, K_MPI_JOB_ROLE=launcher); hosts from " + str(etc / "hostfile"))
    assert f"SSH key {home}/.ssh/id_rsa" in c.notice
    hosts = hosts_from(c.hosts, c.hostfile, None, c.np, c.default_slots)
    assert [(h.name, h.slots) for h in hosts] == [("pi-worker-0.pi.default.svc", 2), ("pi-worker-1.pi.default.svc", 2)]
    # -i wins over the mounted key; -H over the hostfile (the pod's SSH rules stay)
    c = LaunchConfig.create(CMD, 1, environ=env, key="/k", hosts="a:1")
    assert c.remote.key == "/k" and c.hostfile is None and c.hosts == "a:1" and not c.remote.record_hosts


def test_trainer_hostfile_variable_and_mpich_dialect_with_default_slots(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-node-0-0.job\njob-node-0-1.job:3\n")
    env = {"HYDRA_HOST_FILE": str(hostfile), "I_MPI_PERHOST": "4", "HOME": str(tmp_path),
           "APPLIANCE_MPI_CONFIG_DIR": str(tmp_path / "none")}
    c = LaunchConfig.create(CMD, 2, environ=env)
    assert c.hostfile == str(hostfile) and c.remote.key is None  # no ~/.ssh/id_rsa: the default search
    assert c.notice.startswith(f"Kubernetes (Kubernetes hostfile, HYDRA_HOST_FILE={hostfile})")
    assert [(h.name, h.slots) for h in hosts_from(None, c.hostfile, None, 2, c.default_slots)] == [
        ("job-node-0-0.job", 4), ("job-node-0-1.job", 3)]
    # elastic without a discovery script: fault tolerance over the hostfile's hosts, with a cool-down
    c = LaunchConfig.create(CMD, 2, min_np=1, environ=env)
    assert c.elastic.discovery_script is None and c.hostfile == str(hostfile) and c.elastic.kubernetes
    assert c.elastic.cooldown_range == COOLDOWN_S


def test_elastic_takes_discover_hosts_sh_with_slots_from_the_flag_or_the_hostfile(pod):
    etc, _, env = pod
    script = add_script(etc)
    c = LaunchConfig.create(CMD, 2, min_np=1, max_np=4, environ=env)
    e = c.elastic
    assert (e.discovery_script, e.slots_per_host, e.cooldown_range, e.kubernetes) == (script, 2, COOLDOWN_S, True)
    assert c.hostfile is None and f"hosts from {script} (discovery)" in c.notice and "cool-down 10-300 s" in c.notice
    c = LaunchConfig.create(CMD, 2, min_np=1, slots_per_host=1, blacklist_cooldown_range=(2, 4), environ=env)
    assert (c.elastic.slots_per_host, c.elastic.cooldown_range) == (1, (2.0, 4.0))
    no_default = {k: v for k, v in env.items() if k != "OMPI_MCA_orte_set_default_slots"}
    assert LaunchConfig.create(CMD, 2, min_np=1, environ=no_default).elastic.slots_per_host == 2  # the hostfile's
    # a static job in the same pod still takes the hostfile
    assert LaunchConfig.create(CMD, 2, environ=env).hostfile == str(etc / "hostfile")


def test_bad_input_names_the_culprit(pod, tmp_path):
    etc, _, env = pod
    with pytest.raises(ConfigError, match="OMPI_MCA_orte_set_default_slots='0'"):
        LaunchConfig.create(CMD, 1, environ={**env, "OMPI_MCA_orte_set_default_slots": "0"})
    bad = tmp_path / "bad-hostfile"
    bad.write_text("a slots=1\nb slots=1 cores=2\n")
    c = LaunchConfig.create(CMD, 1, environ={"OMPI_MCA_orte_default_hostfile": str(bad), "HOME": str(tmp_path)})
    with pytest.raises(HostsError, match=f"^{bad}:2: expected 'host slots=N' or 'host:N'"):
        hosts_from(c.hosts, c.hostfile, None, 1, c.default_slots)


def test_a_key_openssh_refuses_is_named_with_the_fix(tmp_path):
    key = tmp_path / "id_rsa"
    key.write_text("k")
    key.chmod(0o640)
    line = key_mode_warning(str(key))
    assert line and str(key) in line and "0640" in line and "install -m 600" in line
    key.chmod(0o600)
    assert key_mode_warning(str(key)) is None


def test_horovodrun_in_a_launcher_pod_says_what_it_took_and_runs(pod, tmp_path):
    etc, home, env = pod
    (etc / "hostfile").chmod(0o644)
    (etc / "hostfile").write_text("localhost\n")  # slots from OMPI_MCA_orte_set_default_slots
    (home / ".ssh" / "id_rsa").chmod(0o640)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    r = subprocess.run([horovodrun, "-np", "2", sys.executable, "-c", "import os; print(os.environ['HOROVOD_RANK'])"],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("appliance launch: Kubernetes")]
    assert said == [f"appliance launch: Kubernetes (MPI Operator, K_MPI_JOB_ROLE=launcher); hosts from "
                    f"{etc}/hostfile; 2 slots per host by default; SSH key {home}/.ssh/id_rsa"], r.stderr
    assert f"warning: the SSH key {home}/.ssh/id_rsa has mode 0640" in r.stderr
    assert sorted(r.stdout.split()) == ["[0]<stdout>:0", "[1]<stdout>:1"]


def test_appliance_check_in_a_launcher_pod_checks_the_mounted_hostfile_with_the_mounted_key(pod):
    from appliance.launcher.config import CheckConfig

    etc, home, env = pod
    c = CheckConfig.create(environ=env)
    assert c.hostfile == str(etc / "hostfile") and c.default_slots == 2
    assert c.remote.key == str(home / ".ssh" / "id_rsa") and not c.remote.record_hosts
    assert CheckConfig.create(environ={"HOME": str(home)}).hostfile is None
