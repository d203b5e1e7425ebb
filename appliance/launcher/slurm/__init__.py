"""The srun launcher: inside a Slurm allocation, every rank is a task of one ``srun`` step.

What it holds: ``step`` (which launcher a job uses, ``launcher_of``; the step's private
directory; ``SrunStep``, the running step as ``failures.wait_for_end`` sees a worker group) and
``task`` (the wrapper ``srun`` runs as each task, ``python -m appliance.launcher.slurm.task``:
the rank's environment from Slurm's, its start and exit records). The allocation itself (its
nodes and tasks, a task's place) is read by ``appliance.common.slurm``, below the launcher and
the runtime, which both need it; the hosts and rank layout are the launcher's own (``hosts``),
the same as over SSH.

Importing this package loads neither module: each task imports only what its wrapper needs.
Env vars and failure modes: each module's own.
"""
