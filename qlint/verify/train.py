"""The training harness for one run: Adam, MSE, a fixed step budget, one seed.

Blow-up criterion (the paper's "non-finite, or many orders of magnitude above the
target's dynamic range", made concrete): a run **blew up** when

* its validation MSE is non-finite (NaN/±inf) at any periodic evaluation or at the end
  (a non-finite *training* loss stops the run and triggers an immediate evaluation), or
* (equivalently) its training loss turns non-finite: the run stops there, since the
  next Adam step would make every parameter and so the validation loss NaN, or
* its final validation MSE exceeds ``BLOWUP_FACTOR × Var(target)`` = 1e3 × 1 = **1e3**
  (targets are z-scored with train statistics, so their variance is ~1).

Learning rate: the paper does not state one; we use Adam with ``lr = 1e-3`` (the
common default of the PatchTST / Mamba time-series code bases), no weight decay,
no gradient clipping and no LR schedule — clipping or warm-up would hide the very
instability that is being measured.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

BLOWUP_FACTOR = 1e3
"""A finite final val MSE above ``BLOWUP_FACTOR × Var(z-scored target)`` (= 1e3) is a blow-up."""

DEFAULT_LR = 1e-3


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; picklable so it can cross a spawn boundary."""

    backbone: str  # "mamba" | "patchtst"
    variant: str
    dataset: str  # short name for tables (ETTh1, weather, synthetic)
    data: str  # CSV path or "synthetic:ROWS:VARS:SEED"
    horizon: int
    depth: int
    seed: int
    steps: int = 300
    batch_size: int = 32
    lr: float = DEFAULT_LR
    d_model: int = 32
    seq_len: int = 96
    eval_every: int = 100
    max_eval_windows: int = 512  # 0 = every window of the split
    device: str = "cpu"
    bf16: bool = False
    threads: int = 0  # torch.set_num_threads in this process; 0 = leave alone
    model_kwargs: tuple = field(default_factory=tuple)  # extra (key, value) pairs for build()
    fast_scan: bool = True  # train Mamba through scan_unbind (same numbers, faster backward)

    @property
    def key(self) -> tuple:
        return run_key(asdict(self))


KEY_FIELDS = ("backbone", "variant", "dataset", "horizon", "depth", "seed")


def run_key(rec: dict) -> tuple:
    """The identity of a run in runs.jsonl (used for resume and sharding)."""
    return tuple(rec[k] for k in KEY_FIELDS)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but torch.cuda.is_available() is False")
    return device


def build_model(
    backbone: str,
    variant: str,
    *,
    n_vars: int,
    seq_len: int,
    horizon: int,
    d_model: int,
    depth: int,
    **kwargs: Any,
):
    """The reference architecture from ``qlint.zoo.<backbone>``."""
    import importlib

    module = importlib.import_module(f"qlint.zoo.{backbone}")
    return module.build(
        variant,
        n_vars=n_vars,
        seq_len=seq_len,
        horizon=horizon,
        d_model=d_model,
        depth=depth,
        **kwargs,
    )


def scan_unbind(dA, dBx, C):
    """Bit-identical to ``qlint.zoo.mamba.MambaMixer.scan`` but 3-5x faster to train on CPU.

    The zoo's loop indexes ``dA[:, t]``; the backward of each such select allocates a
    full-size zero tensor, so a 96-step scan moves 96 full copies of ``dA``/``dBx``/``C``
    per layer. ``unbind`` has a single backward node that stacks the slice gradients.
    Same operations in the same order, so forward values and gradients are unchanged
    (tests/test_verify.py checks this against the zoo's scan).
    """
    import torch

    h = torch.zeros_like(dBx[:, 0])
    ys = []
    for a, b, c in zip(dA.unbind(1), dBx.unbind(1), C.unbind(1)):
        h = a * h + b
        ys.append((h * c[:, None, :]).sum(-1))
    return torch.stack(ys, dim=1)


def use_fast_scan(model) -> int:
    """Route every Mamba mixer of ``model`` through :func:`scan_unbind` (per instance;
    the zoo class is untouched). Returns how many mixers were patched."""
    import inspect

    n = 0
    for module in model.modules():
        scan = getattr(type(module), "scan", None)
        if type(module).__name__ == "MambaMixer" and scan is not None:
            if list(inspect.signature(scan).parameters) == ["dA", "dBx", "C"]:
                module.scan = scan_unbind
                n += 1
    return n


