"""The result cache: a model's report replayed, without torch, while nothing it was built from changed.

Like ruff's and mypy's caches it lives in ``.qlint_cache/`` at the project root (the
config file's folder, else the working directory; ``cache-dir`` / ``--cache-dir`` /
``QLINT_CACHE_DIR`` move it, ``--no-cache`` / ``QLINT_NO_CACHE=1`` turn it off, ``qlint
clean`` empties it). An entry's key is everything the analysis reads that is not a file:
the spec, the working directory, ``PYTHONPATH``, the effective analysis options (mode,
tracer, device, threshold, input shapes and dtype, remedies, declared primitives), the
Python version and the installed versions of qlint, torch, transformers and timm.

The files are recorded while the model is loaded and analysed (:func:`recording`): the
source of every module imported by the end of the run — the spec's file, the local
helpers it imports, qlint's own modules, the libraries — and every file opened for
reading meanwhile (a JSON config a factory reads, the rules catalogue), including
the ones that did not exist (a file that appears later can change what a factory does),
every folder listed, and every ``sys.path`` folder (the import system searches them, so a
new module that would shadow an imported one is seen). A hit needs each file as it was: the
same size and modification time, and, for a file modified within two seconds of the
entry (git's "racily clean" case) or whose stat changed, the same content hash; and each
folder with the same names (``__pycache__`` and the cache itself aside). Anything else is
a miss, and the model is analysed again.

What is stored is the report before suppressions: rule selection, ``noqa`` comments and
the baseline are applied afresh on every run. A model that failed is never stored. What
is not tracked: environment variables other than ``PYTHONPATH`` and files a factory reads
without ``open`` (a memory map, a subprocess); ``--no-cache`` is the escape hatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from qlint._version import DISTRIBUTION, __version__
from qlint.core.results import ModelReport

CACHE_DIR_NAME = ".qlint_cache"
FORMAT = 1  # bump when the entry layout or the report's classes change shape
VERSIONED = (DISTRIBUTION, "torch", "transformers", "timm")
HASHED_UP_TO = 1 << 20  # larger files (shared libraries) are checked by size and mtime only
RACY_SECONDS = 2.0
_UNSEEN = ("/proc/", "/dev/", "/sys/")

_recorders: list[set[str]] = []
_hook_installed = False


def _on_audit(event: str, args: tuple) -> None:
    """Every file opened for reading and every folder listed while a recorder is active
    (``sys.addaudithook``); a folder is recorded with a trailing separator."""
    if not _recorders or event not in ("open", "os.listdir", "os.scandir"):
        return
    if event != "open":
        folder = args[0] if args and args[0] is not None else "."
        if isinstance(folder, (str, bytes, os.PathLike)):
            for opened in _recorders:
                opened.add(os.path.join(os.path.abspath(os.fsdecode(folder)), ""))
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor
    if isinstance(mode, str) and any(c in mode for c in "wax") and "+" not in mode:
        return
    if mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR) == os.O_WRONLY:
        return
    name = os.path.abspath(os.fsdecode(path))
    for opened in _recorders:
        opened.add(name)


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """Collect the files opened for reading in the block (modules are added by :func:`read_files`)."""
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_on_audit)  # audit hooks cannot be removed; idle unless recording
        _hook_installed = True
    opened: set[str] = set()
    _recorders.append(opened)
    try:
        yield opened
    finally:
        _recorders.remove(opened)


def read_files(opened: set[str]) -> list[str]:
    """What an analysis depended on: ``opened`` (files, and folders ending in a separator),
    the source of every module loaded now and the ``sys.path`` folders (listed before the
    recording began, to import qlint)."""
    files = set(opened) | {os.path.join(os.path.abspath(entry or "."), "") for entry in sys.path if os.path.isdir(entry or ".")}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            files.add(os.path.abspath(file))
    return sorted(f for f in files if not f.startswith(_UNSEEN) and "__pycache__" not in f
                  and (f.endswith(os.sep) or not os.path.isdir(f)))


@dataclass(frozen=True)
class FileState:
    """A file as the analysis saw it (None for size when it did not exist), or a folder
    (its path ends in a separator) and the digest of its names."""

    path: str
    size: Optional[int]
    mtime_ns: int
    digest: Optional[str]  # sha256 for files up to HASHED_UP_TO bytes; of the names for a folder

    @classmethod
    def now(cls, path: str) -> "FileState":
        if path.endswith(os.sep):
            return cls(path, None, 0, _listing(path))
        try:
            stat = os.stat(path)
        except OSError:
            return cls(path, None, 0, None)
        return cls(path, stat.st_size, stat.st_mtime_ns, _digest(path) if stat.st_size <= HASHED_UP_TO else None)

    def unchanged(self, written_at: float) -> bool:
        """Is the file still as recorded? Stat first; content when the stat differs or is racy."""
        if self.path.endswith(os.sep):
            return _listing(self.path) == self.digest
        try:
            stat = os.stat(self.path)
        except OSError:
            return self.size is None
        if self.size is None or stat.st_size != self.size:
            return False
        racy = self.mtime_ns / 1e9 >= written_at - RACY_SECONDS
        if stat.st_mtime_ns == self.mtime_ns and not racy:
            return True
        return self.digest is not None and _digest(self.path) == self.digest


def _listing(folder: str) -> Optional[str]:
    """The digest of a folder's names, without the ones qlint and Python write there."""
    try:
        names = sorted(n for n in os.listdir(folder) if n not in ("__pycache__", CACHE_DIR_NAME))
    except OSError:
        return None
    return hashlib.sha256("\0".join(names).encode()).hexdigest()


