"""The core's Python API as declared: ``_core.pyi`` matches the compiled module, and every engine
knob of ``appliance.common.knobs`` feeds an engine option (csrc/common/options.h) with the same
default, so a knob is copied into the core by name and declared in two places only."""
import ast
from pathlib import Path

from appliance.common.knobs import KNOBS
from appliance.runtime import _core
from appliance.runtime.config import RuntimeConfig
from fixtures import ROOT

STUB = ast.parse((ROOT / "appliance" / "runtime" / "_core.pyi").read_text())


def _stub_class(name):
    return next(n for n in STUB.body if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls) -> dict:
    out = {}
    for n in cls.body:
        if isinstance(n, ast.Assign):
            out[n.targets[0].id] = ast.literal_eval(n.value)
        elif isinstance(n, ast.AnnAssign):
            out[n.target.id] = None
        elif isinstance(n, ast.FunctionDef) and not n.name.startswith("__"):
            out[n.name] = None
    return out


def test_every_engine_knob_feeds_an_option_with_its_default():
    fed = {k.core: k for k in KNOBS.values() if k.core}
    assert len(fed) == len([k for k in KNOBS.values() if k.core]), "two knobs feed one option"
    assert set(fed) == set(_core.ENGINE_OPTIONS), "options without a knob, or knobs naming no option"
    for option, knob in fed.items():
        assert _core.ENGINE_OPTIONS[option] == knob.default, (knob.env, option)
    assert RuntimeConfig.from_env({}).options == _core.ENGINE_OPTIONS
    cfg = _core.RuntimeConfig()
    for option, default in _core.ENGINE_OPTIONS.items():
        assert getattr(cfg, option) == default


def test_knobs_reach_the_core_by_name():
    options = RuntimeConfig.from_env({"HOROVOD_FUSION_THRESHOLD": "2M", "HOROVOD_STALL_CHECK_DISABLE": "1",
                                      "HOROVOD_TIMELINE": "DYNAMIC"}).options
    assert options["fusion_threshold"] == 2 << 20 and options["stall_check_disable"] is True
    assert options["timeline"] == "DYNAMIC"  # the core reads DYNAMIC as "not from init"


def test_the_stub_declares_the_module():
    for enum_name in ("DataType", "ReduceOp", "OpKind"):
        declared = _members(_stub_class(enum_name))
        assert declared == {m.name: m.value for m in getattr(_core, enum_name)}, enum_name
    declared = _members(_stub_class("RuntimeConfig"))
    actual = {n for n in dir(_core.RuntimeConfig()) if not n.startswith("_")}
    assert set(declared) == actual
    for cls in ("Runtime", "Request", "Result"):
        declared = set(_members(_stub_class(cls)))
        actual = {n for n in dir(getattr(_core, cls)) if not n.startswith("_")}
        assert declared == actual, cls
    functions = {n.name for n in STUB.body if isinstance(n, ast.FunctionDef)}
    assert functions == {n for n in dir(_core) if callable(getattr(_core, n)) and not n.startswith("_")
                         and not isinstance(getattr(_core, n), type)}


def test_horovod_constants_are_the_core_codes_as_plain_ints():
    import appliance.runtime as rt

    for name in ("Average", "Sum", "Adasum", "Min", "Max", "Product"):
        value = getattr(rt, name)
        assert type(value) is int and value == _core.ReduceOp[name.upper()]
    assert (rt.Average, rt.Sum, rt.Adasum, rt.Min, rt.Max, rt.Product) == (0, 1, 2, 3, 4, 5)


def test_the_negotiation_simulator_is_in_the_test_build_only():
    """The virtual job (N negotiators wired in memory, tests/cpp/virtual) is the test-only extension's:
    the product module neither offers it nor carries its code."""
    from appliance.runtime import _core_testing

    assert not hasattr(_core, "negotiation_model")
    cost = _core_testing.negotiation_model("tree", 4, 2)
    assert set(cost) == {"rank0_ns", "rank0_msgs", "max_msgs", "hops"} and cost["rank0_ns"] > 0, cost
    # A message only the simulator's code has, looked for in both shared objects.
    marker = b"ranks, ops and tensors must be positive"
    assert marker in Path(_core_testing.__file__).read_bytes()
    assert marker not in Path(_core.__file__).read_bytes()
