"""Baselines: accept today's findings, fail only on new ones.

``qlint --write-baseline qlint-baseline.json`` records the current findings;
``qlint --baseline qlint-baseline.json`` accepts the findings it lists (they move to
the report's ``suppressed`` list, SARIF ``baselineState: unchanged``). An entry is
keyed by (model spec, rule code, block name, hash of the normalised message): no
line numbers, so moving code, editing other models or reformatting keeps the
baseline valid, while a block whose exponent changes (a different message) shows
up as new. Keys are a multiset: two identical findings need two entries. Writing
the baseline again drops the entries of findings that were fixed.

The file is JSON, sorted, one entry per key with a ``count``, easy to review::

    {"qlint_baseline": 1, "qlint_version": "0.1.0",
     "findings": [{"model": "pkg/model.py:build", "code": "QL101",
                   "block": "layers.3", "fingerprint": "1f0c...", "count": 1,
                   "message": "..."}]}
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from qlint._version import __version__
from qlint.ci.identity import Key, finding_key, normalize_message
from qlint.core.errors import QlintError
from qlint.core.results import Report

FORMAT_VERSION = 1

class BaselineError(QlintError):
    """A baseline file that is missing, unreadable or malformed (exit 2)."""


def _entries(report: Report, root: Path) -> list[dict[str, Any]]:
    counts: Counter[Key] = Counter()
    messages: dict[Key, str] = {}
    for model in report.models:
        for finding in model.findings:
            key = finding_key(model.spec, finding, root)
            counts[key] += 1
            messages.setdefault(key, normalize_message(finding.message))
    return [
        {
            "model": key[0],
            "code": key[1],
            "block": key[2] or None,
            "fingerprint": key[3],
            "count": counts[key],
            "message": messages[key],
        }
        for key in sorted(counts)
    ]


def write_baseline(report: Report, path: str | os.PathLike[str]) -> int:
    """Record every finding of ``report`` in ``path``; returns how many were recorded."""
    path = Path(path)
    entries = _entries(report, path.resolve().parent)
    data = {"qlint_baseline": FORMAT_VERSION, "qlint_version": __version__, "findings": entries}
    try:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {path}: {exc.strerror or exc}") from None
    return sum(e["count"] for e in entries)


def load_baseline(path: str | os.PathLike[str]) -> Counter[Key]:
    """The multiset of keys a baseline file accepts; :class:`BaselineError` if malformed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"baseline file not found: {path} (create it with --write-baseline)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"malformed baseline {path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict) or "findings" not in data or "qlint_baseline" not in data:
        raise BaselineError(f"malformed baseline {path}: expected an object with 'qlint_baseline' and 'findings'")
    if data["qlint_baseline"] != FORMAT_VERSION:
        raise BaselineError(
            f"malformed baseline {path}: unsupported format version {data['qlint_baseline']!r} "
            f"(this qlint reads {FORMAT_VERSION}; rewrite it with --write-baseline)"
        )
    if not isinstance(data["findings"], list):
        raise BaselineError(f"malformed baseline {path}: 'findings' must be an array")
    counts: Counter[Key] = Counter()
    for index, entry in enumerate(data["findings"]):
        where = f"malformed baseline {path}: findings[{index}]"
        if not isinstance(entry, dict):
            raise BaselineError(f"{where} must be an object")
        for field in ("model", "code", "fingerprint"):
            if not isinstance(entry.get(field), str) or not entry[field]:
                raise BaselineError(f"{where}.{field} must be a non-empty string")
        block = entry.get("block")
        if block is not None and not isinstance(block, str):
            raise BaselineError(f"{where}.block must be a string or null")
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise BaselineError(f"{where}.count must be a positive integer")
        counts[(entry["model"], entry["code"], block or "", entry["fingerprint"])] += count
    return counts


def filter_new(report: Report, baseline_path: str | os.PathLike[str]) -> Report:
    """``report`` with the findings the baseline accepts (each entry used ``count`` times)
    moved to each model's ``suppressed`` list, marked ``baseline``."""
    remaining = load_baseline(baseline_path)
    root = Path(baseline_path).resolve().parent
    models = []
    for model in report.models:
        kept, accepted = [], []
        for finding in model.findings:
            key = finding_key(model.spec, finding, root)
            if remaining[key] > 0:
                remaining[key] -= 1
                accepted.append(replace(finding, suppression="baseline"))
            else:
                kept.append(finding)
        models.append(replace(model, findings=kept, suppressed=[*model.suppressed, *accepted]))
    return replace(report, models=models, baseline=str(baseline_path))
