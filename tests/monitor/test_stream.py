"""qlint.monitor: per-block stream norms and gains on a fixed batch, its warnings, and the Hugging Face
Trainer callback run for real on a tiny model (Lightning's, with the log sinks: tests/monitor/test_monitor_logs.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import qlint
from conftest import ROOT
from qlint.monitor.stream import (MonitorError, StreamMonitor, escape_scale, first_warning, overflow_depth, top_exponent,
                              warning_for)


class Scaled(nn.Module):
    """x + a x: the gain ||v(sx)|| / ||sx|| is a at every s."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))

    def forward(self, x):
        return x + self.a * x


class Cubic(nn.Module):
    """x + x^3 (elementwise): the gain at 4x is 16 times the gain at x."""

    def forward(self, x):
        return x + x * x * x


class CubicTimes(nn.Module):
    """x + a x^3 (elementwise): on rows of norm 1 made of four entries 0.5, the gain is a s^2 / 4."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = a

    def forward(self, x):
        return x + self.a * (x * x * x)


class DroppedScaled(Scaled):
    def __init__(self, a: float) -> None:
        super().__init__(a)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.a * self.drop(x)


class Stack(nn.Module):
    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.double().reshape(x.shape[0], -1).norm(dim=1)


def test_records_are_the_exact_gains_of_hand_built_blocks():
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    logged = []
    mon = qlint.monitor(Stack(Scaled(0.5), Cubic(), Scaled(2.0)), (x,), log=logged.append)
    assert mon.blocks == ["layers.0", "layers.1", "layers.2"]
    records = mon.measure(step=7)
    assert logged == records == mon.records
    assert [set(r) for r in records] == [{"step", "block", "stream_norm", "gain", "static_q", "exponent",
                                          "escape_scale"}] * 3
    assert [r["static_q"] for r in records] == [1.0, 3.0, 1.0]  # qlint's exponents: the model is supercritical
    assert [r["step"] for r in records] == [7, 7, 7] and [set(r["gain"]) for r in records] == [{"1", "4", "16", "64"}] * 3
    first, cubic, last = records
    assert first["stream_norm"] == pytest.approx(float(_rows(x).max()), rel=1e-6)
    assert first["gain"] == pytest.approx({"1": 0.5, "4": 0.5, "16": 0.5, "64": 0.5}, rel=1e-6)
    assert first["exponent"] == pytest.approx(1.0) and first["escape_scale"] is None  # linear: no runaway
    stream = 1.5 * x.double()  # x + 0.5 x
    assert cubic["stream_norm"] == pytest.approx(float(_rows(stream).max()), rel=1e-6)
    for s in (1.0, 4.0, 16.0, 64.0):
        expected = float((_rows((s * stream) ** 3) / _rows(s * stream)).max())
        assert cubic["gain"][f"{s:g}"] == pytest.approx(expected, rel=1e-5)
    assert cubic["gain"]["4"] == pytest.approx(16 * cubic["gain"]["1"], rel=1e-5)
    assert cubic["exponent"] == pytest.approx(3.0, rel=1e-5)
    # the gain is above 1 already on the data (s = 1): the smallest scale measured, nothing is extrapolated below it
    assert cubic["gain"]["1"] > 1 and cubic["escape_scale"] == 1.0
    assert last["gain"] == pytest.approx({"1": 2.0, "4": 2.0, "16": 2.0, "64": 2.0}, rel=1e-6)


def test_step_measures_every_n_calls_and_scales_are_chosen():
    x = torch.randn(2, 4)
    mon = qlint.monitor(Stack(Scaled(0.25), Scaled(0.25)), x, every=2, scales=(1, 2, 8))
    assert [mon.step() for _ in range(5)].count(None) == 3
    assert [(r["step"], r["block"]) for r in mon.records] == [(2, "layers.0"), (2, "layers.1"), (4, "layers.0"), (4, "layers.1")]
    assert mon.records[0]["gain"] == pytest.approx({"1": 0.25, "2": 0.25, "8": 0.25}, rel=1e-6)


def test_the_figures_follow_the_weights_as_training_changes_them():
    """The traced graph shares the model's parameters: an optimizer step shows in the next record."""
    model = Stack(Scaled(0.5))
    mon = qlint.monitor(model, torch.randn(3, 4))
    assert mon.measure()[0]["gain"]["1"] == pytest.approx(0.5, rel=1e-6)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.layers[0].a.grad = torch.tensor(-1.5)
    optimizer.step()
    assert mon.measure()[0]["gain"]["1"] == pytest.approx(2.0, rel=1e-6)


