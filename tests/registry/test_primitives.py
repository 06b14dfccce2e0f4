"""Registry rules on small modules: each exponent and each soundness guard."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlint
from qlint.capture.pipeline import capture
from qlint.growth.engine import analyse_graph
from qlint.registry import default as load

D = 8


class Residual(nn.Module):
    """x + branch(x): the smallest residual block."""

    def __init__(self, branch):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.out = nn.Linear(D, D)
        self.branch = branch

    def forward(self, x):
        return x + self.out(self.branch(self, self.fc(x)))


def q_of(branch, *, mode=None, inputs=True):
    model = Residual(branch)
    report = qlint.analyze(model, (torch.randn(2, 4, D),) if inputs else None, mode=mode)
    (block,) = report.blocks
    return block


@pytest.mark.parametrize(
    ("branch", "q"),
    [
        (lambda m, h: torch.relu(h), 1),
        (lambda m, h: F.gelu(h), 1),
        (lambda m, h: F.silu(h) * h, 2),
        (lambda m, h: torch.tanh(h) * h, 1),
        (lambda m, h: torch.sigmoid(h), 0),
        (lambda m, h: F.softmax(h, dim=-1), 0),
        (lambda m, h: h**2, 2),
        (lambda m, h: h.pow(4), 4),
        (lambda m, h: torch.sqrt(h * h), 1),
        (lambda m, h: F.layer_norm(h, (D,)), 0),
        (lambda m, h: F.normalize(h, dim=-1) * 3, 0),
        (lambda m, h: F.hardtanh(h) + F.relu6(h), 0),
        (lambda m, h: torch.cat([h, h**3], dim=-1)[..., :D], 3),
        (lambda m, h: h.softmax(-1) @ h.transpose(-1, -2) @ h, 2),
        (lambda m, h: F.scaled_dot_product_attention(h, h, h), 1),
        (lambda m, h: torch.clamp(h, -1, 1), 0),
        (lambda m, h: torch.clamp(h, min=0), 1),
        (lambda m, h: h / 3.0, 1),
        (lambda m, h: h / (1 + torch.exp(-h)), 1),  # x * sigmoid(x), a hand-written SiLU: exp(-h) >= 0
        (lambda m, h: torch.exp(-F.softplus(h)) * h, 1),  # exp of a non-positive argument is at most 1
        (lambda m, h: torch.exp(torch.tanh(h)), 0),  # exp of a bounded argument is bounded
        (lambda m, h: torch.log(1 + torch.exp(h)), math.inf),  # softplus by hand: exp(h) is unbounded
        (lambda m, h: torch.log1p(torch.relu(h)), 1),
        (lambda m, h: h * h.norm().item(), 2),  # .item() carries the data's growth
        (lambda m, h: torch.zeros_like(h).fill_(h.sum()) * h, 2),  # the fill value grows
        (lambda m, h: torch.full_like(h, 2.0) * h + torch.zeros_like(h), 1),  # a template only
        (lambda m, h: torch.lerp(h, 2 * h, 0.5), 1),
        (lambda m, h: torch.lerp(h, torch.zeros_like(h), h), 2),  # an input-dependent weight multiplies
        (lambda m, h: F.mse_loss(h, torch.zeros_like(h), reduction="none"), 2),  # the error squared
        (lambda m, h: F.mse_loss(torch.tanh(h), torch.zeros_like(h), reduction="none"), 0),
        (lambda m, h: F.l1_loss(h, 2 * h, reduction="none"), 1),
        (lambda m, h: F.huber_loss(h, torch.zeros_like(h), reduction="none") * h, 2),  # linear beyond delta
        (lambda m, h: F.smooth_l1_loss(h, h.detach() ** 3, reduction="none"), 3),  # the target's exponent
        (lambda m, h: F.mse_loss(h, torch.zeros_like(h)) * h, 3),  # a mean keeps the exponent
        (lambda m, h: F.max_pool1d(h, 3, 1, 1), 1),  # F.max_pool1d is `fn(*args, **kwargs)`: bound as it dispatches
        (lambda m, h: h * h * torch.relu(torch.sigmoid(h) - 1), 0),  # relu of a value <= 0 is exactly 0
        (lambda m, h: h * h * torch.relu(torch.sigmoid(h) - 0.5), 2),  # in [0, 0.5]: not 0
        (lambda m, h: h * F.relu6(-torch.sigmoid(h)) * h, 0),  # relu6 of a value <= 0 too, as a middle factor
        (lambda m, h: torch.exp(h) * torch.relu(torch.sigmoid(h) - 1), math.inf),  # 0 * inf is NaN
        (lambda m, h: torch.cat(h.split(4, dim=-1), dim=-1), 1),  # the parts held by one node: no crash
        (lambda m, h: h * torch.sigmoid(h.topk(2, dim=-1).values.sum(-1, keepdim=True)), 1),  # a tuple output
        (lambda m, h: (h / (h - h.detach())) * torch.relu(-torch.sigmoid(h)), None),  # 0 * a pole: unknown
    ],
)
def test_exponent(branch, q):
    assert q_of(branch).q == q


@pytest.mark.parametrize(
    ("branch", "culprit"),
    [
        (lambda m, h: h / h.sum(), "division"),
        (lambda m, h: torch.rsqrt(h.abs()), "reciprocal"),
        (lambda m, h: torch.log(h.abs()), "log"),
        (lambda m, h: torch.special.i0(h), "i0"),
        (lambda m, h: torch.pow(2.0, h), "pow of an argument not bounded above"),
        (lambda m, h: h * F.mse_loss(h[:, :0], h[:, :0]), "a mean of nothing is NaN"),
    ],
)
def test_cannot_bound_is_never_certified(branch, culprit):
    block = q_of(branch)
    assert block.status != "ok"
    assert block.q is None or math.isinf(block.q)
    assert culprit in block.extra["culprit"]


@pytest.mark.parametrize(
    ("branch", "description"),
    [
        (lambda m, h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6), "RMSNorm written out"),
        (lambda m, h: (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, keepdim=True) + 1e-5), "LayerNorm written out"),
        (lambda m, h: (h - h.mean(-1, keepdim=True)) / (((h - h.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + 1e-5).sqrt(), "LayerNorm written out"),
        (lambda m, h: h / (h.norm(dim=-1, keepdim=True) + 1e-6), "L2 normalization written out"),
        (lambda m, h: h / h.norm(dim=-1, keepdim=True).clamp(min=1e-6), "L2 normalization written out"),
        (lambda m, h: h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6), "RMSNorm written out"),
    ],
)
def test_handwritten_normalizations_are_recognised(branch, description):
    block = q_of(lambda m, h: branch(m, h) * h)  # a normalised factor times a q = 1 factor
    assert block.q == 1
    block = q_of(branch)
    assert block.q == 0 and description in block.dominant


def test_a_statistic_of_another_tensor_is_not_a_normalization():
    # rsqrt(mean(relu(h)^2) + eps) <= eps^-1/2 is merely bounded: h times it stays q = 1
    block = q_of(lambda m, h: h * torch.rsqrt(torch.relu(h).pow(2).mean(-1, keepdim=True) + 1e-6))
    assert block.q == 1 and "written out" not in block.dominant
    # without the eps floor the reciprocal may blow up near 0
    block = q_of(lambda m, h: h * torch.rsqrt(torch.relu(h).pow(2).mean(-1, keepdim=True)))
    assert block.status == "uncertified"


class BatchNormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(D)
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc(self.bn(x) ** 2)


@pytest.mark.parametrize(("mode", "q"), [("train", 0), ("eval", 2)])
def test_batchnorm_normalizes_only_with_batch_statistics(mode, q):
    """The rule: q 0 on batch statistics (the training graph), q 2 on running ones. A model that trains is reported
    with its BatchNorm frozen too (the frozen-BatchNorm recipe), so its verdict is the eval graph's."""
    model = BatchNormBlock().train(mode == "train")
    graph = capture(model, (torch.randn(4, D),), prefer="export")
    report = analyse_graph(model, (torch.randn(4, D),), graph, load(), spec="bn").report
    assert report.blocks[0].q == q
    assert qlint.analyze(BatchNormBlock(), (torch.randn(4, D),), mode=mode).blocks[0].q == 2


