"""The launcher's way to other hosts: SSH, from the first check to the last byte of a rank's output.

What it holds: ``connection`` (who to be on another host, connecting, running commands and
opening channels, with one actionable reason per failure), ``hostkeys`` (the cluster's
known_hosts, else trust on first use), ``keys`` (``appliance keys``: the cluster's SSH material
on the share), ``preflight`` (every host checked in parallel before ranks start; ``appliance
check`` shows it), ``probe`` (the facts gathered on one host, sent there as source),
``network`` (which address each host's ranks listen on), ``worker`` (a remote rank as a
``workers.Worker``: one channel to one remote stub) and ``remote_stub`` (the program on the
other host, ``python -m appliance.launcher.ssh.remote_stub``, between sshd and the rank).

Importing this package loads none of them: the remote stub runs on hosts where only the
standard library and ``appliance`` are needed. Env vars and failure modes: each module's own.
"""
