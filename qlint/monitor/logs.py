"""Sinks for :func:`qlint.monitor`'s ``log=``: a CSV file and TensorBoard.

>>> with CSVLog("runs/qlint.csv") as to_csv, TensorBoardLog("runs/qlint") as to_tb:
...     mon = qlint.monitor(model, (x,), every=100, log=fan_out(to_csv, to_tb))
...     for batch in loader:
...         train_step(batch)
...         mon.step()

Each record's figures are :func:`figures`: every numeric field
but ``step`` (``stream_norm``, and any the records gain later) and each entry of a dict
field as ``<field>@<key>`` (``gain@4``). The TensorBoard tags are those the Trainer and
Lightning callbacks log, ``qlint/<block>/<figure>``. Nothing here imports tensorboard until a
``TensorBoardLog`` is made on a directory.
"""

from __future__ import annotations

import csv
import math
import numbers
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["CSVLog", "TensorBoardLog", "fan_out", "figures", "metrics"]


def figures(record: dict) -> dict[str, Optional[float]]:
    """A record's figures by name, in the record's order: every numeric (or None) field but
    ``step``, and each entry ``k`` of a dict field ``x`` as ``x@k`` (``gain@4``); other fields
    (text) are left out. None (a non-finite figure) stays None; a bool counts as 0 / 1.
    """
    out: dict[str, Optional[float]] = {}
    for key, value in record.items():
        if key in ("step", "block"):
            continue
        entries = {f"{key}@{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value}
        out.update({name: None if v is None else float(v) for name, v in entries.items() if _numeric(v)})
    return out


def metrics(records: Sequence[dict]) -> dict[str, float]:
    """One flat scalar per block and figure, ``qlint/<block>/<figure>`` (nan for None), the shape training
    loggers take; the figures are :func:`figures`'."""
    return {f"qlint/{record['block']}/{name}": _number(value)
            for record in records for name, value in figures(record).items()}


def _numeric(value: Any) -> bool:
    return value is None or isinstance(value, numbers.Real)


def _number(value: Optional[float]) -> float:
    return math.nan if value is None else value


class CSVLog:
    """One row per record in ``path``: ``step, block`` and the record's figures (``stream_norm, gain@1,
    gain@4``, ...; an empty cell for a non-finite one), the columns those of the first record.

    Each row is flushed as it is written. An existing file is appended to when its header is the
    same, else the first record raises ``ValueError``; a figure a later record adds is dropped with
    a warning (the header is written once).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.columns: Optional[list[str]] = None
        self._file: Any = None
        self._writer: Optional[csv.DictWriter] = None
        self._dropped: set[str] = set()

    def __call__(self, record: dict) -> None:
        row = {"step": record["step"], "block": record["block"],
               **{name: "" if value is None else value for name, value in figures(record).items()}}
        if self._writer is None:
            self._open(list(row))
        assert self.columns is not None and self._writer is not None
        extra = [name for name in row if name not in self.columns and name not in self._dropped]
        if extra:
            self._dropped.update(extra)
            warnings.warn(f"qlint CSVLog: {self.path} has no column for {', '.join(extra)}: left out", RuntimeWarning,
                          stacklevel=2)
        self._writer.writerow(row)
        self._file.flush()

    def _open(self, columns: list[str]) -> None:
        header = self.columns or columns
        existing = None
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, newline="") as file:
                existing = next(csv.reader(file), [])
            if existing != header:
                raise ValueError(f"{self.path} has the columns {existing}, these records {header}: log to another file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 (open across records, until close())
        self._writer = csv.DictWriter(self._file, header, restval="", extrasaction="ignore")
        self.columns = header
        if existing is None:
            self._writer.writeheader()
            self._file.flush()

    def close(self) -> None:
        """Close the file (a later record opens it again, appending)."""
        if self._file is not None:
            self._file.close()
        self._file, self._writer = None, None

    def __enter__(self) -> "CSVLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardLog:
    """Each record's figures as ``add_scalar(f"qlint/{block}/{figure}", value, step)`` (nan for a
    non-finite one) to ``writer_or_log_dir``: a ``SummaryWriter`` (anything with ``add_scalar``), or a
    directory, for which this sink makes a ``torch.utils.tensorboard.SummaryWriter`` and owns it.
    ``close()`` closes a writer it owns and only flushes a given one.
    """

    def __init__(self, writer_or_log_dir: Any) -> None:
        self.owns_writer = isinstance(writer_or_log_dir, (str, os.PathLike))
        if self.owns_writer:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError("qlint TensorBoardLog needs tensorboard: pip install tensorboard") from exc
            self.writer = SummaryWriter(log_dir=os.fspath(writer_or_log_dir))
        else:
            self.writer = writer_or_log_dir

    def __call__(self, record: dict) -> None:
        for tag, value in metrics([record]).items():
            self.writer.add_scalar(tag, value, record["step"])

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        if self.owns_writer:
            self.writer.close()
        else:
            self.writer.flush()

    def __enter__(self) -> "TensorBoardLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fan_out(*sinks: Callable[[dict], None]) -> Callable[[dict], None]:
    """One ``log=`` that hands each record to every sink, in order."""
    def log(record: dict) -> None:
        for sink in sinks:
            sink(record)
    return log