class PostLN(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return self.norm(x + self.fc(x))


class PostLNStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(PostLN() for _ in range(2))
        self.final = nn.LayerNorm(D)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final(x)


def test_post_ln_updates_are_reported_as_info():
    report = qlint.analyze(PostLNStack())
    assert [(b.name, b.form, b.q) for b in report.blocks] == [("layers.0", "post-norm", 1), ("layers.1", "post-norm", 1)]
    exponent_findings = [f for f in report.findings if f.code.startswith("QL1")]
    assert [f.code for f in exponent_findings] == ["QL104", "QL104"]
    assert all(f.severity == "info" for f in exponent_findings)


class GeluApprox(nn.Module):
    """GPT-2's tanh-approximate GELU contains `x + 0.044715 * x**3`: not a block."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        h = self.fc(x)
        gelu = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + gelu


def test_a_residual_form_inside_a_velocity_is_not_a_block():
    report = qlint.analyze(GeluApprox())
    assert [(b.name, b.q) for b in report.blocks] == [("GeluApprox", 1)]


class NoResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        return self.fc(x) + 1.0


def test_a_normalization_without_eps_is_not_proved():
    # x / ||x|| is undefined at x = 0: without eps > 0 (or clamp(min > 0)) it is a division by a value that may vanish
    block = q_of(lambda m, h: h / h.norm(dim=-1, keepdim=True))
    assert block.status == "uncertified" and "division" in block.extra["culprit"]


def test_a_model_without_residual_blocks_is_never_certified():
    report = qlint.analyze(NoResidual(), isolated=True)
    assert report.blocks == [] and report.verdict == "uncertified"
    assert [f.code for f in report.findings if f.code.startswith("QL1")] == ["QL106"]


def test_registry_entries_are_justified():
    registry = load()
    table1 = [p for p in registry.primitives if p.table1]
    names = " ".join(p.name for p in table1)
    for row in ("Saturating", "Softmax", "LayerNorm", "RMSNorm", "L2", "Affine", "Lipschitz", "attention", "Polynomial"):
        assert row in names, row
    for primitive in registry.primitives:
        assert primitive.why and primitive.q, primitive.name


class TopLevelStack(nn.Module):
    """Blocks written inline in the model's own forward: no module owns the add."""

    def __init__(self, post_norm):
        super().__init__()
        self.post_norm = post_norm
        self.fcs = nn.ModuleList(nn.Linear(D, D) for _ in range(3))
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in range(3))
        self.final = nn.LayerNorm(D)

    def forward(self, x):
        for fc, norm in zip(self.fcs, self.norms):
            x = norm(x + fc(x)) if self.post_norm else x + fc(norm(x))
        return x if self.post_norm else self.final(x)


@pytest.mark.parametrize(("post_norm", "form", "q"), [(True, "post-norm", 1), (False, "additive", 0)])
def test_a_final_norm_after_top_level_blocks_is_not_post_ln(post_norm, form, q):
    report = qlint.analyze(TopLevelStack(post_norm))
    assert [(b.name, b.form, b.q) for b in report.blocks] == [(f"TopLevelStack#{i}", form, q) for i in (1, 2, 3)]
