"""The appliance plane: Docker containers that make hosts into a cluster around one shared mount.

Modules: ``config`` (``ClusterConfig``), ``docker`` (Docker SDK access, names ``appliance-*``,
labels, the flags every container gets, networks), ``secondary`` (``appliance secondary``: the
sshd container), ``primary`` (``appliance primary``: the primary container, output streaming,
signals), ``status`` (``appliance status``), ``view`` (the per-host startup view), ``jobrun``
(runs inside the primary container: ``python -m appliance.cluster.jobrun``, one launcher run
whose preflight checks every host), ``rankexec`` (records each rank's start), ``locksweep``
(locks whose holder's container is gone) and ``say`` (the plane's own ``appliance primary:``
lines). The shared mount's layout, locks and atomic files are ``appliance.mount``, a package of
its own that training jobs use without this one.
Env vars: through ``appliance.cluster.config.ClusterConfig`` only.
"""