def test_training_flags_rng_and_gradients_are_left_alone_and_dropout_is_off():
    model = Stack(DroppedScaled(0.5), Scaled(1.0))
    model.train()
    model.layers[1].eval()  # a per-module flag, not only the root's
    mon = qlint.monitor(model)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    records = mon.measure(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)))  # the analysis runs here, too
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [m.training for m in model.modules()] == [True, True, True, True, False]
    assert all(p.grad is None for p in model.parameters())
    assert records[0]["gain"] == pytest.approx({"1": 0.5, "4": 0.5, "16": 0.5, "64": 0.5}, rel=1e-6)  # eval: no dropout


def test_a_batch_of_another_shape_is_analysed_for_its_own_graph():
    mon = qlint.monitor(Stack(Scaled(0.5), Cubic()), torch.randn(2, 3))
    records = mon.measure(torch.ones(6, 5))
    assert [r["block"] for r in records] == ["layers.0", "layers.1"]
    assert records[0]["stream_norm"] == pytest.approx(math.sqrt(5), rel=1e-6)


def test_the_overflow_warning_fires_once_at_its_threshold():
    """x + 3x from ||X_0|| = 1: 4^k passes the float16 maximum 65504 at k = 8, not at 7."""
    x = torch.full((2, 4), 0.5)  # every row has norm 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seven = qlint.monitor(Stack(*(Scaled(3.0) for _ in range(7))), x, dtype=torch.float16)
        seven.measure()
        assert caught == [] and seven.warning is None
        eight = qlint.monitor(Stack(*(Scaled(3.0) for _ in range(8))), x, dtype=torch.float16)
        eight.measure()
        eight.measure()
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    message = str(caught[0].message)
    assert message == eight.warning and "\n" not in message
    assert "block layers.0 has gain 3 at s=1, 3 at s=4" in message
    assert "float16 maximum 65504 after k* = 8 blocks, within the model's 8" in message
    fp32 = qlint.monitor(Stack(*(Scaled(3.0) for _ in range(8))), x)
    fp32.measure()
    assert fp32.warning is None  # 4^8 is far below the float32 maximum


def _record(norm, gains):
    return {"step": 0, "block": "b", "stream_norm": norm, "gain": gains}


def test_overflow_depth_is_the_layerwise_recursion_of_the_measured_power_law():
    # equal gains g = 1: (1 + 1)^k, past 65504 at k = 16 (the paper's Remark 6)
    assert overflow_depth([_record(1.0, {"1": 1.0, "4": 1.0})] * 16, torch.float16) == 16
    assert overflow_depth([_record(1.0, {"1": 1.0, "4": 1.0})] * 15, torch.float16) is None
    # gain x16 from s = 1 to 4: q = 3, c = 1 / 10^2 at r = 10; r: 20, 100, 10100, 1.0e10, 1.1e28, 1e82
    cubic = _record(10.0, {"1": 1.0, "4": 16.0})
    assert overflow_depth([cubic] * 6, torch.float32) == 6
    assert overflow_depth([cubic] * 5, torch.float32) is None
    # a gain that falls with the scale counts as linear with its larger gain (q floored at 1)
    assert overflow_depth([_record(1.0, {"1": 1.0, "4": 0.1})] * 16, torch.float16) == 16
    # a stream that is already non-finite has overflowed at that block
    assert overflow_depth([_record(1.0, {"1": 0.1}), _record(None, {"1": None})], torch.float32) == 1


def _gains(**gains):
    return _record(10.0, {key.removeprefix("s"): value for key, value in gains.items()})


