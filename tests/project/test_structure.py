"""The package's shape, read from the source with ``ast`` (nothing is imported): the plane rule,
no import loops among appliance modules, and no private name of one module used by another.

Import graph: one edge per ``import``/``from ... import`` statement anywhere in a module, at
module level or inside a function (a lazy import still makes a loop, it only hides it until
run time). ``from P import N`` is an edge to the module ``P.N`` when N is a module (a ``.py``
file, a package, or, as Python decides, any name package P's ``__init__`` does not bind: a
compiled extension such as ``runtime/_core``, built or not), else to ``P``. Only appliance
modules count. Loops are allowed inside ``appliance/torch`` and ``appliance/tensorflow`` only
(Horovod's module shape puts some there).

Planes: every module belongs to one (``appliance.<plane>...``; ``appliance.__main__`` is the
CLI's; the root package ``appliance`` holds the version, imports nothing, and anyone may import
it), and each plane imports only the planes ``MAY_IMPORT`` lists: data flows down, so the runtime
knows nothing of the launcher or Docker, the launcher nothing of tensors or Horovod's API, and
``common`` is the ground floor that imports no plane.

Private names: ``from M import _x``, ``M._x`` (M bound to another appliance module by an
import) and ``import M._x``, where ``_x`` is not a dunder. A private *module* (``_tensors``) may
be used by the modules of its own package and by no one else.
"""
from __future__ import annotations

import ast
from pathlib import Path

from fixtures import ROOT

PKG = ROOT / "appliance"

# plane -> the planes its modules may import (besides their own plane and the root package).
PLANES = ("common", "runtime", "torch", "tensorflow", "hvdcompat", "launcher", "cluster", "mount", "examples", "cli")
MAY_IMPORT: dict[str, set[str]] = {
    "common": set(),                                   # the ground floor
    "runtime": {"common"},                             # the collective engine
    "torch": {"runtime", "hvdcompat", "common"},       # Horovod's torch API over the runtime
    "tensorflow": {"runtime", "hvdcompat", "common"},  # Horovod's TensorFlow API over the runtime (the C door)
    "hvdcompat": {"runtime", "launcher", "common"},    # Horovod's framework-free layer (no torch), horovodrun
    "launcher": {"common", "mount"},                   # hosts, ranks, SSH, Slurm: no tensors, no Horovod API
    "cluster": {"launcher", "mount", "common"},        # Docker containers around the launcher
    "mount": {"common"},                               # the shared mount
    "examples": {"torch", "tensorflow", "runtime", "hvdcompat", "mount", "common"},  # training jobs
    "cli": set(PLANES) - {"cli"},                      # parse -> config -> call
}
ROOT_PACKAGE = "appliance"

# Loops that are allowed outside appliance/torch and appliance/tensorflow (none), each a set of modules forming one
# strongly connected component, and private names allowed across modules: (user, owner, name).
ALLOWED_LOOPS: list[set[str]] = []
ALLOWED_PRIVATE: set[tuple[str, str, str]] = set()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules() -> dict[str, Path]:
    """Module name -> source file, for every .py under appliance/."""
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _is_module(name: str) -> bool:
    if name in MODULES:
        return True
    *pkg, last = name.split(".")
    where = ROOT.joinpath(*pkg)
    # compiled extensions (appliance/runtime/_core) and their stubs
    return any(where.glob(f"{last}.*.so")) or (where / f"{last}.so").exists() or (where / f"{last}.pyi").exists()


