"""Tests for qlint.zoo reference architectures and their fixtures/ entry files."""
import math

import pytest
import torch

from qlint.zoo import mamba, patchtst, toy
from qlint.zoo import transformer as tr

from conftest import ALL_FACTORIES, fixture, load_fixture
LOOPED = {"mamba", "hymba"}  # contain the Python-loop scan: export only
MAMBA_VARIANTS = ["free", "rmsnorm", "preln", "periln", "linear"]
NORM_VARIANTS = ["free", "rmsnorm", "preln", "periln"]



def velocity_slope(block, x, alphas):
    """Least-squares slope of log ||block(a x) - a x|| against log a."""
    with torch.no_grad():
        logv = torch.tensor([math.log((block(a * x) - a * x).norm().item()) for a in alphas])
    loga = torch.log(torch.tensor(alphas, dtype=torch.float64))
    loga, logv = loga - loga.mean(), logv - logv.mean()
    return (loga * logv).sum().item() / (loga * loga).sum().item()


# --- fixtures -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family,name", ALL_FACTORIES)
def test_fixture_forward_backward(family, name):
    factory = getattr(load_fixture(family), name)
    assert "q = " in factory.__doc__
    model, inputs = factory()
    assert isinstance(inputs, tuple)
    out = model(*inputs)
    assert torch.isfinite(out).all()
    out.pow(2).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("family,name", [fn for fn in ALL_FACTORIES if fn[0] not in LOOPED])
def test_fixture_symbolic_trace(family, name):
    model, inputs = fixture(family, name)
    graph = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(graph(*inputs), model(*inputs))


@pytest.mark.parametrize("family,name", [fn for fn in ALL_FACTORIES if fn[0] in LOOPED])
def test_fixture_looped_scan_needs_export(family, name):
    model, inputs = fixture(family, name)
    with pytest.raises(TypeError, match="Proxy"):
        torch.fx.symbolic_trace(model)


@pytest.mark.parametrize("family,name", [("mamba", "native"), ("hymba", "ssm_unnormed"),
                                         ("patchtst", "periln")])
def test_fixture_export_non_strict(family, name):
    model, inputs = fixture(family, name)
    program = torch.export.export(model, inputs, strict=False)
    torch.testing.assert_close(program.module()(*inputs), model(*inputs))
    stacks = [n.meta.get("nn_module_stack", {}) for n in program.graph.nodes]
    paths = {path for stack in stacks for path, _ in stack.values()}
    assert any(p.endswith("layers.1") for p in paths)  # each residual block is its own module


def test_fixture_factories_are_deterministic():
    (m1, x1), (m2, x2) = fixture("mamba", "native"), fixture("mamba", "native")
    torch.testing.assert_close(x1, x2, rtol=0, atol=0)
    torch.testing.assert_close(m1(*x1), m2(*x2), rtol=0, atol=0)


# --- shapes, variants, budgets -------------------------------------------------------------------

@pytest.mark.parametrize("variant", MAMBA_VARIANTS)
@pytest.mark.parametrize("revin", [False, True])
def test_mamba_forecaster_shapes(variant, revin):
    model = mamba.build(variant, n_vars=3, seq_len=12, horizon=5, d_model=8, depth=2, revin=revin)
    assert model(*mamba.example_inputs(batch=2, seq_len=12, n_vars=3)).shape == (2, 5, 3)
    assert len(model.layers) == 2 and all(isinstance(b, mamba.MambaBlock) for b in model.layers)
    has_final_norm = not isinstance(model.norm_f, torch.nn.Identity)
    assert has_final_norm == (variant not in ("free", "linear"))


@pytest.mark.parametrize("variant", NORM_VARIANTS)
def test_patchtst_shapes(variant):
    model = patchtst.build(variant, n_vars=3, seq_len=32, horizon=5, patch_len=8, stride=4, d_model=8,
                           n_heads=2, d_ff=16, depth=2)
    assert model(*patchtst.example_inputs(batch=2, seq_len=32, n_vars=3)).shape == (2, 5, 3)


def test_norm_placement_per_variant():
    kinds = {v: mamba.MambaBlock(8, v).mixer for v in MAMBA_VARIANTS}
    assert isinstance(kinds["free"].norm_in, torch.nn.Identity)
    assert isinstance(kinds["linear"].norm_in, torch.nn.Identity) and kinds["linear"].fn.linear_growth
    assert isinstance(kinds["rmsnorm"].norm_in, torch.nn.RMSNorm)
    assert isinstance(kinds["preln"].norm_in, torch.nn.LayerNorm)
    assert isinstance(kinds["preln"].norm_out, torch.nn.Identity)
    assert isinstance(kinds["periln"].norm_out, torch.nn.LayerNorm)


