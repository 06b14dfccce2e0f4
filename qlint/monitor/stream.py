"""``qlint.monitor``: the residual stream's growth measured during a user's own training (the package
:mod:`qlint.monitor` is callable as this module's :func:`monitor`).

The static verdict says whether ``||v(x)|| <= c||x||^q + b`` holds with q <= 1; this
module watches what training does with c. On a fixed batch it records, per residual
block that qlint's analysis found, the largest stream norm ||X_k|| over the batch's
windows and the gain ``||v(sX_k)|| / ||sX_k||`` at each scale s (default 1, 4, 16, 64): a
block whose gain grows with s is the latent instability of the paper's Figure 1, the
stream still flat at s = 1.

It warns (once, :func:`warning_for`) on two separate signals: a superlinear block whose
velocity would outgrow the stream within ``margin`` (4) times the fixed batch's norm
(:func:`escape_scale`), and measured gains that, compounded across the model's depth,
leave the training dtype (:func:`overflow_depth`). Neither says when a run will blow up,
and a q <= 1 model whose per-block gain is large (Remark 6's exponential regime) can
diverge in its loss without either firing; results/README.md has the measurements.

Each block's velocity is the probe's (:class:`qlint.velocity.field.VelocityField`): the
block's region of the traced graph re-run with X_k := sX_k, everything else as recorded.
The graph shares the model's parameters, so the figures are those of the weights as
they are now. Nothing is attached to the model: measuring runs the traced graph.

>>> with qlint.monitor(model, (x,), dtype=torch.float16) as mon:
...     for step, batch in enumerate(loader):
...         train_step(batch)
...         mon.step()              # every ``every`` calls: measure the fixed batch
>>> mon.records[-1]
{'step': 300, 'block': 'layers.2', 'stream_norm': 25.1, 'gain': {'1': 0.41, '4': 97.3, '16': 9.1e4, '64': 2.3e7},
 'static_q': 5.0, 'exponent': 4.9, 'escape_scale': 1.9}
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from qlint.analysis import Options, run
from qlint.growth.stream import StreamBlock
from qlint.core.errors import QlintError
from qlint.capture.graph_check import shares_parameters
from qlint.capture.trace import TraceFailure
from qlint.velocity import bounds as paper_bounds
from qlint.velocity.field import Trajectory, VelocityField

__all__ = ["DEFAULT_SCALES", "ESCAPE_MARGIN", "MonitorError", "RUNAWAY_EXPONENT", "StreamMonitor", "escape_scale",
           "first_warning", "monitor", "overflow_depth", "top_exponent", "warning_for"]

DEFAULT_SCALES = (1.0, 4.0, 16.0, 64.0)
"""The s of the gains: the data's stream and 4, 16, 64 times it (the top pair measures the growth exponent)."""

RUNAWAY_EXPONENT = 1.5
"""A block whose gain grows faster than s^(RUNAWAY_EXPONENT - 1) between the two largest scales is superlinear.

Measured (results/etth1-monitor, etth1-d64: :func:`top_exponent` between s = 16 and 64 over every measurement of
52 runs): the q = 1 blocks (linear-growth Mamba, free PatchTST) at most 1.10 and the q = 0 variants at most 0, free
Mamba (q = 5) 4.0-6.5 from initialisation on; 1.5 sits between them with room on both sides, and below every
superlinear primitive's exponent (x^p with p >= 2)."""

