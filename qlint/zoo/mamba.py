"""Mamba selective-SSM blocks and a small time-series forecaster.

The native block has velocity exponent q = 5: Δ, B, C are linear in x (q = 1),
Δ⊙B⊙x makes the state q = 3 (Ā = exp(Δ·A) with A < 0 is a contraction, q = 0),
C⊙h gives q = 4 and the SiLU gate silu(z)⊙y gives q = 5.  ``linear_growth=True``
is the paper's modification: x_proj reads x/||x|| (Δ, B, C become q = 0) and the
gate is sigmoid(z), so the block is q = 1 without any norm layer.

The scan is a Python loop over time, as Mamba is usually written:
``torch.fx.symbolic_trace`` cannot trace it, ``torch.export`` (non-strict) unrolls it.
``scan="chunked"`` computes the same recurrence as a parallel prefix scan
(:func:`scan_chunked`): the same Euler ΔB̄x inputs, log-depth over time instead of one
step per time step, equal to the loop within float rounding.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from qlint.zoo import Forecaster, NormedBranch, example_inputs, make_norm, norm_kinds

__all__ = ["MambaMixer", "MambaBlock", "MambaForecaster", "build", "example_inputs", "scan_chunked", "SCANS"]

SCANS = ("loop", "chunked")
"""How the mixer runs its recurrence: the Python loop over time, or :func:`scan_chunked`."""


def _affine_scan(a: torch.Tensor, b: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All prefixes of h_t = a_t h_{t-1} + b_t along ``dim`` from h = 0: (prod_{s<=t} a_s, h_t).

    Hillis-Steele: after the round with offset d, position t holds the composition of
    the maps t-2d+1..t, combined as (a, b) after (a', b') = (a a', a b' + b), so
    ceil(log2 n) rounds of whole-tensor products and sums replace n steps. Only
    products of the a's and sums of b's scaled by them occur, no division and no
    log, so a in [0, 1] (Ā = exp(Δ·A), A < 0) keeps every factor in [0, 1].
    """
    n = a.shape[dim]
    offset = 1
    while offset < n:
        a_before = torch.cat([torch.ones_like(a.narrow(dim, 0, offset)), a.narrow(dim, 0, n - offset)], dim)
        b_before = torch.cat([torch.zeros_like(b.narrow(dim, 0, offset)), b.narrow(dim, 0, n - offset)], dim)
        b = a * b_before + b
        a = a * a_before
        offset *= 2
    return a, b


