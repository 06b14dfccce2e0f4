"""Where a finding is and who it is: paths relative to a root, and the line-free key baselines and SARIF share.

A finding's identity is (model spec, rule code, block name, hash of the normalised
message): no line numbers or folder names, so moving code or the checkout keeps it.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional

from qlint.core.results import Finding
from qlint.loader import is_path_spec, join_spec, split_spec

Key = tuple[str, str, str, str]  # (model, code, block, fingerprint)


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


def normalize_message(message: str) -> str:
    """The message without line numbers or folder names, whitespace collapsed.

    ``"x + f(x) at /home/me/pkg/model.py:42"`` -> ``"x + f(x) at model.py"``.
    """
    text = _PATH_LINE.sub(lambda m: os.path.basename(m.group("path").replace("\\", "/")), message)
    text = _LINE_WORD.sub(lambda m: m.group(1).lower(), text)
    return " ".join(text.split())


def fingerprint(message: str) -> str:
    return hashlib.sha256(normalize_message(message).encode("utf-8")).hexdigest()[:16]


def normalize_model_spec(spec: str, root: Optional[Path] = None) -> str:
    """A file spec's path relative to ``root`` (the baseline's folder), forward slashes."""
    target, attr = split_spec(spec)
    if not is_path_spec(target):
        return spec
    absolute = os.path.normpath(Path.cwd() / target)
    rel = relative_path(target, (root or Path.cwd()).resolve()) or absolute.replace(os.sep, "/")
    return join_spec(rel, attr)


def finding_key(spec: str, finding: Finding, root: Optional[Path] = None) -> Key:
    return (normalize_model_spec(spec, root), finding.code, finding.block or "", fingerprint(finding.message))
