"""The adversarial corpus (fixtures/adversarial/): qlint must refuse every unsafe case and certify every safe one.

Written against the CLI only: one ``python -m qlint SPEC... --format json --isolated``
run covers every case of fixtures/adversarial/CASES.toml. Each case has two tests:

* ``test_cli_verdict``: an "unsafe" case (true exponent > 1, super-polynomial or a
  pole) must not be ``certified``; a "safe" one must be ``certified`` with
  ``max_q <= 1``.
* ``test_label_is_true``: the label itself is re-measured numerically with
  bench/adversarial_truth.py (quick mode), so the corpus cannot rot.

A model qlint cannot trace is in the report with verdict ``failed`` (exit 2): a refusal,
which an unsafe case passes and a safe case fails. If the run gives no report at all,
the specs are bisected until the failing ones are isolated; those fail with qlint's
one-line error and the rest are judged normally.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from conftest import ROOT, load_module
TRUTH_PATH = ROOT / "bench" / "adversarial_truth.py"
CANARY = "fixtures/adversarial/skip_syntax.py:sub_skip_safe"  # the plainest residual block of the corpus
MAX_CLI_RUNS = 30  # bisection budget when the single run fails


truth = load_module(TRUTH_PATH, "adversarial_truth")
CASES = truth.load_cases()
IDS = [case.spec for case in CASES]

# Safe cases qlint refuses on purpose: proving them needs facts the value domain does not
# keep (strict: fixing one makes its test fail until it is removed from this list).
CONSERVATIVE = {
    "sign_facts.py:exp_abs_difference_safe": "(-2|z|) - (-|z|) <= 0 needs a relation between the two terms (interval arithmetic gives any sign)",
    "special_complex.py:complex_exp_imaginary": "|exp(i u)| = 1 needs the real part of a complex value, which the domain does not track",
    "r1_subclass.py:logged_weight_safe": "a parameter whose class overrides __torch_function__ is refused: what it computes is not read",
    "r1_decays.py:slstm_stabilised_safe": "exp(i - m_t) <= 1 needs m_t >= i, a relation through the max-stabiliser the domain does not keep",
    "r1_linalg.py:skew_matrix_exp_rotation_safe": "matrix_exp of a matrix computed from x is orthogonal only for a skew argument: structure the domain does not keep",
    "r1_linalg.py:cayley_rotation_safe": "solve(I - S, I + S) of a skew S from x is orthogonal: structure the domain does not keep",
    "r7_selection.py:shape_threshold_safe": "a selection's threshold computed from the input's shape is finite for each shape, but only a parameter or a finite float buffer is taken as a finite threshold (an expression may overflow to inf)",
    "r7_postnorm.py:post_batchnorm_train_safe": "BatchNorm on batch statistics after the join is read as the head's transition, not as the block's Post-LN norm",
    "r7_reflected.py:rtruediv_shift_ratio_safe": "(n + 1) / n for n >= 1 lies in (1, 2]: the own-shift ratio rule reads n / (n + c) only",
    "r7_reflected.py:rsub_softmax_safe": "exp(min z - z) normalised by its sum: the shift by the row minimum has no rule (the maximum's has)",
    "r8_bounds.py:negative_correction_ln_times_u_safe": "a variance with a negative correction is no statistic the normalisation rule takes (its deviation passes sqrt(n) standard deviations; the wider bound is not derived)",
    "r8_divisors.py:fmod_inf_linear_safe": "a float buffer holding inf is unknown wherever it is read (fmod by inf keeps its dividend: linear here, but a rule reading the buffer as a finite constant would not be sound)",
    "r6_casts.py:own_shift_int64_safe": "an integer cast is not followed by the relations: past 2^63 a float -> int64 conversion wraps to INT64_MIN, so n / (int64(n) + 1) then grows like n (exact only below 9.2e18, which the label measures)",
    "r1_buffers.py:denorm_with_running_std_safe": "a buffer the forward writes (running statistics) read by value outside BatchNorm is unknown",
    # review r15: a platform fact no run here can vary stays a condition of the certificate (QL109)
    "r15_safe.py:device_dispatch": "a branch on the device (x.is_cuda): the GPU path cannot be run on this CPU, so the certificate holds for the CPU only",
    "r15_safe.py:ddp_aware_mean": "with a process group the forward calls dist.get_world_size(), which fails without one: that answer cannot be run, so it stays a condition",
    "r15_safe.py:stochastic_depth": "a Python branch on a draw of torch's generator: the other draw is not forced, so the path stays a condition",
    # review c1 (issue 39's safe controls): the 12 of 60 still refused, each with the rule it lacks
    "c1_masked.py:timesfm_masked_revin": "mean and spread over a data-dependent 0/1 mask: no normalisation rule takes masked statistics (only an all-ones mask is rewritten to a mean)",
    "r10_wrap.py:small_scale_interval_safe": "a comparison of c v with a number is read as one of v in floating dtypes only (an integer product wraps past its range): here the integers do not reach it",
    "r10_wrap.py:small_scale_abs_safe": "the same for |v| scaled by an integer",
    "r10_sizes.py:bincount_minlength_safe": "bincount's length depends on the values (max + 1): refused even where minlength covers every value the input can take",
    "r11_masklen.py:mask_rows_shrinking_pow_safe": "x[mask]'s length depends on the input's values: its sizes are not constants, even where the value built from them shrinks",
    "r11_metadim.py:size_dim_shrinking_safe": "x.size(d) at a dim the input's values choose is one of those values, not a size of the example",
    "r11_eyecols.py:eye_capped_cols_safe": "eye(1, m)'s length depends on m's value: a cap on m is a relation the length check does not read",
    "c1_mhc.py:mhc_sinkhorn_tanh": "a hyper-connection stream mixed by a doubly-stochastic matrix has no identity term: no block is found and the model is uncovered",
    "c1_mhc.py:mhc_sinkhorn_rmsnorm": "the same hyper-connection with an RMSNorm on the mixing logits: no identity term, no block",
    "c1_routing.py:moe_top2_capacity": "a capacity int(cf n k / E) computed from the batch size: each size is another graph, and past two other shapes analysed the rest are uncovered",
    # review r12: a forward that takes another path after N calls or in float64 is refused, safe or not
    "r12_callstate.py:closure_counter_linear_safe": "a call counter kept in a closure: state across calls, which one traced call cannot stand for (the path after 176 calls is not seen)",
    "r12_f64copy.py:dtype_is_float64_linear_safe": "a float64 copy takes another path than the float32 model: the graph shows one of them",
    "r12_version.py:version_keyed_log_safe": "reads a parameter's version counter: a value no run can try every count of, refused by name whatever the forward does with it",
    "r12_safe25.py:linear_attention_elu": "sum_j w_j v_j / (sum_j w_j + eps) with w = (elu(q)+1)(elu(k)+1) >= 0 is a convex combination of the v_j: a relation between numerator and denominator (through two cumsums and a matmul) that the normalisation rules do not read",
    "r12_safe25.py:sliding_window_gqa": "a float mask buffer holding -inf: a float buffer is a parameter, and at other values of it a whole row may be -inf (softmax of it is NaN)",
    # review r17
    "r17_safe.py:platform_choice_linear_safe": "a branch on `sys.platform`: a platform fact no run here can vary stays a condition of the certificate",
    "r17_safe.py:dispatch_mode_attention_safe": "a forward that asks which dispatch mode is active sees qlint's own: the answer of a plain run is not tried, so it stays a condition",
    "r17_safe.py:deque_logging_safe": "a log the forward appends to each call is state kept across calls; whether a later call reads it is not followed",
    "r17_kernels.py:custom_op_skip_empty_safe": "a custom op whose Python body branches on its argument's values is not inlined (traced on one value it would stand for that value's path): the op stays unknown",
    "r17_floatstate.py:float_attribute_constant_zero": "a float tensor the model holds is a parameter: any value of it is analysed, so the square it scales counts (q 2)",
    # review r18
    "r18_safe.py:slots_meter_logging_safe": "a meter the forward moves each call is state kept across calls, whether or not a later call reads it",
    "r18_safe.py:rocm_getattr_activation_safe": "a branch on `getattr(torch.version, 'hip', None)`: a platform fact no run here can vary stays a condition",
    "r18_safe.py:custom_op_chunked_safe": "a custom op whose Python body branches on its argument's sizes is not inlined (traced at one size it stands for that size's path): the op stays unknown",
}


# ------------------------------------------------------------------ the CLI run


def _cli(specs: list[str], isolated: bool = True) -> tuple[int, str, str]:
    command = [sys.executable, "-m", "qlint", *specs, "--format", "json"] + (["--isolated"] if isolated else [])
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny models: threads only contend
    # the limit is for a hang: the whole corpus takes 6-8 minutes on a loaded 2-core machine
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _error_line(rc: int, stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exit {rc}: " + (lines[-1] if lines else "(no message)")


class _Runner:
    """Runs the CLI on batches of specs; bisects a failing batch within a budget of runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.isolated = True

    def run(self, specs: list[str]) -> dict[str, dict[str, Any]] | str:
        """spec -> model entry of the JSON report, or the one-line error of the run."""
        self.runs += 1
        rc, out, err = _cli(specs, self.isolated)
        if rc == 2 and self.isolated and "--isolated" in err and "no such option" in err.lower():
            self.isolated = False  # an engine without --isolated: drop it
            rc, out, err = _cli(specs, self.isolated)
        if rc not in (0, 1, 2):
            return _error_line(rc, err)
        try:
            models = json.loads(out)["models"]
        except (ValueError, KeyError, TypeError) as exc:
            if rc == 2:  # qlint could not run at all (an engine that stops at the first failure)
                return _error_line(rc, err)
            return f"exit {rc}: unreadable JSON report ({type(exc).__name__}: {exc})"
        if len(models) != len(specs):
            return f"exit {rc}: the report has {len(models)} models for {len(specs)} specs"
        by_spec = {m.get("spec"): m for m in models}
        if all(s in by_spec for s in specs):
            return {s: by_spec[s] for s in specs}
        return dict(zip(specs, models))  # the engine renamed the specs: the order still matches

    def analyse(self, specs: list[str]) -> dict[str, dict[str, Any]]:
        result = self.run(specs)
        if isinstance(result, dict):
            return result
        canary = self.run([CANARY])
        if isinstance(canary, str):  # qlint cannot check even the plainest block: no use bisecting
            return {s: {"error": f"qlint cannot run at all (on {CANARY}: {canary})"} for s in specs}
        return self._bisect(specs, result)

    def _bisect(self, specs: list[str], error: str) -> dict[str, dict[str, Any]]:
        if len(specs) == 1:
            return {specs[0]: {"error": error}}
        if self.runs >= MAX_CLI_RUNS:
            return {s: {"error": f"a batch holding this spec failed ({error}); not isolated within {MAX_CLI_RUNS} runs"} for s in specs}
        half = len(specs) // 2
        out: dict[str, dict[str, Any]] = {}
        for part in (specs[:half], specs[half:]):
            result = self.run(part)
            out.update(result if isinstance(result, dict) else self._bisect(part, result))
        return out


