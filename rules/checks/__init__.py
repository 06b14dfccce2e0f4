"""Lint rules in the style of ruff's rule docs: code, message, why, example, remedy.

A rule is documentation plus a severity; the analysis (QL1xx) or a check function
registered with :func:`check` (QL2xx, QL3xx) produces its findings.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Callable, Iterable

from qlint.report import Finding, Severity


@dataclass(frozen=True)
class Rule:
    """One lint rule: what it checks, why (with the source it rests on), and the fix."""

    code: str
    name: str
    severity: Severity
    summary: str
    rationale: str
    example: str
    remedy: str

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


RULES: dict[str, Rule] = {}
CHECKS: dict[str, Callable[..., Iterable[Finding]]] = {}


def define(rule: Rule) -> Rule:
    """Add a rule to the catalogue (codes are unique)."""
    if rule.code in RULES:
        raise ValueError(f"rule {rule.code} is defined twice")
    RULES[rule.code] = rule
    return rule


def check(code: str) -> Callable[[Callable[..., Iterable[Finding]]], Callable[..., Iterable[Finding]]]:
    """Register a function ``(context) -> findings`` that implements rule ``code``."""

    def register(fn: Callable[..., Iterable[Finding]]) -> Callable[..., Iterable[Finding]]:
        CHECKS[code] = fn
        return fn

    return register


def load_all() -> dict[str, Rule]:
    """Import every rule module so the catalogue is complete."""
    from qlint.rules.checks import exponent  # noqa: F401  (defines QL1xx)

    for optional in ("attention", "placement", "looped", "suppression"):
        try:
            __import__(f"qlint.rules.checks.{optional}")
        except ModuleNotFoundError as exc:
            if exc.name != f"qlint.rules.checks.{optional}":
                raise
    return RULES
