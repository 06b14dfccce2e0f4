"""The probe's numerical linear algebra, free of models and graphs.

Overflow-safe norms (a velocity at alpha = 1e7 exceeds float64 when squared), a
Jacobian's operator norm by power iteration, its spectral radius and norm densely or
by restarted Arnoldi / Lanczos on Jacobian-vector products (each with an error bar),
and the least-squares slope of a log-log fit. :mod:`qlint.probe.measure` and
:mod:`qlint.probe.loops` drive them on a block's velocity and a loop's map.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

TensorMap = Callable[[torch.Tensor], torch.Tensor]  # a block's velocity, a loop's map, a matrix product


# --- overflow-safe norms --------------------------------------------------------------


def log_norm(value: torch.Tensor) -> Optional[float]:
    """log ||value||_2 computed as log(max|v|) + log||v / max|v|||, never overflowing.

    -inf for a zero tensor, None when the tensor holds inf or nan (a failed sample).
    """
    value = value.detach().to(torch.float64)
    if value.numel() == 0:
        return -math.inf
    if not bool(torch.isfinite(value).all()):
        return None
    peak = float(value.abs().max())
    if peak == 0.0:
        return -math.inf
    return math.log(peak) + math.log(float((value / peak).norm()))


def stable_norm(value: torch.Tensor) -> float:
    """||value||_2 by :func:`log_norm` (inf when it exceeds float64, nan when not finite)."""
    logarithm = log_norm(value)
    if logarithm is None:
        return math.nan
    return math.exp(logarithm) if logarithm < 709.0 else math.inf


# --- power iteration on Jacobian-vector products --------------------------------------


def _unit_random(like: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    u = torch.randn(like.shape, generator=generator, dtype=like.dtype).to(like.device)
    return u / u.norm()


def _quiet_jvp_import() -> None:
    """torch.func.jvp imports torch's JVP decompositions on first use, which call the deprecated
    torch.jit.script and print a FutureWarning on every probe run: import them with it silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script`", category=FutureWarning)
        try:
            import torch._decomp.decompositions_for_jvp  # noqa: F401
        except ImportError:  # a torch without the module: nothing to silence
            pass


def operator_norm(fn: TensorMap, x: torch.Tensor, iters: int = 20, seed: int = 0) -> float:
    """||grad fn(x)||_2: power iteration on J^T J, one JVP and one VJP per step.

    Returns ||J u|| for the last unit vector u, a lower estimate that converges to
    the largest singular value.
    """
    _quiet_jvp_import()
    u = _unit_random(x, seed)
    _, pullback = torch.func.vjp(fn, x)
    sigma = 0.0
    for _ in range(iters):
        _, ju = torch.func.jvp(fn, (x,), (u,))
        sigma = stable_norm(ju)
        if not 0.0 < sigma < math.inf:
            return sigma
        (jtju,) = pullback(ju)
        length = stable_norm(jtju)
        if not 0.0 < length < math.inf:
            return sigma
        u = jtju / length
    return sigma


# --- a Jacobian's spectral radius and norm: dense, or Arnoldi on JVPs -----------------


@dataclass(frozen=True)
class Estimate:
    """A spectral quantity of a Jacobian, its error bar, and how it was found.

    ``error`` is 0.0 for a dense decomposition (exact up to float64 round-off); for
    Arnoldi it is the residual-based estimate its function documents, inf when the
    iteration did not converge.
    """

    value: float
    error: float
    method: str  # "dense" or "arnoldi"
    detail: str  # the matrix's size, or the Krylov cycles run


def jacobian_matrix(fn: TensorMap, x: torch.Tensor, chunk_entries: int = 1 << 20) -> torch.Tensor:
    """d fn / d x at x as a dense matrix (n = x.numel() columns): forward-mode AD on the unit vectors.

    The columns go through ``torch.func.vmap`` about ``chunk_entries / n`` at a time (memory
    grows with the chunk); a function vmap cannot batch (a data-dependent or random op
    in the graph) is differentiated one column at a time, n JVPs.
    """
    _quiet_jvp_import()
    n = x.numel()
    units = torch.eye(n, dtype=x.dtype, device=x.device).reshape(n, *x.shape)

    def push(tangent: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(fn, (x,), (tangent,))[1]

    with torch.no_grad():
        try:
            columns = torch.func.vmap(push, chunk_size=max(1, chunk_entries // n))(units)
        except (RuntimeError, NotImplementedError):
            columns = torch.stack([push(unit) for unit in units])
    return columns.reshape(n, -1).T


def dense_spectrum(fn: TensorMap, x: torch.Tensor) -> tuple[Estimate, Estimate]:
    """rho(J) and ||J||_2 of the dense Jacobian by ``torch.linalg.eigvals`` / ``svdvals``: exact up to round-off."""
    matrix = jacobian_matrix(fn, x)
    detail = f"dense {matrix.shape[0]}×{matrix.shape[1]}"
    if not bool(torch.isfinite(matrix).all()):
        return Estimate(math.nan, math.nan, "dense", detail), Estimate(math.nan, math.nan, "dense", detail)
    radius = float(torch.linalg.eigvals(matrix).abs().max())
    norm = float(torch.linalg.svdvals(matrix)[0])
    return Estimate(radius, 0.0, "dense", detail), Estimate(norm, 0.0, "dense", detail)


def arnoldi(apply: TensorMap, start: torch.Tensor, dimension: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An orthonormal basis V of the Krylov space of ``apply`` from ``start``, and the Hessenberg H.

    H has shape (k+1, k), k <= dimension, and ``apply(V[:, :k]) = V[:, :k] H[:k] + H[k, k-1]
    v e_k^T`` with v the next basis vector. Modified Gram-Schmidt, run twice per vector
    (once loses orthogonality as the space nearly closes). It stops early when the new
    direction vanishes against ||apply(v)||: the space is then invariant, H[k, k-1] is
    round-off and H[:k]'s eigenvalues are the operator's.
    """
    basis = start.new_zeros(start.numel(), dimension + 1)
    hessenberg = start.new_zeros(dimension + 1, dimension)
    basis[:, 0] = start / start.norm()
    for j in range(dimension):
        w = apply(basis[:, j])
        size = w.norm()
        for _ in range(2):
            for i in range(j + 1):
                overlap = basis[:, i] @ w
                hessenberg[i, j] += overlap
                w = w - overlap * basis[:, i]
        hessenberg[j + 1, j] = w.norm()
        if not hessenberg[j + 1, j] > 1e-12 * size:
            return basis[:, : j + 1], hessenberg[: j + 2, : j + 1]
        basis[:, j + 1] = w / hessenberg[j + 1, j]
    return basis, hessenberg


def _real_direction(z: torch.Tensor) -> torch.Tensor:
    """A real vector in the span of a complex vector and its conjugate (a restart for real Arnoldi)."""
    peak = z[z.abs().argmax()]
    return (z * peak.conj() / peak.abs()).real


def _round_off(square: torch.Tensor) -> float:
    """The backward error of a k×k eigensolver, k eps ||H||_F: the floor under any residual."""
    return square.shape[0] * torch.finfo(square.dtype).eps * float(torch.linalg.matrix_norm(square))


def _dominant_ritz(hessenberg: torch.Tensor) -> tuple[float, torch.Tensor, float]:
    """|theta| for H's largest-modulus eigenvalue theta, its unit eigenvector, and the error estimate
    kappa (residual + round-off)."""
    k = hessenberg.shape[1]
    square = hessenberg[:k, :k]
    values, vectors = torch.linalg.eig(square)
    index = int(values.abs().argmax())
    y = vectors[:, index]
    residual = float(hessenberg[k, k - 1].abs() * y[k - 1].abs())
    try:  # rows of V^-1 are the left eigenvectors w with w^T y = 1, so kappa = ||w|| ||y|| = ||w||
        condition = float(torch.linalg.inv(vectors)[index].norm())
    except RuntimeError:  # a defective H: no first-order bound
        condition = math.inf
    return float(values[index].abs()), y, condition * (residual + _round_off(square))


def _top_singular_ritz(hessenberg: torch.Tensor) -> tuple[float, torch.Tensor, float]:
    """sqrt(theta) for the top eigenvalue theta of H from J^T J (symmetric up to round-off), its eigenvector,
    and its error bar."""
    k = hessenberg.shape[1]
    square = (hessenberg[:k, :k] + hessenberg[:k, :k].T) / 2
    values, vectors = torch.linalg.eigh(square)
    sigma = math.sqrt(max(float(values[-1]), 0.0))
    residual = float(hessenberg[k, k - 1].abs() * vectors[k - 1, -1].abs()) + _round_off(square)
    return sigma, vectors[:, -1], residual / sigma if sigma > 0 else math.sqrt(residual)


def _restarted_arnoldi(
    apply: TensorMap,
    start: torch.Tensor,
    ritz: Callable[[torch.Tensor], tuple[float, torch.Tensor, float]],
    *,
    dimension: int,
    cycles: int,
    tolerance: float,
    products: str,
) -> Estimate:
    """Arnoldi spaces rebuilt from the Ritz vector until ``ritz``'s error bar is below ``tolerance`` (relative).

    When the cycles run out first, the figure is the last Ritz value, "not converged",
    with an infinite error bar: far from normal, a Ritz value wanders by more than its
    residual says, so a residual that has not come down bounds nothing.
    """
    with torch.no_grad():
        for cycle in range(1, cycles + 1):
            basis, hessenberg = arnoldi(apply, start, min(dimension, start.numel()))
            k = hessenberg.shape[1]
            if not bool(torch.isfinite(hessenberg).all()):
                return Estimate(math.nan, math.nan, "arnoldi", f"{cycle}×{k} {products}, not finite")
            value, vector, error = ritz(hessenberg)
            if error <= tolerance * value:
                return Estimate(value, error, "arnoldi", f"{cycle}×{k} {products}")
            start = _real_direction(basis[:, :k].to(vector.dtype) @ vector)
    return Estimate(value, math.inf, "arnoldi", f"{cycles}×{k} {products}, not converged")


def arnoldi_spectral_radius(
    fn: TensorMap, x: torch.Tensor, *, dimension: int = 80, cycles: int = 10, tolerance: float = 1e-10, seed: int = 0
) -> Estimate:
    """rho(grad fn(x)) from JVPs: the largest modulus |theta| of the Ritz values of an Arnoldi space.

    The error bar is kappa * ||J x - theta x|| (plus the eigensolver's round-off): theta is
    an exact eigenvalue of a matrix within the Ritz residual of J, and kappa (theta's
    condition number in H) turns that into the first-order bound on |lambda - theta|, so
    on ||lambda| - |theta|| too. An estimate, not a certificate: it fails where J is so
    far from normal that the eigenvalue itself is ill-posed (kappa in H under-reads
    kappa in J), and an eigenvalue the Krylov space never saw is missed.
    """
    _quiet_jvp_import()

    def apply(v: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(fn, (x,), (v.reshape(x.shape),))[1].reshape(-1)

    start = _unit_random(x, seed).reshape(-1)
    return _restarted_arnoldi(apply, start, _dominant_ritz, dimension=dimension, cycles=cycles, tolerance=tolerance,
                              products="JVPs")


def lanczos_operator_norm(
    fn: TensorMap, x: torch.Tensor, *, dimension: int = 80, cycles: int = 10, tolerance: float = 1e-10, seed: int = 0
) -> Estimate:
    """||grad fn(x)||_2 from JVPs and VJPs: Arnoldi on J^T J, which is Lanczos with full reorthogonalization.

    theta, the top Ritz value of the symmetric J^T J, is at most sigma_max^2, and some
    eigenvalue sigma^2 lies within the residual r (plus the eigensolver's round-off) of
    it, so |sigma - sqrt(theta)| <= r / sqrt(theta): the error bar (it assumes that
    eigenvalue is the top one).
    """
    _quiet_jvp_import()
    _, pullback = torch.func.vjp(fn, x)

    def apply(v: torch.Tensor) -> torch.Tensor:
        pushed = torch.func.jvp(fn, (x,), (v.reshape(x.shape),))[1]
        return pullback(pushed)[0].reshape(-1)

    start = _unit_random(x, seed).reshape(-1)
    return _restarted_arnoldi(apply, start, _top_singular_ritz, dimension=dimension, cycles=cycles,
                              tolerance=tolerance, products="JVP+VJPs")


# --- the log-log fit ------------------------------------------------------------------


def least_squares_slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope through (x, y) points: on (log alpha, log||v||), the growth exponent."""
    mean_x = sum(p[0] for p in points) / len(points)
    mean_y = sum(p[1] for p in points) / len(points)
    covariance = sum((px - mean_x) * (py - mean_y) for px, py in points)
    variance = sum((px - mean_x) ** 2 for px, _ in points)
    return covariance / variance
