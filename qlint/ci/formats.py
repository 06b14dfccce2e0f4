"""Output formats for ``--output-format`` (alias ``--format``).

* ``full``: the rich report (``qlint.ci.render``, written by the core);
* ``concise``: one line per finding, ``file:line: CODE message``;
* ``json``: ``Report.to_dict()``, the documented schema;
* ``sarif``: SARIF 2.1.0 as GitHub code scanning accepts it;
* ``github``: GitHub Actions workflow-command annotations;
* ``markdown``: a pull-request comment summary;
* ``junit``: JUnit XML, one test case per block (and per model-level finding), for CI test reports;
* ``gitlab``: a GitLab Code Quality report;
* ``html``: one self-contained page (``qlint.ci.html_report``): the ladder, derivation graphs, remedies,
  measured growth; also what a notebook shows for a report.

Each renderer registers itself with ``@output_format(name)``; :data:`OUTPUT_FORMATS`, the
names config validation and the CLI accept, is read off that registry, so a new format is
one decorated function here. ``--statistics`` replaces the findings by a count per rule,
like ruff. :func:`render` returns text for every format but ``full``; :func:`write_output`
writes any format to a stream or a file. Nothing here imports torch (nor
:mod:`qlint.ci.config`, which imports this module for the names).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Optional
from urllib.parse import quote

from qlint._version import DISTRIBUTION, __version__
from qlint.ci import html_report
from qlint.ci.identity import finding_key, git_root, relative_path
from qlint.core.algebra import format_q
from qlint.core.results import Finding, ModelReport, Report, Source, set_html_renderer


def _information_uri() -> str | None:
    """The project's home page from the installed metadata (its ``[project.urls]``), else None: no
    package index has torch-qlint, so there is no page to point at that the metadata does not name."""
    try:
        from importlib.metadata import metadata

        meta: Any = metadata(DISTRIBUTION)
        for entry in meta.get_all("Project-URL") or []:
            label, _, url = entry.partition(",")
            if label.strip().lower() in ("homepage", "home", "source", "repository") and url.strip():
                if "pypi.org/" not in url:  # an install made before pyproject stopped naming PyPI
                    return url.strip()
        if meta.get("Home-page") and "pypi.org/" not in str(meta["Home-page"]):
            return str(meta["Home-page"])
    except Exception:  # noqa: BLE001  (not installed)
        pass
    return None


SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}
# baselined findings get a baselineState instead
SARIF_SUPPRESSION = {"noqa": "inSource", "per-block-ignores": "external", "per-model-ignores": "external"}


# ---------------------------------------------------------------------------
# the registry: one decorator per format
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputFormat:
    """A renderer registered with :func:`output_format`.

    ``options``: the keyword-only parameters the renderer takes (``summary`` for concise;
    ``color``, ``width``, ``show_all_derivations`` for full); each renderer is given only
    its own. ``writes_stream``: the renderer writes to the stream itself (the rich report
    colours and wraps for the terminal it writes to) instead of returning text."""

    name: str
    renderer: Callable[..., Any]
    writes_stream: bool = False
    options: frozenset[str] = frozenset()

    def own(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options this renderer takes, out of those given for every format."""
        return {key: value for key, value in options.items() if key in self.options}


_REGISTRY: dict[str, OutputFormat] = {}


