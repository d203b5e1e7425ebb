"""README documents every knob of appliance/common/knobs.py, and nothing that is not one."""
import re
from pathlib import Path

from appliance.common.knobs import KNOBS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_knob_is_in_the_readme_table():
    table = set(re.findall(r"^\| `([A-Z_]+)` \|", README, re.M))
    assert set(KNOBS) <= table, sorted(set(KNOBS) - table)
    assert table <= set(KNOBS), sorted(table - set(KNOBS))
