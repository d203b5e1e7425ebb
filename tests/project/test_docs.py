"""The documentation: docs/knobs.md is what docs/gen_knobs.py makes from the knob table, README
stays short, every relative link leads to a file (and heading) that exists, and no page cites
issue numbers. Pure text checks: nothing is built or started.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from appliance.common.knobs import KNOBS
from fixtures import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 200


def _gen_knobs():
    spec = importlib.util.spec_from_file_location("gen_knobs", DOCS / "gen_knobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # [text](link) -> text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", "", path.read_text())
    for m in re.finditer(r"(?m)^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", text):
        base = _slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    prose = _prose(path.read_text())
    inline = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose)
    reference = re.findall(r"(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", prose)
    html = re.findall(r"<(?:a|img)\b[^>]*\b(?:href|src)=\"([^\"]+)\"", prose)
    return inline + reference + html


def test_knobs_page_is_what_the_generator_makes():
    expected = _gen_knobs().render()
    actual = (DOCS / "knobs.md").read_text() if (DOCS / "knobs.md").exists() else ""
    assert actual == expected, (
        "docs/knobs.md differs from the knob table in appliance/common/knobs.py: "
        "regenerate it with `python docs/gen_knobs.py` and commit the result")


def test_every_knob_has_one_row():
    rows = re.findall(r"(?m)^\| `([A-Z0-9_]+)` \|", (DOCS / "knobs.md").read_text())
    assert sorted(rows) == sorted(KNOBS), (
        "docs/knobs.md rows and KNOBS differ: run `python docs/gen_knobs.py`")


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines, more than {README_MAX_LINES}: move the details to a page in docs/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page):
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I):   # http:, https:, mailto:...
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers(page):
    hits = [line for line in page.read_text().splitlines()
            if re.search(r"\bissues?\s*(#\s*)?\d+|(^|[\s(])#\d+\b", line, re.I)]
    assert not hits, (f"{page.relative_to(ROOT)} cites issue numbers (history belongs in commit "
                      "messages):\n  " + "\n  ".join(hits))