@pytest.fixture(scope="module")
def cli_report() -> dict[str, dict[str, Any]]:
    return _Runner().analyse([case.cli_spec for case in CASES])


def _describe(model: dict[str, Any]) -> str:
    blocks = ", ".join(f"{b.get('name')} q={b.get('q')} {b.get('status')}" for b in model.get("blocks", [])) or "no blocks"
    codes = ",".join(f.get("code", "?") for f in model.get("findings", [])) or "none"
    return f"qlint said verdict={model.get('verdict')} max_q={model.get('max_q')} [{blocks}] findings={codes}"


# ------------------------------------------------------------------ tests


# Unsafe cases qlint still certifies: a read no mechanism sees yet (strict: closing one makes its test fail until it
# is removed from this list)
OPEN = {
    "r16_modstate.py:flag_read_through_method": "a submodule's method reading its own training flag is its own read "
                                                "(Gemma3n's AltUp does so), and a module's own flag is flipped only "
                                                "with the whole model's (--mode)",
    "r17_memo.py:lazy_capability_flag": "a platform query asked once by the factory's warm-up call and kept as a plain "
                                        "attribute: qlint checks the model as built here, and no watched forward asks",
    "r17_dtype.py:cast_identity_dtype_branch": "the identity of a no-op cast (`x.float() is x`) tells the dtype without "
                                               "a dtype read, so no reduced-precision copy is run",
    "r18_platform.py:platform_imported_by_name": "`from sys import platform` binds the value at import: the forward "
                                                 "reads a global string of its own module, no read of the platform",
}
KNOWN = {**CONSERVATIVE, **OPEN}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN[c.spec], strict=True))
                                  if c.spec in KNOWN else c for c in CASES], ids=IDS)
