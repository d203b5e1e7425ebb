"""The launcher's set-up stays in one place: the shape ``appliance/launcher`` keeps so that hosts,
keys, ports and flags are found once (flags declared once: ``test_flag_table.py``).

- ``mechanism.Mechanism``, what every way of starting ranks implements, stays a handful of methods
  (prepare, start, signal, wait, close), and each mechanism (the executors', srun's static and
  elastic step) has them all: static and elastic srun are two classes, not one with a branch.
- Executors are made in one place, ``hostset.py`` (hosts opened one way, static and elastic alike).
- ``run.run`` and ``elastic.launch.run_elastic`` both enter ``setup.JobSetup``.

Pure logic: the source is read with ``ast``; ``check`` is run on a broken copy once, so a rule that
no longer finds anything fails too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import appliance.launcher as launcher_pkg
from appliance.launcher import mechanism
from appliance.launcher.slurm import step as srun

LAUNCHER = Path(launcher_pkg.__file__).parent
MAX_METHODS = 5
EXECUTORS = {"SSHExecutor", "LocalExecutor"}


def methods(cls: type) -> set[str]:
    tree = ast.parse(Path(mechanism.__file__).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__).body
    return {n.name for n in body if isinstance(n, ast.FunctionDef)}


def check(sources: dict[str, str]) -> list[str]:
    """What breaks the rules in ``sources`` (path relative to appliance/launcher -> text)."""
    wrong = []
    entered = {}
    for rel, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in EXECUTORS and rel != "hostset.py":
                    wrong.append(f"{rel}:{node.lineno}: makes a {name}; hosts are opened in hostset.py only")
            if isinstance(node, ast.FunctionDef) and node.name in ("run", "run_elastic"):
                entered[(rel, node.name)] = any(
                    isinstance(w, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                                    and getattr(i.context_expr.func, "id", None) == "JobSetup"
                                                    for i in w.items)
                    for w in ast.walk(node))
    for where in (("run.py", "run"), ("elastic/launch.py", "run_elastic")):
        if not entered.get(where):
            wrong.append(f"{where[0]}: {where[1]}() does not enter JobSetup")
    return wrong


def launcher_sources() -> dict[str, str]:
    return {str(p.relative_to(LAUNCHER)): p.read_text() for p in LAUNCHER.rglob("*.py")}


def test_mechanism_stays_a_handful_of_methods_that_every_mechanism_has():
    declared = methods(mechanism.Mechanism)
    assert declared == {"prepare", "start", "signal", "wait", "close"} and len(declared) <= MAX_METHODS, declared
    for impl in (mechanism.Executors, srun.SrunStatic, srun.SrunElastic):
        missing = [m for m in declared if not callable(getattr(impl, m, None))]
        assert not missing, f"{impl.__name__} lacks {missing}"
    assert not issubclass(srun.SrunStatic, srun.SrunElastic) and not issubclass(srun.SrunElastic, srun.SrunStatic)


def test_hosts_are_opened_one_way_and_every_job_enters_the_shared_set_up():
    sources = launcher_sources()
    assert check(sources) == []
    # the rules see a break: an executor made elsewhere, and a run() that skips JobSetup
    broken = dict(sources)
    broken["run.py"] = sources["run.py"].replace("with JobSetup(", "with contextlib.nullcontext(")
    broken["elastic/driver.py"] = sources["elastic/driver.py"] + "\n\ndef _f():\n    return SSHExecutor('h')\n"
    found = check(broken)
    assert any("run.py: run() does not enter JobSetup" in w for w in found), found
    assert any(w.startswith("elastic/driver.py:") and "SSHExecutor" in w for w in found), found
