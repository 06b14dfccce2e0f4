"""Issue 42: the atlas page is generated from the committed sweep data, and agrees with it."""

from __future__ import annotations

import json

from conftest import ROOT, load_module

atlas = load_module(ROOT / "scripts" / "atlas.py", "atlas_script")


def test_the_page_is_what_render_makes_of_the_committed_data():
    assert atlas.PAGE.read_text() == atlas.render(), "run `python scripts/atlas.py render` and commit docs/atlas.md"


def test_every_line_names_its_entry_once_and_a_verdict():
    for library in atlas.LIBRARIES:
        path = atlas.DATA / f"{library}.jsonl"
        if not path.exists():
            continue
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert lines, path
        assert all(line["spec"].startswith(f"{library}:") for line in lines)
        assert all(line["verdict"] in ("certified", "uncertified", "supercritical", "failed", "timeout")
                   for line in lines), {line["verdict"] for line in lines}
        assert all("versions" in line for line in lines)


def test_the_counts_row_adds_up():
    """Each library's row: certified + supercritical + other uncertified + failed + timed out = entries."""
    for row in atlas.render().splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if cells[0] in atlas.LIBRARIES:
            entries, *kinds = (int(cell) for cell in cells[1:7])
            assert entries == sum(kinds), row
