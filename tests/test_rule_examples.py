"""Every rule fires on the examples it names and stays silent on the others (Fixit's VALID / INVALID).

The examples are fixture specs listed in each rule's ``fires_on`` / ``silent_on``
(rules/checks/*.toml); a rule without both kinds of example fails here, so a new
code cannot land without them. ``qlint check`` rules run through ``qlint.check``
(configuration, suppressions and all), the ``probe --loop`` ones through the loop probe,
the ``probe`` ones (the init logs) through ``qlint.api.probe``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from qlint.lint.rule import rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = [(code, spec, fires) for code, r in rules().items() for fires, specs in ((True, r.fires_on), (False, r.silent_on)) for spec in specs]


@lru_cache(maxsize=None)
def codes_reported(spec: str, produced_by: str) -> frozenset[str]:
    path = f"{FIXTURES / spec}"
    if produced_by == "probe --loop":
        import qlint.api

        return frozenset(f.code for probes in qlint.api.probe_loops([path], isolated=True).values() for probe in probes for f in probe.findings)
    if produced_by == "probe":
        import qlint.api
        from qlint.probe.measure import ProbeSettings

        # the init logs do not read the exponent fits: sample two scales, no random directions
        quick = ProbeSettings(random_directions=0, perturb=False, power_iterations=1, lowest_decade=6, points_per_decade=1, fit_decades=1)
        return frozenset(f.code for result in qlint.api.probe([path], isolated=True, settings=quick) for f in result.report.findings)
    import qlint

    report = qlint.check([path], isolated=True, select=["ALL"])
    return frozenset(f.code for model in report.models for f in model.findings)


def test_every_rule_has_examples_of_both_kinds():
    missing = [code for code, r in rules().items() if not (r.fires_on and r.silent_on)]
    assert missing == []


def test_every_example_spec_exists():
    for _, spec, _ in CASES:
        file, _, factory = spec.partition(":")
        assert f"def {factory}(" in (FIXTURES / file).read_text(), spec


@pytest.mark.parametrize("code, spec, fires", CASES, ids=[f"{c}-{'fires' if f else 'silent'}-{s}" for c, s, f in CASES])
def test_rule_example(code, spec, fires):
    reported = codes_reported(spec, rules()[code].produced_by)
    assert (code in reported) == fires, f"{code} {'did not fire' if fires else 'fired'} on {spec}; reported: {sorted(reported)}"
