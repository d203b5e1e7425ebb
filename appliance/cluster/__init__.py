"""The appliance plane: Docker containers that make hosts into a cluster around one shared mount.

Modules: ``engine`` (docker SDK access, names ``appliance-*``, labels, the flags every container
gets, networks), ``secondary`` (``appliance secondary``: the sshd container), ``primary``
(``appliance primary``: the primary container, output streaming, signals), ``status``
(``appliance status``), ``view`` (the per-host startup view), ``driver`` (runs inside the primary
container: per-host checks, then ``appliance launch``) and ``rankexec`` (records each rank's
start). The shared mount's layout, locks and atomic files are ``appliance.mount``, a package of
its own that training jobs use without this one.
Env vars: through ``appliance.cluster.config.ClusterConfig`` only.
"""
