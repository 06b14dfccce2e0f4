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
from pathlib import Path
from typing import Iterable, Optional

from qlint.ci.config import Config
from qlint.core.results import Finding, ModelReport, Report, Source

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
    standalone: bool = False  # alone on its line: covers no code, so it is always misplaced

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
                directives.append(Directive(file, row, (row, row), parsed[0], standalone=True))
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


NEAR = 3  # a noqa alone on a line this close to an accepted line gets a "move it to line N" hint


def accepted_lines(finding: Finding) -> list[Source]:
    """Where a noqa for ``finding`` may go: its line and every other line its message names."""
    return [s for s in (finding.source, *finding.related) if s is not None]


@dataclass
class _Looked:
    """A noqa comment on a line some model's analysis read, shared by every model of the run."""

    directive: Directive
    shown_file: str
    owner: int  # index of the first model that read the line: QL100 is reported there
    block: Optional[str]


def apply_suppressions(models: list[ModelReport], config: Optional[Config] = None) -> list[ModelReport]:
    """Apply rule selection, ``per-block-ignores``, ``per-model-ignores`` and noqa comments
    to the models of one run; add QL100.

    Each model keeps the findings that are enabled (``select``/``ignore``), not ignored
    for their block and not suppressed by a comment; the others move to its
    ``suppressed`` list, marked with how. A comment counts for every model it suppresses
    a finding in, so QL100 (unused noqa, if enabled) fires once, in the first model that
    read its line, only when no model used it; a comment alone on a line a few lines
    from where it would work (the line above, say) is reported with the line to move it to.
    """
    from qlint.lint.rule import rules as all_rules

    config = config or Config()
    rules = all_rules()
    looked: dict[tuple[str, int], _Looked] = {}
    results: list[ModelReport] = []
    misplaced: list[tuple[int, Finding]] = []
    for index, model in enumerate(models):
        _read_comments(model, index, looked)
        kept, suppressed = [], list(model.suppressed)
        for finding in model.findings:
            if not config.is_selected(finding.code):
                continue
            if _code_matches(config.block_ignores(finding.block), finding.code):
                suppressed.append(replace(finding, suppression="per-block-ignores"))
                continue
            if _code_matches(set(config.model_ignores(model.spec)), finding.code):
                suppressed.append(replace(finding, suppression="per-model-ignores"))
                continue
            hits = [
                entry.directive for entry in looked.values()
                if entry.directive.matches(finding.code)
                and any(_key(s.file) == _key(entry.shown_file) and entry.directive.covers(s.line)
                        for s in accepted_lines(finding))
            ]
            if hits:
                for directive in hits:
                    directive.used.add("*" if directive.codes is None else finding.code)
                suppressed.append(replace(finding, suppression="noqa"))
                continue
            kept.append(finding)
            misplaced.append((index, finding))
        results.append(replace(model, findings=kept, suppressed=suppressed))

    if not config.is_selected("QL100"):
        return results
    unused: dict[int, list[Finding]] = {}
    hinted: set[tuple[str, int]] = set()
    for index, finding in misplaced:
        for near, target in _near_misses(finding):
            if (_key(near.file), near.line) in hinted or _code_matches(config.block_ignores(finding.block), "QL100"):
                continue
            hinted.add((_key(near.file), near.line))
            unused.setdefault(index, []).append(rules["QL100"].finding(
                finding.block, near, blanket="", detail=f" (not on a line qlint reads for {finding.code}: "
                f"move it to line {target.line}, which the finding names)"))
    for (file_key, row), entry in looked.items():
        message = _unused_message(entry.directive, rules, config)
        if message is None or (file_key, row) in hinted or _code_matches(config.block_ignores(entry.block), "QL100"):
            continue
        unused.setdefault(entry.owner,
                          []).append(rules["QL100"].finding(entry.block, Source(entry.shown_file, row), **message))
    for index, extra in unused.items():
        extra.sort(key=lambda f: (f.source.file, f.source.line) if f.source else ("", 0))
        results[index] = replace(results[index], findings=[*results[index].findings, *extra])
    return results


def _read_comments(model: ModelReport, index: int, looked: dict[tuple[str, int], _Looked]) -> None:
    """Record the noqa comments on the lines this model's analysis read (block adds, finding lines)."""
    lines: dict[str, dict[int, Optional[str]]] = {}
    shown: dict[str, str] = {}
    places = [(b.source, b.name)
              for b in model.blocks] + [(s, f.block) for f in model.findings for s in accepted_lines(f)]
    for source, block in places:
        if source is not None:
            lines.setdefault(_key(source.file), {}).setdefault(source.line, block)
            shown.setdefault(_key(source.file), source.file)
    for file_key, rows in lines.items():
        for directive in scan_file(shown[file_key]):
            covered = [row for row in rows if directive.covers(row)]
            if covered and (file_key, directive.line) not in looked:
                looked[(file_key, directive.line)] = _Looked(directive, shown[file_key], index, rows[covered[0]])


def _near_misses(finding: Finding) -> Iterable[tuple[Source, Source]]:
    """Comments alone on a line, naming ``finding``'s code, a few lines from a line that would accept them."""
    for target in accepted_lines(finding):
        for directive in scan_file(target.file):
            if directive.standalone and directive.matches(finding.code) and abs(directive.line - target.line) <= NEAR:
                yield Source(target.file, directive.line), target


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


def add_noqa(report: Report, root: Optional[Path] = None) -> tuple[int, int]:
    """Append ``# qlint: noqa: CODES`` to the line of every finding in the repository (ruff's
    ``--add-noqa``); returns (lines changed, files changed).

    A line with a qlint noqa already gets the missing codes; a blanket one is left alone,
    and so is a line that cannot take a comment (inside a string, or ending in a
    backslash). QL100 findings are not suppressed this way. Each file is rewritten in one
    atomic replace, in its own encoding and line endings.
    """
    from qlint.ci.identity import git_root, relative_path

    root = (root or git_root()).resolve()
    wanted: dict[str, dict[int, set[str]]] = {}
    for model in report.models:
        for finding in model.findings:
            source = finding.source
            if finding.code != "QL100" and source is not None and relative_path(source.file, root) is not None:
                wanted.setdefault(os.path.abspath(source.file), {}).setdefault(source.line, set()).add(finding.code)
    lines = files = 0
    for file, codes_at in sorted(wanted.items()):
        changed = _add_to_file(file, codes_at)
        lines += changed
        files += bool(changed)
    return lines, files


def _add_to_file(file: str, codes_at: dict[int, set[str]]) -> int:
    with open(file, "rb") as handle:
        raw = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    text = raw.decode(encoding)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return 0
    open_end = {tok.start[0] for tok in tokens if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT)}
    existing = {d.line: d for d in scan_source(text, file)}
    physical = text.splitlines(keepends=True)
    changed = 0
    for row, codes in sorted(codes_at.items()):
        if row not in open_end or row > len(physical):
            continue
        line = physical[row - 1]
        body = line.rstrip("\r\n")
        ending = line[len(body):]
        directive = existing.get(row)
        if directive is not None:
            if directive.codes is None or codes <= set(directive.codes):
                continue
            merged = ", ".join(sorted({*directive.codes, *codes}))
            body = NOQA.sub(f"# qlint: noqa: {merged}", body, count=1)
        else:
            body = f"{body}  # qlint: noqa: {', '.join(sorted(codes))}"
        physical[row - 1] = body + ending
        changed += 1
    if changed:
        temporary = f"{file}.qlint-tmp"
        with open(temporary, "wb") as handle:
            handle.write("".join(physical).encode(encoding))
        os.replace(temporary, file)
    return changed
