"""The training harness for one run: Adam, MSE or L1, a fixed step budget, one seed.

Two blow-up counts are recorded per run (:func:`classify_blowup`):

* ``blew_up_final`` — **the paper's rule** ("non-finite, or many orders of magnitude
  above the target's dynamic range", made concrete): the validation MSE at the end is
  non-finite (NaN/±inf) or exceeds ``BLOWUP_FACTOR × Var(target)`` = 1e3 × 1 = **1e3**
  (targets are z-scored with train statistics, so their variance is ~1), or a
  parameter turned non-finite (the run stops there: an Adam step without weight decay
  keeps a NaN/inf parameter non-finite, NaN - x = NaN, inf - x ∈ {inf, NaN}, so it is
  non-finite at the end too);
* ``blew_up_any`` — the harness's earlier, stricter rule: ``blew_up_final``, or a
  non-finite validation MSE at *any* periodic evaluation (training goes on after one,
  so a run can overflow on some windows mid-training and recover by the end).

A non-finite *training* loss does not stop a run by itself: under fp16 the GradScaler
skips that step and the parameters stay finite. After every such step the parameters
are checked, and the run stops (blown up by both rules, not evaluated) once one of
them is non-finite.

Defaults: Adam with ``lr = 1e-3`` (the common default of the PatchTST / Mamba
time-series code bases), no weight decay, no gradient clipping and no LR schedule —
clipping or warm-up would hide the very instability that is being measured. The grid's
presets and flags (``qlint verify grid --lr ... --amp fp16``) set every knob per run.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

BLOWUP_FACTOR = 1e3
"""A finite final val MSE above ``BLOWUP_FACTOR × Var(z-scored target)`` (= 1e3) is a blow-up;
a training loss above it (or non-finite) sets ``blowup_step``."""

DEFAULT_LR = 1e-3

AMP_MODES = ("fp32", "fp16", "bf16")
"""fp16 = autocast fp16 + a GradScaler (as the cited code bases' ``--use_amp``); bf16 = autocast bf16."""

LOSSES = ("mse", "l1")


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
    # qlint.monitor's measurements of the fixed batch during training (0: only at evaluations); it runs in
    # eval mode under a forked RNG, so it does not change the training trajectory (not a protocol knob)
    monitor_every: int = 0
    max_eval_windows: int = 512  # 0 = every window of the split
    device: str = "cpu"
    amp: str = "fp32"  # one of AMP_MODES
    loss: str = "mse"  # training loss, one of LOSSES (evaluation is always MSE)
    revin: bool = False  # RevIN instance normalisation around the model (qlint.zoo.Forecaster)
    d_state: Optional[int] = None  # Mamba's SSM state size; None = the zoo's default
    threads: int = 0  # torch.set_num_threads in this process; 0 = leave alone
    model_kwargs: tuple = field(default_factory=tuple)  # extra (key, value) pairs for build()
    # Mamba's recurrence: "loop" trains through scan_unbind (the zoo's loop, faster backward),
    # "chunked" through qlint.zoo.mamba.scan_chunked (log-depth over time: the GPU's choice)
    scan: str = "loop"

    @property
    def key(self) -> tuple:
        return run_key(asdict(self))


KEY_FIELDS = ("backbone", "variant", "dataset", "horizon", "depth", "seed")


def run_key(rec: dict) -> tuple:
    """The identity of a run in runs.jsonl (used for resume and sharding)."""
    return tuple(rec[k] for k in KEY_FIELDS)


def resolve_scan(scan: str, device: str) -> str:
    """``"auto"``: the chunked scan on cuda (one kernel launch per log2 step instead of per time
    step), the loop on cpu (measured faster there: chunked runs at 0.71x of scan_unbind)."""
    if scan != "auto":
        return scan
    return "chunked" if resolve_device(device).startswith("cuda") else "loop"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but torch.cuda.is_available() is False")
    return device


def build_for(cfg: RunConfig, n_vars: int):
    """The model of ``cfg``: the one the grid lints and the one it trains."""
    kwargs = dict(cfg.model_kwargs)
    if cfg.d_state is not None:
        kwargs["d_state"] = cfg.d_state
    if cfg.backbone == "mamba" and cfg.scan != "loop":
        kwargs["scan"] = cfg.scan
    return build_model(
        cfg.backbone,
        cfg.variant,
        n_vars=n_vars,
        seq_len=cfg.seq_len,
        horizon=cfg.horizon,
        d_model=cfg.d_model,
        depth=cfg.depth,
        revin=cfg.revin,
        **kwargs,
    )


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
    (tests/verify/test_verify.py checks this against the zoo's scan).
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


def classify_blowup(
    val_history: list[Optional[float]], final_val: Optional[float], stopped: str = ""
) -> tuple[bool, bool, str]:
    """``(blew_up_final, blew_up_any, reason)`` from the periodic val MSEs, the final one,
    and ``stopped`` (why training stopped early on non-finite parameters, if it did)."""
    if stopped:
        return True, True, stopped
    if final_val is None or not math.isfinite(final_val):
        return True, True, "non-finite final validation MSE"
    if final_val > BLOWUP_FACTOR:
        return True, True, f"final val MSE {final_val:.3g} > {BLOWUP_FACTOR:g} x Var(target)"
    bad = sum(v is None or not math.isfinite(v) for v in val_history)
    if bad:
        return (False, True,
                f"non-finite validation MSE at {bad} of {len(val_history)} periodic evaluations, finite at the end")
    return False, False, ""


def autocast(device_type: str, amp: str):
    """The forward-pass autocast context of an AMP mode (a no-op for fp32)."""
    import contextlib

    import torch

    dtype = amp_dtype(amp)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


def amp_dtype(amp: str):
    """The autocast dtype of an AMP mode (None for fp32)."""
    import torch

    if amp not in AMP_MODES:
        raise ValueError(f"amp must be one of {AMP_MODES}, got {amp!r}")
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[amp]


def _all_finite(model) -> bool:
    import torch

    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) else None


TELEMETRY_WINDOWS = 32
"""The fixed batch of the stream telemetry: this many of the evaluated windows, evenly spread."""


def _eval_starts(series, seq_len: int, horizon: int, max_windows: int):
    """The split's window starts, evenly subsampled to ``max_windows`` (0: all of them)."""
    n = len(series) - seq_len - horizon + 1
    if n <= 0:
        raise ValueError(f"split too short for seq_len={seq_len}, horizon={horizon}")
    if max_windows and n > max_windows:
        return np.unique(np.linspace(0, n - 1, max_windows).round().astype(np.int64))
    return np.arange(n)


def measure_stream(monitor, series, starts, seq_len: int, horizon: int, step: int) -> None:
    """Record, at ``step``, each block's largest stream norm and gains on the fixed batch:
    TELEMETRY_WINDOWS of the evaluated window ``starts``, evenly spread (the same ones every time)."""
    from qlint.verify.data import batch_windows

    fixed = starts[np.unique(np.linspace(0, len(starts) - 1, TELEMETRY_WINDOWS).round().astype(np.int64))]
    monitor.measure(batch_windows(series, fixed, seq_len, horizon)[0], step=step)


def evaluate(model, series, seq_len: int, horizon: int, max_windows: int, batch: int, amp: str,
             monitor=None, step: int = 0) -> float:
    """Mean squared error over the split's windows (evenly subsampled to ``max_windows``);
    with ``monitor`` (a :class:`qlint.monitor.stream.StreamMonitor`) first :func:`measure_stream`."""
    import torch

    from qlint.verify.data import batch_windows

    starts = _eval_starts(series, seq_len, horizon, max_windows)
    if monitor is not None:
        measure_stream(monitor, series, starts, seq_len, horizon, step)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts), batch):
            x, y = batch_windows(series, starts[i : i + batch], seq_len, horizon)
            with autocast(series.device.type, amp):
                pred = model(x)
            err = (pred.float() - y).double().pow(2).sum().item()
            total += err
            count += y.numel()
    model.train()
    return total / count


