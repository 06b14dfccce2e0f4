"""Every rule fires on the examples it names and stays silent on the others (Fixit's VALID / INVALID).

The examples are fixture specs listed in each rule's ``fires_on`` / ``silent_on``
(rules/checks/*.toml); a rule without both kinds of example fails here, so a new
code cannot land without them, and so does a ``qlint check`` rule without a checker
(or a checker of a probe rule). ``qlint check`` rules run through ``qlint.check``
(configuration, suppressions and all), the ``probe --loop`` ones through the loop probe,
the ``probe`` ones (the init logs) through ``qlint.api.probe``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from qlint.lint.rule import rules

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = [(code, spec, fires) for code, r in rules().items()
         for fires, specs in ((True, r.fires_on), (False, r.silent_on)) for spec in specs]

# `qlint check` rules whose findings no checker makes, with the module that makes them instead
MADE_OUTSIDE_CHECKERS = {
    "QL100": "qlint/ci/suppress.py (an unused noqa is known only once every model of the run is checked)",
}


@lru_cache(maxsize=None)
def codes_reported(spec: str, produced_by: str) -> frozenset[str]:
    path = f"{FIXTURES / spec}"
    if produced_by == "probe --loop":
        import qlint.api

        probed = qlint.api.probe_loops([path], isolated=True)
        return frozenset(f.code for probes in probed.values() for probe in probes for f in probe.findings)
    if produced_by == "probe":
        import qlint.api
        from qlint.probe.measure import ProbeSettings

        # the init logs do not read the exponent fits: sample two scales, no random directions
        quick = ProbeSettings(random_directions=0, perturb=False, power_iterations=1, lowest_decade=6,
                              points_per_decade=1, fit_decades=1)
        results = qlint.api.probe([path], isolated=True, settings=quick)
        return frozenset(f.code for result in results for f in result.report.findings)
    import qlint

    report = qlint.check([path], isolated=True, select=["ALL"])
    return frozenset(f.code for model in report.models for f in model.findings)


EXAMPLE_KINDS = {"fires_on": "it must fire on", "silent_on": "it must stay silent on"}


def test_every_rule_has_examples_of_both_kinds():
    missing = [f"{code} ({r.name}) in {r.source} has no {kind}: add {kind} = [\"file.py:factory\"] naming "
               f"a model factory in fixtures/ {what}"
               for code, r in rules().items() for kind, what in EXAMPLE_KINDS.items() if not getattr(r, kind)]
    assert missing == [], "\n".join(missing)


def test_every_check_rule_has_a_checker_and_every_checker_a_check_rule():
    """A rule `qlint check` reports is made by a ``@checker`` in qlint/lint/<group>.py (or, for the
    codes of MADE_OUTSIDE_CHECKERS, elsewhere); a probe rule has none. A checker of a code no TOML
    defines cannot register at all (:func:`qlint.lint.rule.checker` raises, saying what to add)."""
    from qlint.lint import load_checkers

    checkers = load_checkers()
    problems = []
    for code, r in rules().items():
        if r.produced_by == "check" and code not in checkers and code not in MADE_OUTSIDE_CHECKERS:
            problems.append(f"{code} ({r.name}) in {r.source} has no checker: add @checker(\"{code}\") "
                            f"def {r.name.replace('-', '_')}(analysis, rule) in qlint/lint/{r.group}.py, or set "
                            f"produced_by to the command that reports it")
        if r.produced_by != "check" and code in checkers:
            problems.append(f"{code} ({r.name}) in {r.source} is produced_by {r.produced_by!r} but has a checker "
                            f"in qlint/lint/{r.group}.py: remove the checker, or produced_by")
    stale = sorted(set(MADE_OUTSIDE_CHECKERS) & set(checkers))
    assert problems == [], "\n".join(problems)
    assert stale == [], f"{stale} have a checker now: drop them from MADE_OUTSIDE_CHECKERS in {__file__}"


def test_every_example_spec_exists():
    for _, spec, _ in CASES:
        file, _, factory = spec.partition(":")
        assert f"def {factory}(" in (FIXTURES / file).read_text(), spec


@pytest.mark.parametrize("code, spec, fires", CASES, ids=[f"{c}-{'fires' if f else 'silent'}-{s}" for c, s, f in CASES])
def test_rule_example(code, spec, fires):
    reported = codes_reported(spec, rules()[code].produced_by)
    assert (code in reported) == fires, \
        f"{code} {'did not fire' if fires else 'fired'} on {spec}; reported: {sorted(reported)}"
