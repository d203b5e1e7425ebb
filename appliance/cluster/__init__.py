"""The appliance plane: Docker containers that make hosts into a cluster around one shared mount.

Modules: ``engine`` (docker SDK access, names ``appliance-*``, labels, the flags every container
gets, networks), ``secondary`` (``appliance secondary``: the sshd container), ``primary``
(``appliance primary``: the primary container, output streaming, signals), ``status``
(``appliance status``), ``view`` (the per-host startup view), ``driver`` (runs inside the primary
container: per-host checks, then ``appliance launch``), ``rankexec`` (records each rank's start),
``shared`` (the shared mount's layout, run and host locks, atomic writes) and ``locks`` (lock
files with owner records and dead-holder detection). Importing this package imports nothing
heavy: ``shared``/``locks`` are used by training jobs, which must not need the docker SDK.
Env vars: through ``appliance.config.ClusterConfig`` only.
"""
