"""The ground floor: what every plane reads and no plane owns.

Modules: ``knobs`` (the one knob table and its reader), ``ranks`` (a rank's place in a job, the
one rank-layout type), ``slurm`` (Slurm's environment, read), ``jobsecret`` (a job's secret kept
in a file), ``netif`` (network interfaces). Nothing here
imports a plane (runtime, torch, launcher, cluster, mount).
"""