def output_format(name: str, *, writes_stream: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the renderer of ``--output-format name``: ``(report, **options) -> str``, or with
    ``writes_stream``, ``(report, stream, **options) -> None``. :data:`OUTPUT_FORMATS`, the
    names config validation and the CLI accept, lists them in the order this module defines them."""

    def register(renderer: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY:
            raise ValueError(f"output format {name!r} is registered twice")
        parameters = inspect.signature(renderer).parameters.values()
        options = frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)
        _REGISTRY[name] = OutputFormat(name, renderer, writes_stream, options)
        return renderer

    return register


def _registered(name: str) -> OutputFormat:
    if name not in _REGISTRY:
        raise ValueError(f"unknown output format {name!r} (expected one of: {', '.join(_REGISTRY)})")
    return _REGISTRY[name]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def display_path(file: str) -> str:
    """A path as shown to people: an installed library's file relative to its distribution's
    folder, else relative to the cwd when inside it (:func:`qlint.ci.render.display_path`)."""
    from qlint.ci.render import display_path as shown  # render never imports this module

    return shown(file)


def _rules() -> dict[str, Any]:
    from qlint.lint.rule import rules

    return rules()


def _sorted_findings(report: Report) -> list[tuple[ModelReport, Finding]]:
    return [(m, f) for m in report.models for f in m.findings]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(report: Report) -> str:
    """``Found 2 findings (1 error, 1 warning).``, ``All checks passed!``, with what was
    suppressed and which models could not be analysed."""
    findings = report.findings
    failed = f" {_plural(len(report.failures), 'model')} could not be analysed." if report.failures else ""
    hidden = f" ({len(report.suppressed)} suppressed)" if report.suppressed else ""
    if not findings:
        skipped = any(m.unchecked for m in report.models if m.verdict == "certified")
        return (f"No findings{hidden}." if report.failures else
                f"No findings, but not every check ran (see the verdicts){hidden}." if skipped else
                f"All checks passed!{hidden}") + failed
    parts = [
        _plural(report.count(sev), sev)
        for sev in ("error", "warning", "info")
        if report.count(sev)
    ]
    return f"Found {_plural(len(findings), 'finding')} ({', '.join(parts)}){hidden}.{failed}"


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def statistics(report: Report) -> list[dict[str, Any]]:
    """Count per rule code, most frequent first (ties by code)."""
    rules = _rules()
    counts = Counter(f.code for f in report.findings)
    return [
        {
            "code": code,
            "name": rules[code].name if code in rules else "",
            "severity": rules[code].severity if code in rules else "",
            "count": count,
        }
        for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def render_statistics(report: Report, fmt: str = "full") -> str:
    rows = statistics(report)
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if not rows:
        return ""
    width = max(len(str(r["count"])) for r in rows)
    code_width = max(len(r["code"]) for r in rows)
    lines = [f"{r['count']:>{width}}\t{r['code']:<{code_width}}\t{r['name']}".rstrip() for r in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# full
# ---------------------------------------------------------------------------


@output_format("full", writes_stream=True)
def render_full(report: Report, stream: IO[str], *, color: Optional[bool] = None, width: Optional[int] = None,
                show_all_derivations: bool = False) -> None:
    """The core's rich report (``qlint.ci.render``): coloured on a terminal, plain in a file or a log."""
    from qlint.ci import render as full

    full.print_report(report, full.make_console(stream, color=color, width=width),
                      show_all_derivations=show_all_derivations)


# ---------------------------------------------------------------------------
# concise
# ---------------------------------------------------------------------------


def _where(model: ModelReport, finding: Finding) -> str:
    if finding.source is not None:
        return f"{display_path(finding.source.file)}:{finding.source.line}"
    return model.spec


@output_format("concise")
def render_concise(report: Report, *, summary: bool = True) -> str:
    lines = [f"failed: {_one_line(m.failure_line())}" for m in report.failures]
    lines += [f"{_where(m, f)}: {f.code} {_one_line(f.message)}" for m, f in _sorted_findings(report)]
    if summary:
        lines.append(summary_line(report))
    return "\n".join(lines) + ("\n" if lines else "")


# ---------------------------------------------------------------------------
# json
# ---------------------------------------------------------------------------


@output_format("json")
def render_json(report: Report) -> str:
    """``Report.to_dict()``, the documented schema (with ``--statistics``, :func:`render_statistics`
    writes the counts as JSON rows instead)."""
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# SARIF
# ---------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _rule_descriptor(rule: Any) -> dict[str, Any]:
    summary = _one_line(rule.summary)
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": summary.split(". ")[0].rstrip(".") + "."},
        "fullDescription": {"text": f"{summary} {_one_line(rule.rationale)}"},
        "help": {
            "text": f"{summary}\n\nRemedy: {_one_line(rule.remedy)}",
            "markdown": rule.doc(),
        },
        "defaultConfiguration": {"level": SARIF_LEVEL.get(rule.severity, "warning")},
        "properties": {"tags": ["qlint", rule.severity]},
    }


def _fallback_file(spec: str) -> Optional[str]:
    """The file a model spec names, for findings without a source line."""
    from qlint.loader import is_path_spec, split_spec

    target, _ = split_spec(spec)
    if is_path_spec(target):
        return target
    try:
        import importlib.util

        found = importlib.util.find_spec(target)
    except Exception:  # noqa: BLE001  (a broken package must not break the report)
        return None
    return found.origin if found is not None and found.origin not in (None, "built-in", "frozen") else None


