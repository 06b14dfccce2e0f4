"""The tracer chain: which tracer runs, module paths on every path, opaque leaves, errors."""

import json
import textwrap

import pytest
import torch
from click.testing import CliRunner
from torch import nn

import qlint
from qlint.analysis import Options, run_specs as check
from qlint.cli import main
from qlint.capture.pipeline import capture
from conftest import fixture_spec

D = 8

UNTRACEABLE = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Gate(nn.Module):
        def forward(self, x):
            steps = int(x.abs().max().clamp(max=3))
            for _ in range(steps):
                x = torch.tanh(x)
            return x


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.gate = Gate()

        def forward(self, x):
            return x + self.fc(self.gate(x))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


    def build_model():
        return Net(), (torch.randn(2, 8),)
    """
)


@pytest.fixture
def untraceable(tmp_path, monkeypatch):
    """A model whose loop bound is a tensor's value: no tracer can follow it (at most 3 steps: the checks run it
    at inputs scaled to 1e6)."""
    (tmp_path / "net.py").write_text(UNTRACEABLE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_untraceable_model_fails_in_one_actionable_line(untraceable):
    result = invoke("net.py", "--isolated")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and result.stdout == ""
    line = lines[0]
    assert line.startswith("qlint: error: net.py: could not trace Net: `layers.0.gate` (Gate)")
    assert "net.py:8 `steps = int(x.abs().max().clamp(max=3))`" in line
    assert "reads the value of the input `x` in Python (make_fx on the example's values: " in line
    assert "compute it with tensor ops (torch.where), or declare its exponent" in line
    assert 'qlint.register(Gate, q=..., why=...)' in line
    assert '[tool.qlint.primitives] "net.Gate" = { q = ..., why = "..." }' in line


def test_declaring_the_leaf_in_pyproject_makes_it_traceable(untraceable):
    (untraceable / "pyproject.toml").write_text(
        '[tool.qlint.primitives]\n"net.Gate" = { q = 0, why = "repeated tanh: every entry in [-1, 1]" }\n'
    )
    result = invoke("net.py", "--format", "json", "--select", "QL1")
    assert result.exit_code == 0, result.output
    model = json.loads(result.stdout)["models"][0]
    assert model["tracer"] == "symbolic_trace"
    assert [(b["name"], b["q"], b["dominant"]) for b in model["blocks"]] == [("layers.0", 0.0, "Gate"), ("layers.1", 0.0, "Gate")]


SHAPE_LOOP = textwrap.dedent(
    """
    from torch import nn


    class Unrolled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            for _ in range(x.shape[1]):
                x = x + self.fc(x)
            return x


    def build_model():
        return Unrolled()  # no example inputs
    """
)


def test_without_inputs_the_error_asks_for_them(tmp_path, monkeypatch):
    (tmp_path / "unrolled.py").write_text(SHAPE_LOOP)
    monkeypatch.chdir(tmp_path)
    result = invoke("unrolled.py", "--isolated")
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("qlint: error: unrolled.py: could not trace Unrolled: its forward at ")
    assert "`for _ in range(x.shape[1]):`" in line and "(symbolic_trace); give --input-shape so torch.export can run it" in line
    result = invoke("unrolled.py", "--isolated", "--input-shape", "2,3,8", "--select", "QL1", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [b["q"] for b in json.loads(result.stdout)["models"][0]["blocks"]] == [1.0, 1.0, 1.0]


# --- opaque leaves where torch.export inlines modules ------------------------------------


class Bessel(nn.Module):
    """J0 is bounded by 1; qlint's registry has no entry for it."""

    def forward(self, x):
        return torch.special.bessel_j0(x) * 2


class DeclaredBessel(Bessel):
    pass


class Recurrent(nn.Module):
    """A Python loop over time (symbolic_trace cannot run it) around a squashing leaf."""

    def __init__(self, squash):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.squash = squash

    def forward(self, x):
        steps = [self.fc(self.squash(x[:, t])) for t in range(x.shape[1])]
        return x + torch.stack(steps, 1)


