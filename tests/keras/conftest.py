"""tests/keras: TensorFlow must be installed (the ``test`` extra installs tensorflow-cpu), and
tf-keras for the tests that run under ``TF_USE_LEGACY_KERAS=1``. Without them each test skips
locally and fails under ``--strict-prereqs`` (CI), so the Keras tests cannot silently vanish.
The check asks for the modules' specs only: TensorFlow is imported by the ranks, never by pytest."""
from __future__ import annotations

import importlib.util

import pytest


def _need(request, module: str, how: str) -> None:
    if importlib.util.find_spec(module) is not None:
        return
    msg = f"{module} not installed ({how})"
    if request.config.getoption("--strict-prereqs"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(autouse=True)
def tensorflow_installed(request):
    _need(request, "tensorflow", "pip install -e '.[test]' installs tensorflow-cpu")


@pytest.fixture
def tf_keras_installed(request):
    _need(request, "tf_keras", "pip install --no-deps tf-keras==2.21.0")
