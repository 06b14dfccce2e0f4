"""Lint rules in the style of ruff: each QL code owns its doc, severity, message and examples.

A rule's metadata lives in ``rules/checks/*.toml`` (code, name, severity, the message
template, the documentation, and ``fires_on`` / ``silent_on`` fixture specs that
``tests/test_rule_examples.py`` runs, Fixit-style); reading it needs no torch, so
``qlint explain`` and config validation are instant. The checker of a code is a
function in ``qlint/lint/<group>.py`` registered with :func:`checker` (:mod:`qlint.lint.rule`); findings are made
only through the rule object, ``rule("QL101").finding(...)``, so the code, the severity
and the message wording come from one place.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from qlint.core.results import Finding
from qlint.lint.rule import CHECKERS, Checker, Rule, checker, rule, rules


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