ESCAPE_MARGIN = 4.0
"""Warn when a superlinear block's gain reaches 1 on a stream this many times the fixed batch's (see escape_scale)."""


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
    (:func:`qlint.velocity.bounds.step`) from the first block's r_0 then bounds the stream.
    With equal gains g it is (1 + g)^k r_0, past M after k* = log(M / r_0) / log(1 + g)
    blocks (Remark 6: g = 1 leaves float16 after 16 blocks); a gain that grows with s
    (q_k > 1) shortens it. An extrapolation from the measured scales, an early warning,
    not a certificate; and a window's norm, not its largest entry, is held against M, so in
    half precision it can fire before any entry overflows. A non-finite stream norm at block
    k is an overflow already: k. None when the bound stays below M through every block (or a
    gain is not finite).
    """
    for index, record in enumerate(records):
        if record["stream_norm"] is None:
            return index
    constants = [_power_law(record) for record in records]
    if not records or any(block is None for block in constants):
        return None
    limit, r = float(torch.finfo(dtype).max), records[0]["stream_norm"]
    for depth, block in enumerate(constants, 1):
        r = paper_bounds.step(r, block)
        if r > limit:
            return depth
    return None


def _gains(record: dict) -> list[tuple[float, float]]:
    """(s, g(s)) in increasing s, the finite gains only: a velocity that left the dtype at some scale says
    nothing the block's growth rather than the dtype is to blame for (a half-precision model's 64x stream)."""
    return sorted((float(s), g) for s, g in record["gain"].items() if g is not None)


def top_exponent(record: dict) -> Optional[float]:
    """The growth exponent ``1 + log(g(s_n) / g(s_n-1)) / log(s_n / s_n-1)`` between the two largest scales
    with a finite gain.

    For a block with ``||v(x)|| <= c||x||^q + b`` and q <= 1 the gain g(s) = ||v(sX)|| / ||sX|| is at most
    ``c (s r)^(q-1) + b / (s r)``, bounded as s grows, so this exponent tends to at most 1; for a block that
    grows like ``c||x||^q`` it tends to q. None with fewer than two finite gains or a zero gain.
    """
    gains = _gains(record)
    if len(gains) < 2 or record["stream_norm"] is None:
        return None
    (s_low, g_low), (s_high, g_high) = gains[-2], gains[-1]
    if g_low == 0.0 or g_high == 0.0:
        return None
    return 1.0 + math.log(g_high / g_low) / math.log(s_high / s_low)


def escape_scale(record: dict) -> Optional[float]:
    """The multiple of the fixed batch's stream at which a superlinear block's velocity outgrows the stream.

    Derivation. A block whose :func:`top_exponent` exceeds :data:`RUNAWAY_EXPONENT` grows like c||x||^q
    with q > 1 where the measurements reach. Where its gain g = c r^(q-1) reaches 1 the block at least
    doubles the stream, r -> r + c r^q >= 2r, and every doubling multiplies the gain by 2^(q-1): the
    iteration leaves any float range within about log_q(log_2(M / r)) + 1 applications (fp32: 4 at q = 5,
    8 at q = 2), a finite-time blow-up where a q <= 1 block only compounds (Figure 1). The scale s* where
    g(s*) = 1 is read off the log-log interpolation of the measured gains (the first crossing; above
    the largest scale, extrapolated along the top pair's exponent). None for a block that is not
    superlinear, or whose stream has overflowed already (that is an overflow, not a margin), and for
    a block qlint proved q <= 1 (``static_q``): its velocity cannot outgrow c||x|| + b, whatever a
    gain rising between two finite scales suggests. A scale at which the velocity itself is not
    finite (on a finite stream) counts as escaped there, whatever the exponent: the dtype cannot
    hold the block's output at that multiple of the stream.
    """
    if record.get("static_q") is not None and record["static_q"] <= 1.0 or record["stream_norm"] is None:
        return None
    overflow = min((float(s) for s, g in record["gain"].items() if g is None), default=None)
    crossing = _crossing(record)
    return min((s for s in (overflow, crossing) if s is not None), default=None)


def _crossing(record: dict) -> Optional[float]:
    """Where the finite gains of a superlinear record reach 1 (see :func:`escape_scale`)."""
    exponent = top_exponent(record)
    if exponent is None or exponent < RUNAWAY_EXPONENT:
        return None
    gains = _gains(record)
    if gains[0][1] >= 1.0:
        return gains[0][0]
    for (s_low, g_low), (s_high, g_high) in zip(gains, gains[1:]):
        if g_high >= 1.0:
            if g_low == 0.0:
                return s_high
            return s_low * math.exp(math.log(1.0 / g_low) * math.log(s_high / s_low) / math.log(g_high / g_low))
    s_top, g_top = gains[-1]
    return s_top * math.exp(-math.log(g_top) / (exponent - 1.0))


def warning_for(records: Sequence[dict], dtype: torch.dtype, margin: float = ESCAPE_MARGIN) -> Optional[str]:
    """The monitor's warning for one measurement of every block (``records``, in stream order), or None.

    Two separate signals: a superlinear block whose :func:`escape_scale` is at most ``margin`` (the
    latent instability of q > 1: tame on the data, a runaway within a factor ``margin`` of it), and
    :func:`overflow_depth` within the model's blocks (the measured gains compounded across depth leave
    ``dtype``: Remark 6's regime, which q <= 1 does not exclude). A stream already non-finite is reported
    as such.
    """
    for record in records:
        if record["stream_norm"] is None:
            return f"the stream entering block {record['block']} is already non-finite"
    escapes = [(scale, record) for record in records
               if (scale := record["escape_scale"] if "escape_scale" in record else escape_scale(record)) is not None
               and scale <= margin]
    if escapes:
        scale, record = min(escapes, key=lambda pair: pair[0])
        return (f"block {record['block']} grows superlinearly (gain {_gain_text(record)}; exponent "
                f"{top_exponent(record):.3g} between the largest scales): its velocity outgrows the stream at "
                f"{scale:.3g}x the fixed batch's stream norm {record['stream_norm']:.3g}, within the margin "
                f"{margin:g}x, and past that point the block runs away in a few applications")
    depth = overflow_depth(records, dtype)
    if depth is None:
        return None
    worst = max(records, key=lambda r: max((g for g in r["gain"].values() if g is not None), default=math.inf))
    dtype_name = str(dtype).removeprefix("torch.")
    return (f"block {worst['block']} has gain {_gain_text(worst)}: compounded across depth, the stream would exceed "
            f"the {dtype_name} maximum {torch.finfo(dtype).max:.5g} after k* = {depth} blocks, within the model's "
            f"{len(records)} (stream norm {records[0]['stream_norm']:.3g} at the first block)")


def first_warning(telemetry: Sequence[dict], dtype: torch.dtype, margin: float = ESCAPE_MARGIN) -> Optional[int]:
    """The first step of ``telemetry`` (records of several measurements, in order) whose records warn."""
    by_step: dict[int, list[dict]] = {}
    for record in telemetry:
        by_step.setdefault(record["step"], []).append(record)
    return next((step for step, records in by_step.items() if warning_for(records, dtype, margin)), None)


def _gain_text(record: dict) -> str:
    return ", ".join(f"{g:.3g} at s={s}" if g is not None else f"non-finite at s={s}"
                     for s, g in record["gain"].items())


def _power_law(record: dict) -> Optional[paper_bounds.BlockConstants]:
    """``c ||x||^q`` through the gains at the smallest and largest measured scale (q >= 1)."""
    gains = {float(s): g for s, g in record["gain"].items()}
    if any(g is None for g in gains.values()):
        return None
    low, high = min(gains), max(gains)
    r = record["stream_norm"]
    if gains[low] == 0.0 or gains[high] == 0.0 or r == 0.0:  # a velocity below sX's precision: no power law
        return paper_bounds.BlockConstants(1.0, max(gains.values()), 0.0)
    q = 1.0 if high == low else max(1.0, 1.0 + math.log(gains[high] / gains[low]) / math.log(high / low))
    log_c = math.log(gains[low]) + (1.0 - q) * math.log(low * r)
    return paper_bounds.BlockConstants(q, math.exp(log_c) if log_c < 709.0 else math.inf, 0.0)


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
                 scales: Sequence[float] = DEFAULT_SCALES, dtype: Optional[torch.dtype] = None,
                 log: Optional[Callable[[dict], None]] = None, margin: float = ESCAPE_MARGIN) -> None:
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, not {every}")
        if not scales or any(not (s > 0 and math.isfinite(s)) for s in scales):
            raise ValueError(f"scales must be positive finite numbers, not {tuple(scales)}")
        if len({f"{float(s):g}" for s in scales}) < 2:
            raise ValueError(f"scales must hold at least two distinct values (the growth fit needs two), not "
                             f"{tuple(scales)}")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype must be the training's floating-point dtype, not {dtype}")
        if not margin >= 1.0:
            raise ValueError(f"margin must be a multiple of the stream norm >= 1, not {margin}")
        self.model = model
        self.every = every
        self.scales = tuple(sorted(float(s) for s in scales))
        self.margin = float(margin)
        self.dtype = dtype or next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.log = log
        self.records: list[dict] = []
        self.steps = 0
        self.warning: Optional[str] = None  # the warning, once given (warning_for), and its step
        self.warning_step: Optional[int] = None
        self.batch = self._as_inputs(example_inputs) if example_inputs is not None else None
        self._graphs: dict[tuple, tuple[Any, list[StreamBlock]]] = {}
        self._static_q: dict[str, Optional[float]] = {}  # per block: qlint's proven exponent, None where unproven
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
            complete = analysis.report.verdict in ("certified", "supercritical")  # every block found and bounded
            self._static_q.update({block.name: float(block.q) if complete and block.q is not None else None
                                   for block in analysis.report.blocks})
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
        """The block's record: the largest gain over the windows per scale, and the growth exponent and
        escape scale of each window on its own (the largest and the smallest): a window's gains are one
        curve, while the largest gain at each scale may come from different windows (a near-empty window's
        bias-dominated gain would hide another's runaway)."""
        stream = field_.stream
        norms = _row_norms(stream)
        nonzero = norms > 0
        name = field_.block.name
        keys = [f"{s:g}" for s in self.scales]
        per_window: dict[str, list[Optional[float]]] = {}
        for key, s in zip(keys, self.scales):
            if not bool(torch.isfinite(norms).all()):  # an overflowed stream has no gain
                per_window[key] = [None]
            elif bool(nonzero.any()):
                ratios = _row_norms(field_(s * stream))[nonzero] / (s * norms[nonzero])
                per_window[key] = [_finite_or_none(float(g)) for g in ratios]
            else:  # X_k = 0 in every window: nothing to divide by
                per_window[key] = [0.0]
        gains = {key: None if None in values else max(values) for key, values in per_window.items()}
        record = {"step": step, "block": name, "stream_norm": _finite_or_none(float(norms.max())), "gain": gains,
                  "static_q": self._static_q.get(name)}
        windows = [{**record, "gain": {key: per_window[key][i] for key in keys}}
                   for i in range(len(per_window[keys[0]]))]
        exponents = [e for window in windows if (e := top_exponent(window)) is not None]
        escapes = [e for window in windows if (e := escape_scale(window)) is not None]
        record["exponent"] = max(exponents, default=None)
        record["escape_scale"] = min(escapes, default=None)
        return record

    def _maybe_warn(self, records: list[dict], step: int) -> None:
        """Warn once, at the first measurement :func:`warning_for` flags."""
        if self.warning is not None:
            return
        found = warning_for(records, self.dtype, self.margin)
        if found is None:
            return
        self.warning, self.warning_step = f"qlint.monitor: at step {step} {found}", step
        warnings.warn(self.warning, RuntimeWarning, stacklevel=3)

    # --- the context manager ----------------------------------------------------------

    def close(self) -> None:
        """Drop the traced graphs (the records stay)."""
        self._graphs.clear()

    def __enter__(self) -> "StreamMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def monitor(model: torch.nn.Module, example_inputs: Any = None, *, every: int = 1,
            scales: Sequence[float] = DEFAULT_SCALES, dtype: Optional[torch.dtype] = None,
            log: Optional[Callable[[dict], None]] = None, margin: float = ESCAPE_MARGIN) -> StreamMonitor:
    """A :class:`StreamMonitor` of ``model``'s residual blocks.

    ``example_inputs`` (a tensor or tuple, the model's positional inputs) is the fixed
    batch, and the blocks are found on it now; without it the first batch measured
    becomes both. ``every``: :meth:`StreamMonitor.step` measures every that many calls.
    ``scales``: the s of the gains ``||v(sX_k)|| / ||sX_k||`` (at least two; the top pair
    measures the growth exponent). ``dtype``: the training dtype whose largest value the
    depth signal is about (default: the parameters'). ``margin``: the escape scale at or
    below which a superlinear block warns (:func:`warning_for`). ``log(record)`` is called
    with each record, a dict ``{"step", "block", "stream_norm", "gain": {"1": ..., "4": ...},
    "static_q", "exponent", "escape_scale"}`` (None for a non-finite or undefined figure;
    ``static_q`` is qlint's exponent of the block where the analysis proved it); all are kept
    in ``records``. The first warning goes through :mod:`warnings` once and stays in
    ``warning`` / ``warning_step``. Raises :class:`MonitorError` when qlint cannot find the blocks.
    """
    return StreamMonitor(model, example_inputs, every=every, scales=scales, dtype=dtype, log=log, margin=margin)