INPUTS = (torch.randn(2, 3, D),)


def test_an_undeclared_op_inside_an_inlined_module_stays_unknown():
    report = qlint.analyze(Recurrent(Bessel()), INPUTS)
    assert report.tracer == "export"
    [block] = report.blocks
    assert block.q is None and block.status == "uncertified"
    assert block.unknown_ops == ["torch.ops.aten.special_bessel_j0"]


def test_a_declared_module_is_an_opaque_region_under_export():
    qlint.register(DeclaredBessel, q=0, why="|J0| <= 1")
    report = qlint.analyze(Recurrent(DeclaredBessel()), INPUTS)
    assert report.tracer == "export"
    [block] = report.blocks
    assert (block.q, block.status, block.unknown_ops, block.dominant) == (0.0, "ok", [], "DeclaredBessel")
    steps = [(s.primitive, s.q) for s in block.derivation]
    assert ("DeclaredBessel", 0.0) in steps and steps[0] == ("block input X_k", 1.0)


class Cube(nn.Module):
    def forward(self, x):
        return torch.special.bessel_j0(x) * x * x * x


class DeclaredCube(Cube):
    pass


def test_a_region_composes_its_declared_exponent_with_its_inputs():
    """compose(q_declared, max q_in): a declared q = 3 leaf on the raw stream gives q = 3."""
    qlint.register(DeclaredCube, q=3, why="|J0| <= 1 times x^3")
    report = qlint.analyze(Recurrent(DeclaredCube()), INPUTS)
    assert report.tracer == "export" and report.blocks[0].q == 3.0


# --- the chain itself ------------------------------------------------------------------


class Cache:
    """Stands for a KV cache object: not a pytree, so torch.export rejects it as an output."""


class ReluBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class CachingStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(ReluBlock() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return {"hidden": x, "cache": Cache()}


def test_non_tensor_outputs_are_dropped_and_module_paths_kept():
    """symbolic_trace would follow this model too; export is asked for."""
    model = CachingStack()
    report = qlint.analyze(model, (torch.randn(2, D),), tracer="export")
    assert report.tracer == "export"
    assert [(b.name, b.q) for b in report.blocks] == [("layers.0", 1.0), ("layers.1", 1.0)]
    assert "forward" not in vars(model)  # the instance is left as it was


def test_make_fx_keeps_module_paths_for_block_names():
    expected = [b.name for b in check([fixture_spec("llama.py:with_norm")], Options()).models[0].blocks]
    report = check([fixture_spec("llama.py:with_norm")], Options(tracer="make_fx")).models[0]
    assert report.tracer == "make_fx"
    assert [b.name for b in report.blocks] == expected == ["layers.0:self_attn", "layers.0:mlp", "layers.1:self_attn", "layers.1:mlp"]
    assert {b.q for b in report.blocks} == {0.0}


def test_hugging_face_models_skip_symbolic_trace():
    """Detected by class name: transformers itself is not needed (nor imported)."""
    pretrained = type("PreTrainedModel", (nn.Module,), {"__module__": "transformers.modeling_utils"})

    class TinyHF(pretrained):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(D, D)

        def forward(self, x):
            return x + self.fc(x)

    traced = capture(TinyHF(), (torch.randn(2, D),))
    assert traced.tracer == "export"
    assert traced.attempts == ["symbolic_trace: skipped (Hugging Face models branch on tensor values; torch.export follows them)"]
    assert capture(TinyHF(), (torch.randn(2, D),), prefer="symbolic_trace").tracer == "symbolic_trace"


class RevIN(nn.Module):
    """Instance normalisation around a residual stack: y * scale + loc at the end."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(ReluBlock() for _ in range(2))

    def forward(self, x):
        loc = x.mean(1, keepdim=True)
        scale = x.std(1, keepdim=True) + 1.0
        h = (x - loc) / scale
        for layer in self.layers:
            h = layer(h)
        return h * scale + loc


def test_a_broadcast_bias_is_not_the_stream():
    """``loc`` (shape (b, 1, d)) is broadcast into the sum: the blocks are the stack's."""
    report = qlint.analyze(RevIN(), (torch.randn(2, 4, D),), tracer="export")
    assert report.tracer == "export"
    assert [(b.name, b.q) for b in report.blocks] == [("layers.0", 1.0), ("layers.1", 1.0)]


class CopyInto(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        h = torch.zeros_like(x)
        h.copy_(self.fc(x) * self.fc(x))
        return x + h


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        h = self.fc(x)
        h.mul_(self.fc(x)).mul_(self.fc(x))
        return x + h


@pytest.mark.parametrize(("model", "q"), [(CopyInto(), 2.0), (InPlace(), 3.0)])
def test_in_place_ops_under_export_carry_their_values(model, q):
    """copy_ holds the source's values (not the zeros it overwrote); mul_ multiplies."""
    report = qlint.analyze(model, (torch.randn(2, D),), tracer="export")
    assert report.tracer == "export" and [b.q for b in report.blocks] == [q]


def test_a_tensor_method_replaced_at_run_time_is_not_matched_by_name(monkeypatch):
    """fx records `h.relu()` by name; a monkeypatched Tensor.relu must not pass as ReLU."""
    import torch
    from torch import nn

    import qlint

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return x + self.w2(self.w1(x).relu())

    torch.manual_seed(0)
    model, inputs = Net(), (torch.randn(2, 8),)
    assert qlint.analyze(model, inputs, isolated=True).verdict == "certified"
    monkeypatch.setattr(torch.Tensor, "relu", lambda self: torch.nn.functional.relu(self) * self.abs())
    report = qlint.analyze(model, inputs, isolated=True)
    assert report.verdict == "uncertified" and report.blocks[0].q is None


def test_the_checks_leave_the_users_model_as_it_was():
    """Redrawn parameters and train-mode forwards (BatchNorm statistics) are undone."""
    import torch
    from torch import nn

    import qlint

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w, self.bn = nn.Linear(8, 8), nn.BatchNorm1d(8)

        def forward(self, x):
            return x + self.bn(self.w(x))

    torch.manual_seed(0)
    model = Net().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = qlint.analyze(model, (torch.randn(4, 8),), isolated=True)
    assert report.verdict == "certified" and model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export", "make_fx"])
def test_every_tracer_shares_the_models_parameters(tracer):
    """The redrawn-parameter comparison redraws the model's parameters in place; a graph that
    held its own copies would be refused (fail closed), so every tracer must share them."""
    import torch
    from torch import nn

    from qlint.capture.pipeline import capture
    from qlint.capture.graph_check import shares_parameters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    traced = capture(model, (torch.randn(2, 8),), prefer=tracer)
    assert traced.tracer == tracer and shares_parameters(traced.module, model)
    assert "with redrawn parameters" in traced.graph_check


@pytest.mark.parametrize("tracer", ["symbolic_trace", "export"])
def test_a_trainable_plain_tensor_attribute_is_never_read_by_value(tracer):
    """exp(p z^2) u with p = -1 a plain tensor that requires grad: export lifts it as a detached
    constant, but an optimizer given it trains it (p = 1 gives exp(z^2)): not certified."""
    from qlint.loader import load

    loaded = load("fixtures/adversarial/trace_gap.py:trainable_tensor_attribute_sign")
    assert loaded.model.p.requires_grad
    [model] = qlint.check(["fixtures/adversarial/trace_gap.py:trainable_tensor_attribute_sign"], isolated=True, tracer=tracer).models
    assert (model.tracer, model.verdict) == (tracer, "supercritical")
