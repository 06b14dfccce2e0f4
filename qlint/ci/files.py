"""Files written whole: every file qlint writes (reports, baselines, cache entries, the verify
tables) goes to a temporary file in the target's own folder, is flushed to disk and renamed over
the target. A reader sees the old file or the new one, never half of either; a full disk, a
crash or a Ctrl-C leaves the old file as it was. Errors name the file.

:func:`prepare_output` checks an output path before the analysis starts (ruff creates the
parent folders of ``--output-file``; so does qlint), so a typo in a folder name costs nothing.
Nothing here imports torch.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Union

from qlint.core.errors import QlintError

PathLike = Union[str, "os.PathLike[str]"]
_PREFIX = ".qlint-tmp-"  # the temporary files, so a leftover one is recognisable


class WriteError(QlintError):
    """A file qlint could not write (exit 2); the message names it."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _target(path: Path) -> Path:
    """The file a write replaces: a symbolic link's target (the link itself stays a link)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _mode_for(target: Path) -> int:
    """The permission bits the written file gets: the old file's, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def write_bytes(path: PathLike, data: bytes, *, what: str = "") -> None:
    """Write ``data`` to ``path`` whole (a temporary file in the same folder, renamed over it).

    Raises :class:`WriteError` naming the file (``what`` says which, e.g. ``"baseline"``);
    the old file, if any, is left untouched and no temporary file stays behind.
    """
    target, label = _writable_target(path, what)
    folder = target.parent
    try:
        fd, temporary = tempfile.mkstemp(prefix=_PREFIX, suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write {label}: {_reason(exc)}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, _mode_for(target))
        os.replace(temporary, target)
    except BaseException as exc:  # a full disk, a Ctrl-C: the old file stays, the temporary goes
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {label}: {_reason(exc)}") from None
        raise
    _sync_folder(folder)


def _writable_target(path: PathLike, what: str) -> tuple[Path, str]:
    """The file a write lands in (links followed) and the label errors name; a folder is refused."""
    given = Path(path)
    target = _target(given)
    label = f"{what} {given}" if what else str(given)
    if target.is_dir():
        raise WriteError(f"cannot write {label}: it is a folder")
    return target, label


def write_text(path: PathLike, text: str, *, what: str = "", encoding: str = "utf-8") -> None:
    """:func:`write_bytes` for text (``\\n`` line ends on every platform, as the reports use)."""
    write_bytes(path, text.encode(encoding), what=what)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every platform opens folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prepare_output(path: PathLike, *, what: str = "") -> Path:
    """Check before the analysis that ``path`` can be written: its parent folders are created
    (as ruff does for ``--output-file``), it is not a folder, and a file can be created beside
    it. Raises :class:`WriteError` naming the path; returns it."""
    target, label = _writable_target(path, what)
    folder = target.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WriteError(f"cannot write {label}: {folder} is not a folder") from None
    except OSError as exc:
        raise WriteError(f"cannot write {label}: cannot create the folder {folder}: {_reason(exc)}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=_PREFIX, suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write {label}: {_reason(exc)}") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return Path(path)


__all__ = ["WriteError", "prepare_output", "write_bytes", "write_text"]
