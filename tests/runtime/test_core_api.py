"""The core's Python API as declared: every engine knob of ``appliance.common.knobs`` feeds an
engine option (csrc/engine/options.h) with the same default, so a knob is copied into the core by
name and declared in two places only."""
from appliance.common.knobs import KNOBS
from appliance.runtime import _core
from appliance.runtime.config import RuntimeConfig


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
