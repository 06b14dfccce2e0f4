"""A lint rule: its code, severity, message template, documentation and examples, read from TOML.

Reading needs no torch (``qlint explain``, ``qlint rules`` and config validation are
instant). A checker names its code once, in ``@checker("QL101")``, and is handed its
:class:`Rule`: it makes findings only through ``rule.finding(...)``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from qlint.core.results import Finding, Severity, Source
from qlint.core.toml import tomllib
from qlint.registry import rules_dir

_FIELDS = {"code", "name", "severity", "summary", "rationale", "example", "remedy", "message", "fires_on", "silent_on",
           "produced_by", "source"}


@dataclass(frozen=True)
class Rule:
    """One lint rule: what it checks, why (with the source it rests on), the fix, examples."""

    code: str
    name: str
    severity: Severity
    summary: str
    rationale: str
    example: str
    remedy: str
    message: str  # a str.format template filled by the checker
    fires_on: tuple[str, ...] = ()
    silent_on: tuple[str, ...] = ()
    produced_by: str = "check"  # "check" (qlint check) or the command that reports it ("probe --loop")
    source: str = ""

    @property
    def group(self) -> str:
        """The group named by the rule's file, rules/checks/<group>.toml: its checker lives in qlint/lint/<group>.py."""
        return Path(self.source).stem

    def finding(self, block: Optional[str] = None, source: Optional[Source] = None, *,
                related: Iterable[Optional[Source]] = (), **fields: Any) -> Finding:
        """A finding of this rule: its code, its severity, its message filled with ``fields``;
        ``related``: the other source lines the message names."""
        others = tuple(dict.fromkeys(s for s in related if s is not None and s != source))
        return Finding(self.code, self.severity, self.message.format(**fields), block, source, related=others)

    def internal_error(self, model: str, exc: BaseException) -> Finding:
        """The finding that stands for this rule's result when its checker raised ``exc`` on
        ``model``: of the rule's code, naming the rule, the model and the exception.

        Severity info for a warning or info rule, so a crash in a rule that does not gate
        neither fails the run nor hides the rest of the report; error for an error rule (the
        gate fails closed: its silence is not a pass)."""
        first = (str(exc).strip().splitlines() or [""])[0]
        error = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        severity: Severity = "error" if self.severity == "error" else "info"
        message = (f"internal error in rule {self.code} ({self.name}) on `{model}`: {error}; this rule's result is "
                   f"missing for this model, every other result stands (rerun with --traceback for the Python trace)")
        return Finding(self.code, severity, message)

    def doc(self) -> str:
        """The rule's documentation as Markdown (``qlint explain``, docs/rules.md)."""
        return "\n".join(
            [
                f"## {self.code} {self.name} ({self.severity})",
                "",
                "### What it checks",
                _dedent(self.summary),
                "",
                "### Why",
                _dedent(self.rationale),
                "",
                "### Example",
                "```python",
                _dedent(self.example),
                "```",
                "",
                "### Use instead",
                _dedent(self.remedy),
                "",
            ]
        )


def _dedent(text: str) -> str:
    return textwrap.dedent(text).strip()


_RULES: Optional[dict[str, Rule]] = None


def rules() -> dict[str, Rule]:
    """Every rule by code, in code order (read once from rules/checks/*.toml)."""
    global _RULES
    if _RULES is None:
        found: dict[str, Rule] = {}
        for path in sorted((rules_dir() / "checks").glob("*.toml")):
            with path.open("rb") as handle:
                data = tomllib.load(handle)
            for table in data.get("rule", []):
                unknown = set(table) - _FIELDS
                if unknown:
                    raise ValueError(f"rules/checks/{path.name}: {table.get('code')} has unknown keys "
                                     f"{sorted(unknown)}")
                if table["code"] in found:
                    raise ValueError(f"rule {table['code']} is defined twice")
                table = {**table, "source": f"rules/checks/{path.name}"}
                table["fires_on"] = tuple(table.get("fires_on", ()))
                table["silent_on"] = tuple(table.get("silent_on", ()))
                found[table["code"]] = Rule(**table)
        _RULES = dict(sorted(found.items()))
    return _RULES


def rule(code: str) -> Rule:
    """The rule of ``code``, for findings made outside a checker (the probe's, an internal error)."""
    return rules()[code]


Checker = Callable[[Any, Rule], Iterable[Finding]]
CHECKERS: dict[str, Checker] = {}


def checker(code: str) -> Callable[[Checker], Checker]:
    """Register the function ``(analysis, rule) -> findings`` that implements rule ``code``.

    The code is written here only: the checker is handed its :class:`Rule` and makes its
    findings with ``rule.finding(...)``. It must live in ``qlint/lint/<group>.py`` of its
    rule's ``rules/checks/<group>.toml``, the modules :func:`qlint.lint.load_checkers` imports.
    """

    def register(fn: Checker) -> Checker:
        where = f"{fn.__module__}.{fn.__qualname__}"
        if code not in rules():
            raise ValueError(f"checker {where} implements {code}, which no [[rule]] table in rules/checks/*.toml "
                             f"defines: add one (code, name, severity, message, docs, fires_on, silent_on)")
        home = f"{__package__}.{rules()[code].group}"
        if fn.__module__ != home:
            raise ValueError(f"checker {where} implements {code} of {rules()[code].source}: "
                             f"move it to {home} (the modules load_checkers imports)")
        CHECKERS[code] = fn
        return fn

    return register
