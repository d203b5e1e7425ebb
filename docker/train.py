"""``python -m train`` in the appliance image: the default training job (``appliance.examples.train``).

Resolution rule: Python puts the working directory first on ``sys.path`` for ``python -m``, and
``appliance primary`` runs the ranks in the shared directory, so a ``train.py`` (or a ``train/``
package) there is the one that runs; this module, installed in /opt/venv's site-packages, is used
only when the working directory has none. Arguments are the default job's (``--epochs``,
``--batch-size``, ``--run``...: ``python -m train --help``).
"""
from appliance.examples.train import main

if __name__ == "__main__":
    raise SystemExit(main())