def test_cli_verdict(case, cli_report):
    model = cli_report[case.cli_spec]
    if "error" in model:
        # refusing to trace a model whose graph would not be the model (float(param), .item() in
        # an `if`) is not certifying it: fine for an unsafe case, a failure for a safe one
        if case.expect == "unsafe" and "could not trace" in model["error"]:
            return
        pytest.fail(f"qlint could not check {case.cli_spec}: {model['error']}")
    detail = f"{case.spec} (family {case.family}, q_true = {case.q_true}: {case.why}); {_describe(model)}"
    if case.expect == "unsafe":
        assert model["verdict"] != "certified", f"certified an unsafe model: {detail}"
    else:
        assert model["verdict"] == "certified", f"refused a safe model: {detail}"
        assert model["max_q"] is not None and model["max_q"] <= 1, f"certified without a q <= 1 block: {detail}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_label_is_true(case):
    result = truth.check_case(case, quick=True)
    assert result.confirmed, f"{case.spec}: label {case.expect} / q_true = {case.q_true} is contradicted: {result.reason}"


def test_every_factory_has_a_label():
    """Every zero-argument public function of fixtures/adversarial/*.py is a case, and every case exists."""
    labelled = {case.spec for case in CASES}
    found = set()
    for path in sorted(truth.ADVERSARIAL.glob("*.py")):
        module = load_module(path, f"adversarial_scan_{path.stem}")
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_"):
                if not inspect.signature(obj).parameters:
                    found.add(f"{path.name}:{name}")
    assert found - labelled == set(), "factories without a CASES.toml entry"
    assert labelled - found == set(), "CASES.toml entries without a factory"
