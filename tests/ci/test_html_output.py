"""The HTML report: the ladder, the derivation graphs, remedies, escaping, the notebook repr and a
real browser's rendering of it."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import subprocess
from collections import Counter

import pytest
import torch
from click.testing import CliRunner

from qlint.analysis import Options, run_specs
from qlint.ci import html_report
from qlint.ci.formats import render
from qlint.cli import main
from qlint.core import results
from qlint.core.results import Block, Finding, ModelReport, Report, Source
from conftest import fixture_spec

NATIVE, RMSNORM = fixture_spec("mamba.py:native"), fixture_spec("mamba.py:rmsnorm")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "headless_shell")


@pytest.fixture(scope="module")
def native() -> Report:
    return run_specs([NATIVE], Options(witness=False))


@pytest.fixture(scope="module")
def certified() -> Report:
    return run_specs([RMSNORM], Options(witness=False))


def _graphs(page: str) -> int:
    return page.count('aria-label="derivation graph"')


def test_the_engine_records_the_derivation_graph_of_failing_blocks(native, certified):
    record = native.models[0].blocks[0].extra["derivation_graph"]
    nodes = record["nodes"]
    assert nodes[0]["op"] == "block input X_k"
    dominant = nodes[record["dominant"]]
    assert (dominant["op"], dominant["q"], dominant["source"]["line"]) == ("Hadamard product", "5", 115)
    assert all(source < target for source, target in record["edges"])  # a DAG, in graph order
    assert [0, len(nodes) - 1] in record["edges"]  # the skip: X_k to the join
    assert max(node["count"] for node in nodes) == 8  # the scan, unrolled over the 8 steps, is one node per op
    assert {node["status"] for node in nodes} == {"ok", "supercritical"}
    assert all("derivation_graph" not in block.extra for block in certified.models[0].blocks)


def test_the_derivation_graph_survives_json_and_the_cache(native):
    model = native.models[0]
    record = model.blocks[0].extra["derivation_graph"]
    assert json.loads(json.dumps(model.to_dict()))["blocks"][0]["derivation_graph"] == record
    assert pickle.loads(pickle.dumps(model)).blocks[0].extra["derivation_graph"] == record  # the result cache pickles


def test_html_shows_every_block_its_q_and_the_graph_of_each_failing_block(native):
    page = render(native, "html")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for block in native.models[0].blocks:
        assert re.search(rf"<code>{re.escape(block.name)}</code></td><td class=\"q\">5</td>", page)
    assert _graphs(page) == 1  # layers.1 repeats layers.0 and is named, not drawn again
    assert "derivation graph: the same as <code>layers.0</code>" in page
    assert f'fill="{html_report.DOMINANT_FILL}"' in page and "Hadamard product · q=5" in page
    assert "qlint/zoo/mamba.py:115" in page and "QL101" in page
    for reference in ("http://", "https://", "<script", "src=", "@import", "url(http"):
        assert reference not in page


def test_a_certified_model_has_a_ladder_and_no_graph(certified):
    page = render(certified, "html")
    assert 'class="ladder"' in page and page.count('<td class="q">0</td>') == 2
    assert _graphs(page) == 0 and ">certified</span>" in page


def test_cli_writes_the_html_report_and_exits_1(tmp_path):
    target = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(main, [NATIVE, "--isolated", "--no-cache", "--no-witness",
                                       "--output-format", "html", "-o", str(target)])
    assert result.exit_code == 1, result.output
    page = target.read_text()
    assert _graphs(page) == 1 and "layers.1" in page
    copy = tmp_path / "copy.html"
    result = CliRunner().invoke(main, [RMSNORM, "--isolated", "--no-cache", "--no-witness",
                                       "--output", f"html:{copy}"])
    assert result.exit_code == 0, result.output
    assert 'class="ladder"' in copy.read_text()


def _hostile() -> Report:
    name = '<script>alert("x")</script>'
    graph = {"nodes": [{"op": "<img src=x onerror=alert(1)>", "q": "2", "status": "supercritical",
                        "source": {"file": "m&<u>.py", "line": 3}, "count": 1}], "edges": [], "dominant": 0}
    patches = [{"kind": "preln", "path": "m.py", "q_after": 0.0,
                "diff": "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-return x + f(x)  # </pre>\n+return x + f(norm(x))\n"}]
    block = Block(name, 0, 2.0, "supercritical", [], dominant="<u>gate</u>", source=Source("m.py", 1),
                  extra={"derivation_graph": graph, "patches": patches})
    finding = Finding("QL101", "error", f"block `{name}` is supercritical", name, Source("m.py", 1))
    return Report([ModelReport('m.py:"<evil>"', "fx", "eval", [block], [finding])])


def test_everything_from_the_model_is_escaped():
    page = render(_hostile(), "html")
    assert "<script" not in page and "<img" not in page and "<u>" not in page and '"<evil>"' not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "m&amp;&lt;u&gt;.py:3" in page
    assert html_report.escape("a'b\"<&>") == "a&#x27;b&quot;&lt;&amp;&gt;"


def test_patches_are_drawn_as_coloured_diffs():
    page = render(_hostile(), "html")
    assert '<span class="del">-return x + f(x)  # &lt;/pre&gt;</span>' in page
    assert '<span class="add">+return x + f(norm(x))</span>' in page
    assert '<span class="hunk">@@ -1 +1 @@</span>' in page
    assert '<span class="context">+++ b/m.py</span>' in page  # file headers are not additions


def test_the_notebook_shows_the_report(native):
    formatters = pytest.importorskip("IPython.core.formatters")
    formatter = formatters.DisplayFormatter()
    for shown in (native, native.models[0]):
        data, _ = formatter.format(shown)
        assert 'class="ladder"' in data["text/html"] and _graphs(data["text/html"]) == 1
        assert "<!DOCTYPE" not in data["text/html"]  # a fragment with its style scoped to .qlint


def test_without_a_registered_renderer_the_repr_is_plain_text(native, monkeypatch):
    monkeypatch.setattr(results, "_html_renderer", None)
    assert native._repr_html_() == f"<pre>{NATIVE}: supercritical, max q = 5</pre>"


# --- a real browser ------------------------------------------------------------------------------


def _browser() -> str:
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None:
        pytest.skip(f"no headless browser found (looked for {', '.join(BROWSERS)}): the page is not rendered")
    return found


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def test_chromium_renders_the_ladder_and_a_derivation_graph(native, tmp_path):
    browser = _browser()
    image_module = pytest.importorskip("PIL.Image")
    page = tmp_path / "mamba.html"
    page.write_text(render(native, "html"))
    shot = tmp_path / "mamba.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1300,2200", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = image_module.open(shot).convert("RGB")
    colours = Counter({colour: count for count, colour in image.getcolors(1 << 24)})
    assert len(colours) > 50 and colours.most_common(1)[0][1] < 0.97 * image.size[0] * image.size[1]  # not blank
    bar = bytes(_rgb(html_report.STATUS_COLOUR["supercritical"])) * 240  # q = 5 of max q 5: the whole 260px track
    assert bar in image.tobytes()  # a run of 240 pixels in a row: a ladder bar, not a verdict badge
    box = html_report.NODE_WIDTH * html_report.NODE_HEIGHT
    assert colours[_rgb(html_report.DOMINANT_FILL)] >= 0.6 * box  # the dominant op's box
    assert colours[_rgb(html_report.NODE_FILL["supercritical"])] >= 5 * 0.6 * box  # the supercritical ops' boxes
    assert colours[_rgb(html_report.NODE_FILL["ok"])] >= 5 * 0.6 * box


def _segments(path: str) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The straight pieces of an edge's path data (M, L, V, H commands)."""
    x = y = 0.0
    pieces = []
    for command, numbers in re.findall(r"([MLVH])([-\d.,]+)", path):
        values = [float(v) for v in numbers.split(",")]
        start = (x, y)
        if command in "ML":
            x, y = values
        elif command == "V":
            y = values[0]
        else:
            x = values[0]
        if command != "M":
            pieces.append((start, (x, y)))
    return pieces


