"""tests/tensorflow: TensorFlow must be installed (the ``test`` extra installs tensorflow-cpu).
Without it each test skips locally and fails under ``--strict-prereqs`` (CI), as the tiers' tools
do, so the TensorFlow tests cannot silently vanish. The check asks for the module's spec only:
TensorFlow itself is imported by the ranks, never by pytest."""
from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(autouse=True)
def tensorflow_installed(request):
    if importlib.util.find_spec("tensorflow") is not None:
        return
    msg = "tensorflow not installed (pip install -e '.[test]' installs tensorflow-cpu)"
    if request.config.getoption("--strict-prereqs"):
        pytest.fail(msg)
    pytest.skip(msg)