def test_escape_scale_is_where_a_superlinear_gain_crosses_one():
    # crossing between s = 4 and 16 on the log-log line: 4 * (1 / 0.5)^(log 4 / log 16) = 4 * 2^(1/2)
    rising = _gains(s1=0.1, s4=0.5, s16=8.0, s64=128.0)
    assert top_exponent(rising) == pytest.approx(3.0)
    assert escape_scale(rising) == pytest.approx(4 * math.sqrt(2))
    # past the largest scale: extrapolated along the top pair's exponent, 64 * (1 / 0.8)^(1/2)
    assert escape_scale(_gains(s1=0.001, s4=0.004, s16=0.05, s64=0.8)) == pytest.approx(64 / math.sqrt(0.8))
    # already at or above 1 at the smallest scale
    assert escape_scale(_gains(s1=1.5, s4=24.0, s16=384.0, s64=6144.0)) == 1.0
    # the velocity left the dtype at s = 64 (a None gain): left out, the exponent and crossing come from the rest
    overflowed = _gains(s1=0.1, s4=0.5, s16=2.0, s64=None)
    assert top_exponent(overflowed) == pytest.approx(2.0) and escape_scale(overflowed) == pytest.approx(8.0)
    # a velocity that is not finite on a finite stream has escaped at that scale, whatever the exponent: so a
    # linear block whose 64x stream overflows a half-precision dtype escapes at 64, beyond the margin (no warning),
    # and one whose output overflows already at 4x escapes within it
    linear_fp16 = _gains(s1=2.0, s4=2.0, s16=2.0, s64=None)
    assert escape_scale(linear_fp16) == 64.0 and warning_for([linear_fp16], torch.float16) is None
    assert escape_scale(_gains(s1=6.7, s4=None, s16=None, s64=None)) == 4.0
    assert escape_scale({**_gains(s1=6.7, s4=None, s16=None, s64=None), "static_q": 1.0}) is None
    # a gain that saturates (q = 1 with a bias) or falls (a normalised branch) never runs away, however large
    assert top_exponent(_gains(s1=0.85, s4=1.1, s16=1.15, s64=1.16)) < 1.01
    assert escape_scale(_gains(s1=0.85, s4=1.1, s16=1.15, s64=1.16)) is None
    assert escape_scale(_gains(s1=9.8, s4=2.4, s16=0.6, s64=0.15)) is None
    # just below / at the runaway exponent 1.5: gain x2 from s = 16 to 64 is exponent exactly 1.5
    assert escape_scale(_gains(s1=1.0, s4=1.0, s16=1.0, s64=1.9)) is None
    assert escape_scale(_gains(s1=1.0, s4=1.0, s16=1.0, s64=2.0)) == 1.0
    # a block qlint proved q <= 1 cannot run away, whatever two finite scales suggest (a hard threshold
    # between 16x and 64x the data makes a linear block's gain jump there); unproven (None) or q > 1: measured
    assert escape_scale({**rising, "static_q": 1.0}) is None and escape_scale({**rising, "static_q": 0.0}) is None
    assert escape_scale({**rising, "static_q": None}) == escape_scale({**rising, "static_q": 5.0}) == escape_scale(rising)
    # an overflowed stream has no margin: it is reported as an overflow, not a scale
    assert escape_scale(_record(None, {"1": None, "4": None, "16": None, "64": None})) is None
    assert warning_for([_record(None, {"1": None})], torch.float32) == "the stream entering block b is already non-finite"


def test_the_runaway_warning_fires_within_its_margin_and_not_on_large_linear_gains():
    x = torch.full((2, 4), 0.5)  # rows of norm 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        near = qlint.monitor(Stack(CubicTimes(1.0)), x)  # gain s^2 / 4: 1 at s = 2
        near.measure(step=5)
        near.measure(step=6)
        far = qlint.monitor(Stack(CubicTimes(1 / 16)), x)  # gain s^2 / 64: 1 at s = 8, beyond the margin 4
        far.measure()
        linear = qlint.monitor(Stack(Scaled(3.0)), x)  # gain 3 at every scale: large, but q = 1
        linear.measure()
    assert [r["escape_scale"] for r in near.records] == pytest.approx([2.0, 2.0], rel=1e-5)
    assert far.records[0]["escape_scale"] == pytest.approx(8.0, rel=1e-5)
    assert linear.records[0]["escape_scale"] is None and linear.records[0]["exponent"] == pytest.approx(1.0)
    assert len(caught) == 1 and (near.warning, near.warning_step) == (str(caught[0].message), 5)
    assert near.warning.startswith("qlint.monitor: at step 5 block layers.0 grows superlinearly (gain 0.25 at s=1, ")
    assert "exponent 3 between the largest scales" in near.warning and "at 2x the fixed batch's stream norm 1" in near.warning
    assert far.warning is None and linear.warning is None
    wider = qlint.monitor(Stack(CubicTimes(1 / 16)), x, margin=8.0)  # the margin is the user's to set
    with pytest.warns(RuntimeWarning, match="at 8x the fixed batch's stream norm 1, within the margin 8x"):
        wider.measure()
    with pytest.raises(ValueError, match="margin"):
        qlint.monitor(Stack(Scaled(0.5)), x, margin=0.5)


class Fading(nn.Module):
    """x + x exp(-x^2): a velocity that vanishes below sX's precision at large s (a zero top gain)."""

    def forward(self, x):
        return x + x * torch.exp(-x * x)