def artifact_uri(relative: str) -> str:
    """A repo-relative path as a SARIF ``uri``: a URI reference (RFC 3986), so spaces, ``#``,
    ``%`` and non-ASCII characters are percent-encoded (UTF-8) and ``/`` separates segments."""
    return quote(relative, safe="/!$&'()*+,;=@")  # ':' too: a first segment may not hold one


def _physical_location(file: str, line: int, root: Path) -> dict[str, Any]:
    rel = relative_path(file, root)
    if rel is not None:
        artifact = {"uri": artifact_uri(rel), "uriBaseId": "%SRCROOT%"}
    else:
        artifact = {"uri": Path(file).resolve().as_uri()}
    return {"physicalLocation": {"artifactLocation": artifact, "region": {"startLine": max(1, int(line))}}}


def to_sarif(report: Report, root: Optional[Path] = None) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log (one run) for GitHub code scanning."""
    root = (root or git_root()).resolve()
    catalogue = _rules()
    codes = sorted(set(catalogue) | {f.code for f in report.findings})
    rules = []
    for code in codes:
        if code in catalogue:
            rules.append(_rule_descriptor(catalogue[code]))
        else:  # a finding from a rule outside the catalogue: describe it minimally
            rules.append({"id": code, "shortDescription": {"text": code}, "defaultConfiguration": {"level": "warning"}})
    index = {code: i for i, code in enumerate(codes)}

    results = []
    every = [*_sorted_findings(report), *((m, f) for m in report.models for f in m.suppressed)]
    for (model, finding), fingerprint in zip(every, fingerprints(every, root)):
        key = finding_key(model, finding, root)
        result: dict[str, Any] = {
            "ruleId": finding.code,
            "ruleIndex": index[finding.code],
            "level": SARIF_LEVEL.get(finding.severity, "warning"),
            "message": {"text": finding.message or finding.code},
            "partialFingerprints": {"qlintFindingHash/v2": fingerprint},
            "properties": {
                k: v
                for k, v in (("model", key[0]), ("block", finding.block), ("severity", finding.severity))
                if v is not None
            },
        }
        source: Optional[Source] = finding.source
        if source is not None:
            result["locations"] = [_physical_location(source.file, source.line, root)]
        else:
            file = _fallback_file(model.spec)
            if file is not None:
                result["locations"] = [_physical_location(file, 1, root)]
        if finding.related:
            result["relatedLocations"] = [
                {"id": i, **_physical_location(s.file, s.line, root)} for i, s in enumerate(finding.related)
            ]
        if finding.suppression in SARIF_SUPPRESSION:
            kind = SARIF_SUPPRESSION[finding.suppression]
            result["suppressions"] = [{"kind": kind, "justification": finding.suppression}]
        if report.baseline is not None:
            result["baselineState"] = "unchanged" if finding.suppression == "baseline" else "new"
        results.append(result)

    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "qlint",
                        "version": __version__,
                        "semanticVersion": __version__,
                        **({"informationUri": uri} if (uri := _information_uri()) else {}),
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
                "invocations": [_invocation(report, root)],
                "results": results,
                "columnKind": "unicodeCodePoints",
            }
        ],
    }


def _invocation(report: Report, root: Path) -> dict[str, Any]:
    """Whether the run analysed every model; one error notification per model that failed."""
    notifications = []
    for model in report.failures:
        notification: dict[str, Any] = {
            "level": "error",
            "message": {"text": f"could not be analysed: {model.failure_line()}"},
            "descriptor": {"id": "model-failed"},
        }
        file = _fallback_file(model.spec)
        if file is not None:
            notification["locations"] = [_physical_location(file, 1, root)]
        notifications.append(notification)
    return {"executionSuccessful": not report.failures, "toolExecutionNotifications": notifications}


@output_format("sarif")
def render_sarif(report: Report) -> str:
    return json.dumps(to_sarif(report), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# github
# ---------------------------------------------------------------------------


def escape_data(value: str) -> str:
    """Escape a workflow command's message (as @actions/core does)."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """Escape a workflow command's property value."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


