"""Long-horizon forecasting data: the ETT / Weather CSVs and a synthetic series.

The split protocol is the standard one of Informer / Autoformer / PatchTST
(``../shared/data/README.md``):

* **ETTh** (hourly): train = first 12 months = 8,640 rows, val = next 2,880,
  test = next 2,880 (rows past 14,400 are unused);
* **ETTm** (15 min): the same months, ×4 rows (34,560 / 11,520 / 11,520);
* **custom** (Weather and anything else): 0.7 / 0.1 / 0.2 of the rows, with
  ``n_train = int(0.7 n)``, ``n_test = int(0.2 n)``, ``n_val = n - n_train - n_test``.

Each split's window starts ``seq_len`` rows *before* its boundary, so the first
forecast target of the val/test split is the first row after the boundary. All
columns except the leading ``date`` are used (multivariate, "M" setting) and
z-scored with the mean/std of the train split only.

Only csv / numpy / torch are used: no pandas.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np

SEQ_LEN = 96
HORIZONS = (96, 192, 336, 720)
SPLITS = ("train", "val", "test")

# ETT-small rows per "month" in the protocol: 30 days × 24 h.
_ETTH_MONTH = 30 * 24


def infer_kind(path: str | os.PathLike) -> str:
    """``"ETTh"``, ``"ETTm"`` or ``"custom"`` from the file name (ETTh1.csv -> ETTh)."""
    name = Path(path).name.lower()
    if name.startswith("etth"):
        return "ETTh"
    if name.startswith("ettm"):
        return "ETTm"
    return "custom"


def dataset_name(path: str | os.PathLike) -> str:
    """The data set's short name: the file stem (``ETTh1``, ``weather``)."""
    return Path(path).stem


def split_borders(kind: str, n_rows: int, seq_len: int = SEQ_LEN) -> list[tuple[int, int]]:
    """Row ranges ``[(start, end)]`` for train, val, test (end exclusive).

    ``start`` of val/test is ``seq_len`` rows before the split boundary.
    """
    if kind in ("ETTh", "ETTm"):
        month = _ETTH_MONTH * (4 if kind == "ETTm" else 1)
        n_train, n_val, n_test = 12 * month, 4 * month, 4 * month
        b = [0, n_train, n_train + n_val, n_train + n_val + n_test]
        if b[3] > n_rows:
            raise ValueError(
                f"{kind} protocol needs {b[3]} rows (12/4/4 months) but the file has {n_rows}"
            )
    elif kind == "custom":
        n_train = int(n_rows * 0.7)
        n_test = int(n_rows * 0.2)
        n_val = n_rows - n_train - n_test
        b = [0, n_train, n_train + n_val, n_rows]
    else:
        raise ValueError(f"unknown data set kind {kind!r}")
    return [
        (0, b[1]),
        (max(b[1] - seq_len, 0), b[2]),
        (max(b[2] - seq_len, 0), b[3]),
    ]


