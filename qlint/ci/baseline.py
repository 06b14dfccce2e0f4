"""Baselines: accept today's findings, fail only on new ones.

``qlint --write-baseline qlint-baseline.json`` records the current findings;
``qlint --baseline qlint-baseline.json`` accepts the findings it lists (they move to
the report's ``suppressed`` list, SARIF ``baselineState: unchanged``). An entry is
keyed by (model spec, rule code, structural fingerprint: :mod:`qlint.ci.identity`),
so moving lines, renaming ``self.layers``, inserting a layer in front, moving the
dominant op into a helper and rewording messages keep it matching, while a block
whose exponent changes shows up as new. A renamed model file or factory is
re-matched by its model class. Keys are a multiset: two identical findings need two
entries. Entries nothing matched are reported as stale; ``--prune-baseline`` drops
them, writing the baseline again records only today's findings.

The file is JSON, sorted, one entry per key with a ``count``, easy to review::

    {"qlint_baseline": 2, "qlint_version": "0.1.0",
     "findings": [{"model": "pkg/model.py:build", "code": "QL101", "fingerprint": "1f0c...",
                   "count": 1, "model_class": "GPT", "block": "layers.3",
                   "anchor": "GPT>ModuleList>Block", "role": "block",
                   "primitive": "Polynomial activation x^p", "q": "2", "message": "..."}]}

Only ``model``, ``code``, ``fingerprint``, ``count`` and ``model_class`` are read; the
rest is there for the reviewer.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from qlint._version import __version__
from qlint.ci.files import WriteError, write_text
from qlint.ci.identity import Key, finding_key, model_class, normalize_message, normalize_model_spec, position
from qlint.core.errors import QlintError
from qlint.core.results import Finding, ModelReport, Report

FORMAT_VERSION = 2


class BaselineError(QlintError):
    """A baseline file that is missing, unreadable or malformed (exit 2)."""


def _entries(pairs: Iterable[tuple[ModelReport, Finding]], root: Path) -> list[dict[str, Any]]:
    counts: Counter[Key] = Counter()
    shown: dict[Key, dict[str, Any]] = {}
    for model, finding in pairs:
        key = finding_key(model, finding, root)
        counts[key] += 1
        where = position(model, finding)
        shown.setdefault(key, {"model_class": model_class(model), "block": finding.block, "anchor": where.anchor,
                               "role": where.role, "primitive": where.primitive, "q": where.q,
                               "message": normalize_message(finding.message)})
    return [
        {"model": key[0], "code": key[1], "fingerprint": key[2], "count": counts[key], **shown[key]}
        for key in sorted(counts)
    ]


def _write(path: Path, entries: list[dict[str, Any]]) -> int:
    data = {"qlint_baseline": FORMAT_VERSION, "qlint_version": __version__, "findings": entries}
    try:  # whole or not at all: a failed rewrite leaves the committed baseline as it was
        write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    except WriteError as exc:
        raise BaselineError(str(exc).replace("cannot write ", "cannot write baseline ", 1)) from None
    return sum(e["count"] for e in entries)


def write_baseline(report: Report, path: str | os.PathLike[str]) -> int:
    """Record every finding of ``report`` in ``path``; returns how many were recorded."""
    path = Path(path)
    return _write(path, _entries(((m, f) for m in report.models for f in m.findings), path.resolve().parent))


def prune_baseline(report: Report, path: str | os.PathLike[str]) -> int:
    """Rewrite ``path`` with only the entries ``report`` used (a :func:`filter_new` result);
    an entry re-matched to a renamed spec is written under the new spec. Returns how many were dropped."""
    path = Path(path)
    accepted = ((m, f) for m in report.models for f in m.suppressed if f.suppression == "baseline")
    _write(path, _entries(accepted, path.resolve().parent))
    return sum(e["count"] for e in report.stale_baseline)


@dataclass
class Baseline:
    """The accepted findings: a multiset of keys, and each spec's model class for re-matching."""

    counts: Counter[Key]
    classes: dict[str, str]  # model spec -> model class
    entries: dict[Key, dict[str, Any]]


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """The findings a baseline file accepts; :class:`BaselineError` if malformed."""
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
    baseline = Baseline(Counter(), {}, {})
    for index, entry in enumerate(data["findings"]):
        where = f"malformed baseline {path}: findings[{index}]"
        if not isinstance(entry, dict):
            raise BaselineError(f"{where} must be an object")
        for field_name in ("model", "code", "fingerprint"):
            if not isinstance(entry.get(field_name), str) or not entry[field_name]:
                raise BaselineError(f"{where}.{field_name} must be a non-empty string")
        if not isinstance(entry.get("model_class", ""), str):
            raise BaselineError(f"{where}.model_class must be a string")
        count = entry.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise BaselineError(f"{where}.count must be a positive integer")
        key = (entry["model"], entry["code"], entry["fingerprint"])
        baseline.counts[key] += count
        baseline.entries.setdefault(key, entry)
        if entry.get("model_class"):
            baseline.classes.setdefault(entry["model"], entry["model_class"])
    return baseline


def filter_new(report: Report, baseline_path: str | os.PathLike[str]) -> Report:
    """``report`` with the findings the baseline accepts (each entry used ``count`` times)
    moved to each model's ``suppressed`` list, marked ``baseline``; the entries nothing
    matched are the report's ``stale_baseline``.

    A model whose spec has no entry (its file or factory was renamed) is matched against
    the entries of specs that are no longer checked and had the same model class.
    """
    baseline = load_baseline(baseline_path)
    remaining = baseline.counts
    root = Path(baseline_path).resolve().parent
    current = {normalize_model_spec(m.spec, root) for m in report.models}
    vanished = sorted({key[0] for key in remaining} - current)
    models = []
    for model in report.models:
        spec = normalize_model_spec(model.spec, root)
        candidates = [spec] + [old for old in vanished if baseline.classes.get(old) == model_class(model) != ""]
        kept, accepted = [], []
        for finding in model.findings:
            _, code, fingerprint = finding_key(model, finding, root)
            match = next((key for key in ((s, code, fingerprint) for s in candidates) if remaining[key] > 0), None)
            if match is None:
                kept.append(finding)
                continue
            remaining[match] -= 1
            accepted.append(replace(finding, suppression="baseline"))
        models.append(replace(model, findings=kept, suppressed=[*model.suppressed, *accepted]))
    stale = [{**baseline.entries[key], "count": count} for key, count in sorted(remaining.items()) if count > 0]
    return replace(report, models=models, baseline=str(baseline_path), stale_baseline=stale)