def test_unknown_variant_rejected():
    with pytest.raises(ValueError, match="variant"):
        patchtst.build("linear")
    with pytest.raises(ValueError, match="variant"):
        mamba.build("postln")


def test_transformer_shapes():
    ids = torch.randint(0, 512, (2, 16))
    assert tr.GPT2Model()(ids).shape == (2, 16, 64)
    assert tr.LlamaModel(norm=True)(ids).shape == (2, 16, 64)
    assert tr.LlamaModel(norm=False)(ids).shape == (2, 16, 64)
    x = torch.randn(2, 16, 32)
    assert tr.HymbaModel()(x).shape == x.shape
    assert tr.HymbaModel(ssm_norm=False)(x).shape == x.shape
    assert tr.SwiGLUResidual(32, 64, norm=False)(x).shape == x.shape


def test_toy_shapes_and_stack():
    x = torch.randn(2, 4, 6)
    for cls in (toy.PolyMLP, toy.SinhBlock, toy.ExpBlock, toy.UnknownOpBlock, toy.BoundedExpBlock,
                toy.LipschitzMLP):
        assert cls(6)(x).shape == x.shape
    stack = toy.StackOf(toy.PolyMLP, 3, 6, p=2)
    assert len(stack.layers) == 3 and stack(x).shape == x.shape
    torch.fx.symbolic_trace(stack)


@pytest.mark.parametrize("variant", MAMBA_VARIANTS)
def test_mamba_paper_scale_budget(variant):
    n = sum(p.numel() for p in mamba.build(variant, d_model=64, depth=8, horizon=720).parameters())
    assert 100_000 < n <= 2_000_000


@pytest.mark.parametrize("variant", NORM_VARIANTS)
@pytest.mark.parametrize("d_model", [16, 64])
def test_patchtst_paper_scale_budget(variant, d_model):
    n = sum(p.numel() for p in patchtst.build(variant, d_model=d_model, depth=8, horizon=720).parameters())
    assert n <= 2_000_000


# --- semantics ------------------------------------------------------------------------------------

def test_causality():
    """Changing the last step must not change earlier outputs (causal conv slice, scan, attention mask)."""
    torch.manual_seed(0)
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    y = x.clone()
    y[:, -1] += 1.0
    for model in (mamba.MambaMixer(16), tr.HymbaModel(d_model=16, n_heads=2), tr.LlamaBlock(16, 2, 32)):
        model = model.double()
        torch.testing.assert_close(model(x)[:, :-1], model(y)[:, :-1])
        assert not torch.allclose(model(x)[:, -1], model(y)[:, -1])


def test_revin_is_affine_equivariant():
    torch.manual_seed(0)
    model = mamba.build("free", n_vars=3, seq_len=16, horizon=4, d_model=8, depth=1, revin=True).double()
    x = torch.randn(2, 16, 3, dtype=torch.float64)
    torch.testing.assert_close(model(3.0 * x + 5.0), 3.0 * model(x) + 5.0, rtol=1e-4, atol=1e-4)


def test_llama_rmsnorm_matches_torch():
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(tr.LlamaRMSNorm(8)(x), torch.nn.RMSNorm(8, eps=1e-6)(x))
    assert tr.LlamaRMSNorm(8).double()(x.double()).dtype == torch.float64


def test_seeded_build_is_deterministic():
    def run():
        torch.manual_seed(123)
        model = patchtst.build("periln", seq_len=32, horizon=4, patch_len=8, stride=4, d_model=8, n_heads=2,
                               d_ff=16, depth=1)
        return model(*patchtst.example_inputs(seq_len=32))
    torch.testing.assert_close(run(), run(), rtol=0, atol=0)


def test_mamba_trains_on_cpu_float64():
    torch.manual_seed(0)
    model = mamba.build("linear", n_vars=2, seq_len=8, horizon=4, d_model=8, depth=1).double()
    t = torch.linspace(0, 6, 12, dtype=torch.float64)
    series = torch.stack([t.sin(), t.cos()], -1)[None]
    x, target = series[:, :8], series[:, 8:]
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = (model(x) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


# --- velocity exponents -----------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 3])
def test_poly_mlp_velocity_slope(p):
    torch.manual_seed(0)
    block = toy.PolyMLP(8, p=p).double()
    slope = velocity_slope(block, torch.randn(1, 4, 8, dtype=torch.float64), [1e2, 1e3, 1e4])
    assert slope == pytest.approx(p, abs=0.1)


@pytest.mark.parametrize("variant,q", [("free", 5), ("linear", 1), ("rmsnorm", 0)])
def test_mamba_block_velocity_slope(variant, q):
    torch.manual_seed(0)
    block = mamba.MambaBlock(8, variant).double()
    slope = velocity_slope(block, torch.randn(1, 6, 8, dtype=torch.float64), [1e5, 1e6, 1e7])
    assert slope == pytest.approx(q, abs=0.1)
