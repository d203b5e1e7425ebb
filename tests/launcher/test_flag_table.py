"""The launch flags are declared once (``appliance/launcher/flagtable.py``): one row added to the
table reaches ``appliance launch``, ``horovodrun``, ``LaunchFlags`` (and its JSON) and
``LaunchConfig``; ``launch()`` and ``horovod.run()`` take the flags by the table's names. Pure logic."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from appliance.launcher import flagtable


def test_one_added_row_reaches_both_clis_and_the_config():
    # A fresh interpreter where the table has one more row, as if it were written in flagtable.py.
    program = textwrap.dedent("""
        from appliance.launcher import flagtable
        flagtable.FLAGS = flagtable.FLAGS + (flagtable.Flag(
            "job_timeout", ("--job-timeout",), "seconds for the whole job", float, "S", config="timeout",
            api="job_timeout", check=False),)
        from appliance.cli import build_parser
        from appliance.hvdcompat import horovodrun
        from appliance.launcher.flags import LaunchFlags, launch_config, parse_launch_flags
        from appliance.launcher.flagtable import api_kwargs
        cli = launch_config(build_parser().parse_args(["launch", "-np", "1", "--job-timeout", "5", "prog"]), environ={})
        hr = horovodrun.parse(["-np", "1", "--job-timeout", "6", "prog"])
        flags, _ = parse_launch_flags(["-np", "1", "--job-timeout", "7", "prog"])
        again = LaunchFlags.from_json(flags.to_json())
        assert api_kwargs({"job_timeout": 8.0}) == {"timeout": 8.0}
        print(cli.timeout_s, hr.flags.launch_config(hr.command, environ={}).timeout_s, again.job_timeout,
              again.launch_config(["prog"], environ={}).timeout_s)
        """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["5.0", "6.0", "7.0", "7.0"]
    # and without the row, none of them knows the flag
    from appliance.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "-np", "1", "--job-timeout", "5", "prog"])


def test_every_row_has_one_parser_spelling_and_a_known_knob():
    from appliance.common.knobs import KNOBS
    names = [n for f in flagtable.FLAGS for n in f.names]
    assert len(names) == len(set(names))
    assert all(f.knob in KNOBS for f in flagtable.FLAGS if f.knob)


def test_python_api_names_map_onto_the_config_keywords():
    assert flagtable.api_kwargs({"ssh_key": "/k", "output": "/o", "forward": ["A"], "hostfile": None}) == {
        "key": "/k", "output_dir": "/o", "forward": ("A",)}
    assert flagtable.api_kwargs({"num_proc": 3, "slots": 2, "cooldown_range": [1, 2], "executable": "/py"},
                                horovod=True) == {"np": 3, "slots_per_host": 2, "blacklist_cooldown_range": (1, 2),
                                                  "remote_python": "/py"}
    with pytest.raises(TypeError, match="bogus"):
        flagtable.api_kwargs({"bogus": 1})
    from appliance.launcher import launch
    with pytest.raises(TypeError, match="bogus"):
        launch(["true"], 1, bogus=1)
