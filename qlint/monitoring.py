"""``qlint.monitor``: the residual stream's growth measured during a user's own training
(the module is ``qlint.monitoring``, so the function keeps the name).

The static verdict says whether ``||v(x)|| <= c||x||^q + b`` holds with q <= 1; this
module watches what training does with c. On a fixed batch it records, per residual
block that qlint's analysis found, the largest stream norm ||X_k|| over the batch's
windows and the gain ``||v(sX_k)|| / ||sX_k||`` at each scale s (default 1 and 4): a
block whose gain grows with s is the latent instability of the paper's Figure 1, the
stream still flat at s = 1.

Each block's velocity is the probe's (:class:`qlint.probe.measure.VelocityField`): the
block's region of the traced graph re-run with X_k := sX_k, everything else as recorded.
The graph shares the model's parameters, so the figures are those of the weights as
they are now. Nothing is attached to the model: measuring runs the traced graph.

>>> with qlint.monitor(model, (x,), dtype=torch.float16) as mon:
...     for step, batch in enumerate(loader):
...         train_step(batch)
...         mon.step()              # every ``every`` calls: measure the fixed batch
>>> mon.records[-1]
{'step': 300, 'block': 'layers.2', 'stream_norm': 25.1, 'gain': {'1': 0.41, '4': 97.3}}
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from qlint.analysis import Options, run
from qlint.core.blocks import StreamBlock
from qlint.core.errors import QlintError
from qlint.core.graph_check import shares_parameters
from qlint.core.trace import TraceFailure
from qlint.probe import bounds as probe_bounds
from qlint.probe.measure import Trajectory, VelocityField

__all__ = ["MonitorError", "StreamMonitor", "monitor", "overflow_depth"]


class MonitorError(QlintError):
    """The model's residual blocks cannot be found or measured; one-line message."""


def overflow_depth(records: Sequence[dict], dtype: torch.dtype) -> Optional[int]:
    """The number of blocks after which the measured gains no longer keep ||X|| below ``dtype``'s
    largest value M, if that happens within the model's blocks (``records``, in stream order).

    Derivation. For X_{k+1} = X_k + v(X_k), ||X_{k+1}|| <= ||X_k|| + ||v(X_k)||. Block k
    was measured at r_k = ||X_k|| (the largest over the batch) with gains g_k(s) at the
    scales s; a power law through the smallest and largest scale, ||v(x)|| = c_k ||x||^q_k
    with q_k = 1 + log(g_k(s_hi) / g_k(s_lo)) / log(s_hi / s_lo) and c_k = g_k(s_lo)
    (s_lo r_k)^(1 - q_k), meets both measurements. q_k is floored at 1: below it the gain
    falls with the norm, and the linear bound with the smaller scale's gain covers every
    larger norm. The paper's layerwise recursion r_{k+1} = r_k + c_k r_k^q_k
    (:func:`qlint.probe.bounds.step`) from the first block's r_0 then bounds the stream.
    With equal gains g it is (1 + g)^k r_0, past M after k* = log(M / r_0) / log(1 + g)
    blocks (Remark 6: g = 1 leaves float16 after 16 blocks); a gain that grows with s
    (q_k > 1) shortens it. An extrapolation from the measured scales, an early warning,
    not a certificate. A non-finite stream norm at block k is an overflow already: k.
    None when the bound stays below M through every block (or a gain is not finite).
    """
    for index, record in enumerate(records):
        if record["stream_norm"] is None:
            return index
    constants = [_power_law(record) for record in records]
    if not records or any(block is None for block in constants):
        return None
    limit, r = float(torch.finfo(dtype).max), records[0]["stream_norm"]
    for depth, block in enumerate(constants, 1):
        r = probe_bounds.step(r, block)
        if r > limit:
            return depth
    return None


def _power_law(record: dict) -> Optional[probe_bounds.BlockConstants]:
    """``c ||x||^q`` through the gains at the smallest and largest measured scale (q >= 1)."""
    gains = {float(s): g for s, g in record["gain"].items()}
    if any(g is None for g in gains.values()):
        return None
    low, high = min(gains), max(gains)
    r = record["stream_norm"]
    if gains[low] == 0.0 or r == 0.0:
        return probe_bounds.BlockConstants(1.0, gains[high], 0.0)
    q = 1.0 if high == low else max(1.0, 1.0 + math.log(gains[high] / gains[low]) / math.log(high / low))
    log_c = math.log(gains[low]) + (1.0 - q) * math.log(low * r)
    return probe_bounds.BlockConstants(q, math.exp(log_c) if log_c < 709.0 else math.inf, 0.0)


