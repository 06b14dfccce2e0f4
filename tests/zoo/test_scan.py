"""The chunked selective scan: the loop's numbers within float32 rounding, the loop's gradients,
and the same exponents for qlint and the probe (q = 5 native, 1 linear-growth)."""

from __future__ import annotations

import pytest
import torch

import qlint
from qlint.probe.measure import ProbeSettings, measure_model
from qlint.zoo import mamba


def _scan_inputs(length: int, seed: int = 0) -> list[torch.Tensor]:
    """Ā = exp(Δ·A) in (0, 1), B̄x and C of either sign: what the mixer feeds its scan."""
    g = torch.Generator().manual_seed(seed)
    return [torch.exp(-2 * torch.rand(3, length, 6, 4, generator=g)).requires_grad_(),
            torch.randn(3, length, 6, 4, generator=g).requires_grad_(),
            torch.randn(3, length, 4, generator=g).requires_grad_()]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """rtol 1e-4 against the tensor's scale (entries near 0 come from cancelling sums)."""
    return bool((a - b).abs().max() <= 1e-4 * b.abs().max())


@pytest.mark.parametrize("length,chunk", [(1, 16), (15, 16), (16, 16), (17, 16), (96, 16), (96, 5), (96, 128), (2000, 16)])
def test_chunked_scan_values_and_gradients_match_the_loop(length, chunk):
    inputs = _scan_inputs(length)
    loop = mamba.MambaMixer.scan(*inputs)
    loop_grads = torch.autograd.grad(loop.square().sum(), inputs)
    chunked = mamba.scan_chunked(*inputs, chunk=chunk)
    chunked_grads = torch.autograd.grad(chunked.square().sum(), inputs)
    assert chunked.shape == loop.shape == (3, length, 6)
    assert _close(chunked, loop)
    for mine, theirs in zip(chunked_grads, loop_grads):
        assert _close(mine, theirs)


def test_a_forecaster_with_either_scan_is_the_same_function():
    torch.manual_seed(0)
    loop = mamba.build("free", n_vars=3, seq_len=40, horizon=8, d_model=8, depth=2)
    chunked = mamba.build("free", n_vars=3, seq_len=40, horizon=8, d_model=8, depth=2, scan="chunked")
    chunked.load_state_dict(loop.state_dict())
    assert [m.scan_mode for m in chunked.modules() if isinstance(m, mamba.MambaMixer)] == ["chunked", "chunked"]
    x = torch.randn(4, 40, 3)
    out_loop, out_chunked = loop(x), chunked(x)
    assert _close(out_chunked, out_loop)
    out_loop.square().sum().backward()
    out_chunked.square().sum().backward()
    for (name, p), q in zip(loop.named_parameters(), chunked.parameters()):
        assert _close(q.grad, p.grad), name


def test_unknown_scan_is_refused():
    with pytest.raises(ValueError, match="unknown scan 'fft'"):
        mamba.MambaMixer(8, scan="fft")


@pytest.mark.parametrize("variant,q,verdict", [("free", 5.0, "supercritical"), ("linear", 1.0, "certified")])
def test_qlint_gives_the_loop_exponents_for_the_chunked_scan(variant, q, verdict):
    model = mamba.build(variant, n_vars=3, seq_len=20, horizon=4, d_model=8, depth=2, scan="chunked")
    report = qlint.analyze(model, mamba.example_inputs(batch=2, seq_len=20, n_vars=3), isolated=True)
    assert [(block.name, block.q) for block in report.blocks] == [("layers.0", q), ("layers.1", q)]
    assert report.verdict == verdict


def test_the_probe_measures_q_5_through_the_chunked_scan():
    torch.manual_seed(0)
    model = mamba.build("free", n_vars=3, seq_len=20, horizon=4, d_model=8, depth=1, scan="chunked")
    (block,) = measure_model(model, mamba.example_inputs(batch=1, seq_len=20, n_vars=3),
                             ProbeSettings(random_directions=2, perturb=False))
    assert block.q_measured == pytest.approx(5.0, abs=0.05)
    assert block.agrees and block.agreement == "exact"


def test_the_grid_trains_mamba_through_the_chunked_scan_on_cuda(monkeypatch):
    pytest.importorskip("numpy")
    from dataclasses import replace

    from qlint.verify import grid as G
    from qlint.verify.train import resolve_scan, train_run

    assert resolve_scan("auto", "cpu") == "loop" and resolve_scan("chunked", "cpu") == "chunked"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_scan("auto", "auto") == "chunked" and resolve_scan("auto", "cuda") == "chunked"
    monkeypatch.undo()
    (cfg,) = G.build_grid(G.SCALES["smoke"], ["synthetic:1200:7:0"], backbones=["mamba"], variants=["free"],
                          depths=[3], scan="chunked", steps=3)
    assert cfg.scan == "chunked" and G.lint_key(vars(cfg)) == "mamba/free/L3/d8/s8/chunked"
    assert G.lint_key(vars(replace(cfg, scan="loop"))) == "mamba/free/L3/d8/s8"  # the key of every earlier run
    chunked, loop = train_run(cfg), train_run(replace(cfg, scan="loop"))
    assert chunked["scan"] == "chunked" and loop["scan"] == "loop"
    assert chunked["val_mse"] == pytest.approx(loop["val_mse"], rel=1e-4)
    assert [r["gain"]["4"] for r in chunked["telemetry"]] == pytest.approx([r["gain"]["4"] for r in loop["telemetry"]], rel=1e-3)
