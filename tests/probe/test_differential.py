"""The differential soundness law: qlint never certifies a block whose eager velocity grows
faster than linearly (or than its static q), on random blocks drawn from the whole op
vocabulary (qlint.probe.differential), measured by the eager witness under adversarial
directions and parameter values. ``bench/differential_long.py`` runs it for minutes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from qlint.probe.differential import Example, check, examples


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(examples())
def test_qlint_never_certifies_what_the_eager_model_contradicts(example):
    outcome = check(example)
    assert outcome.sound, f"UNSOUND: {example}: {outcome.violation}"


def test_the_generator_reaches_certified_and_refused_blocks():
    """A generator that only builds what the rules handle proves nothing: both kinds occur."""
    certified = check(Example("plus", ("lin", ("layer_norm", ("x",))), ("x",), 0))
    refused = check(Example("plus", ("mul", ("lin", ("x",)), ("lin", ("x",))), ("x",), 0))
    unknown = check(Example("plus", ("div", ("x",), ("lin", ("x",))), ("x",), 0))
    assert certified.verdict == "certified" and certified.sound and certified.measured is not None
    assert refused.verdict == "supercritical" and unknown.verdict == "uncertified"