def scan_chunked(dA: torch.Tensor, dBx: torch.Tensor, C: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """:meth:`MambaMixer.scan` as a blocked prefix scan: equal within float rounding.

    Time is cut into chunks of ``chunk`` steps (the tail padded with the identity map
    Ā = 1, B̄x = 0); each chunk is scanned in parallel from h = 0 (:func:`_affine_scan`),
    the chunks' end states are scanned the same way across chunks, and each chunk adds
    its entry state carried by its cumulative Ā. Same inputs, so the velocity's
    exponent is the loop's (q = 5 for the native block): the state is a sum of
    B̄x terms scaled by products of Ā in [0, 1].
    """
    batch, length = dBx.shape[:2]
    pad = -length % chunk
    if pad:
        dA = torch.cat([dA, dA.new_ones(batch, pad, *dA.shape[2:])], 1)
        dBx = torch.cat([dBx, dBx.new_zeros(batch, pad, *dBx.shape[2:])], 1)
    blocks = (length + pad) // chunk
    decay, local = _affine_scan(dA.reshape(batch, blocks, chunk, *dA.shape[2:]),
                                dBx.reshape(batch, blocks, chunk, *dBx.shape[2:]), dim=2)
    _, ends = _affine_scan(decay[:, :, -1], local[:, :, -1], dim=1)   # h at the end of each chunk
    entry = torch.cat([torch.zeros_like(ends[:, :1]), ends[:, :-1]], 1)  # h entering each chunk
    h = (local + decay * entry[:, :, None]).reshape(batch, length + pad, *dBx.shape[2:])[:, :length]
    return (h * C[:, :, None, :]).sum(-1)


class MambaMixer(nn.Module):
    """Selective SSM mixer, (batch, seq, d_model) -> (batch, seq, d_model); ``scan`` is one of :data:`SCANS`."""

    def __init__(self, d_model: int, d_state: int = 8, d_conv: int = 4, expand: int = 2,
                 dt_rank: int | None = None, linear_growth: bool = False, scan: str = "loop"):
        super().__init__()
        if scan not in SCANS:
            raise ValueError(f"unknown scan {scan!r}; expected one of {SCANS}")
        self.scan_mode = scan
        d_inner = expand * d_model
        self.d_state = d_state
        self.dt_rank = dt_rank or math.ceil(d_model / 16)
        self.linear_growth = linear_growth
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0)).repeat(d_inner, 1))  # S4D-real
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        self._init_dt()

    @torch.no_grad()
    def _init_dt(self, dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        """Mamba's Δ init: softplus(dt_proj.bias) log-uniform in [dt_min, dt_max], for a stable start."""
        nn.init.uniform_(self.dt_proj.weight, -self.dt_rank ** -0.5, self.dt_rank ** -0.5)
        u = torch.rand(self.dt_proj.out_features)
        dt = torch.exp(u * math.log(dt_max / dt_min) + math.log(dt_min))
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[1]
        x, z = self.in_proj(x).chunk(2, dim=-1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :seq_len].transpose(1, 2))  # causal depthwise conv
        params = self.x_proj(F.normalize(x, dim=-1) if self.linear_growth else x)
        dt, B, C = params.split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(dt))                    # Δ: (batch, seq, d_inner)
        A = -torch.exp(self.A_log)                           # (d_inner, d_state), A < 0
        dA = torch.exp(dt[..., None] * A)                    # Ā: (batch, seq, d_inner, d_state)
        dBx = dt[..., None] * B[:, :, None, :] * x[..., None]  # B̄x: same shape
        y = (self.scan if self.scan_mode == "loop" else scan_chunked)(dA, dBx, C) + self.D * x
        gate = torch.sigmoid(z) if self.linear_growth else F.silu(z)
        return self.out_proj(y * gate)

    @staticmethod
    def scan(dA: torch.Tensor, dBx: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
        """Sequential recurrence h_t = Ā_t h_{t-1} + B̄x_t, y_t = <h_t, C_t>."""
        h = torch.zeros_like(dBx[:, 0])
        ys = []
        for t in range(dBx.shape[1]):
            h = dA[:, t] * h + dBx[:, t]
            ys.append((h * C[:, t, None, :]).sum(-1))
        return torch.stack(ys, dim=1)


def _norm_variant(variant: str) -> str:
    """"linear" is the norm-free variant with the linear-growth mixer."""
    return "free" if variant == "linear" else variant


class MambaBlock(nn.Module):
    """Residual block ``x + mixer(x)``, mixer = MambaMixer wrapped per ``variant``
    ("free", "rmsnorm", "preln", "periln", or "linear" for the linear-growth mixer)."""

    def __init__(self, d_model: int, variant: str, **mixer_kw):
        super().__init__()
        mixer_kw["linear_growth"] = variant == "linear"
        self.mixer = NormedBranch(MambaMixer(d_model, **mixer_kw), d_model, _norm_variant(variant))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mixer(x)


class MambaForecaster(Forecaster):
    """(batch, seq_len, n_vars) -> (batch, horizon, n_vars) with a stack of MambaBlocks.

    The head is factorised (per-step readout d_model -> n_vars, then a shared
    Linear over time seq_len -> horizon): a flat Linear(seq_len*d_model ->
    horizon*n_vars) would be ~31M parameters at horizon 720 instead of the
    paper's <= 2M.  "free" and "linear" have no final norm; the normed variants
    end with a norm of their input kind.
    """

    def __init__(self, n_vars: int = 7, seq_len: int = 96, horizon: int = 96, d_model: int = 32,
                 depth: int = 3, variant: str = "rmsnorm", revin: bool = False, **mixer_kw):
        super().__init__(revin)
        self.embed = nn.Linear(n_vars, d_model)
        self.layers = nn.ModuleList(MambaBlock(d_model, variant, **mixer_kw) for _ in range(depth))
        self.norm_f = make_norm(norm_kinds(_norm_variant(variant))[0], d_model)
        self.readout = nn.Linear(d_model, n_vars)
        self.head = nn.Linear(seq_len, horizon)

    def forecast(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        y = self.readout(self.norm_f(x))                    # (batch, seq_len, n_vars)
        return self.head(y.transpose(1, 2)).transpose(1, 2)


def build(variant: str = "free", **kw) -> MambaForecaster:
    """MambaForecaster with the given norm variant; ``kw`` as in its constructor."""
    return MambaForecaster(variant=variant, **kw)