def _digest(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def installed_versions() -> dict[str, Optional[str]]:
    """qlint's, torch's, transformers' and timm's installed versions, read without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, Optional[str]] = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    found[DISTRIBUTION] = f"{found[DISTRIBUTION]} ({__version__})"
    return found


class ResultCache:
    """Entries under ``directory``, one file per key, written atomically (parallel runs share it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.hits = 0
        self.misses = 0

    def key(self, spec: str, options: dict[str, Any]) -> str:
        """The hex key of one model's analysis with these options."""
        parts = {
            "format": FORMAT,
            "spec": spec,
            "cwd": os.getcwd(),
            "pythonpath": os.environ.get("PYTHONPATH", ""),
            "python": sys.version,
            "versions": installed_versions(),
            "options": options,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()

    def lookup(self, key: str) -> Optional[ModelReport]:
        """The stored report when every file it was built from is unchanged, else None."""
        try:
            with open(self._entry(key), "rb") as handle:
                entry = pickle.load(handle)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
            self.misses += 1
            return None
        if entry.get("format") != FORMAT or not all(state.unchanged(entry["written_at"]) for state in entry["files"]):
            self.misses += 1
            return None
        self.hits += 1
        return entry["report"]

    def store(self, key: str, report: ModelReport, files: list[str]) -> None:
        """Record ``report`` with the state of ``files``; a cache that cannot be written is skipped."""
        entry = {"format": FORMAT, "written_at": time.time(), "report": report,
                 "files": [FileState.now(f) for f in files if not f.startswith(str(self.directory.resolve()))]}
        try:
            self._prepare()
            with tempfile.NamedTemporaryFile("wb", dir=self.directory / "entries", delete=False) as handle:
                pickle.dump(entry, handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(handle.name, self._entry(key))
        except OSError:
            return

    def clear(self) -> int:
        """Remove the cache folder; the number of entries it held."""
        if not self.directory.is_dir():
            return 0
        count = len(list((self.directory / "entries").glob("*.pickle")))
        shutil.rmtree(self.directory)
        return count

    def _entry(self, key: str) -> Path:
        return self.directory / "entries" / f"{key}.pickle"

    def _prepare(self) -> None:
        """The folder, marked as a cache for git (``.gitignore``) and backup tools (``CACHEDIR.TAG``)."""
        (self.directory / "entries").mkdir(parents=True, exist_ok=True)
        ignore = self.directory / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# Automatically created by qlint.\n*\n", encoding="utf-8")
            (self.directory / "CACHEDIR.TAG").write_text(
                "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by qlint.\n",
                encoding="utf-8",
            )