@output_format("github")
def render_github(report: Report) -> str:
    root = git_root()
    lines = [f"::error title=qlint::{escape_data(f'could not be analysed: {m.failure_line()}')}"
             for m in report.failures]
    for model, finding in _sorted_findings(report):
        props = []
        message = finding.message
        if finding.source is not None:
            file = relative_path(finding.source.file, root) or finding.source.file
            props += [f"file={escape_property(file)}", f"line={max(1, finding.source.line)}"]
        else:
            message = f"{model.spec}: {message}"
        props.append(f"title={escape_property(finding.code)}")
        level = GITHUB_LEVEL.get(finding.severity, "error")
        lines.append(f"::{level} {','.join(props)}::{escape_data(message)}")
    return "\n".join(lines) + ("\n" if lines else "")


# ---------------------------------------------------------------------------
# markdown
# ---------------------------------------------------------------------------


def _md(text: Any) -> str:
    """A Markdown table cell: pipes escaped, newlines as <br>."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


VERDICT_ICON = {"certified": "✅", "supercritical": "❌", "uncertified": "⚠️", "failed": "💥"}


@output_format("markdown")
def render_markdown(report: Report) -> str:
    out = ["## qlint report", ""]
    if not report.models:
        out += ["No models were checked.", ""]
        return "\n".join(out)
    out += ["| Model | Verdict | max q | Blocks | Findings |", "| --- | --- | ---: | ---: | --- |"]
    for model in report.models:
        counts = Counter(f.severity for f in model.findings)
        found = ", ".join(_plural(counts[s], s) for s in ("error", "warning", "info") if counts[s]) or "none"
        if model.suppressed:
            found += f" ({len(model.suppressed)} suppressed)"
        if model.failure is not None:
            found = _md(model.failure)
        max_q = model.max_q
        if max_q is None and model.blocks:
            max_q_text = "?"
        elif not model.blocks:
            max_q_text = "–"
        else:
            max_q_text = format_q(max_q)
        icon = VERDICT_ICON.get(model.verdict, "")
        accepted = model.suppressed and not model.findings and model.verdict != "certified"
        verdict = f"{model.verdict}, accepted" if accepted else model.verdict
        out.append(
            f"| `{_md(model.spec)}` | {icon} {verdict} | {max_q_text} | {len(model.blocks)} | {found} |"
        )
    out.append("")
    rows = _sorted_findings(report)
    if rows:
        out += [
            "### Findings",
            "",
            "| Code | Severity | Model | Block | Location | Message |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for model, f in rows:
            location = f"`{_md(display_path(f.source.file))}:{f.source.line}`" if f.source else ""
            block = f"`{_md(f.block)}`" if f.block else ""
            out.append(
                f"| {f.code} | {f.severity} | `{_md(model.spec)}` | {block} | {location} | {_md(f.message)} |"
            )
        out.append("")
    out += [f"**{summary_line(report)}**", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------
# JUnit XML and GitLab Code Quality
# ---------------------------------------------------------------------------


def fingerprints(found: list[tuple[ModelReport, Finding]], root: Path) -> list[str]:
    """A stable, unique id per finding: the hash of its structural key (qlint.ci.identity)
    and its occurrence number among equal keys (two identical findings stay two)."""
    seen: Counter[str] = Counter()
    out = []
    for model, finding in found:
        digest = hashlib.sha256("\0".join(finding_key(model, finding, root)).encode("utf-8")).hexdigest()[:32]
        seen[digest] += 1
        out.append(f"{digest}:{seen[digest]}")
    return out


@output_format("junit")
def render_junit(report: Report) -> str:
    """One <testsuite> per model; a <testcase> per block, failing with the block's findings;
    model-level findings (no block) are a case of their own; a model qlint could not
    analyse is one <error> case."""
    from xml.etree import ElementTree as ET

    suites = ET.Element("testsuites", name="qlint")
    for model in report.models:
        suite = ET.SubElement(suites, "testsuite", name=model.spec)
        cases: dict[str, list[Finding]] = {b.name: [] for b in model.blocks}
        for finding in model.findings:
            cases.setdefault(finding.block or model.spec, []).append(finding)
        if model.failure is not None:
            error = ET.SubElement(ET.SubElement(suite, "testcase", name=model.spec, classname=model.spec), "error",
                                  message="could not be analysed")
            error.text = model.failure_line()
        for name, findings in cases.items():
            case = ET.SubElement(suite, "testcase", name=name, classname=model.spec)
            for finding in findings:
                where = f"{display_path(finding.source.file)}:{finding.source.line}: " if finding.source else ""
                failure = ET.SubElement(case, "failure", message=f"{finding.code} {_one_line(finding.message)}",
                                        type=finding.severity)
                failure.text = f"{where}{finding.code} {finding.message}"
        failures = sum(1 for case in suite if case.find("failure") is not None)
        suite.set("tests", str(len(suite)))
        suite.set("failures", str(failures))
        suite.set("errors", "1" if model.failure is not None else "0")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


GITLAB_SEVERITY = {"error": "major", "warning": "minor", "info": "info"}


@output_format("gitlab")
def render_gitlab(report: Report) -> str:
    """GitLab's Code Quality report: a JSON array of issues with a stable fingerprint and a
    path relative to the repository root (GitLab shows them in merge requests)."""
    root = git_root()
    issues = []
    found = _sorted_findings(report)
    for (model, finding), fingerprint in zip(found, fingerprints(found, root)):
        file = finding.source.file if finding.source else _fallback_file(model.spec)
        issues.append({
            "type": "issue",
            "check_name": finding.code,
            "description": f"{finding.code} {_one_line(finding.message)}",
            "severity": GITLAB_SEVERITY.get(finding.severity, "minor"),
            "fingerprint": fingerprint,
            "location": {"path": (relative_path(file, root) or file) if file else model.spec,
                         "lines": {"begin": max(1, finding.source.line if finding.source else 1)}},
        })
    for model in report.failures:
        issues.append({"type": "issue", "check_name": "qlint-failed",
                       "description": f"could not be analysed: {model.failure_line()}", "severity": "blocker",
                       "fingerprint": hashlib.sha256(model.spec.encode("utf-8")).hexdigest(),
                       "location": {"path": model.spec, "lines": {"begin": 1}}})
    return json.dumps(issues, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# html
# ---------------------------------------------------------------------------


@output_format("html")
def render_html(report: Report) -> str:
    """One self-contained page (qlint.ci.html_report): no script, nothing fetched."""
    return html_report.page(report, summary=summary_line(report))


def _notebook_html(report: Report) -> str:
    """What Jupyter shows for a Report or a ModelReport: the page's body, its style scoped to it."""
    return html_report.fragment(report, summary=summary_line(report))


