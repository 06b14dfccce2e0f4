"""The result cache: a model's report replayed, without torch, while nothing it was built from changed.

Like ruff's and mypy's caches it lives in ``.qlint_cache/`` at the project root (the
config file's folder, else the working directory; ``cache-dir`` / ``--cache-dir`` /
``QLINT_CACHE_DIR`` move it, ``--no-cache`` / ``QLINT_NO_CACHE=1`` turn it off, ``qlint
clean`` empties it). An entry's key is everything the analysis reads that is not a file,
taken before the model is loaded: the spec, the working directory, the interpreter
(``sys.executable``, ``sys.prefix``, ``sys.path``), ``PYTHONPATH``, the effective analysis
options (mode, tracer, device, threshold, input shapes and dtype, remedies, declared
primitives), the Python version and the installed versions of qlint, torch, transformers
and timm.

The files are recorded from the moment this module is imported (an audit hook, so a file
a helper module reads when it is first imported counts for every model of the run): every
file opened for reading, including the ones that did not exist (a file that appears later
can change what a factory does), next to each of them the weight files a loader may map
into memory without ``open`` (``*.safetensors``, ``*.bin``, ``*.pt`` ...), the source of
every module imported by the end of the run, every folder the factory listed, and every
folder the import system searched (each ``sys.path`` entry and package folder, so a new
module that would shadow an imported one is seen; a listed folder that is a ``sys.path``
entry or a package counts as searched by imports). A hit needs each file as it was: the
same size, modification time, inode and change time (which no tool can set back), or,
for a file modified within two seconds of the entry (git's "racily clean" case) or
whose stat changed, the same content hash (files up to 1 MiB); each folder the factory
listed with the same names, and each folder the import system searched with the same
importable names (packages and module files: a report or baseline written next to the
model changes nothing), always without ``__pycache__`` and the cache itself. A file whose
stat changed between its first opening and the end of the analysis is not trusted: the
entry is not stored. Anything else is a miss, and the model is analysed again.

What is stored is the report before suppressions: rule selection, ``noqa`` comments and
the baseline are applied afresh on every run. A model that failed is never stored. Not
tracked: environment variables other than ``PYTHONPATH``, and files read without ``open``
other than weight files next to an opened file (a subprocess's reads); ``--no-cache`` is
the escape hatch. The cache only writes into, and ``qlint clean`` only removes, a folder
marked by qlint's ``CACHEDIR.TAG`` (or a new one); a folder holding only what qlint writes
there gets a damaged or missing tag back, and :meth:`ResultCache.problem` says why any other
folder is not used (the run prints it as a warning, never silently caching nothing).

Nothing read back is trusted: an entry that does not unpickle, or unpickles to anything but
an entry of this format, is a miss (``ResultCache.why`` says which; ``qlint -v`` prints it).
Entries are written whole (:mod:`qlint.ci.files`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import json
import os
import pickle
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from qlint._version import DISTRIBUTION, __version__
from qlint.ci.files import WriteError, write_bytes, write_text
from qlint.core.errors import QlintError
from qlint.core.results import ModelReport

CACHE_DIR_NAME = ".qlint_cache"
FORMAT = 3  # bump when the entry layout or the report's classes change shape
VERSIONED = (DISTRIBUTION, "torch", "transformers", "timm")
HASHED_UP_TO = 1 << 20  # larger files (shared libraries) are checked by size and mtime only
RACY_SECONDS = 2.0
_UNSEEN = ("/proc/", "/dev/", "/sys/")
_LIBRARIES = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
FILE, FOLDER, MODULES = "file", "folder", "modules"
_IMPORTABLE = tuple(importlib.machinery.all_suffixes())

_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npz", ".npy", ".h5", ".gguf", ".msgpack")
_GITIGNORE = "# Automatically created by qlint.\n*\n"
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by qlint.\n"
_recorded: set[tuple[str, str]] = set()  # (kind, path) since this module was imported
_first_stat: dict[str, Optional[tuple]] = {}  # a file's stat when it was first opened


def _on_audit(event: str, args: tuple) -> None:
    """Every file opened for reading and every folder listed (``sys.addaudithook``)."""
    if event not in ("open", "os.listdir", "os.scandir"):
        return
    if event != "open":
        folder = args[0] if args and args[0] is not None else "."
        if isinstance(folder, (str, bytes, os.PathLike)):
            _recorded.add((FOLDER, os.path.abspath(os.fsdecode(folder))))
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # a file descriptor
    if isinstance(mode, str) and any(c in mode for c in "wax") and "+" not in mode:
        return
    if mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR) == os.O_WRONLY:
        return
    name = os.path.abspath(os.fsdecode(path))
    if (FILE, name) not in _recorded:
        _recorded.add((FILE, name))
        _first_stat[name] = _stat(name)


sys.addaudithook(_on_audit)  # cannot be removed; a set lookup per open


def read_files() -> list[tuple[str, str]]:
    """What the analyses of this process depended on: every file and folder recorded, the
    weight files beside the opened files, the source of every module loaded now and the
    ``sys.path`` folders (searched before the hook was installed, to import qlint)."""
    searched = {os.path.abspath(entry or ".") for entry in sys.path if os.path.isdir(entry or ".")}
    found = {(MODULES if kind == FOLDER and _searched_by_imports(path, searched) else kind, path)
             for kind, path in _recorded}
    found |= {(MODULES, folder) for folder in searched}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            found.add((FILE, os.path.abspath(file)))
    for folder in {os.path.dirname(path) for kind, path in found if kind == FILE and not path.startswith(_LIBRARIES)}:
        try:
            with os.scandir(folder) as entries:
                found.update((FILE, e.path) for e in entries if e.name.endswith(_WEIGHTS))
        except OSError:
            continue
    return sorted((kind, path) for kind, path in found if not path.startswith(_UNSEEN) and "__pycache__" not in path
                  and (kind != FILE or not os.path.isdir(path)))


def _searched_by_imports(folder: str, searched: set[str]) -> bool:
    """A ``sys.path`` folder or a package folder: imports list them (so does torch, looking for
    CUDA libraries there), and what they find there are modules."""
    return folder in searched or os.path.isfile(os.path.join(folder, "__init__.py"))


def changed_since_opened(files: list[tuple[str, str]]) -> Optional[str]:
    """A recorded file whose stat changed after it was first opened (edited during the run)."""
    for kind, path in files:
        if kind == FILE and path in _first_stat and _stat(path) != _first_stat[path]:
            return path
    return None


def _stat(path: str) -> Optional[tuple]:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns


@dataclass(frozen=True)
class FileState:
    """A file as the analysis saw it (no stat when it did not exist), or a folder and the
    digest of its names (of its importable names for a folder the import system searched)."""

    kind: str  # FILE, FOLDER or MODULES
    path: str
    stat: Optional[tuple]  # size, mtime_ns, inode, ctime_ns
    digest: Optional[str]  # sha256 for files up to HASHED_UP_TO bytes; of the names for a folder

    @classmethod
    def now(cls, kind: str, path: str) -> "FileState":
        if kind != FILE:
            return cls(kind, path, None, _listing(path, importable=kind == MODULES))
        stat = _stat(path)
        return cls(kind, path, stat, _digest(path) if stat is not None and stat[0] <= HASHED_UP_TO else None)

    def unchanged(self, written_at: float) -> bool:
        """Is it still as recorded? The whole stat first; the content when the stat differs or is racy."""
        if self.kind != FILE:
            return _listing(self.path, importable=self.kind == MODULES) == self.digest
        stat = _stat(self.path)
        if stat is None or self.stat is None:
            return stat is None and self.stat is None
        if stat[0] != self.stat[0]:
            return False
        racy = max(self.stat[1], self.stat[3]) / 1e9 >= written_at - RACY_SECONDS
        if stat == self.stat and not racy:
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


@functools.lru_cache(maxsize=1)  # once per process, not once per spec
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
        self.why = ""  # why the last lookup missed

    def key(self, spec: str, options: dict[str, Any]) -> str:
        """The hex key of one model's analysis with these options."""
        parts = {
            "format": FORMAT,
            "spec": spec,
            "cwd": os.getcwd(),
            "interpreter": [sys.executable, sys.prefix, list(sys.path)],
            "pythonpath": os.environ.get("PYTHONPATH", ""),
            "python": sys.version,
            "versions": installed_versions(),
            "options": options,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()

    def lookup(self, key: str) -> Optional[ModelReport]:
        """The stored report when every file it was built from is unchanged, else None.

        Nothing in the folder is trusted: an entry that cannot be read, or that unpickles to
        anything but an entry of this format (another type, a report of another shape, a
        malformed file state), is a miss like a changed file. ``self.why`` says why the last
        lookup missed (``""`` on a hit, ``"no entry"`` when there was none)."""
        self.why = ""
        name = self._entry(key).name
        try:
            with open(self._entry(key), "rb") as handle:
                entry = pickle.load(handle)
        except FileNotFoundError:
            return self._miss("no entry")
        except Exception as exc:  # noqa: BLE001  (truncated, another pickle, a class that moved: a miss)
            return self._miss(f"cache entry {name} unreadable ({type(exc).__name__}), analysing again")
        problem = _invalid(entry)
        if problem:
            return self._miss(f"cache entry {name} ignored ({problem}), analysing again")
        try:
            changed = next((state.path for state in entry["files"] if not state.unchanged(entry["written_at"])), None)
        except Exception as exc:  # noqa: BLE001
            return self._miss(f"cache entry {name} ignored (its file states do not read: {type(exc).__name__}), "
                              "analysing again")
        if changed is not None:
            return self._miss(f"{changed} changed")
        self.hits += 1
        return entry["report"]

    def _miss(self, why: str) -> None:
        self.misses += 1
        self.why = why
        return None

    def problem(self) -> Optional[str]:
        """Why this folder will not take entries (checked before the analysis, so the run can say
        so), or None when it will. A folder qlint made whose ``CACHEDIR.TAG`` was damaged is
        repaired when an entry is stored, not refused."""
        folder = self.directory
        if folder.exists() and not folder.is_dir():
            return f"{folder} is not a folder"
        if folder.is_dir() and not self.is_ours() and any(folder.iterdir()) and not self._is_repairable():
            return (f"{folder} is not a qlint cache (it holds other files and no CACHEDIR.TAG written by qlint): "
                    "remove it or choose another --cache-dir")
        probe = folder if folder.is_dir() else next((p for p in folder.parents if p.is_dir()), None)
        if probe is not None and not os.access(probe, os.W_OK | os.X_OK):
            return f"{probe} is not writable"
        return None

    def store(self, key: str, report: ModelReport, files: list[tuple[str, str]]) -> bool:
        """Record ``report`` with the state of ``files``; False (nothing stored) when a file changed
        during the analysis, or the folder is not qlint's, or cannot be written."""
        own = self.directory.resolve()
        files = [(kind, path) for kind, path in files if not _inside(path, own)]
        if changed_since_opened(files) is not None or not self._prepare():
            return False
        entry = {"format": FORMAT, "written_at": time.time(), "report": report,
                 "files": [FileState.now(kind, path) for kind, path in files]}
        try:
            write_bytes(self._entry(key), pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL), what="cache entry")
        except (WriteError, pickle.PicklingError, TypeError, AttributeError):
            return False
        return True

    def is_ours(self) -> bool:
        """Does the folder carry the CACHEDIR.TAG qlint writes?"""
        try:
            return (self.directory / "CACHEDIR.TAG").read_text(encoding="utf-8") == _TAG
        except OSError:
            return False

    def clear(self) -> int:
        """Remove the cache folder; the number of entries it held. Raises CacheError for a folder
        that is not a qlint cache (``--cache-dir src`` must not delete the sources)."""
        if not self.directory.exists():
            return 0
        if not self.is_ours() and not self._is_repairable():
            raise CacheError(f"refusing to remove {self.directory}: it is not a qlint cache (no CACHEDIR.TAG written "
                             "by qlint)")
        count = len(list((self.directory / "entries").glob("*.pickle")))
        shutil.rmtree(self.directory)
        return count

    def _entry(self, key: str) -> Path:
        return self.directory / "entries" / f"{key}.pickle"

    def _prepare(self) -> bool:
        """The folder, marked as a cache for git (``.gitignore``) and backup tools (``CACHEDIR.TAG``);
        False for an existing folder with other content (qlint writes no ``.gitignore`` there).
        A folder qlint made (only its own names in it) whose tag was damaged gets the tag back."""
        if (self.directory.exists() and not self.is_ours() and any(self.directory.iterdir())
            and not self._is_repairable()):
            return False
        try:
            (self.directory / "entries").mkdir(parents=True, exist_ok=True)
            if not self.is_ours():
                write_text(self.directory / ".gitignore", _GITIGNORE)
                write_text(self.directory / "CACHEDIR.TAG", _TAG)
        except (OSError, WriteError):
            return False
        return True

    def _is_repairable(self) -> bool:
        """A folder holding nothing but what qlint writes there (its ``.gitignore``, entries, a
        ``CACHEDIR.TAG`` that is not another tool's whole tag): its tag was lost or damaged
        (truncated, edited), so it is written again rather than caching being silently off."""
        try:
            names = {p.name for p in self.directory.iterdir()}
        except OSError:
            return False
        if not names or not names <= {".gitignore", "CACHEDIR.TAG", "entries"}:
            return False
        try:
            tag = (self.directory / "CACHEDIR.TAG").read_text(encoding="utf-8", errors="replace")
        except OSError:
            tag = ""
        if tag.startswith(_TAG.splitlines()[0]) and "qlint" not in tag:
            return False  # a whole tag another tool wrote (a damaged one is a prefix of ours, or garbage)
        if ".gitignore" in names:
            try:
                if (self.directory / ".gitignore").read_text(encoding="utf-8") != _GITIGNORE:
                    return False  # someone's own .gitignore: not ours to overwrite
            except (OSError, UnicodeDecodeError):
                return False
        entries = self.directory / "entries"
        try:
            return (not entries.exists()
                    or (entries.is_dir() and all(p.name.endswith((".pickle", ".tmp")) for p in entries.iterdir())))
        except OSError:
            return False


