"""``appliance keys --shared DIR``: files, modes sshd's StrictModes accepts, idempotency, repair."""
import os
import shutil
import stat
import subprocess
import sys

import pytest

MODES = {"": 0o700, "id_ed25519": 0o600, "id_ed25519.pub": 0o644, "ssh_host_ed25519_key": 0o600,
         "ssh_host_ed25519_key.pub": 0o644, "authorized_keys": 0o600, "known_hosts": 0o644}


def keys(shared) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "appliance", "keys", "--shared", str(shared)], capture_output=True,
                          text=True, timeout=30)


def snapshot(d):
    return {name: (stat.S_IMODE(os.stat(d / name).st_mode), os.stat(d / name).st_uid,
                   (d / name).read_bytes() if name else b"") for name in MODES}


@pytest.mark.timeout(60)
def test_keys_created_with_strict_modes_and_idempotent(tmp_path):
    r = keys(tmp_path / "share")
    assert r.returncode == 0, r.stderr
    d = tmp_path / "share" / "ssh"
    first = snapshot(d)
    for name, mode in MODES.items():
        assert first[name][:2] == (mode, os.getuid()), name
    pub = (d / "id_ed25519.pub").read_text().split()
    host = (d / "ssh_host_ed25519_key.pub").read_text().split()
    assert pub[0] == host[0] == "ssh-ed25519" and pub[1] != host[1]
    assert (d / "authorized_keys").read_text().split()[:2] == pub[:2]
    assert (d / "known_hosts").read_text() == f"* ssh-ed25519 {host[1]}\n"
    if shutil.which("ssh-keygen"):  # OpenSSH reads what we wrote
        for key, line in (("id_ed25519", pub), ("ssh_host_ed25519_key", host)):
            out = subprocess.run(["ssh-keygen", "-y", "-f", str(d / key)], capture_output=True, text=True).stdout
            assert out.split()[:2] == line[:2]
    assert keys(tmp_path / "share").returncode == 0
    assert snapshot(d) == first  # a second run changes nothing

    # repair: loose modes, a lost .pub, other users' keys in authorized_keys are kept
    os.chmod(d, 0o755)
    os.chmod(d / "id_ed25519", 0o644)
    os.chmod(d / "authorized_keys", 0o666)
    (d / "id_ed25519.pub").unlink()
    with open(d / "authorized_keys", "a") as f:
        f.write("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOtherKeyOtherKeyOtherKeyOtherKey alice\n")
    r = keys(tmp_path / "share")
    assert r.returncode == 0 and "fixed" in r.stdout
    again = snapshot(d)
    for name, mode in MODES.items():
        assert again[name][0] == mode, name
    assert again["id_ed25519"] == first["id_ed25519"] and again["id_ed25519.pub"][2].split()[:2] == first[
        "id_ed25519.pub"][2].split()[:2]
    assert b"alice" in again["authorized_keys"][2] and again["authorized_keys"][2].count(pub[1].encode()) == 1


@pytest.mark.timeout(30)
def test_keys_errors_name_the_file(tmp_path):
    d = tmp_path / "share" / "ssh"
    d.mkdir(parents=True)
    (d / "id_ed25519").write_text("not a key\n")
    r = keys(tmp_path / "share")
    assert r.returncode == 1 and f"{d / 'id_ed25519'} is not an unencrypted OpenSSH private key" in r.stderr
