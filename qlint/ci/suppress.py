"""Suppressions: ``# qlint: noqa`` comments and ``per-block-ignores``, ruff-style.

A finding points at the user's source line of the residual add (``Finding.source``).
A comment ``# qlint: noqa: QL101`` (or ``QL101, QL104``, or a bare ``# qlint: noqa``
for every code) anywhere on that *logical* line suppresses it: for an add that
spans several physical lines, any of them may carry the comment. Comments are found
with :mod:`tokenize`, so the text inside a string literal never counts.

Suppressions that suppress nothing on a line qlint looked at (a block's residual
add, or a finding's line) are reported as QL100 unused-noqa, like ruff's RUF100.
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from dataclasses import dataclass, field, replace
from typing import Optional

from qlint.ci.config import Config
from qlint.core.results import Finding, ModelReport, Source

NOQA = re.compile(
    r"#\s*qlint\s*:\s*noqa(?:\s*:\s*(?P<codes>[A-Za-z]+[0-9]+(?:(?:\s*,\s*|\s+)[A-Za-z]+[0-9]+)*))?",
    re.IGNORECASE,
)


@dataclass
class Directive:
    """One ``# qlint: noqa`` comment: its line, the logical line it covers, its codes."""

    file: str
    line: int
    span: tuple[int, int]
    codes: Optional[tuple[str, ...]]  # None: blanket noqa
    used: set[str] = field(default_factory=set)  # codes it suppressed ("*" for blanket)

    def covers(self, line: int) -> bool:
        return self.span[0] <= line <= self.span[1]

    def matches(self, code: str) -> bool:
        return self.codes is None or code in self.codes


def parse_noqa(comment: str) -> Optional[tuple[Optional[tuple[str, ...]]]]:
    """``"# qlint: noqa: QL101, QL104"`` -> ``((QL101, QL104),)``; bare -> ``(None,)``;
    a comment without a qlint noqa -> None."""
    match = NOQA.search(comment)
    if not match:
        return None
    if not match.group("codes"):
        return (None,)
    return (tuple(c.upper() for c in re.split(r"[\s,]+", match.group("codes").strip()) if c),)


_CACHE: dict[tuple[str, int, int], list[Directive]] = {}