def _bound_names(package: str) -> set[str]:
    """Names the package's ``__init__`` binds at its top level."""
    tree = ast.parse(MODULES[package].read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _is_submodule(package: str, name: str) -> bool:
    """``from package import name`` imports a module: a file, or a name its ``__init__`` lacks."""
    full = f"{package}.{name}"
    if _is_module(full):
        return True
    return (package in MODULES and MODULES[package].name == "__init__.py" and name != "*"
            and name not in _bound_names(package))


def _package(module: str) -> str:
    return module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module).split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Imports(ast.NodeVisitor):
    """Edges and private-name uses of one module."""

    def __init__(self, module: str):
        self.module = module
        self.edges: set[str] = set()
        self.lines: dict[str, int] = {}                # edge -> line of its first import
        self.private: list[tuple[str, str, int]] = []  # (owner module, name, line)
        self.aliases: dict[str, str] = {}              # local name -> appliance module

    def _edge(self, target: str, line: int) -> None:
        if target != self.module and (target == "appliance" or target.startswith("appliance.")):
            self.edges.add(target)
            self.lines.setdefault(target, line)
            self._private_path(target, line)

    def _private_path(self, target: str, line: int) -> None:
        """A private module component of ``target`` outside the importer's own package."""
        parts = target.split(".")
        for i, part in enumerate(parts):
            if _is_private(part):
                owner_pkg = ".".join(parts[:i])
                if not (self.module == owner_pkg or self.module.startswith(owner_pkg + ".")):
                    self.private.append((owner_pkg, part, line))
                return

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = alias.name
            while target and not _is_module(target):
                target = target.rpartition(".")[0]
            if target:
                self._edge(target, node.lineno)
                if alias.asname:
                    self.aliases[alias.asname] = target
                else:
                    self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _absolute(self.module, node)
        if not (base == "appliance" or base.startswith("appliance.")):
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if _is_submodule(base, alias.name):
                self._edge(full, node.lineno)
                self.aliases[alias.asname or alias.name] = full
            else:
                self._edge(base, node.lineno)
                if _is_private(alias.name) and base != self.module:
                    self.private.append((base, alias.name, node.lineno))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.aliases and _is_private(node.attr):
            owner = ".".join([self.aliases[value.id], *reversed(chain[1:])])
            if _is_module(owner) and owner != self.module:
                self.private.append((owner, node.attr, node.lineno))
        self.generic_visit(node)


def _scan() -> dict[str, _Imports]:
    out = {}
    for module, path in MODULES.items():
        v = _Imports(module)
        v.visit(ast.parse(path.read_text(), str(path)))
        out[module] = v
    return out


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _path_in(component: set[str], graph: dict[str, set[str]]) -> str:
    """One loop through the component, for the failure message."""
    start = min(component)
    path, seen, node = [start], {start}, start
    while True:
        nxt = min(n for n in graph[node] if n in component)
        path.append(nxt)
        if nxt in seen:
            return " -> ".join(path[path.index(nxt):])
        seen.add(nxt)
        node = nxt


def plane_of(module: str) -> str | None:
    """The plane of an appliance module (None for the root package)."""
    if module == ROOT_PACKAGE:
        return None
    part = module.split(".")[1]
    return "cli" if part == "__main__" else part


def plane_violations(module: str, scan: _Imports) -> list[str]:
    """One line per import of ``module`` that the plane rule forbids."""
    own = plane_of(module)
    bad = []
    for target in sorted(scan.edges):
        other = plane_of(target)
        if other is None or other == own:
            continue
        if own is None or other not in MAY_IMPORT.get(own, set()):
            bad.append(f"{scan.lines[target]}: {own or 'the root package'} imports {other} ({target})")
    return bad


def test_every_module_belongs_to_a_plane():
    stray = sorted(m for m in MODULES if m != ROOT_PACKAGE and plane_of(m) not in PLANES)
    assert not stray, f"modules outside the planes {PLANES} (declare the plane in MAY_IMPORT): {stray}"


def test_planes_import_only_the_planes_below():
    bad = []
    for module, scan in _scan().items():
        bad += [f"{MODULES[module].relative_to(ROOT)}:{line}" for line in plane_violations(module, scan)]
    assert not bad, "imports against the plane rule (tests/project/test_structure.py, MAY_IMPORT):\n" + "\n".join(bad)


def _in_framework(module: str) -> bool:
    return any(module == f"appliance.{fw}" or module.startswith(f"appliance.{fw}.") for fw in ("torch", "tensorflow"))


def test_no_import_loops_outside_the_framework_adapters():
    scans = _scan()
    graph = {m: s.edges for m, s in scans.items()}
    bad = [c for c in _cycles(graph)
           if not (all(_in_framework(m) for m in c) and len({m.split(".")[1] for m in c}) == 1)
           and not any(c == allowed for allowed in ALLOWED_LOOPS)]
    assert not bad, "import loops:\n" + "\n".join(_path_in(c, graph) for c in bad)


def test_no_private_names_across_modules():
    bad = []
    for module, scan in _scan().items():
        for owner, name, line in scan.private:
            if (module, owner, name) not in ALLOWED_PRIVATE:
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {owner}.{name}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


# --- the checker itself, on small made-up sources ---------------------------------------------
def _check_source(module: str, source: str) -> _Imports:
    v = _Imports(module)
    v.visit(ast.parse(source))
    return v


