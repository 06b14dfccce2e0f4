"""Lint rules in the style of ruff: each QL code owns its doc, severity, message and examples.

A rule's metadata lives in ``rules/checks/*.toml`` (code, name, severity, the message
template, the documentation, and ``fires_on`` / ``silent_on`` fixture specs that
``tests/lint/test_rule_examples.py`` runs, Fixit-style); reading it needs no torch, so
``qlint explain`` and config validation are instant. The checker of a code is a
function in ``qlint/lint/<group>.py`` (the group of its ``rules/checks/<group>.toml``)
registered with ``@checker("QL101")`` (:mod:`qlint.lint.rule`), the one place its code is
written; it is handed its rule and makes findings only through ``rule.finding(...)``, so
the code, the severity and the message wording come from one place.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import traceback
from typing import Any, Iterable, Optional

from qlint.core.results import Finding
from qlint.lint.rule import CHECKERS, Checker, Rule, checker, rule, rules


def load_checkers() -> dict[str, Checker]:
    """Every registered checker by code, their modules imported first (they need torch)."""
    _import_checker_modules()
    return CHECKERS


@functools.cache
def _import_checker_modules() -> None:
    """Import the modules of this package named after a rules/checks/<group>.toml: the checker
    modules, found without a hand-kept list. The helpers (``rule``, ``graph_queries``,
    ``branch_scale``) are named after no group and load only when a checker imports them."""
    groups = {r.group for r in rules().values()}
    for module in pkgutil.iter_modules(__path__):
        if module.name in groups:
            importlib.import_module(f"{__name__}.{module.name}")


def run_checks(analysis: Any, codes: Optional[Iterable[str]] = None) -> list[Finding]:
    """Every finding of every registered checker, in code order.

    Each checker runs isolated: an exception inside one (a bug in a rule, a model its
    author did not foresee) costs that rule's result only. The findings it yielded before
    the exception are kept, and the exception becomes one internal-error finding of the
    rule's code naming the rule and the model (:meth:`Rule.internal_error`); its formatted
    traceback is kept in the report's ``extra["internal_errors"]`` (``--traceback``).
    Every other rule, the blocks and the verdict stand.
    """
    checkers = load_checkers()
    wanted = set(codes) if codes is not None else None
    findings: list[Finding] = []
    for code in sorted(checkers):
        if wanted is None or code in wanted:
            findings.extend(_isolated(rule(code), checkers[code], analysis))
    return findings


def _isolated(checked: Rule, check: Checker, analysis: Any) -> list[Finding]:
    """The checker's findings, the exception it raised turned into an internal-error finding."""
    found: list[Finding] = []
    try:
        for finding in check(analysis, checked):
            found.append(finding)
    except Exception as exc:  # noqa: BLE001  (any bug in one rule; KeyboardInterrupt and SystemExit pass)
        report = getattr(analysis, "report", None)
        spec = getattr(report, "spec", None) or type(getattr(analysis, "model", analysis)).__name__
        error = checked.internal_error(spec, exc)
        found.append(error)
        if report is not None:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            report.extra.setdefault("internal_errors", []).append(
                {"code": checked.code, "message": error.message, "traceback": text})
    return found


__all__ = ["CHECKERS", "Rule", "checker", "load_checkers", "rule", "rules", "run_checks"]
