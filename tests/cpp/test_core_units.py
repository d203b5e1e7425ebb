"""The C++ unit tests of the core (tests/cpp/units, GoogleTest), run from pytest.

They are one binary, built beside the test-only extension when the core is configured with
APPLIANCE_BUILD_TESTS=ON (tests/run.sh does); the extension records where it is
(``_core_testing.CORE_UNITS``). The binary runs once per session with a JSON report; each C++
test is one pytest test named after it (``Suite.spec_as_words``), which fails with the C++
failure messages. When the extension or the binary is missing, ``test_the_cpp_unit_tests_are_built``
skips with the reason, or fails under ``--strict-prereqs``.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest


def _locate() -> tuple[str | None, str]:
    """(path of the unit test binary, "") or (None, why there is none)."""
    try:
        from appliance.runtime import _core_testing
    except ImportError as e:
        return None, (f"the test-only extension appliance.runtime._core_testing is not built ({e}); install with "
                      "--config-settings=cmake.define.APPLIANCE_BUILD_TESTS=ON, as tests/run.sh does")
    path = _core_testing.CORE_UNITS
    if not path:
        return None, "GoogleTest (Debian: libgtest-dev) was missing when the core was configured: no C++ unit tests"
    if not os.access(path, os.X_OK):
        return None, f"the C++ unit test binary {path} is gone (its build dir was removed?): reinstall"
    return path, ""


def _list(binary: str) -> list[str]:
    out = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, timeout=60, check=True).stdout
    names, suite = [], ""
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


BINARY, WHY = _locate()
NAMES = _list(BINARY) if BINARY else []


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Runs the binary once: {test name: [failure texts]} and the finished process."""
    report = tmp_path_factory.mktemp("core_units") / "report.json"
    proc = subprocess.run([BINARY, f"--gtest_output=json:{report}"], capture_output=True, text=True, timeout=600)
    found: dict[str, list[str]] = {}
    if report.exists():
        for suite in json.loads(report.read_text()).get("testsuites", []):
            for test in suite.get("testsuite", []):
                found[f"{suite['name']}.{test['name']}"] = [f.get("failure", "") for f in test.get("failures", [])]
    return found, proc


def test_the_cpp_unit_tests_are_built(request):
    if BINARY:
        assert NAMES, f"{BINARY} lists no tests"
        return
    if request.config.getoption("--strict-prereqs"):
        pytest.fail(WHY)
    pytest.skip(WHY)


@pytest.mark.parametrize("name", NAMES)
def test_core_unit(name, results):
    found, proc = results
    if name not in found:
        pytest.fail(f"{name} did not run (the binary exited with {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    assert not found[name], f"{name}:\n" + "\n".join(found[name])