set_html_renderer(_notebook_html)  # Report._repr_html_ (floor 0 may not import this floor)


# ---------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------

# every renderer is defined above this line: the CLI and the configuration accept these names
OUTPUT_FORMATS = tuple(_REGISTRY)  # --output-format, output-format in [tool.qlint], --output FORMAT:PATH


def render(report: Report, fmt: str, *, statistics: bool = False, **options: Any) -> str:
    """The report as text in a format that returns text, every one but ``full`` (``statistics``:
    counts per code; ``options`` a format does not take are ignored: ``summary=False`` makes
    concise drop its summary line, for ``-q``)."""
    chosen = _registered(fmt)
    if statistics:
        return render_statistics(report, fmt)
    if chosen.writes_stream:
        raise ValueError(f"the {fmt!r} format is rendered by qlint.ci.render (use write_output)")
    return chosen.renderer(report, **chosen.own(options))


def write_output(
    report: Report,
    fmt: str = "full",
    *,
    output_file: str | os.PathLike[str] | None = None,
    statistics: bool = False,
    stream: Optional[IO[str]] = None,
    color: Optional[bool] = None,
    **options: Any,
) -> None:
    """Write the report in ``fmt`` to ``output_file`` (replaced whole: a temporary file renamed
    over it; a failure raises :class:`~qlint.ci.files.WriteError` naming the file and leaves the
    old one) or ``stream`` (stdout). ``options`` go to the renderer that takes them:
    ``show_all_derivations`` and ``width`` (full), ``summary`` (concise)."""
    chosen = _registered(fmt)
    if output_file is not None:  # rendered whole, then written whole (qlint.ci.files): never half a report
        from io import StringIO

        from qlint.ci.files import write_text

        buffer = StringIO(newline="\n")
        write_output(report, fmt, statistics=statistics, stream=buffer, color=False, **options)
        write_text(output_file, buffer.getvalue(), what=f"the {fmt} report")
        return
    stream = stream if stream is not None else sys.stdout
    if chosen.writes_stream and not statistics:
        chosen.renderer(report, stream, **chosen.own({"color": color, **options}))
    else:
        stream.write(render(report, fmt, statistics=statistics, **options))
    stream.flush()