def _drawn(native):
    """(record, boxes, edge paths) of each failing block's derivation graph."""
    for model in native.models:
        for block in model.blocks:
            record = block.extra.get("derivation_graph")
            if record:
                layers, boxes = html_report._boxes(record)
                yield record, boxes, html_report._edge_paths(record, layers, boxes)


def test_no_edge_of_a_derivation_graph_runs_through_a_box(native):
    """Issue 41: every edge visible; the skip and the long edges go round the boxes, not through them."""
    checked = 0
    for record, boxes, paths in _drawn(native):
        assert len(paths) == len(record["edges"]) and any(" H" in p for p in paths)  # the skip is routed
        for path in paths:
            for (x1, y1), (x2, y2) in _segments(path):
                for step in range(1, 40):
                    x, y = x1 + (x2 - x1) * step / 40, y1 + (y2 - y1) * step / 40
                    inside = [n for n, b in boxes.items() if abs(x - b.x) < html_report.NODE_WIDTH / 2 - 1
                              and b.top + 1 < y < b.bottom - 1]
                    assert not inside, f"edge {path} passes through box {inside}"
                    checked += 1
    assert checked > 1000


def test_box_labels_are_whole_and_wrapped(native):
    record = next(record for record, _, _ in _drawn(native))
    page = html_report.derivation_svg(record, "t")
    assert "…" not in page and "Lipschitz activation (GELU," in page and "SiLU, Mish, Hardswish)" in page