def test_the_checker_sees_lazy_imports_aliases_and_private_uses():
    v = _check_source("appliance.cluster.jobrun", (
        "def f():\n"
        "    from ..cli import build_parser\n"
        "    from ..launcher import executors as ex\n"
        "    from ..launcher.workers import _pgid_alive\n"
        "    return ex._is_local('h')\n"))
    assert {"appliance.cli", "appliance.launcher.executors", "appliance.launcher.workers"} <= v.edges
    assert ("appliance.launcher.workers", "_pgid_alive", 4) in v.private
    assert ("appliance.launcher.executors", "_is_local", 5) in v.private
    # a private module is fine within its package, not outside it
    assert not _check_source("appliance.torch.mpi_ops", "from appliance.torch import _tensors\n").private
    assert _check_source("appliance.cluster.view", "from appliance.torch._tensors import stage\n").private
    # a compiled extension, built or not, is a module of its package, not the package
    v = _check_source("appliance.runtime.api", "from appliance.runtime import _not_built_ext\n")
    assert v.edges == {"appliance.runtime._not_built_ext"} and not v.private
    # attributes of non-module names (self._x, obj._y) are not private-name uses
    assert not _check_source("appliance.cli", "import os\nx = os._exit\nclass A:\n    y = 1\nA()._y\n").private


def test_the_plane_rule_sees_lazy_relative_and_upward_imports():
    def bad(module: str, source: str) -> list[str]:
        return plane_violations(module, _check_source(module, source))

    # a lazy import counts, and a relative one resolves to its plane
    assert bad("appliance.runtime.api", "def f():\n    from appliance.launcher import launch\n") == [
        "2: runtime imports launcher (appliance.launcher)"]
    assert bad("appliance.launcher.run", "from ..runtime import devices\n") == [
        "1: launcher imports runtime (appliance.runtime.devices)"]
    assert bad("appliance.launcher.ssh.worker", "from ...torch import mpi_ops\n") == [
        "1: launcher imports torch (appliance.torch.mpi_ops)"]
    assert bad("appliance.launcher.hosts", "import appliance.hvdcompat.horovodrun\n") == [
        "1: launcher imports hvdcompat (appliance.hvdcompat.horovodrun)"]
    assert bad("appliance.hvdcompat.util", "import appliance.torch\n") == ["1: hvdcompat imports torch (appliance.torch)"]
    # appliance.tensorflow is a framework adapter like appliance.torch: above the runtime, beside torch
    assert bad("appliance.launcher.run", "import appliance.tensorflow\n") == [
        "1: launcher imports tensorflow (appliance.tensorflow)"]
    assert bad("appliance.runtime.engine", "from appliance.tensorflow import mpi_ops\n")
    assert bad("appliance.tensorflow.mpi_ops", "import appliance.torch\n")
    assert not bad("appliance.tensorflow.mpi_ops", "from appliance.runtime import api\nfrom appliance.hvdcompat import util\n")
    assert bad("appliance.cluster.primary", "from appliance.runtime import api\n")
    assert bad("appliance.common.slurm", "from appliance.mount import Layout\n")
    assert bad("appliance", "from appliance import cli\n")  # the root package imports no plane
    # allowed: downward, within a plane, and the root package's version from anywhere
    assert not bad("appliance.torch.mpi_ops", "from appliance.hvdcompat.util import x\nfrom .. import runtime\n")
    assert not bad("appliance.hvdcompat.horovodrun",
                   "from appliance.launcher import run\nfrom appliance import __version__\n")
    assert not bad("appliance.cluster.jobrun", "from ..launcher.hosts import Host\nfrom ..mount import Layout\n")
    assert not bad("appliance.__main__", "from appliance.cli import main\n")


def test_the_checker_finds_a_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    (component,) = _cycles(graph)
    assert component == {"a", "b", "c"} and _path_in(component, graph) == "a -> b -> c -> a"


# --- the C++ core's floors (appliance/runtime/csrc) --------------------------------------------
# Each folder of the core is a floor; a file may include its own folder's headers and those of
# lower floors, never a higher floor's nor a sibling's on the same floor (siblings are
# independent: collectives never see an operation, backends never open a link). Subfolders
# (transport/tcp, backends/nccl) belong to their folder's floor. Read from the sources; no build.
import re  # noqa: E402  (this part of the file stands on its own)

CORE = ROOT / "appliance" / "runtime" / "csrc"
CORE_FLOORS: list[set[str]] = [
    {"common"},                              # status, dtypes, crypto, logging: needs nothing
    {"wire"},                                # frame codec, payload Reader/Writer
    {"transport", "coordinator", "fusion"},  # links and channels; rank 0's negotiation; packing
    {"store", "collectives", "ops"},         # rendezvous store; algorithms over a Comm; op state
    {"bootstrap", "backends"},               # store + links -> mesh; plan entries -> collectives
    {"engine"},                              # the Runtime
    {"capi"},                                # the C door: frameworks' op libraries
    {"bindings"},                            # Python
]
_CORE_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _core_floor(folder: str) -> int:
    for level, floor in enumerate(CORE_FLOORS):
        if folder in floor:
            return level
    raise AssertionError(f"csrc/{folder}/ is on no floor: add it to CORE_FLOORS in {Path(__file__).name}")


