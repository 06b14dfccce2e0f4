"""Where a finding is and who it is: paths relative to a root, and the line-free key baselines and SARIF share.

A finding's identity is (model spec, rule code, fingerprint of its structural
:class:`Position`): the module classes on its block's path, the block's role, the
primitive that decided it and its exponent. No line number, file name, layer index,
attribute name or message text is part of it, so moving code, renaming ``self.layers``,
inserting a layer in front or rewording a message in a new qlint keeps it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from qlint.core.algebra import format_q
from qlint.core.installed import installed
from qlint.core.results import Finding, ModelReport, Source
from qlint.loader import is_path_spec, join_spec, split_spec

Key = tuple[str, str, str]  # (model, code, fingerprint)


def git_root(start: Optional[Path] = None) -> Path:
    """The enclosing git work tree's root, else ``start`` (the cwd)."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


def relative_path(file: str, root: Path) -> Optional[str]:
    """``file`` relative to ``root`` with forward slashes; None if outside it."""
    path = Path(file)
    if not path.is_absolute():
        path = Path.cwd() / path
    path = Path(os.path.normpath(path))
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return None
    if rel.startswith(".."):
        return None
    return rel.replace(os.sep, "/")


_PATH_LINE = re.compile(r"(?P<path>[^\s:'\"()\[\],]*\.py)(?::\d+)+")
_LINE_WORD = re.compile(r"\b(lines?)\s+\d+(\s*[-–]\s*\d+)?", re.IGNORECASE)
_INDEX = re.compile(r"(?<=\.)\d+(?=[.:]|$)|^\d+(?=[.:]|$)")


def normalize_message(message: str) -> str:
    """The message without line numbers or folder names, whitespace collapsed (for display).

    ``"x + f(x) at /home/me/pkg/model.py:42"`` -> ``"x + f(x) at model.py"``.
    """
    text = _PATH_LINE.sub(lambda m: os.path.basename(m.group("path").replace("\\", "/")), message)
    text = _LINE_WORD.sub(lambda m: m.group(1).lower(), text)
    return " ".join(text.split())


@dataclass(frozen=True)
class Position:
    """Where a finding is, structurally: the module classes on its block's path, what the
    place is (block, transition, module or the model), and what decided it there."""

    anchor: str  # "GPT>ModuleList>Block>MLP"; without class paths, the name with indices as "*"
    role: str
    primitive: str  # the dominant primitive of the block or transition, else ""
    q: str  # its exponent: a block that gets worse under the same primitive is a new finding

    def fingerprint(self, code: str) -> str:
        text = "\0".join((code, self.anchor, self.role, self.primitive, self.q))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def position(model: ModelReport, finding: Finding) -> Position:
    """The finding's :class:`Position` in ``model`` (no line, index, file or message text)."""
    name = finding.block or ""
    blocks = {b.name: b for b in model.blocks}
    transitions = {t.name: t for t in model.transitions}
    part = blocks.get(name) or transitions.get(name)
    role = "block" if name in blocks else "transition" if name in transitions else "module" if name else "model"
    anchor = model.anchors.get(name) or _INDEX.sub("*", name)
    return Position(anchor, role, part.dominant if part else "", format_q(part.q) if part else "")


def attribute_to_repository(model: ModelReport, origin: Optional[Source], root: Optional[Path] = None) -> ModelReport:
    """Findings whose line is outside the repository (a library's code: transformers, timm, also when
    the virtual environment that holds it sits in the repository) or that have no line get the spec's
    factory line as their place, with the library line as a related one and named in the message:
    GitHub can place them, and a noqa on the factory line works."""
    root = (root or git_root()).resolve()
    if origin is None or not _in_repository(origin.file, root):
        return model

    def placed(finding: Finding) -> Finding:
        if finding.source is not None and _in_repository(finding.source.file, root):
            return finding
        related = (finding.source, *finding.related) if finding.source is not None else finding.related
        message = finding.message if finding.source is None else f"{finding.message} (in {finding.source})"
        return replace(finding, source=origin, message=message, related=tuple(dict.fromkeys(related)))

    return replace(model, findings=[placed(f) for f in model.findings])


def _in_repository(file: str, root: Path) -> bool:
    return relative_path(file, root) is not None and not installed(file)


def model_class(model: ModelReport) -> str:
    """The analysed model's class ("" when unknown): baselines re-match a renamed spec by it."""
    return model.anchors.get("", "")


def normalize_model_spec(spec: str, root: Optional[Path] = None) -> str:
    """A file spec's path relative to ``root`` (the baseline's folder), forward slashes."""
    target, attr = split_spec(spec)
    if not is_path_spec(target):
        return spec
    absolute = os.path.normpath(Path.cwd() / target)
    rel = relative_path(target, (root or Path.cwd()).resolve()) or absolute.replace(os.sep, "/")
    return join_spec(rel, attr)


def finding_key(model: ModelReport, finding: Finding, root: Optional[Path] = None) -> Key:
    """(model spec relative to ``root``, rule code, structural fingerprint)."""
    return (normalize_model_spec(model.spec, root), finding.code, position(model, finding).fingerprint(finding.code))