def read_csv(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """Columns (without ``date``) and a float32 array (rows, columns)."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        skip_first = header[0].strip().lower() == "date"
        columns = header[1:] if skip_first else header
        rows = [r[1:] if skip_first else r for r in reader if r]
    data = np.asarray(rows, dtype=np.float64).astype(np.float32)
    return columns, data


def synthetic_series(
    n_rows: int = 2000,
    n_vars: int = 7,
    seed: int = 0,
    n_components: int = 3,
    noise: float = 0.1,
) -> np.ndarray:
    """Sums of sines with random periods/phases/amplitudes per variable plus Gaussian noise.

    Deterministic in ``seed``; returns float32 (n_rows, n_vars).
    """
    rng = np.random.default_rng(seed)
    t = np.arange(n_rows, dtype=np.float64)[:, None]
    out = np.zeros((n_rows, n_vars))
    for _ in range(n_components):
        period = rng.uniform(6.0, 96.0, size=n_vars)
        phase = rng.uniform(0.0, 2 * np.pi, size=n_vars)
        amp = rng.uniform(0.5, 2.0, size=n_vars)
        out += amp * np.sin(2 * np.pi * t / period + phase)
    out += rng.uniform(-1.0, 1.0, size=n_vars)  # offsets, so z-scoring matters
    out += noise * rng.standard_normal((n_rows, n_vars))
    return out.astype(np.float32)


def write_csv(path: str | os.PathLike, data: np.ndarray, columns: Optional[list[str]] = None) -> None:
    """Write ``data`` in the ETT layout (a ``date`` column first) — for tests and demos."""
    columns = columns or [f"v{i}" for i in range(data.shape[1])]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["date", *columns])
        for i, row in enumerate(data):
            w.writerow([f"t{i}", *(repr(float(x)) for x in row)])


@dataclass
class SplitData:
    """Z-scored train/val/test arrays (rows, n_vars) with the train statistics."""

    name: str
    kind: str
    seq_len: int
    columns: list[str]
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    borders: list[tuple[int, int]]

    @property
    def n_vars(self) -> int:
        return self.train.shape[1]

    def split(self, name: str) -> np.ndarray:
        return {"train": self.train, "val": self.val, "test": self.test}[name]

    def n_windows(self, split: str, horizon: int) -> int:
        """Number of (input, target) windows: ``len - seq_len - horizon + 1``."""
        return max(len(self.split(split)) - self.seq_len - horizon + 1, 0)


def make_splits(
    raw: np.ndarray,
    kind: str,
    name: str = "data",
    seq_len: int = SEQ_LEN,
    columns: Optional[list[str]] = None,
) -> SplitData:
    """Split ``raw`` by the protocol for ``kind`` and z-score with train statistics only."""
    borders = split_borders(kind, len(raw), seq_len)
    t0, t1 = borders[0]
    train_raw = raw[t0:t1].astype(np.float64)
    mean = train_raw.mean(axis=0)
    std = train_raw.std(axis=0)
    std = np.where(std > 0, std, 1.0)

    def z(a: np.ndarray) -> np.ndarray:
        return ((a.astype(np.float64) - mean) / std).astype(np.float32)

    parts = [z(raw[s:e]) for s, e in borders]
    return SplitData(
        name=name,
        kind=kind,
        seq_len=seq_len,
        columns=columns or [f"v{i}" for i in range(raw.shape[1])],
        train=parts[0],
        val=parts[1],
        test=parts[2],
        mean=mean.astype(np.float32),
        std=std.astype(np.float32),
        borders=borders,
    )


@lru_cache(maxsize=8)
def load_dataset(path: str, seq_len: int = SEQ_LEN) -> SplitData:
    """Load a CSV (ETTh*/ETTm*/other inferred from the file name) and split it."""
    if path.startswith("synthetic"):
        return load_synthetic(path, seq_len)
    columns, raw = read_csv(path)
    return make_splits(raw, infer_kind(path), dataset_name(path), seq_len, columns)


def load_synthetic(spec: str = "synthetic", seq_len: int = SEQ_LEN) -> SplitData:
    """``synthetic[:ROWS[:VARS[:SEED]]]`` -> a sines+noise series split 0.7/0.1/0.2."""
    parts = spec.split(":")
    n_rows = int(parts[1]) if len(parts) > 1 and parts[1] else 2000
    n_vars = int(parts[2]) if len(parts) > 2 and parts[2] else 7
    seed = int(parts[3]) if len(parts) > 3 and parts[3] else 0
    raw = synthetic_series(n_rows, n_vars, seed)
    return make_splits(raw, "custom", "synthetic", seq_len)


def repo_root() -> Path:
    """The project root (the folder holding the ``qlint`` package)."""
    return Path(__file__).resolve().parents[2]


def default_data_path() -> Optional[str]:
    """``$QLINT_DATA``, else ETTh1 at ``../shared/data/ETT-small/ETTh1.csv`` beside the
    repo root or the current directory; ``None`` when none exists."""
    env = os.environ.get("QLINT_DATA")
    if env:
        p = Path(env)
        if p.is_dir():
            p = p / "ETT-small" / "ETTh1.csv" if (p / "ETT-small").is_dir() else p / "ETTh1.csv"
        return str(p) if p.exists() else None
    rel = Path("..") / "shared" / "data" / "ETT-small" / "ETTh1.csv"
    for base in (repo_root(), Path.cwd()):
        cand = (base / rel).resolve()
        if cand.exists():
            return str(cand)
    return None


def batch_windows(series, starts, seq_len: int, horizon: int):
    """Gather (x, y) windows from a (rows, n_vars) torch tensor at integer ``starts``.

    x: (B, seq_len, n_vars) = series[s : s+seq_len]; y: (B, horizon, n_vars) the next rows.
    """
    import torch

    starts = torch.as_tensor(starts, dtype=torch.long, device=series.device)
    idx = starts[:, None] + torch.arange(seq_len + horizon, device=series.device)[None, :]
    w = series[idx]  # (B, seq_len + horizon, n_vars)
    return w[:, :seq_len], w[:, seq_len:]