def test_a_vanishing_velocity_a_near_empty_window_and_bad_arguments():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither a crash nor a warning
        fading = qlint.monitor(Stack(Fading(), Fading()), x)
        records = fading.measure()
    assert [r["gain"]["64"] for r in records] == [0.0, 0.0] and fading.warning is None
    # the largest gain per scale can come from different windows: a near-empty window's bias-dominated gain
    # must not hide the runaway of another (each window's curve is read on its own)
    cubic = torch.full((1, 4), 0.5)
    padded = torch.cat([cubic, torch.full((1, 4), 1e-6)])
    escapes = []
    for batch in (cubic, padded):  # v(s x) = s^3 x^3 + 0.1: gain 2 (0.125 s^3 + 0.1) / s on the 0.5-row, 1 at s = 1.655
        mon = qlint.monitor(Stack(Biased(CubicTimes(1.0))), batch)
        escapes.append(mon.measure()[0]["escape_scale"])
        assert mon.warning is not None
    assert escapes == pytest.approx([1.655, 1.655], rel=1e-3)
    with pytest.raises(ValueError, match="two distinct"):
        StreamMonitor(Stack(Scaled(0.5)), scales=(1.0,))
    with pytest.raises(ValueError, match="floating-point"):
        StreamMonitor(Stack(Scaled(0.5)), dtype=torch.int64)


class Biased(nn.Module):
    """The wrapped block plus a constant 0.1 (the bias that dominates a near-empty window's gain)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x) + 0.1


def test_first_warning_is_the_first_measurement_that_warns():
    tame = [_gains(s1=0.1, s4=0.2, s16=0.5, s64=5.0)]  # superlinear, crossing at 16 * ... > 4
    close = [_gains(s1=0.1, s4=1.2, s16=20.0, s64=400.0)]
    telemetry = [{**r, "step": step} for step, records in ((0, tame), (25, tame), (50, close), (75, tame))
                 for r in records]
    assert first_warning(telemetry, torch.float32) == 50
    assert first_warning(telemetry, torch.float32, margin=64.0) == 0
    assert first_warning(telemetry[:2], torch.float32) is None


def test_no_blocks_no_batch_or_no_trace_is_an_error_not_silence():
    with pytest.raises(MonitorError, match="no residual blocks in Linear"):
        qlint.monitor(nn.Linear(4, 4), torch.randn(2, 4))
    with pytest.raises(MonitorError, match="no batch to measure"):
        qlint.monitor(Stack(Scaled(0.5))).measure()

    class Called(Stack):
        def __call__(self, x):
            return super().__call__(x)

    with pytest.raises(MonitorError, match="cannot trace Called"):
        qlint.monitor(Called(Scaled(0.5)), torch.randn(2, 4))
    with pytest.raises(ValueError, match="scales"):
        StreamMonitor(Stack(Scaled(0.5)), scales=(0.0,))


def test_importing_qlint_and_the_callbacks_imports_neither_library():
    code = ("import sys, qlint, qlint.monitor.callbacks; qlint.monitor; "
            "print(any(m.split('.')[0] in ('transformers', 'lightning', 'pytorch_lightning') for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# --- the framework callbacks, for real ------------------------------------------------------


def test_hugging_face_trainer_logs_the_figures_of_every_block(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it on torch
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from qlint.monitor.callbacks import QlintTrainerCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(32, (8, 12))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, report_to=[], use_cpu=True,
                             eval_strategy="steps", eval_steps=2, logging_steps=10, save_strategy="no", disable_tqdm=True)
    callback = QlintTrainerCallback(every_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4])
    callback.attach(trainer)
    trainer.train()
    records = callback.monitor.records
    blocks = ["transformer.h.0:attn", "transformer.h.0:mlp"]
    # every step (1, 2, 3) and every evaluation (step 2, and the last step)
    assert [(r["step"], r["block"]) for r in records] == [(s, b) for s in (1, 2, 2, 3, 3) for b in blocks]
    assert all(r["stream_norm"] > 0 and r["gain"]["1"] > 0 and r["gain"]["4"] > 0 for r in records)
    logged = [entry for entry in trainer.state.log_history if "qlint/transformer.h.0:mlp/gain@4" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 2, 3, 3]
    assert logged[-1]["qlint/transformer.h.0:attn/stream_norm"] == pytest.approx(records[-2]["stream_norm"])


def test_the_verify_harness_stores_telemetry_at_every_validation():
    pytest.importorskip("numpy")
    import json

    from qlint.verify.train import RunConfig, train_run

    cfg = RunConfig("mamba", "free", "synthetic", "synthetic:600:3:0", horizon=8, depth=2, seed=0, steps=4, batch_size=4,
                    d_model=8, seq_len=16, eval_every=2, max_eval_windows=8)
    row = train_run(cfg)
    # at initialisation, the periodic evaluation at step 2, and the final validation at step 4
    # (the test split is not measured)
    assert [(r["step"], r["block"]) for r in row["telemetry"]] == [(s, b) for s in (0, 2, 4) for b in ("layers.0", "layers.1")]
    assert all(r["stream_norm"] > 0 and set(r["gain"]) == {"1", "4", "16", "64"} for r in row["telemetry"])
    json.dumps(row, allow_nan=False)