def test_a_page_with_remedies_does_not_ask_for_them(native):
    plain = render(native, "html")
    assert "run with --show-remedies" in plain
    block = native.models[0].blocks[0]
    block.extra["remedies"] = []
    try:
        shown = render(native, "html")
    finally:
        del block.extra["remedies"]
    assert shown.count("run with --show-remedies") == plain.count("run with --show-remedies") - 1
    assert "the remedies qlint re-checked follow" in shown


def _edge_ink(pixel: tuple[int, int, int], edge: tuple[int, int, int]) -> bool:
    """The edge's grey, anti-aliased on white: nearer it than white, and grey (no box's fill is)."""
    distance = sum(abs(c - e) for c, e in zip(pixel, edge))
    return distance < sum(255 - c for c in pixel) and max(pixel) - min(pixel) < 25


def test_chromium_draws_every_edge_where_it_can_be_seen(native, tmp_path):
    """The graph alone, rendered at the page's corner: the middle of each edge's longest piece is drawn in
    the edge colour (on the white card, not under a box)."""
    browser = _browser()
    image_module = pytest.importorskip("PIL.Image")
    record, boxes, paths = next(_drawn(native))
    svg = html_report.derivation_svg(record, "t")
    page = tmp_path / "graph.html"
    page.write_text(f'<html><body style="margin:0;background:#fff">{svg}</body></html>')
    shot = tmp_path / "graph.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", "--window-size=1300,2400", f"--screenshot={shot}",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    image = image_module.open(shot).convert("RGB")
    edge = _rgb(html_report.EDGE_COLOUR)
    for path in paths:
        (x1, y1), (x2, y2) = max(_segments(path), key=lambda s: abs(s[1][0] - s[0][0]) + abs(s[1][1] - s[0][1]))
        x, y = (x1 + x2) / 2, (y1 + y2) / 2
        near = [image.getpixel((round(x) + dx, round(y) + dy)) for dx in (-1, 0, 1) for dy in (-1, 0, 1)]
        assert any(_edge_ink(pixel, edge) for pixel in near), (path, near)


NO_NUMPY = """
import sys
from importlib.abc import MetaPathFinder


class NoNumpy(MetaPathFinder):  # a plain install: torch runs without numpy
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}")


sys.meta_path.insert(0, NoNumpy())
from qlint.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_the_html_report_needs_no_numpy(tmp_path):
    """networkx lays graphs out with numpy, which a plain install (torch without extras) lacks."""
    import sys

    from conftest import ROOT

    out = tmp_path / "report.html"
    run = subprocess.run([sys.executable, "-c", NO_NUMPY, NATIVE, "--output-format", "html", "--output-file", str(out),
                          "--no-witness", "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "numpy" not in run.stderr and _graphs(out.read_text()) >= 1


class _Squares(torch.nn.Module):
    """x + x * x (X_k into both operands of one product) and x + a(x) * b(x) (two values, one operand each)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        x = x + x * x
        return x + self.a(x) * self.b(x)


def test_both_operands_of_a_product_are_drawn_when_they_are_one_value():
    """Issue 41: x * x adds x's exponent twice (q 2), so the graph has two edges from X_k into the product,
    drawn side by side; a product of two values has one edge from each (two from one box where both are drawn
    as one: two calls on one line)."""
    from qlint.api import analyze

    report = analyze(_Squares(), (torch.randn(2, 4),), isolated=True, witness=False)
    square, gated = (block.extra["derivation_graph"] for block in report.blocks)
    assert [(node["op"], node["q"]) for node in square["nodes"]] == [
        ("block input X_k", "1"), ("Hadamard product", "2"), ("Sum", "2")]
    assert square["edges"] == [[0, 1], [0, 1], [0, 2], [1, 2]]
    layers, boxes = html_report._boxes(square)
    paths = html_report._edge_paths(square, layers, boxes)
    assert len(set(paths)) == 4 and sum(" H" in path for path in paths) == 1  # two side by side, the skip routed
    product = [node["op"] for node in gated["nodes"]].index("Hadamard product")
    linear = [node["op"] for node in gated["nodes"]].index("Affine layer (Linear)")  # a and b: one line, one box
    assert [edge for edge in gated["edges"] if edge[1] == product] == [[linear, product], [linear, product]]