def classify_blowup(val_history: list[float], final_val: Optional[float]) -> tuple[bool, str]:
    """``(blew_up, reason)`` from the periodic val MSEs and the final one."""
    for v in val_history:
        if v is None or not math.isfinite(v):
            return True, "non-finite validation loss"
    if final_val is None or not math.isfinite(final_val):
        return True, "non-finite validation loss"
    if final_val > BLOWUP_FACTOR:
        return True, f"final val MSE {final_val:.3g} > {BLOWUP_FACTOR:g} x Var(target)"
    return False, ""


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


def evaluate(model, series, seq_len: int, horizon: int, max_windows: int, batch: int, bf16: bool) -> float:
    """Mean squared error over the split's windows (evenly subsampled to ``max_windows``)."""
    import torch

    from qlint.verify.data import batch_windows

    n = len(series) - seq_len - horizon + 1
    if n <= 0:
        raise ValueError(f"split too short for seq_len={seq_len}, horizon={horizon}")
    if max_windows and n > max_windows:
        starts = np.unique(np.linspace(0, n - 1, max_windows).round().astype(np.int64))
    else:
        starts = np.arange(n)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts), batch):
            x, y = batch_windows(series, starts[i : i + batch], seq_len, horizon)
            with torch.autocast(series.device.type, dtype=torch.bfloat16, enabled=bf16):
                pred = model(x)
            err = (pred.float() - y).double().pow(2).sum().item()
            total += err
            count += y.numel()
    model.train()
    return total / count


def train_run(cfg: RunConfig) -> dict[str, Any]:
    """Train one model and return its record (without ``q``: the grid adds it)."""
    import torch

    from qlint.verify.data import batch_windows, load_dataset

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    data = load_dataset(cfg.data, cfg.seq_len)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    model = build_model(
        cfg.backbone,
        cfg.variant,
        n_vars=data.n_vars,
        seq_len=cfg.seq_len,
        horizon=cfg.horizon,
        d_model=cfg.d_model,
        depth=cfg.depth,
        **dict(cfg.model_kwargs),
    ).to(device)
    if cfg.fast_scan:
        use_fast_scan(model)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    train = torch.as_tensor(data.train, device=device)
    val = torch.as_tensor(data.val, device=device)
    test = torch.as_tensor(data.test, device=device)
    n_train = data.n_windows("train", cfg.horizon)
    if n_train <= 0:
        raise ValueError(f"{cfg.dataset}: train split too short for horizon {cfg.horizon}")
    gen = torch.Generator().manual_seed(cfg.seed)
    eval_batch = max(cfg.batch_size, 128)

    def ev(series) -> float:
        return evaluate(model, series, cfg.seq_len, cfg.horizon, cfg.max_eval_windows, eval_batch, cfg.bf16)

    val_history: list[float] = []
    train_loss = float("nan")
    steps_done = 0
    stopped = ""
    model.train()
    for step in range(cfg.steps):
        starts = torch.randint(n_train, (cfg.batch_size,), generator=gen)
        x, y = batch_windows(train, starts, cfg.seq_len, cfg.horizon)
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16):
            pred = model(x)
        loss = torch.nn.functional.mse_loss(pred.float(), y)
        train_loss = loss.item()
        if not math.isfinite(train_loss):
            stopped = f"non-finite training loss at step {step + 1}"
            val_history.append(ev(val))
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps_done = step + 1
        if cfg.eval_every and steps_done % cfg.eval_every == 0 and steps_done < cfg.steps:
            v = ev(val)
            val_history.append(v)
            if not math.isfinite(v):
                stopped = f"non-finite validation loss at step {steps_done}"
                break

    if stopped:
        val_mse, test_mse = val_history[-1], float("nan")
    else:
        val_mse, test_mse = ev(val), ev(test)
    blew_up, reason = classify_blowup(val_history, val_mse)
    if stopped:
        # A non-finite training loss stops the run: the next Adam step would turn the
        # parameters into NaN, so the validation loss would be non-finite from then on.
        blew_up, reason = True, stopped
    return {
        "backbone": cfg.backbone,
        "variant": cfg.variant,
        "dataset": cfg.dataset,
        "horizon": cfg.horizon,
        "depth": cfg.depth,
        "seed": cfg.seed,
        "val_mse": _finite(val_mse),
        "test_mse": _finite(test_mse),
        "blew_up": blew_up,
        "blowup_reason": reason,
        "steps": steps_done,
        "seconds": round(time.perf_counter() - t0, 3),
        "device": device,
        "bf16": cfg.bf16,
        "lr": cfg.lr,
        "d_model": cfg.d_model,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "final_train_loss": _finite(train_loss),
        "val_history": [_finite(v) for v in val_history],
        "torch": torch.__version__,
        "pid": os.getpid(),
    }
