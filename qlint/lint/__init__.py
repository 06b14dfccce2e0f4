"""Lint rules in the style of ruff: each QL code owns its doc, severity, message and examples.

A rule's metadata lives in ``rules/checks/*.toml`` (code, name, severity, the message
template, the documentation, and ``fires_on`` / ``silent_on`` fixture specs that
``tests/test_rule_examples.py`` runs, Fixit-style); reading it needs no torch, so
``qlint explain`` and config validation are instant. The checker of a code is a
function in ``qlint/lint/<group>.py`` registered with :func:`checker`; findings are made
only through the rule object, ``RULES["QL101"].finding(...)``, so the code, the severity
and the message wording come from one place.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from qlint.core.results import Finding, Severity, Source
from qlint.registry import rules_dir, tomllib

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

    def finding(self, block: Optional[str] = None, source: Optional[Source] = None, **fields: Any) -> Finding:
        """A finding of this rule: its code, its severity, its message filled with ``fields``."""
        return Finding(self.code, self.severity, self.message.format(**fields), block, source)

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
                    raise ValueError(f"rules/checks/{path.name}: {table.get('code')} has unknown keys {sorted(unknown)}")
                if table["code"] in found:
                    raise ValueError(f"rule {table['code']} is defined twice")
                table = {**table, "source": f"rules/checks/{path.name}"}
                table["fires_on"] = tuple(table.get("fires_on", ()))
                table["silent_on"] = tuple(table.get("silent_on", ()))
                found[table["code"]] = Rule(**table)
        _RULES = dict(sorted(found.items()))
    return _RULES


def rule(code: str) -> Rule:
    return rules()[code]


Checker = Callable[[Any], Iterable[Finding]]
CHECKERS: dict[str, Checker] = {}


def checker(code: str) -> Callable[[Checker], Checker]:
    """Register the function ``(analysis) -> findings`` that implements rule ``code``."""

    def register(fn: Checker) -> Checker:
        if code not in rules():
            raise ValueError(f"checker for undefined rule {code}")
        CHECKERS[code] = fn
        return fn

    return register


def load_checkers() -> dict[str, Checker]:
    """Import every checker module (they need torch) so CHECKERS is complete."""
    from qlint.lint import attention, exponent, looped, placement  # noqa: F401

    return CHECKERS


def run_checks(analysis: Any, codes: Optional[Iterable[str]] = None) -> list[Finding]:
    """Every finding of every registered checker, in code order."""
    checkers = load_checkers()
    wanted = set(codes) if codes is not None else None
    findings: list[Finding] = []
    for code in sorted(checkers):
        if wanted is None or code in wanted:
            findings.extend(checkers[code](analysis))
    return findings


__all__ = ["CHECKERS", "Rule", "checker", "load_checkers", "rule", "rules", "run_checks"]
