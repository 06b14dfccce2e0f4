"""Issue 29: every checker runs isolated; a rule that raises costs its own result only.

A crashing rule becomes one internal-error finding of its code naming the rule and the model
(info for a warning rule, error for an error rule: the gate fails closed), its traceback is kept in
the report's ``internal_errors``, and every other finding, block and the verdict stand. DAC's
residual quantizer, ``x + f(x) * (full(...) < n)``, took the report down in QL204's branch-end
scale (abs of a bool mask): it is measured now.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from qlint.analysis import Options, load_model, run
from qlint.lint import load_checkers, run_checks
from qlint.lint.branch_scale import branch_scales
from tests.conftest import fixture_spec


def _analysed(spec: str, **options):
    loaded = load_model(fixture_spec(spec), Options(**options))
    return run(loaded.model, loaded.inputs, spec=spec, options=Options(**options))


def _boom(analysis, rule):
    raise NotImplementedError('"abs_cpu" not implemented for \'Bool\'\nsecond line')
    yield  # pragma: no cover  (a generator, as the real checkers are)


_QL201 = load_checkers()["QL201"]


def _partial(analysis, rule):
    """Yields QL201's real findings, then raises: the findings it made are kept."""
    yield from _QL201(analysis, rule)
    raise RuntimeError("late failure")


@pytest.fixture(scope="module")
def plain():
    """Two plain attentions: QL201 fires on both blocks (two findings)."""
    return _analysed("attention.py:plain")


def _codes(findings):
    return [(f.code, f.severity, f.block) for f in findings]


def test_a_crashing_warning_rule_is_one_info_finding_and_the_rest_stands(plain, monkeypatch):
    baseline = run_checks(plain)
    assert _codes(baseline) == [("QL201", "warning", "attns.0"), ("QL201", "warning", "attns.1")]
    monkeypatch.setitem(load_checkers(), "QL204", _boom)
    plain.report.extra.pop("internal_errors", None)
    findings = run_checks(plain)
    assert _codes(findings) == _codes(baseline) + [("QL204", "info", None)]
    error = findings[-1]
    assert error.message.startswith("internal error in rule QL204 (unscaled-deep-residual) on `attention.py:plain`: "
                                    "NotImplementedError: \"abs_cpu\" not implemented for 'Bool'; "
                                    "this rule's result is missing")
    assert "second line" not in error.message and "--traceback" in error.message
    assert error.source is None
    [recorded] = plain.report.extra.pop("internal_errors")
    assert recorded["code"] == "QL204" and recorded["message"] == error.message
    assert recorded["traceback"].startswith("Traceback (most recent call last):")
    assert "in _boom" in recorded["traceback"] and "NotImplementedError" in recorded["traceback"]
    assert plain.report.verdict == "certified"  # the blocks and the verdict do not depend on the rule


def test_a_crashing_error_rule_fails_closed(plain, monkeypatch):
    monkeypatch.setitem(load_checkers(), "QL101", _boom)
    findings = run_checks(plain)
    plain.report.extra.pop("internal_errors", None)
    assert ("QL101", "error", None) in _codes(findings)
    assert [f for f in findings if f.code == "QL201"] == run_checks(plain, codes={"QL201"})


def test_findings_made_before_the_exception_are_kept(plain, monkeypatch):
    monkeypatch.setitem(load_checkers(), "QL201", _partial)
    findings = run_checks(plain, codes={"QL201"})
    plain.report.extra.pop("internal_errors", None)
    assert _codes(findings) == [("QL201", "warning", "attns.0"), ("QL201", "warning", "attns.1"),
                                ("QL201", "info", None)]
    assert "RuntimeError: late failure" in findings[-1].message