def train_run(cfg: RunConfig) -> dict[str, Any]:
    """Train one model and return its record (without ``q``: the grid adds it)."""
    import torch

    from qlint.monitor.stream import StreamMonitor
    from qlint.verify.data import batch_windows, load_dataset

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    data = load_dataset(cfg.data, cfg.seq_len)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    model = build_for(cfg, data.n_vars).to(device)
    if cfg.scan == "loop":
        use_fast_scan(model)
    monitor = StreamMonitor(model, dtype=amp_dtype(cfg.amp))  # blocks found on the first evaluation's batch
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # fp16: scale the loss and skip any step whose gradients overflow (disabled: a no-op)
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=cfg.amp == "fp16")
    loss_fn = {"mse": torch.nn.functional.mse_loss, "l1": torch.nn.functional.l1_loss}[cfg.loss]
    train = torch.as_tensor(data.train, device=device)
    val = torch.as_tensor(data.val, device=device)
    test = torch.as_tensor(data.test, device=device)
    n_train = data.n_windows("train", cfg.horizon)
    if n_train <= 0:
        raise ValueError(f"{cfg.dataset}: train split too short for horizon {cfg.horizon}")
    gen = torch.Generator().manual_seed(cfg.seed)
    eval_batch = max(cfg.batch_size, 128)

    def ev(series) -> float:
        return evaluate(model, series, cfg.seq_len, cfg.horizon, cfg.max_eval_windows, eval_batch, cfg.amp,
                        monitor=monitor if series is val else None, step=steps_done)

    val_history: list[float] = []
    train_loss = float("nan")
    nonfinite_train_losses = 0
    blowup_step: Optional[int] = None
    steps_done = 0
    stopped = ""
    val_starts = _eval_starts(val, cfg.seq_len, cfg.horizon, cfg.max_eval_windows)
    if cfg.eval_every or cfg.monitor_every:  # the gains at initialisation: what training starts from
        measure_stream(monitor, val, val_starts, cfg.seq_len, cfg.horizon, step=0)
    model.train()
    for step in range(cfg.steps):
        starts = torch.randint(n_train, (cfg.batch_size,), generator=gen)
        x, y = batch_windows(train, starts, cfg.seq_len, cfg.horizon)
        with autocast(device.split(":")[0], cfg.amp):
            pred = model(x)
        loss = loss_fn(pred.float(), y)
        train_loss = loss.item()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        steps_done = step + 1
        if blowup_step is None and not train_loss <= BLOWUP_FACTOR:  # NaN compares False
            blowup_step = steps_done
        if not math.isfinite(train_loss):
            nonfinite_train_losses += 1
            if not _all_finite(model):
                # non-finite parameters stay non-finite under Adam (module docstring): the run
                # has blown up by either rule, and a model with NaN weights is not evaluated
                stopped = f"non-finite parameters after step {steps_done} (training loss {train_loss})"
                break
        if cfg.eval_every and steps_done % cfg.eval_every == 0 and steps_done < cfg.steps:
            val_history.append(ev(val))  # measures the stream first
        elif cfg.monitor_every and steps_done % cfg.monitor_every == 0:
            measure_stream(monitor, val, val_starts, cfg.seq_len, cfg.horizon, step=steps_done)

    if stopped:
        val_mse = test_mse = float("nan")
    else:
        val_mse, test_mse = ev(val), ev(test)
    blew_up_final, blew_up_any, reason = classify_blowup(val_history, val_mse, stopped)
    return {
        "backbone": cfg.backbone,
        "variant": cfg.variant,
        "dataset": cfg.dataset,
        "horizon": cfg.horizon,
        "depth": cfg.depth,
        "seed": cfg.seed,
        "val_mse": _finite(val_mse),
        "test_mse": _finite(test_mse),
        "blew_up_final": blew_up_final,
        "blew_up_any": blew_up_any,
        "blew_up": blew_up_any,  # the field's meaning since the first runs.jsonl: the any-evaluation rule
        "blowup_reason": reason,
        "steps": steps_done,
        "seconds": round(time.perf_counter() - t0, 3),
        "device": device,
        "amp": cfg.amp,
        "lr": cfg.lr,
        "d_model": cfg.d_model,
        "d_state": cfg.d_state,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "revin": cfg.revin,
        "loss": cfg.loss,
        "eval_every": cfg.eval_every,
        "scan": cfg.scan if cfg.backbone == "mamba" else None,
        "final_train_loss": _finite(train_loss),
        "nonfinite_train_losses": nonfinite_train_losses,
        "blowup_step": blowup_step,
        "monitor_every": cfg.monitor_every or cfg.eval_every,
        "monitor_first_warning_step": monitor.warning_step,
        "val_history": [_finite(v) for v in val_history],
        "telemetry": monitor.records,
        "torch": torch.__version__,
        "pid": os.getpid(),
    }
