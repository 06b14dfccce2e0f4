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
every folder the factory listed, and every folder the import system searched (each
``sys.path`` entry and package folder, so a new module that would shadow an imported one is
seen). A hit needs each file as it was: the same size and modification time, and, for a
file modified within two seconds of the entry (git's "racily clean" case) or whose stat
changed, the same content hash; each folder the factory listed with the same names, and
each folder the import system searched with the same importable names (packages and
module files: a report or baseline written next to the model changes nothing), always
without ``__pycache__`` and the cache itself. Anything else is a miss, and the model is
analysed again.

What is stored is the report before suppressions: rule selection, ``noqa`` comments and
the baseline are applied afresh on every run. A model that failed is never stored. What
is not tracked: environment variables other than ``PYTHONPATH`` and files a factory reads
without ``open`` (a memory map, a subprocess); ``--no-cache`` is the escape hatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
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
FORMAT = 2  # bump when the entry layout or the report's classes change shape
VERSIONED = (DISTRIBUTION, "torch", "transformers", "timm")
HASHED_UP_TO = 1 << 20  # larger files (shared libraries) are checked by size and mtime only
RACY_SECONDS = 2.0
_UNSEEN = ("/proc/", "/dev/", "/sys/")
FILE, FOLDER, MODULES = "file", "folder", "modules"
_IMPORTABLE = tuple(importlib.machinery.all_suffixes())

_recorders: list[set[str]] = []
_hook_installed = False


def _on_audit(event: str, args: tuple) -> None:
    """Every file opened for reading and every folder listed while a recorder is active
    (``sys.addaudithook``). The import system's listings are kept apart: for those only the
    importable names count (a report written next to the model is no new module)."""
    if not _recorders or event not in ("open", "os.listdir", "os.scandir"):
        return
    if event != "open":
        folder = args[0] if args and args[0] is not None else "."
        if isinstance(folder, (str, bytes, os.PathLike)):
            caller = sys._getframe(1).f_code
            kind = MODULES if caller.co_name == "_fill_cache" and "importlib" in caller.co_filename else FOLDER
            for recorded in _recorders:
                recorded.add((kind, os.path.abspath(os.fsdecode(folder))))
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor
    if isinstance(mode, str) and any(c in mode for c in "wax") and "+" not in mode:
        return
    if mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR) == os.O_WRONLY:
        return
    name = os.path.abspath(os.fsdecode(path))
    for recorded in _recorders:
        recorded.add((FILE, name))


@contextlib.contextmanager
def recording() -> Iterator[set[tuple[str, str]]]:
    """Collect the files opened for reading and the folders listed in the block, as (kind, path)
    (modules and ``sys.path`` are added by :func:`read_files`)."""
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_on_audit)  # audit hooks cannot be removed; idle unless recording
        _hook_installed = True
    recorded: set[tuple[str, str]] = set()
    _recorders.append(recorded)
    try:
        yield recorded
    finally:
        _recorders.remove(recorded)


def read_files(recorded: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """What an analysis depended on: ``recorded``, the source of every module loaded now and
    the ``sys.path`` folders (searched before the recording began, to import qlint)."""
    found = set(recorded) | {(MODULES, os.path.abspath(entry or ".")) for entry in sys.path if os.path.isdir(entry or ".")}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            found.add((FILE, os.path.abspath(file)))
    return sorted((kind, path) for kind, path in found if not path.startswith(_UNSEEN) and "__pycache__" not in path
                  and (kind != FILE or not os.path.isdir(path)))


@dataclass(frozen=True)
class FileState:
    """A file as the analysis saw it (None for size when it did not exist), or a folder and
    the digest of its names (of its importable names for a folder the import system searched)."""

    kind: str  # FILE, FOLDER or MODULES
    path: str
    size: Optional[int]
    mtime_ns: int
    digest: Optional[str]  # sha256 for files up to HASHED_UP_TO bytes; of the names for a folder

    @classmethod
    def now(cls, kind: str, path: str) -> "FileState":
        if kind != FILE:
            return cls(kind, path, None, 0, _listing(path, importable=kind == MODULES))
        try:
            stat = os.stat(path)
        except OSError:
            return cls(kind, path, None, 0, None)
        return cls(kind, path, stat.st_size, stat.st_mtime_ns, _digest(path) if stat.st_size <= HASHED_UP_TO else None)

    def unchanged(self, written_at: float) -> bool:
        """Is the file still as recorded? Stat first; content when the stat differs or is racy."""
        if self.kind != FILE:
            return _listing(self.path, importable=self.kind == MODULES) == self.digest
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


def _listing(folder: str, *, importable: bool) -> Optional[str]:
    """The digest of a folder's names, without the ones qlint and Python write there; with
    ``importable`` only those an import could find (packages and module files)."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if e.name not in ("__pycache__", CACHE_DIR_NAME)
                           and (not importable or e.is_dir() or e.name.endswith(_IMPORTABLE)))
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

    def store(self, key: str, report: ModelReport, files: list[tuple[str, str]]) -> None:
        """Record ``report`` with the state of ``files``; a cache that cannot be written is skipped."""
        own = str(self.directory.resolve())
        entry = {"format": FORMAT, "written_at": time.time(), "report": report,
                 "files": [FileState.now(kind, path) for kind, path in files if not path.startswith(own)]}
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