def _core_includes(root: Path = CORE) -> list[tuple[str, int, str]]:
    """(file relative to root, line, included path) for every quoted include of the core."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cc", ".cpp", ".hpp") or not path.is_file():
            continue
        text = path.read_text()
        for m in _CORE_INCLUDE.finditer(text):
            found.append((path.relative_to(root).as_posix(), text.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


def _core_violations(includes: list[tuple[str, int, str]]) -> list[str]:
    """Includes that go up a floor or sideways to a sibling, and quoted includes the core lacks."""
    bad = []
    for rel, line, target in includes:
        src, dst = rel.split("/")[0], target.split("/")[0]
        if "/" not in rel or "/" not in target:
            bad.append(f"{rel}:{line}: #include \"{target}\": every core file and include path names its folder")
            continue
        if src == dst:
            continue
        a, b = _core_floor(src), _core_floor(dst)
        if b > a:
            bad.append(f"{rel}:{line}: #include \"{target}\": {src}/ (floor {a}) may not include "
                       f"{dst}/ (floor {b}, above it)")
        elif b == a:
            bad.append(f"{rel}:{line}: #include \"{target}\": {src}/ and {dst}/ are siblings on floor {a}")
    return bad


def _core_file_graph(includes: list[tuple[str, int, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, _, target in includes:
        graph.setdefault(rel, set()).add(target)
        graph.setdefault(target, set())
    return graph


def _core_folder_graph(includes: list[tuple[str, int, str]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for rel, _, target in includes:
        src, dst = rel.split("/")[0], target.split("/")[0]
        graph.setdefault(src, set())
        graph.setdefault(dst, set())
        if src != dst:
            graph[src].add(dst)
    return graph


def test_core_includes_only_point_down_its_floors():
    includes = _core_includes()
    assert includes, f"no includes found under {CORE}"
    missing = [f"{rel}:{line}: #include \"{t}\"" for rel, line, t in includes if not (CORE / t).is_file()]
    assert not missing, "includes of files the core does not have:\n" + "\n".join(missing)
    bad = _core_violations(includes)
    assert not bad, "includes against the core's floors:\n" + "\n".join(bad)


def test_core_has_no_include_cycles_between_folders_or_files():
    includes = _core_includes()
    for graph, what in ((_core_folder_graph(includes), "folders"), (_core_file_graph(includes), "files")):
        loops = _cycles(graph)
        assert not loops, f"include cycles between {what}:\n" + "\n".join(_path_in(c, graph) for c in loops)


def test_every_core_folder_is_on_one_floor():
    folders = {p.name for p in CORE.iterdir() if p.is_dir() and any(p.rglob("*.[ch]*"))}
    named = [f for floor in CORE_FLOORS for f in floor]
    assert len(named) == len(set(named)), "a folder is on two floors"
    assert folders == set(named), f"folders without a floor: {sorted(folders - set(named))}; " \
                                  f"floors without a folder: {sorted(set(named) - folders)}"


def test_the_floor_check_refuses_an_include_up_or_sideways_and_a_cycle(tmp_path):
    for rel, text in {"common/status.h": "#pragma once\n",
                      "wire/codec.h": '#include "common/status.h"\n#include "engine/runtime.h"\n',
                      "transport/link.h": '#include "coordinator/request.h"\n',
                      "engine/runtime.h": '#include "wire/codec.h"\n',
                      "coordinator/request.h": "#pragma once\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    includes = _core_includes(tmp_path)
    bad = sorted(_core_violations(includes))
    assert len(bad) == 2, bad
    assert bad[0].startswith("transport/link.h:1:") and "siblings on floor 2" in bad[0], bad
    assert bad[1].startswith("wire/codec.h:2:") and "above it" in bad[1], bad
    (loop,) = _cycles(_core_folder_graph(includes))
    assert loop == {"wire", "engine"}
    assert _cycles(_core_file_graph(includes)) == [{"wire/codec.h", "engine/runtime.h"}]


def test_the_engine_includes_no_concrete_backend():
    """The engine holds a BackendRegistry: of backends/ it includes the interface and the registry."""
    allowed = {"backends/backend.h", "backends/registry.h"}
    bad = [f"{rel}:{line}: #include \"{t}\"" for rel, line, t in _core_includes()
           if rel.startswith("engine/") and t.startswith("backends/") and t not in allowed]
    assert not bad, "the engine includes a concrete backend (use backends/registry.h):\n" + "\n".join(bad)