def _signature(inputs: tuple) -> tuple:
    """What a traced graph is specialised on: each input's shape, dtype and device (or type)."""
    return tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else type(x) for x in inputs)


def _row_norms(value: torch.Tensor) -> torch.Tensor:
    """||row|| along dim 0 (a batch-first stream: one norm per window), in float64 (no overflow of the squares)."""
    value = value.detach().to(torch.float64)
    return value.reshape(value.shape[0], -1).norm(dim=1) if value.dim() >= 2 else value.norm().reshape(1)


def _cuda_devices(inputs: tuple) -> list[int]:
    return sorted({x.device.index or 0 for x in inputs if isinstance(x, torch.Tensor) and x.device.type == "cuda"})


def _finite_or_none(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


class StreamMonitor:
    """Per-block stream norm and gain of ``model`` on a fixed batch (see :func:`monitor`)."""

    def __init__(self, model: torch.nn.Module, example_inputs: Any = None, *, every: int = 1,
                 scales: Sequence[float] = (1.0, 4.0), dtype: Optional[torch.dtype] = None,
                 log: Optional[Callable[[dict], None]] = None) -> None:
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, not {every}")
        if not scales or any(not (s > 0 and math.isfinite(s)) for s in scales):
            raise ValueError(f"scales must be positive finite numbers, not {tuple(scales)}")
        self.model = model
        self.every = every
        self.scales = tuple(float(s) for s in scales)
        self.dtype = dtype or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.log = log
        self.records: list[dict] = []
        self.steps = 0
        self.warning: Optional[str] = None  # the overflow warning, once given
        self.batch = self._as_inputs(example_inputs) if example_inputs is not None else None
        self._graphs: dict[tuple, tuple[Any, list[StreamBlock]]] = {}
        if self.batch is not None:
            self._graph_for(self.batch)  # find the blocks now: a model qlint cannot trace fails here, not mid-training

    # --- the blocks -------------------------------------------------------------------

    @staticmethod
    def _as_inputs(batch: Any) -> tuple:
        return tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)

    def _graph_for(self, inputs: tuple) -> tuple[Any, list[StreamBlock]]:
        """The traced graph and residual blocks for inputs of this signature, analysed once.

        A traced graph is specialised on its input shapes, so a batch of another shape
        is analysed again (in eval mode, as it is measured: no dropout in the graph).
        """
        key = _signature(inputs)
        if key not in self._graphs:
            name = type(self.model).__name__
            try:
                # tracing runs the model: keep training's random stream
                with torch.random.fork_rng(devices=_cuda_devices(inputs)):
                    analysis = run(self.model, inputs, spec=name, options=Options(mode="eval"))
            except TraceFailure as exc:
                raise MonitorError(f"qlint.monitor cannot trace {name}, so it has no blocks to measure: {exc}") from exc
            module = analysis.traced.module
            if not analysis.stream.blocks:
                raise MonitorError(f"qlint found no residual blocks in {name}: nothing to monitor")
            if not shares_parameters(module, self.model):
                raise MonitorError(f"the traced graph of {name} holds copies of its parameters, so it would not see "
                                   "training: "
                                   f"tracer {analysis.traced.tracer}")
            self._graphs[key] = (module, list(analysis.stream.blocks))
        return self._graphs[key]

    @property
    def blocks(self) -> list[str]:
        """The residual blocks' names, in stream order (empty before the first batch is known)."""
        return [block.name for block in next(iter(self._graphs.values()), (None, []))[1]]

    # --- measuring --------------------------------------------------------------------

    def step(self, batch: Any = None) -> Optional[list[dict]]:
        """Count one training step; every ``every`` steps measure ``batch`` (default: the fixed batch)."""
        self.steps += 1
        return self.measure(batch, step=self.steps) if self.steps % self.every == 0 else None

    def measure(self, batch: Any = None, *, step: Optional[int] = None) -> list[dict]:
        """One record per block for ``batch`` (default: the fixed batch; the first batch given becomes it).

        No gradients, the model's per-module training flags and the global RNG state are
        left as they were; the figures are those of eval mode (no dropout).
        """
        if batch is not None and self.batch is None:
            self.batch = self._as_inputs(batch)
        inputs = self._as_inputs(batch) if batch is not None else self.batch
        if inputs is None:
            raise MonitorError("qlint.monitor has no batch to measure: give example_inputs or pass a batch")
        module, blocks = self._graph_for(inputs)
        step = self.steps if step is None else step
        modes = [(m, m.training) for m in self.model.modules()]
        try:
            with torch.random.fork_rng(devices=_cuda_devices(inputs)), torch.no_grad():
                self.model.eval()
                with torch.autocast(inputs[0].device.type if isinstance(inputs[0], torch.Tensor) else "cpu",
                                    enabled=False):
                    trajectory = Trajectory(module, inputs)
                    records = [self._record(VelocityField(trajectory, block), step) for block in blocks]
        finally:
            for m, training in modes:
                m.training = training
        self.records += records
        if self.log is not None:
            for record in records:
                self.log(record)
        self._maybe_warn(records, step)
        return records

    def _record(self, field_: VelocityField, step: int) -> dict:
        stream = field_.stream
        norms = _row_norms(stream)
        nonzero = norms > 0
        gains: dict[str, Optional[float]] = {}
        for s in self.scales:
            if not bool(torch.isfinite(norms).all()):  # an overflowed stream has no gain
                gains[f"{s:g}"] = None
            elif bool(nonzero.any()):
                gains[f"{s:g}"] = _finite_or_none(float((_row_norms(field_(s * stream))[nonzero]
                                                         / (s * norms[nonzero])).max()))
            else:  # X_k = 0 in every window: nothing to divide by
                gains[f"{s:g}"] = 0.0
        return {"step": step, "block": field_.block.name, "stream_norm": _finite_or_none(float(norms.max())),
                "gain": gains}

    def _maybe_warn(self, records: list[dict], step: int) -> None:
        """Warn once when the measured gains put the overflow of ``self.dtype`` inside the model's depth."""
        if self.warning is not None:
            return
        depth = overflow_depth(records, self.dtype)
        if depth is None:
            return
        worst = max(records, key=lambda r: max((g for g in r["gain"].values() if g is not None), default=math.inf))
        gains = ", ".join(f"{g:.3g} at s={s}" if g is not None else f"non-finite at s={s}"
                          for s, g in worst["gain"].items())
        dtype = str(self.dtype).removeprefix("torch.")
        self.warning = (f"qlint.monitor: at step {step} block {worst['block']} has gain {gains}: the stream would "
                        "exceed "
                        f"the {dtype} maximum {torch.finfo(self.dtype).max:.5g} after k* = {depth} blocks, within the "
                        f"model's {len(records)} (stream norm {records[0]['stream_norm'] or math.inf:.3g} at the first "
                        "block)")
        warnings.warn(self.warning, RuntimeWarning, stacklevel=3)

    # --- the context manager ----------------------------------------------------------

    def close(self) -> None:
        """Drop the traced graphs (the records stay)."""
        self._graphs.clear()

    def __enter__(self) -> "StreamMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def monitor(model: torch.nn.Module, example_inputs: Any = None, *, every: int = 1, scales: Sequence[float] = (1.0, 4.0),
            dtype: Optional[torch.dtype] = None, log: Optional[Callable[[dict], None]] = None) -> StreamMonitor:
    """A :class:`StreamMonitor` of ``model``'s residual blocks.

    ``example_inputs`` (a tensor or tuple, the model's positional inputs) is the fixed
    batch, and the blocks are found on it now; without it the first batch measured
    becomes both. ``every``: :meth:`StreamMonitor.step` measures every that many calls.
    ``scales``: the s of the gains ``||v(sX_k)|| / ||sX_k||``. ``dtype``: the training
    dtype whose largest value the overflow warning is about (default: the parameters').
    ``log(record)`` is called with each record, a dict ``{"step", "block", "stream_norm",
    "gain": {"1": ..., "4": ...}}`` (None for a non-finite figure); all are kept in
    ``records``. Raises :class:`MonitorError` when qlint cannot find the blocks.
    """
    return StreamMonitor(model, example_inputs, every=every, scales=scales, dtype=dtype, log=log)
