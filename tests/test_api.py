"""The API equals the CLI: the same configuration, declared primitives, suppressions and baseline."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import qlint
import qlint.api
from qlint.cli import main

MODEL = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class Cube(nn.Module):
        def forward(self, x):
            return x ** 3


    class Block(nn.Module):
        def __init__(self, gate):
            super().__init__()
            self.w, self.gate = nn.Linear(6, 6), gate

        def forward(self, x):
            return x + self.w(self.gate(x))


    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block(Cube())
            self.b = Block(Cube())
            self.c = Block(nn.Tanh())

        def forward(self, x):
            x = self.a(x)
            x = self.b(x) * 1.0 + 0.0 * x  # qlint: noqa: QL101
            return self.c(x)


    def build():
        torch.manual_seed(0)
        return Stack(), (torch.randn(2, 3, 6),)
    '''
)

PYPROJECT = textwrap.dedent(
    '''
    [tool.qlint]
    models = ["model.py:build"]
    extend-select = ["QL2"]

    [tool.qlint.per-block-ignores]
    "c" = ["QL203"]

    [tool.qlint.primitives]
    "model.Cube" = { q = 2, why = "declared for the test: a cube is q = 3, this says 2" }
    '''
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["--format", "json", *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_check_equals_the_command_line_in_a_configured_project(project):
    code, cli = _cli()
    api = qlint.check().to_dict()
    assert api == cli
    (model,) = api["models"]
    blocks = {b["name"]: b["q"] for b in model["blocks"]}
    # the declared Cube exponent (2, not 3); b's join is rescaled in Stack.forward, so the block is named there
    assert blocks == {"a": 2.0, "Stack": 2.0, "c": 0.0}
    codes = sorted((f["code"], f.get("block")) for f in model["findings"])
    assert ("QL101", "a") in codes and ("QL101", "Stack") not in codes  # the noqa comment on that line
    assert ("QL203", "c") not in codes  # per-block-ignores
    assert code == 1


def test_check_applies_the_baseline_like_the_command_line(project):
    _, written = _cli("--write-baseline", "baseline.json")
    code, cli = _cli("--baseline", "baseline.json")
    api = qlint.check(baseline="baseline.json").to_dict()
    assert api == cli and code == 0
    assert api["models"][0]["findings"] == []


def test_primitives_are_layered_per_call_not_global(project):
    from model import Cube, Stack  # noqa: E402  (the project's module)

    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 6),)
    declared = qlint.analyze(Stack(), inputs, primitives={"model.Cube": {"q": 0, "why": "per call"}}, isolated=True)
    plain = qlint.analyze(Stack(), inputs, isolated=True)
    assert [b.q for b in declared.blocks] == [0.0, 1.0, 0.0]  # a rescaled stream map: q = max(1, q(F))
    assert [b.q for b in plain.blocks] == [3.0, 3.0, 0.0]  # the earlier call left no trace
    assert getattr(Cube, "__qlint_primitive__", None) is None


def test_analyze_restores_the_mode_of_the_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    model.train()
    qlint.analyze(model, (torch.randn(2, 4),), mode="eval", isolated=True)
    assert model.training
    model.eval()
    qlint.analyze(model, (torch.randn(2, 4),), mode="train", isolated=True)
    assert not model.training


def test_probe_reads_the_configuration(project):
    """``qlint probe`` with no spec probes the configured models with their declared primitives:
    the Cube declared q = 2 measures 3, a violation the probe reports."""
    result = CliRunner().invoke(main, ["probe", "--format", "json", "--directions", "1", "--iterations", "2", "--no-perturb"])
    assert result.exit_code == 1, result.output
    (model,) = json.loads(result.stdout)["models"]
    assert model["spec"] == "model.py:build"
    first = model["blocks"][0]
    assert first["name"] == "a" and first["q"] == 2.0 and first["agreement"] == "VIOLATION"
    assert first["q_measured"] == pytest.approx(3.0, abs=0.05)
    assert [r.report.spec for r in qlint.api.probe(settings=_quick())] == ["model.py:build"]


def _quick():
    from qlint.probe.measure import ProbeSettings

    return ProbeSettings(random_directions=1, power_iterations=2, perturb=False)
