"""Measured growth curves: recorded by the probe, drawn as SVG in the HTML report and as a PNG by
``qlint probe --plot``."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from qlint.ci import html_report
from qlint.cli import main
from qlint.core.results import Block, ModelReport
from qlint.core.curves import GrowthCurve, curves, record
from conftest import fixture_spec

POLY = fixture_spec("toy.py:poly_mlp")  # x + W2 (W1 x)^3: q = 3
QUICK = ["--isolated", "--directions", "2", "--iterations", "2", "--no-perturb", "--threads", "1"]


def test_record_takes_the_median_per_scale_in_decades():
    ln10 = math.log(10)
    fits = [SimpleNamespace(norm=10.0, samples=[(1.0, 2 * ln10), (10.0, 5 * ln10), (100.0, None)]),
            SimpleNamespace(norm=10.0, samples=[(1.0, 4 * ln10), (10.0, 7 * ln10), (100.0, -math.inf)]),
            SimpleNamespace(norm=10.0, samples=[(1.0, 3 * ln10), (10.0, 6 * ln10), (100.0, None)])]
    assert record(fits) == {"log10_x": [1.0, 2.0], "log10_v": [3.0, 6.0]}  # no finite sample at alpha 100: dropped


def test_the_reference_line_has_the_static_slope_through_the_last_sample():
    curve = GrowthCurve("b", 3.0, ((0.0, 1.0), (1.0, 2.5), (2.0, 7.0)))
    (x0, y0), (x1, y1) = curve.reference()
    assert (x1, y1) == (2.0, 7.0) and (y1 - y0) / (x1 - x0) == 3.0
    assert GrowthCurve("b", None, curve.points).reference() is None
    assert GrowthCurve("b", math.inf, curve.points).reference() is None


def test_curves_are_read_off_the_blocks_the_probe_measured():
    measured = Block("a", 0, 2.0, "supercritical", [], extra={"growth_curve": {"log10_x": [0, 1], "log10_v": [0, 2]}})
    model = ModelReport("m.py:f", "fx", "eval", [measured, Block("b", 1, 1.0, "ok", [])])
    assert curves(model) == [GrowthCurve("a", 2.0, ((0, 0), (1, 2)))]
    assert 'aria-label="growth of a"' in html_report.curve_svg(curves(model)[0])


def test_probe_plot_writes_the_growth_curves_and_html_draws_them(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    png = tmp_path / "growth.png"
    result = CliRunner().invoke(main, ["probe", POLY, *QUICK, "--plot", str(png), "--format", "html"])
    assert result.exit_code == 0, result.output
    assert 'aria-label="growth of PolyMLP"' in result.output and "slope q = 3" in result.output
    image = image_module.open(png).convert("RGB")
    assert image.size[0] >= 400 and image.size[1] >= 300
    colours = {colour: count for count, colour in image.getcolors(1 << 24)}
    assert len(colours) > 20  # not blank
    assert colours.get(tuple(bytes.fromhex(html_report.CURVE_COLOUR[1:])), 0) > 100  # the measured curve's markers


def test_probe_plot_without_matplotlib_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["probe", POLY, *QUICK, "--plot", str(tmp_path / "g.png")])
    assert result.exit_code == 2
    assert "qlint probe --plot needs the [plot] extra (matplotlib" in result.output
    assert not (tmp_path / "g.png").exists()


def test_plot_and_html_are_refused_with_loop():
    result = CliRunner().invoke(main, ["probe", POLY, "--loop", "--format", "html"])
    assert result.exit_code == 2 and "--loop measures loops" in result.output