def _invalid(entry: Any) -> str:
    """What is wrong with an unpickled entry ("" when it is one of this format)."""
    if not isinstance(entry, dict):
        return f"it holds {type(entry).__name__}, not a cache entry"
    if entry.get("format") != FORMAT:
        return f"format {entry.get('format')!r}, this qlint writes {FORMAT}"
    written_at, files, report = entry.get("written_at"), entry.get("files"), entry.get("report")
    if isinstance(written_at, bool) or not isinstance(written_at, (int, float)) or written_at != written_at:
        return "no valid time of writing"
    if not isinstance(files, list) or not all(_valid_state(state) for state in files):
        return "malformed file states"
    if not isinstance(report, ModelReport):
        return f"it holds {type(report).__name__}, not a model report"
    if not all(hasattr(report, f.name) for f in fields(ModelReport)) or report.failure is not None:
        return "a report of another shape"
    return ""


def _valid_state(state: Any) -> bool:
    return (isinstance(state, FileState) and state.kind in (FILE, FOLDER, MODULES) and isinstance(state.path, str)
            and (state.stat is None or (isinstance(state.stat, tuple) and len(state.stat) == 4
                                        and all(isinstance(v, int) for v in state.stat)))
            and (state.digest is None or isinstance(state.digest, str)))


def _inside(path: str, folder: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(folder)
    except (OSError, ValueError):
        return False


class CacheError(QlintError):
    """A cache folder qlint will not touch."""