def test_keyboard_interrupt_is_not_swallowed(plain, monkeypatch):
    def interrupted(analysis, rule):
        raise KeyboardInterrupt
        yield  # pragma: no cover

    monkeypatch.setitem(load_checkers(), "QL203", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_checks(plain)


def test_the_api_report_keeps_the_model_and_the_internal_error(monkeypatch):
    """Through ``qlint.check`` (in this process, so the patched checker is the one that runs)."""
    import qlint

    monkeypatch.setitem(load_checkers(), "QL203", _boom)
    report = qlint.check([fixture_spec("attention.py:plain")], isolated=True, select=["ALL"])
    [model] = report.models
    assert model.failure is None and model.verdict == "certified"
    codes = _codes(model.findings)
    assert ("QL203", "info", None) in codes and codes.count(("QL201", "warning", "attns.0")) == 1
    document = report.to_dict()["models"][0]
    assert [e["code"] for e in document["internal_errors"]] == ["QL203"]
    json.dumps(document)  # the traceback is text: the JSON document still serialises


# --- the trigger: a bool mask at a branch's end (DAC's residual vector quantizer) --------------------


class MaskedLayer(nn.Module):
    """x + f(x) * (full((1,), i) < n): the quantizer's mask, a bool constant once shapes are static."""

    def __init__(self, index: int, active: int, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.index, self.active = index, active

    def forward(self, x):
        mask = torch.full((1,), fill_value=self.index, device=x.device) < self.active
        return x + self.proj(torch.tanh(x)) * mask[:, None]


class MaskedResidual(nn.Module):
    """Eight masked layers between a stem and a head (the reference layers QL204 measures against)."""

    def __init__(self, depth: int = 8, d: int = 8, active: int = 6):
        super().__init__()
        self.stem, self.head = nn.Linear(d, d), nn.Linear(d, d)
        self.layers = nn.ModuleList(MaskedLayer(i, active, d) for i in range(depth))

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def masked():
    from qlint.analysis import Options as Opts

    torch.manual_seed(0)
    model = MaskedResidual().eval()
    return run(model, (torch.randn(2, 8),), spec="MaskedResidual", options=Opts(tracer="export"))


def test_a_bool_mask_at_the_branch_end_is_measured_not_a_crash(masked):
    report = masked.report
    assert report.tracer == "export"
    assert "internal_errors" not in report.extra
    assert [f.message for f in report.findings if f.message.startswith("internal error")] == []
    scales = branch_scales(masked)
    assert [s.block for s in scales] == [f"layers.{i}" for i in range(8)]
    # the mask is True for the first 6 layers (factor 1), False for the last two (factor 0)
    assert [s.multiplier for s in scales] == [1.0] * 6 + [0.0] * 2
    assert [s.projection for s in scales] == [f"layers.{i}.proj" for i in range(8)]
    assert [s.scaled for s in scales] == [False] * 6 + [True] * 2
    [ql204] = [f for f in report.findings if f.code == "QL204"]
    assert ql204.block == "layers" and ql204.severity == "warning"
    assert ql204.message.startswith("deep residual stack `layers`: 6 of 8 branches enter the stream unscaled")



def test_a_running_variance_of_zero_with_eps_zero_is_no_crash():
    """BatchNorm in eval with var = 0 and eps = 0 divides by zero: the branch's scale has no finite
    gain (unknown to QL202/QL204/QL206), and the block is uncertified by the propagation, not by a crash."""
    loaded = load_model(fixture_spec("adversarial/sign_facts.py:batch_norm_zero_eps_zero_variance"), Options())
    report = run(loaded.model, loaded.inputs, spec="zero_variance", options=Options()).report
    assert "internal_errors" not in report.extra
    assert [f.code for f in report.findings] == ["QL102"] and "var + eps <= 0" in report.findings[0].message

def test_the_bool_mask_crash_as_it_was_is_one_info_finding(monkeypatch):
    """abs() of the bool mask, as QL204's branch-end scale took it before: the QL204 result is one
    info finding and QL201 / the blocks / the verdict of the model stand (exit 0, not 2)."""
    from qlint.lint import branch_scale

    monkeypatch.setattr(branch_scale, "_magnitude", lambda value: value.abs())
    torch.manual_seed(0)
    analysis = run(MaskedResidual().eval(), (torch.randn(2, 8),), spec="MaskedResidual",
                   options=Options(tracer="export"))
    report = analysis.report
    assert report.verdict == "certified" and [b.name for b in report.blocks] == [f"layers.{i}" for i in range(8)]
    [error] = [f for f in report.findings if f.code == "QL204"]
    assert error.severity == "info"
    assert error.message.startswith("internal error in rule QL204 (unscaled-deep-residual) on `MaskedResidual`: "
                                    "NotImplementedError: \"abs_cpu\" not implemented for 'Bool'")
    # QL202 and QL206 measure branch scales the same way (DeepNorm's beta): each crash is its own finding
    assert [e["code"] for e in report.extra["internal_errors"]] == ["QL202", "QL204", "QL206"]
    assert all(f.severity == "info" for f in report.findings if f.code in ("QL202", "QL206"))


def test_the_cli_prints_a_crashed_rules_traceback_with_traceback_only(monkeypatch):
    """``--traceback`` prints the kept traceback on stderr; without it only the finding shows."""
    from click.testing import CliRunner

    import qlint.api
    from qlint.cli import main

    analyse = qlint.api.analyse_configured

    def crashed(config, **kwargs):
        report = analyse(config, **{**kwargs, "supervised": False})
        report.models[0].extra["internal_errors"] = [{"code": "QL204", "message": "internal error in rule QL204",
                                                      "traceback": "Traceback (most recent call last):\nBoom: here\n"}]
        return report

    monkeypatch.setattr(qlint.api, "analyse_configured", crashed)
    spec = fixture_spec("attention.py:plain")
    shown = CliRunner().invoke(main, [spec, "--isolated", "--no-cache", "--traceback"])
    hidden = CliRunner().invoke(main, [spec, "--isolated", "--no-cache"])
    assert "Boom: here" in shown.stderr and "qlint: " in shown.stderr
    assert "Boom: here" not in hidden.stderr and hidden.exit_code == shown.exit_code == 0
