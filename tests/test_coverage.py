"""``qlint coverage``, the registry's coverage of torch's IR, and the ops added for real models."""

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import qlint
from qlint.analysis import Options, run
from qlint.cli import main
from qlint.coverage import model_coverage, registry_coverage
from qlint.registry import default as load
from conftest import ROOT, fixture_spec

D = 8


def coverage(*args):
    result = CliRunner().invoke(main, ["coverage", *args, "--isolated"])
    assert result.exit_code in (0, 1), result.output
    return result


def ops_of(result):
    [model] = json.loads(result.stdout)["models"]
    return model, {use["op"]: use for use in model["ops"]}


def test_an_unknown_op_in_a_block_fails_the_run():
    result = coverage(fixture_spec("toy.py:unknown_op"), "--format", "json")
    assert result.exit_code == 1
    model, ops = ops_of(result)
    assert model["unknown"] == model["unknown_in_blocks"] == ["torch.special.i0"]
    assert ops["torch.special.i0"] == {"op": "torch.special.i0", "count": 1, "status": "unknown", "entries": [], "blocks": ["UnknownOpBlock"]}
    assert model["ops"][0]["op"] == "torch.special.i0"  # blocking ops come first
    linear = "torch.nn.functional.linear"  # nn.Linear is traced through to its functional form
    assert ops[linear]["status"] == "known" and ops[linear]["entries"] == ["Affine layer (Linear)"] and ops[linear]["count"] == 2


def test_the_table_names_the_blocks_an_unknown_op_leaves_uncertified():
    result = coverage(fixture_spec("toy.py:unknown_op"))
    assert result.exit_code == 1
    assert "torch.special.i0" in result.stdout and "unknown (in blocks)" in result.stdout
    assert "1 unknown, 1 of them in a residual block and computed from X_k" in " ".join(result.stdout.split())


class Head(nn.Module):
    """A residual stack, then an op the registry does not know in the head."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        x = x + torch.relu(self.fc(x))
        return torch.special.i0(x)


def test_an_unknown_op_outside_every_block_is_listed_but_harmless():
    cov = model_coverage(run(Head(), (torch.randn(2, D),), spec="head", options=Options()))
    [unknown] = [use for use in cov.ops if use.status == "unknown"]
    assert unknown.op == "torch.special.i0" and unknown.blocks == [] and cov.blocking == []


class Squash(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x)


class SquashBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.squash = Squash()

    def forward(self, x):
        return x + self.fc(self.squash(x))


def test_a_declared_class_is_reported_as_declared_on_every_tracer():
    qlint.register(Squash, q=0, why="|J0| <= 1")
    for tracer, op in (("symbolic_trace", f"{__name__}.Squash"), ("export", "torch.ops.aten.special_bessel_j0")):
        cov = model_coverage(run(SquashBlock(), (torch.randn(2, D),), spec="s", options=Options(tracer=tracer)))
        uses = {use.op: use for use in cov.ops}
        assert cov.tracer == tracer
        assert (uses[op].status, uses[op].entries) == ("declared", ["Squash"]), tracer
        assert cov.blocking == []


def test_registry_coverage_of_the_core_aten_set():
    sets = {s.name: s for s in registry_coverage(load())}
    core = sets["core ATen ops (torch.Tag.core)"]
    assert {"add", "mul", "convolution", "native_layer_norm", "_softmax"} <= set(core.covered)
    assert set(core.covered) <= set(core.ops) and core.share > 0.9
    # ops without a sound bound stay unknown on purpose; prod is bounded from the traced shapes
    assert {"tan", "atanh", "asin", "acosh"} <= set(core.missing) and "prod" in core.covered
    forward = sets["core ATen ops, forward only"]
    assert not any(op.endswith("_backward") for op in forward.ops) and forward.share >= core.share
    functional = sets["torch.nn.functional, losses excluded"]
    assert "linear" in functional.covered and not any(op.endswith("_loss") for op in functional.ops)


def test_registry_coverage_script_prints_json():
    result = subprocess.run([sys.executable, "scripts/registry_coverage.py", "--format", "json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    sets = json.loads(result.stdout)["sets"]
    assert [s["name"] for s in sets][0] == "core ATen ops (torch.Tag.core)"
    assert all(0 < s["covered"] <= s["total"] for s in sets) and "tan" in sets[0]["missing"]


def test_the_coverage_command_imports_no_torch_until_it_runs():
    code = "import sys, qlint.cli.coverage; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False"


# --- transfers of the ops added for real models -------------------------------------------


def q_of_block(velocity, inputs=(torch.randn(2, 4, D),), tracer="export"):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(D, D)

        def forward(self, x):
            return x + velocity(self.fc(x))

    [block] = qlint.analyze(Block(), inputs, tracer=tracer).blocks
    return block.q


@pytest.mark.parametrize(
    ("velocity", "q"),
    [
        (lambda h: torch.atan(h) * torch.atan2(h, h), 0.0),
        (lambda h: torch.asinh(h) * h, 2.0),
        (lambda h: torch.fmod(h * h, 3.0), 0.0),
        (lambda h: torch.fmod(h * h, h), None),  # NaN where h = 0: no bound
        (lambda h: torch.remainder(h * h * h, h), None),  # likewise
        (lambda h: torch.remainder(h * h * h, 3.0), 0.0),
        (lambda h: torch.fft.irfft(torch.fft.rfft(h, dim=-1), n=D, dim=-1), 1.0),
        (lambda h: torch.cdist(h, h * h).sum(-1, keepdim=True).expand_as(h), 2.0),
        (lambda h: torch.nn.functional.cosine_similarity(h, h * h, dim=-1).unsqueeze(-1).expand_as(h), 0.0),
        (lambda h: torch.nn.functional.glu(torch.cat([h * h, h], -1)), 2.0),
        (lambda h: torch.scatter_reduce(h, 1, torch.zeros(2, 4, D, dtype=torch.long), h * h, "amax"), 2.0),
    ],
    ids=["atan", "asinh", "fmod-const", "fmod", "remainder", "remainder-const", "fft", "cdist", "cosine", "glu", "scatter_reduce"],
)
def test_extra_op_exponents(velocity, q):
    assert q_of_block(velocity) == q


def test_tan_stays_unknown():
    assert q_of_block(torch.tan) is None


def test_scatter_reduce_prod_is_not_bounded():
    index = torch.zeros(2, 4, D, dtype=torch.long)
    assert q_of_block(lambda h: torch.scatter_reduce(h, 1, index, h, "prod")) is None