def scan_source(text: str, file: str = "<string>") -> list[Directive]:
    """Every qlint noqa comment in ``text``, with the logical line each one covers."""
    directives: list[Directive] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        # Not valid Python: fall back to per-line matching (strings may fool it).
        for number, source_line in enumerate(text.splitlines(), start=1):
            if "#" in source_line and (found := parse_noqa(source_line[source_line.index("#") :])):
                directives.append(Directive(file, number, (number, number), found[0]))
        return directives

    logical_start: Optional[int] = None
    pending: list[tuple[int, Optional[tuple[str, ...]]]] = []
    skip = (tokenize.ENCODING, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            parsed = parse_noqa(tok.string)
            if parsed is None:
                continue
            if logical_start is None:  # a comment on a line of its own
                row = tok.start[0]
                directives.append(Directive(file, row, (row, row), parsed[0]))
            else:
                pending.append((tok.start[0], parsed[0]))
        elif tok.type == tokenize.NEWLINE:
            if logical_start is not None:
                span = (logical_start, tok.start[0])
                directives.extend(Directive(file, line, span, codes) for line, codes in pending)
            logical_start, pending = None, []
        elif tok.type == tokenize.NL or tok.type in skip:
            continue
        elif logical_start is None:
            logical_start = tok.start[0]
    if logical_start is not None and pending:  # no trailing NEWLINE token
        span = (logical_start, tokens[-1].start[0])
        directives.extend(Directive(file, line, span, codes) for line, codes in pending)
    return directives


def scan_file(path: str) -> list[Directive]:
    """The noqa directives of a source file (cached on its size and mtime); [] if unreadable."""
    try:
        stat = os.stat(path)
    except OSError:
        return []
    key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _CACHE:
        try:
            with tokenize.open(path) as handle:  # honours the PEP 263 coding cookie
                text = handle.read()
        except (OSError, SyntaxError, UnicodeDecodeError):
            return []
        _CACHE[key] = scan_source(text, path)
    # Fresh copies: `used` is per run.
    return [replace(d, used=set()) for d in _CACHE[key]]


def _key(file: str) -> str:
    return os.path.normcase(os.path.abspath(file))


def _code_matches(selectors: set[str], code: str) -> bool:
    return any(s == "ALL" or code.startswith(s) for s in selectors)


def apply_suppressions(model_report: ModelReport, config: Optional[Config] = None) -> ModelReport:
    """Apply rule selection, ``per-block-ignores`` and noqa comments; add QL100.

    Returns a new :class:`ModelReport` whose findings are the original ones that are
    enabled (``select``/``ignore``), not ignored for their block, and not suppressed
    by a comment, followed by one QL100 (if enabled) per noqa comment on a line qlint
    looked at that suppressed nothing (or named codes that did not fire there).
    """
    from qlint.lint.rule import rules as all_rules

    config = config or Config()
    rules = all_rules()
    findings = model_report.findings

    # Lines qlint looked at: each block's residual add and each finding's place.
    looked: dict[str, set[int]] = {}
    blocks_at: dict[tuple[str, int], str] = {}
    for block in model_report.blocks:
        if block.source is not None:
            looked.setdefault(_key(block.source.file), set()).add(block.source.line)
            blocks_at.setdefault((_key(block.source.file), block.source.line), block.name)
    for finding in findings:
        if finding.source is not None:
            looked.setdefault(_key(finding.source.file), set()).add(finding.source.line)

    shown_name: dict[str, str] = {}
    for item in [*(b.source for b in model_report.blocks), *(f.source for f in findings)]:
        if item is not None:
            shown_name.setdefault(_key(item.file), item.file)

    directives: dict[str, list[Directive]] = {}
    for file_key, lines in looked.items():
        relevant = [
            d for d in scan_file(shown_name.get(file_key, file_key)) if any(d.covers(n) for n in lines)
        ]
        if relevant:
            directives[file_key] = relevant

    kept: list[Finding] = []
    for finding in findings:
        if not config.is_selected(finding.code):
            continue
        if _code_matches(config.block_ignores(finding.block), finding.code):
            continue
        if finding.source is not None:
            covering = [
                d for d in directives.get(_key(finding.source.file), []) if d.covers(finding.source.line)
            ]
            hits = [d for d in covering if d.matches(finding.code)]
            if hits:
                for d in hits:
                    d.used.add("*" if d.codes is None else finding.code)
                continue
        kept.append(finding)

    if config.is_selected("QL100"):
        unused_findings = []
        for file_key, items in directives.items():
            for d in items:
                message = _unused_message(d, rules, config)
                if message is None:
                    continue
                block_name = next(
                    (name for (k, row), name in blocks_at.items() if k == file_key and d.covers(row)),
                    None,
                )
                if _code_matches(config.block_ignores(block_name), "QL100"):
                    continue
                unused_findings.append(rules["QL100"].finding(block_name, Source(shown_name.get(file_key, d.file), d.line), **message))
        unused_findings.sort(key=lambda f: (f.source.file, f.source.line) if f.source else ("", 0))
        kept.extend(unused_findings)
    return replace(model_report, findings=kept)


def _unused_message(d: Directive, rules: dict, config: Config) -> Optional[dict[str, str]]:
    """The QL100 message fields for a directive that suppressed nothing (None when it did)."""
    if d.codes is None:
        return None if d.used else {"blanket": "blanket ", "detail": ""}
    groups: dict[str, list[str]] = {"unused": [], "non-enabled": [], "unknown": []}
    for code in d.codes:
        if code in d.used:
            continue
        if code not in rules:
            groups["unknown"].append(code)
        elif not config.is_selected(code):
            groups["non-enabled"].append(code)
        else:
            groups["unused"].append(code)
    parts = [f"{label}: {', '.join(codes)}" for label, codes in groups.items() if codes]
    if not parts:
        return None
    return {"blanket": "", "detail": f" ({'; '.join(parts)})"}
