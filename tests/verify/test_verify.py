"""Tests for ``qlint verify``: data protocol, blow-up rule, resume, shards, tables, figures, CLI."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from qlint.verify import data as D
from qlint.verify import grid as G
from qlint.verify import tables as T
from qlint.verify.figures import BF16_MAX, FP16_MAX, FP32_MAX, overflow_depth
from qlint.verify.train import BLOWUP_FACTOR, RunConfig, classify_blowup, run_key

REPO = Path(__file__).resolve().parents[2]
ETTH1 = REPO.parent / "shared" / "data" / "ETT-small" / "ETTh1.csv"


# ------------------------------------------------------------------ data


@pytest.mark.skipif(not ETTH1.exists(), reason="../shared/data is absent")
def test_etth1_split_protocol():
    d = D.load_dataset(str(ETTH1), 96)
    assert d.kind == "ETTh" and d.name == "ETTh1" and d.n_vars == 7
    assert d.columns == ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    # train 8640, val 2880, test 2880 rows; val/test windows start seq_len rows early
    assert d.borders == [(0, 8640), (8640 - 96, 11520), (11520 - 96, 14400)]
    assert (len(d.train), len(d.val), len(d.test)) == (8640, 2880 + 96, 2880 + 96)
    assert d.n_windows("test", 96) == 2785  # the standard ETTh1 test-set size at H=96
    assert d.n_windows("test", 720) == 2161
    # the first target row of the test split is row 11520 of the file
    _, raw = D.read_csv(ETTH1)
    first_target = d.test[96] * d.std + d.mean
    np.testing.assert_allclose(first_target, raw[11520], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d.train.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(d.train.std(0), 1, atol=1e-4)


def test_split_borders_all_kinds():
    assert D.split_borders("ETTm", 69680, 96) == [(0, 34560), (34560 - 96, 46080), (46080 - 96, 57600)]
    n = 52696  # Weather
    b = D.split_borders("custom", n, 96)
    n_train, n_test = int(n * 0.7), int(n * 0.2)
    assert b == [(0, n_train), (n_train - 96, n - n_test), (n - n_test - 96, n)]
    with pytest.raises(ValueError):
        D.split_borders("ETTh", 1000, 96)
    assert D.infer_kind("x/ETTh2.csv") == "ETTh"
    assert D.infer_kind("ETTm1.csv") == "ETTm"
    assert D.infer_kind("weather.csv") == "custom"


def test_synthetic_csv_roundtrip_and_zscore_train_only(tmp_path):
    raw = D.synthetic_series(1000, 3, seed=1)
    assert raw.shape == (1000, 3) and raw.dtype == np.float32
    np.testing.assert_array_equal(raw, D.synthetic_series(1000, 3, seed=1))
    assert not np.allclose(raw, D.synthetic_series(1000, 3, seed=2))
    # make val/test wildly different: the z-score must not see them
    raw[700:] += 100.0
    path = tmp_path / "mydata.csv"
    D.write_csv(path, raw, ["a", "b", "c"])
    d = D.load_dataset(str(path), 24)
    assert d.kind == "custom" and d.columns == ["a", "b", "c"]
    assert d.borders == [(0, 700), (700 - 24, 800), (800 - 24, 1000)]
    assert (len(d.train), len(d.val), len(d.test)) == (700, 124, 224)
    train = raw[:700].astype(np.float64)
    np.testing.assert_allclose(d.mean, train.mean(0), rtol=1e-5)
    np.testing.assert_allclose(d.std, train.std(0), rtol=1e-5)
    np.testing.assert_allclose(d.train.mean(0), 0, atol=1e-4)
    assert d.test[24:].mean() > 10  # shifted data stays shifted: stats came from train only


def test_batch_windows():
    import torch

    series = torch.arange(20.0).reshape(10, 2)
    x, y = D.batch_windows(series, [0, 3], 4, 2)
    assert x.shape == (2, 4, 2) and y.shape == (2, 2, 2)
    assert x[1, 0, 0] == 6.0 and y[1, 0, 0] == 14.0


def test_default_data_path(monkeypatch, tmp_path):
    f = tmp_path / "ETTh1.csv"
    f.write_text("date,a\n")
    monkeypatch.setenv("QLINT_DATA", str(f))
    assert D.default_data_path() == str(f)
    monkeypatch.setenv("QLINT_DATA", str(tmp_path / "missing.csv"))
    assert D.default_data_path() is None
    monkeypatch.delenv("QLINT_DATA")
    assert D.default_data_path() == (str(ETTH1.resolve()) if ETTH1.exists() else None)


# ------------------------------------------------------------------ blow-ups


def test_blowup_classification():
    assert BLOWUP_FACTOR == 1e3
    assert classify_blowup([0.9, 0.5], 0.4) == (False, False, "")
    # non-finite mid-training, finite at the end: only the any-evaluation rule counts it
    assert classify_blowup([0.9, float("nan")], 0.4) == (
        False, True, "non-finite validation MSE at 1 of 2 periodic evaluations, finite at the end")
    assert classify_blowup([float("inf"), None], 0.4)[:2] == (False, True)
    assert classify_blowup([0.9], float("nan")) == (True, True, "non-finite final validation MSE")
    assert classify_blowup([], None)[:2] == (True, True)
    assert classify_blowup([], 999.0) == (False, False, "")
    final, anyev, why = classify_blowup([], 1001.0)
    assert final and anyev and "1e+03" in why
    assert classify_blowup([0.5], 0.5, stopped="non-finite parameters after step 3") == (
        True, True, "non-finite parameters after step 3")


def test_fast_scan_matches_zoo_scan():
    torch = pytest.importorskip("torch")
    from qlint.verify.train import scan_unbind, use_fast_scan
    from qlint.zoo import mamba

    g = torch.Generator().manual_seed(0)
    args = [torch.rand(2, 12, 6, 4, generator=g, requires_grad=True),
            torch.randn(2, 12, 6, 4, generator=g, requires_grad=True),
            torch.randn(2, 12, 4, generator=g, requires_grad=True)]
    ref = mamba.MambaMixer.scan(*args)
    (ref.square().sum()).backward()
    grads = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    out = scan_unbind(*args)
    (out.square().sum()).backward()
    assert torch.equal(ref, out)
    for a, gref in zip(args, grads):
        assert torch.equal(a.grad, gref)
    model = mamba.build("free", n_vars=3, seq_len=8, horizon=4, d_model=8, depth=2)
    x = torch.randn(2, 8, 3)
    before = model(x)
    assert use_fast_scan(model) == 2
    assert torch.equal(model(x), before)


# ------------------------------------------------------------------ grid, resume, shards


def _tiny_grid():
    sc = G.SCALES["smoke"]
    return G.build_grid(sc, ["synthetic:600:3:0"], device="cpu")


def test_grid_shape_and_shards():
    configs = _tiny_grid()
    sc = G.SCALES["smoke"]
    n_variants = sum(len(v) for v in G.BACKBONES.values())
    assert len(configs) == n_variants * len(sc.depths) * len(sc.horizons) * len(sc.seeds)
    keys = [c.key for c in configs]
    assert len(set(keys)) == len(keys)
    for n in (1, 2, 3, 5, 7):
        parts = [G.shard(configs, k, n) for k in range(1, n + 1)]
        flat = [c.key for p in parts for c in p]
        assert sorted(flat) == sorted(keys)  # every run exactly once
        assert len(flat) == len(set(flat))
        for k, p in enumerate(parts, 1):
            assert [c.key for c in p] == [c.key for i, c in enumerate(configs) if i % n == k - 1]
    assert G.parse_shard("2/3") == (2, 3) and G.parse_shard(None) == (1, 1)
    for bad in ("0/3", "4/3", "x", "1/0"):
        with pytest.raises(ValueError):
            G.parse_shard(bad)


def test_paper_scale_seeds():
    sc = G.SCALES["paper"]
    configs = G.build_grid(sc, ["/d/ETTm1.csv", "/d/weather.csv"])
    per = {}
    for c in configs:
        per.setdefault((c.dataset, c.backbone, c.variant), set()).add((c.horizon, c.depth, c.seed))
    assert len(per[("ETTm1", "mamba", "free")]) == 4 * 2 * 6  # 24 runs per depth, as in the paper
    assert len(per[("weather", "mamba", "free")]) == 4 * 2 * 3  # 12 runs per depth


def _fake_run(log):
    def run(cfg: RunConfig) -> dict:
        log.append(cfg.key)
        return {
            "backbone": cfg.backbone, "variant": cfg.variant, "dataset": cfg.dataset,
            "horizon": cfg.horizon, "depth": cfg.depth, "seed": cfg.seed,
            "val_mse": 0.5, "test_mse": 0.6, "blew_up_final": False, "blew_up_any": False, "blew_up": False,
            "blowup_reason": "",
            "steps": cfg.steps, "seconds": 0.0, "device": "cpu", "d_model": cfg.d_model, "lr": cfg.lr,
        }
    return run


@pytest.fixture
def no_lint(monkeypatch):
    monkeypatch.setattr(G, "lint_config", lambda cfg, n_vars: {"q": 1.0, "verdict": "certified", "block_q": []})


def test_resume_runs_exactly_the_missing_keys(tmp_path, no_lint):
    configs = _tiny_grid()
    first: list = []
    G.run_grid(configs[:7], tmp_path, progress=False, log=lambda m: None, run_fn=_fake_run(first))
    assert first == [c.key for c in configs[:7]]
    # simulate a kill mid-write: a truncated 8th line
    with open(tmp_path / "runs.jsonl", "a") as fh:
        fh.write('{"backbone": "mamba", "variant": "fr')
    assert len(G.read_runs(tmp_path / "runs.jsonl")) == 7
    second: list = []
    G.run_grid(configs, tmp_path, progress=False, log=lambda m: None, run_fn=_fake_run(second))
    assert second == [c.key for c in configs[7:]]
    recs = G.read_runs(tmp_path / "runs.jsonl")
    assert sorted(run_key(r) for r in recs) == sorted(c.key for c in configs)
    assert all(r["q"] == 1.0 for r in recs)
    for line in (tmp_path / "runs.jsonl").read_text().splitlines():
        json.loads(line)  # the truncated line is gone, every line parses
    third: list = []
    assert G.run_grid(configs, tmp_path, progress=False, log=lambda m: None, run_fn=_fake_run(third)) == []
    assert third == []


def _must_not_run(cfg):
    raise AssertionError(f"{cfg.key} was run")


def test_resume_refuses_runs_of_another_protocol(tmp_path):
    """Finished runs count as done only under the same settings: else two protocols share a table."""
    import inspect
    import shutil

    from qlint.zoo.mamba import MambaMixer

    assert G.MAMBA_D_STATE == inspect.signature(MambaMixer).parameters["d_state"].default
    shutil.copy(REPO / "results" / "etth1-small-v1" / "runs.jsonl", tmp_path / "runs.jsonl")
    quiet = {"progress": False, "log": lambda m: None, "run_fn": _must_not_run}
    # the old grid (no d_state / revin / loss / amp in its records) is exactly small-v1: all 72 done
    assert G.run_grid(G.build_grid(G.SCALES["small-v1"], ["/x/ETTh1.csv"]), tmp_path, **quiet) == []
    with pytest.raises(G.ProtocolMismatch, match=r"mamba/free/ETTh1/96/3/0 with lr = 0.001, but this grid asks for 0.01"):
        G.run_grid(G.build_grid(G.SCALES["small"], ["/x/ETTh1.csv"]), tmp_path, **quiet)
    for knob, value in (("amp", "fp16"), ("d_state", 16), ("revin", True), ("loss", "l1"), ("steps", 300)):
        configs = G.build_grid(G.SCALES["small-v1"], ["/x/ETTh1.csv"], **{knob: value})
        with pytest.raises(G.ProtocolMismatch, match=f"with {knob} = "):
            G.run_grid(configs, tmp_path, **quiet)


def test_cli_refuses_to_resume_under_another_protocol(tmp_path, no_lint):
    from click.testing import CliRunner

    from qlint.cli import main

    G.run_grid(_tiny_grid()[:2], tmp_path, progress=False, log=lambda m: None, run_fn=_fake_run([]))
    before = (tmp_path / "runs.jsonl").read_text()
    result = CliRunner().invoke(main, ["verify", "grid", "--scale", "smoke", "--out", str(tmp_path), "--lr", "0.5",
                                       "--no-figures"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"qlint: error: {tmp_path / 'runs.jsonl'} already holds run mamba/free/synthetic/24/3/0 with lr = 0.001, "
        "but this grid asks for 0.5: pass --out to a new folder, or the flags that match")
    assert (tmp_path / "runs.jsonl").read_text() == before


def test_lint_cached_once_per_config(tmp_path, monkeypatch):
    calls = []

    def fake(cfg, n_vars):
        calls.append((cfg.backbone, cfg.variant, cfg.depth))
        return {"q": 5.0 if cfg.variant == "free" and cfg.backbone == "mamba" else 0.0, "verdict": "x", "block_q": []}

    monkeypatch.setattr(G, "lint_config", fake)
    configs = G.build_grid(G.SCALES["smoke"], ["synthetic:600:3:0"]) * 2
    G.lint_all(configs, tmp_path / "lint.json", lambda p: 3, log=lambda m: None)
    assert len(calls) == len(set(calls)) == 18
    G.lint_all(configs, tmp_path / "lint.json", lambda p: 3, log=lambda m: None)
    assert len(calls) == 18  # read from lint.json


def test_real_train_run_tiny():
    from qlint.verify.train import train_run

    cfg = RunConfig("patchtst", "free", "synthetic", "synthetic:600:3:0", horizon=8, depth=1, seed=0,
                    steps=3, batch_size=4, d_model=8, seq_len=16, eval_every=2, max_eval_windows=8,
                    model_kwargs=(("n_heads", 2), ("d_ff", 8)))
    rec = train_run(cfg)
    assert rec["steps"] == 3 and not rec["blew_up_final"] and not rec["blew_up_any"]
    assert math.isfinite(rec["val_mse"]) and rec["blowup_reason"] == ""
    assert len(rec["val_history"]) == 1
    assert (rec["amp"], rec["loss"], rec["revin"], rec["d_state"], rec["lr"]) == ("fp32", "mse", False, None, 1e-3)
    cfg2 = RunConfig("mamba", "free", "synthetic", "synthetic:600:3:0", horizon=8, depth=1, seed=0,
                     steps=3, batch_size=4, d_model=8, seq_len=16, eval_every=0, max_eval_windows=8,
                     lr=1e12)
    rec2 = train_run(cfg2)  # an absurd learning rate diverges: caught and classified, no crash
    # fp32, no scaler: the overflowing step writes NaN into the weights, which stops the run
    assert rec2["blew_up_final"] and rec2["blew_up_any"] and rec2["blew_up"]
    assert rec2["blowup_reason"].startswith("non-finite parameters after step ")
    assert rec2["steps"] < 3 and rec2["nonfinite_train_losses"] == 1
    assert rec2["val_mse"] is None and rec2["test_mse"] is None
    json.dumps(rec2, allow_nan=False)


# ------------------------------------------------------------------ tables


def _rec(backbone, variant, q, dataset, horizon, depth, seed, blew, mse=0.5, any_eval=None):
    """A runs.jsonl record; ``blew`` = the paper's rule, ``any_eval`` (default: ``blew``) the stricter one."""
    any_eval = blew if any_eval is None else any_eval
    return {"backbone": backbone, "variant": variant, "q": q, "dataset": dataset, "horizon": horizon,
            "depth": depth, "seed": seed, "val_mse": None if blew else mse, "test_mse": None if blew else mse,
            "blew_up_final": blew, "blew_up_any": any_eval, "blew_up": any_eval,
            "steps": 10, "seconds": 1.0, "device": "cpu", "d_model": 16}


def _synthetic_runs():
    runs = []
    for ds in ("ETTm1", "weather"):
        for h in (96, 192):
            for depth in (3, 8):
                for seed in range(3):
                    # seed 1 at L=3 overflows mid-training and recovers: counted by the any rule only
                    runs.append(_rec("mamba", "free", 5.0, ds, h, depth, seed, blew=(depth == 8 or seed == 0), mse=0.6,
                                     any_eval=depth == 8 or seed in (0, 1)))
                    runs.append(_rec("mamba", "rmsnorm", 0.0, ds, h, depth, seed, False, 0.5))
                    runs.append(_rec("patchtst", "free", 1.0, ds, h, depth, seed, False, 0.4))
    return runs


def test_table2_layout(tmp_path):
    runs = _synthetic_runs()
    header, rows = T.table2(runs)
    assert header == ["Backbone", "Variant", "q", "L", "ETTm1 H96", "ETTm1 H192", "weather H96", "weather H192", "Σ",
                      "warned ahead · finite"]
    assert [r[:4] for r in rows] == [
        ["Mamba", "free velocity", "5", "3"],
        ["Mamba", "free velocity", "5", "8"],
        ["Mamba", "RMSNorm", "0", "3"],
        ["Mamba", "RMSNorm", "0", "8"],
        ["PatchTST", "free velocity", "1", "3"],
        ["PatchTST", "free velocity", "1", "8"],
    ]
    # records without blowup_step or telemetry: blown up by any rule they state, never warned
    assert rows[0][4:] == ["1/3 (2/3)", "1/3 (2/3)", "1/3 (2/3)", "1/3 (2/3)", "4/12 (8/12)", "0/8 · 0/4"]
    assert rows[1][4:] == ["3/3 (3/3)"] * 4 + ["12/12 (12/12)", "0/12 · 0/0"]
    assert rows[2][4:] == ["0/3 (0/3)"] * 4 + ["0/12 (0/12)", "0/0 · 0/12"]
    lines = T.summary_lines(runs)
    assert lines[0] == ("Mamba free velocity: q=5, blew up 16/24 (67%; L=3: 4/12, L=8: 12/12); "
                        "by the stricter rule 20/24 (L=3: 8/12, L=8: 12/12)")
    checks = T.pattern_check(runs)
    assert checks[0] == ("q <= 1 variants: 0/48 runs blew up by the paper's rule (paper: 0 — holds); "
                         "0/48 by the stricter rule")
    assert checks[1] == ("q > 1 variants: 16/24 runs blew up by the paper's rule (L=3: 4/12, L=8: 12/12); "
                         "20/24 by the stricter rule (L=3: 8/12, L=8: 12/12)")
    assert "rises with depth (L=3 -> L=8): yes" in checks[-1]
    # files
    with open(tmp_path / "runs.jsonl", "w") as fh:
        for r in runs:
            fh.write(json.dumps(r) + "\n")
    md = T.write_tables(tmp_path)
    assert "| Mamba | free velocity | 5 | 3 | 1/3 (2/3) | 1/3 (2/3) | 1/3 (2/3) | 1/3 (2/3) | 4/12 (8/12) |" in md
    assert "k blew up by the paper's rule" in md
    csv_text = (tmp_path / "table2.csv").read_text().splitlines()
    assert csv_text[0] == "Backbone,Variant,q,L,ETTm1 H96,ETTm1 H192,weather H96,weather H192,Σ,warned ahead · finite"
    assert csv_text[2] == "Mamba,free velocity,5,8,3/3 (3/3),3/3 (3/3),3/3 (3/3),3/3 (3/3),12/12 (12/12),0/12 · 0/0"
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[0] == lines[0] and summary[len(lines)] == checks[0]
    dev = T.deviations(runs)
    cell = dev[("mamba", "ETTm1", 96, 3)]
    # the seed that recovered by the end keeps its test MSE: only the paper's blow-up is left out
    assert cell["free"]["blown"] == 1 and cell["free"]["mean"] == pytest.approx(0.6) and cell["rmsnorm"]["dev_pct"] == pytest.approx(-100 * 0.1 / 1.1)
    assert dev[("mamba", "ETTm1", 96, 8)]["free"]["dev_pct"] is None  # all seeds blew up


def test_warned_ahead_counts_recorded_and_recomputed_warnings():
    base = _rec("mamba", "free", 5.0, "ETTh1", 96, 3, 0, blew=True)
    recorded = [
        {**base, "seed": 0, "blowup_step": 300, "monitor_first_warning_step": 100},  # warned ahead
        {**base, "seed": 1, "blowup_step": 100, "monitor_first_warning_step": 100},  # at the blow-up: not ahead
        {**base, "seed": 2, "blowup_step": 250, "monitor_first_warning_step": None},  # missed
        {**base, "seed": 3, "blowup_step": None, "monitor_first_warning_step": 50, "blew_up_final": False,
         "blew_up_any": False, "blew_up": False},  # finite
    ]
    assert T._warned(recorded) == "1/3 · 1/1"
    # a final val MSE past 1e3 with a training loss below it: blown up (at the end), as in Table 2's counts
    val_only = {**base, "seed": 5, "blowup_step": None, "monitor_first_warning_step": 5, "steps": 10,
                "val_history": [float("nan")], "eval_every": 100}
    assert (T.blowup_step(val_only), T._warned([val_only])) == (10, "1/1 · 0/0")
    # a record from before both were recorded: the stop on non-finite parameters and the telemetry decide
    runaway = {"block": "layers.0", "stream_norm": 40.0, "gain": {"1": 0.3, "4": 1.5}}  # exponent 2.2, s* < 4
    tame = {"block": "layers.0", "stream_norm": 40.0, "gain": {"1": 0.05, "4": 0.3}}
    old = {**base, "seed": 4, "steps": 394, "blowup_reason": "non-finite parameters after step 394 (training loss inf)",
           "val_history": [0.7, 0.7, 0.7], "eval_every": 100,
           "telemetry": [{**tame, "step": 0}, {**runaway, "step": 100}, {**runaway, "step": 200}]}
    assert (T.blowup_step(old), T.warning_step(old)) == (394, 100)
    assert T.blowup_step({**old, "val_history": [0.7, 5e3, None]}) == 200  # the first evaluation past 1e3
    # a model qlint certified at q <= 1 has every block proven linear: the live monitor's fact, applied here too
    certified = {**old, "q": 1.0, "verdict": "certified"}
    assert (T.warning_step(certified), T.warning_step(certified, static=False)) == (None, 100)
    header, rows = T.warning_rows(recorded + [old])
    assert header[-3:] == ["blow-up step", "first warning", "lead"]
    assert [row[6:] for row in rows] == [["0", "300", "100", "200"], ["1", "100", "100", "0"], ["2", "250", "–", "–"],
                                         ["3", "–", "50", "–"], ["4", "394", "100", "294"]]


def test_tables_render_old_runs_without_both_counts(tmp_path):
    """results/etth1-small-v1 predates blew_up_final / blew_up_any: its table still renders."""
    import shutil

    src = REPO / "results" / "etth1-small-v1" / "runs.jsonl"
    old = G.read_runs(src)
    assert len(old) == 72 and not any("blew_up_final" in r or "blew_up_any" in r for r in old)
    shutil.copy(src, tmp_path / "runs.jsonl")
    md = T.write_tables(tmp_path)
    assert "| Mamba | free velocity | 5 | 8 | 0/2 (0/2) | 0/2 (0/2) | 0/4 (0/4) |" in md
    assert "| PatchTST | Peri-LN | 0 | 3 | 0/2 (0/2) | 0/2 (0/2) | 0/4 (0/4) |" in md
    assert (tmp_path / "summary.txt").read_text().splitlines()[-2:] == [
        "q > 1 variants: 0/8 runs blew up by the paper's rule (L=3: 0/4, L=8: 0/4); "
        "0/8 by the stricter rule (L=3: 0/4, L=8: 0/4)",
        "no supercritical run blew up at this scale: the paper's q > 1 divergence is NOT reproduced here",
    ]
    # the old harness's reasons: a stop on a non-finite training loss or a bad final val MSE decides
    # the paper's rule; a stop at a mid-training evaluation leaves the end unknown ("n/a")
    base = {k: old[0][k] for k in ("backbone", "variant", "q", "dataset", "horizon", "depth", "d_model")}
    olds = [
        {**base, "seed": 10, "blew_up": True, "blowup_reason": "non-finite training loss at step 7"},
        {**base, "seed": 11, "blew_up": True, "blowup_reason": "final val MSE 2.1e+04 > 1e+03 x Var(target)"},
        {**base, "seed": 12, "blew_up": True, "blowup_reason": "non-finite validation loss"},
    ]
    assert [T.blew_up_final(r) for r in olds] == [True, True, True]
    header, rows = T.table2(olds)
    assert rows[0][4:6] == ["3/3 (3/3)", "3/3 (3/3)"]
    unknown = {**base, "seed": 13, "blew_up": True, "blowup_reason": "non-finite validation loss at step 100"}
    assert T.blew_up_final(unknown) is None and T.blew_up_any(unknown) is True
    header, rows = T.table2(olds + [unknown])
    assert rows[0][4:6] == ["n/a (4/4)", "n/a (4/4)"]
    assert T.summary_lines(olds + [unknown])[0].startswith("Mamba free velocity: q=5, blew up n/a/4 (L=3: n/a/4); ")
    assert T.pattern_check(olds + [unknown]) == [
        "q <= 1 variants: 0/0 runs blew up by the paper's rule (paper: 0 — no runs to test it); "
        "0/0 by the stricter rule",
        "q > 1 variants: n/a/4 runs blew up by the paper's rule (L=3: n/a/4); 4/4 by the stricter rule "
        "(L=3: 4/4)",
    ]


def test_figures_write(tmp_path):
    pytest.importorskip("matplotlib")
    from qlint.verify.figures import figure1, write_figures

    with open(tmp_path / "runs.jsonl", "w") as fh:
        for r in _synthetic_runs():
            fh.write(json.dumps(r) + "\n")
    assert write_figures(tmp_path) == []  # 2 Mamba variants, 1 PatchTST: too few for a per-cell median
    depths = figure1(tmp_path / "f1.png", cs=(1.0,))
    assert (tmp_path / "f1.png").stat().st_size > 1000
    assert depths[(1.0, 1.0, "fp16")] == 16 and depths[(1.0, 5.0, "fp16")] == 3


# ------------------------------------------------------------------ figure 1


def test_overflow_depth():
    assert overflow_depth(1, 1, 1, FP16_MAX) == 16  # 2**16 = 65536 > 65504 >= 2**15
    assert overflow_depth(1, 1, 1, FP32_MAX) == 128  # 2**128 > 3.4028e38 > 2**127
    assert overflow_depth(1, 1, 1, BF16_MAX) == 128
    assert overflow_depth(1, 1, 1, 65536.0) == 17  # strictly greater: 2**16 does not exceed 2**16
    # q = 2: 1, 2, 6, 42, 1806, 3263442 -> first > 65504 at D = 5
    assert overflow_depth(2, 1, 1, FP16_MAX) == 5
    # q = 5: 1, 2, 34, 45435458 -> D = 3
    assert overflow_depth(5, 1, 1, FP16_MAX) == 3
    assert overflow_depth(0.5, 1, 1, FP32_MAX, max_depth=1000) is None
    d = overflow_depth(0.5, 1, 1, FP16_MAX)
    assert d is not None and 400 < d < 600  # r_k ~ k^2 / 4
    assert overflow_depth(1, 1, 1e5, FP16_MAX) == 0
    assert FP32_MAX == float(np.finfo(np.float32).max) and FP16_MAX == float(np.finfo(np.float16).max)
    assert BF16_MAX == pytest.approx(3.3895e38, rel=1e-4)


def _first_layer_above(q: float, c: float, limit: float, max_depth: int = 10_000):
    """r_{k+1} = r_k + c r_k^q from r_0 = 1 in plain floats, independently of figures.py."""
    r = 1.0
    for k in range(1, max_depth + 1):
        r = r + c * r**q
        if r > limit:
            return k
    return None


def test_figure1_overflow_layers(tmp_path):
    pytest.importorskip("matplotlib")
    from qlint.verify.figures import figure1

    depths = figure1(tmp_path / "f1.png")  # the defaults: q in {0, 1, 2, 5}, c in {0.01, 0.1, 1}, k <= 60
    png = (tmp_path / "f1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert set(depths) == {(c, q, f) for c in (0.01, 0.1, 1.0) for q in (0.0, 1.0, 2.0, 5.0)
                           for f in ("fp16", "bf16", "fp32")}
    expected = {  # (c, q): (fp16, bf16, fp32) first layer past the maximum
        (0.01, 2.0): (108, 111, 111), (0.01, 5.0): (30, 32, 32),
        (0.1, 2.0): (16, 19, 19), (0.1, 5.0): (7, 8, 8),
        (1.0, 2.0): (5, 8, 8), (1.0, 5.0): (3, 5, 5),
        (0.01, 1.0): (1115, 8917, 8917), (0.1, 1.0): (117, 931, 931), (1.0, 1.0): (16, 128, 128),
        (0.01, 0.0): (None, None, None), (0.1, 0.0): (None, None, None), (1.0, 0.0): (None, None, None),
    }
    for (c, q), layers in expected.items():
        for fmt, limit, layer in zip(("fp16", "bf16", "fp32"), (FP16_MAX, BF16_MAX, FP32_MAX), layers):
            assert depths[(c, q, fmt)] == layer == _first_layer_above(q, c, limit), (c, q, fmt)
    # q <= 1 never leaves float32 within the plotted 60 layers, and q = 0 is linear: 1 + c k
    assert all(depths[(c, q, "fp32")] is None or depths[(c, q, "fp32")] > 60
               for c in (0.01, 0.1, 1.0) for q in (0.0, 1.0))
    assert overflow_depth(0, 1.0, 1, FP16_MAX, max_depth=70_000) == 65504  # 1 + k > 65504 first at k = 65504


# ------------------------------------------------------------------ CLI


def test_cli_smoke_grid(tmp_path):
    """The whole smoke grid through the CLI (real lint + training): measured ~40-60 s on 2 cores."""
    from click.testing import CliRunner

    from qlint.cli import main

    out = tmp_path / "smoke"
    t0 = time.perf_counter()
    result = CliRunner().invoke(main, ["verify", "grid", "--scale", "smoke", "--out", str(out)])
    elapsed = time.perf_counter() - t0
    assert result.exit_code == 0, result.output + repr(result.exception)
    for name in ("runs.jsonl", "table2.md", "table2.csv", "lint.json"):
        assert (out / name).exists(), name
    recs = G.read_runs(out / "runs.jsonl")
    assert len(recs) == 18
    assert {r["backbone"] for r in recs} == {"mamba", "patchtst"}
    assert {r["depth"] for r in recs} == set(G.SCALES["smoke"].depths)
    for key in ("backbone", "variant", "q", "dataset", "horizon", "depth", "seed", "val_mse",
                "test_mse", "blew_up", "steps", "seconds", "device"):
        assert key in recs[0]
    assert "| Mamba | free velocity |" in (out / "table2.md").read_text()
    print(f"smoke grid: {elapsed:.1f}s")


def test_cli_figure1(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from qlint.cli import main

    result = CliRunner().invoke(main, ["verify", "figure1", "--out", str(tmp_path / "f.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "f.png").stat().st_size > 10_000
    assert sum(line.startswith("c=") for line in result.output.splitlines()) == 12  # 3 c x 4 q
    assert "c=1 q=1: overflows fp16 at D=16, bf16 at D=128, fp32 at D=128" in result.output
    assert "c=0.1 q=2: overflows fp16 at D=16, bf16 at D=19, fp32 at D=19" in result.output
    assert "c=0.01 q=0: overflows fp16 at D=>10000, bf16 at D=>10000, fp32 at D=>10000" in result.output
    args = ["verify", "figure1", "--out", str(tmp_path / "g.png"), "--q", "2", "--c", "0.5", "--depth", "20"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("c=")] == [
        "c=0.5 q=2: overflows fp16 at D=7, bf16 at D=10, fp32 at D=10"
    ]


def test_failed_run_is_not_recorded_and_retried(tmp_path, no_lint):
    configs = _tiny_grid()[:4]
    calls: list = []
    ok = _fake_run(calls)

    def flaky(cfg):
        if cfg.key == configs[1].key and len(calls) < 3:
            calls.append("boom")
            raise RuntimeError("boom")
        return ok(cfg)

    with pytest.raises(G.GridError, match="1 run"):
        G.run_grid(configs, tmp_path, progress=False, log=lambda m: None, run_fn=flaky)
    assert len(G.read_runs(tmp_path / "runs.jsonl")) == 3
    again: list = []
    G.run_grid(configs, tmp_path, progress=False, log=lambda m: None, run_fn=_fake_run(again))
    assert again == [configs[1].key]


def test_grid_filters():
    c = G.build_grid(G.SCALES["small"], ["/x/ETTh1.csv"], backbones=["mamba"], variants=["free", "rmsnorm"],
                     horizons=[96], depths=[8], n_seeds=3, steps=50)
    assert [(x.variant, x.seed, x.horizon, x.depth, x.steps) for x in c] == [
        (v, s, 96, 8, 50) for s in range(3) for v in ("free", "rmsnorm")
    ]


def test_seeds_select_a_count_a_list_or_a_range():
    assert G.parse_seeds(()) == (None, None)
    assert G.parse_seeds(("2",)) == (2, None)  # a bare number is a count, as before: seeds 0 and 1
    assert G.parse_seeds(("3-5",)) == (None, (3, 4, 5))
    assert G.parse_seeds(("0,2", "2", "7")) == (None, (0, 2, 7))  # repeated flags name seeds; duplicates once
    assert G.parse_seeds(("4,",)) == (None, (4,))
    assert G.parse_seeds(("3", "")) == (3, None)  # an empty value is no value
    for bad in (("0",), ("a",), ("1-x",), (",",), ("0,5-3",), ("²",)):
        with pytest.raises(ValueError):
            G.parse_seeds(bad)
    picked = G.build_grid(G.SCALES["small"], ["/x/ETTh1.csv"], backbones=["patchtst"], variants=["free"],
                          horizons=[96], depths=[3], seeds=(4, 2), monitor_every=10)
    assert [(c.seed, c.monitor_every) for c in picked] == [(4, 10), (2, 10)]
    assert {c.monitor_every for c in G.build_grid(G.SCALES["small"], ["/x/ETTh1.csv"])} == {25}


def test_cli_seeds_and_monitor_every_reach_the_runs(tmp_path, no_lint):
    from click.testing import CliRunner

    from qlint.cli import main

    out = tmp_path / "slice"
    args = ["verify", "grid", "--scale", "smoke", "--out", str(out), "--no-figures", "--backbone", "patchtst",
            "--variant", "free", "--depth", "3", "--seeds", "1-2", "--monitor-every", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = G.read_runs(out / "runs.jsonl")
    assert sorted((r["seed"], r["monitor_every"]) for r in rows) == [(1, 3), (2, 3)]
    assert all(sorted({t["step"] for t in r["telemetry"]}) == [0, 3, 6] for r in rows)
    bad = CliRunner().invoke(main, args[:-4] + ["--seeds", "x"])
    assert bad.exit_code == 2 and "--seeds" in bad.output


def test_the_monitor_records_its_warning_and_the_blowup_step_without_changing_training():
    from qlint.verify.train import train_run

    base = RunConfig("mamba", "free", "synthetic", "synthetic:600:3:0", horizon=8, depth=2, seed=0, steps=6,
                     batch_size=4, d_model=8, seq_len=16, eval_every=3, max_eval_windows=8)
    quiet, watched = train_run(base), train_run(replace(base, monitor_every=1))
    assert watched["val_history"] == quiet["val_history"] and watched["val_mse"] == quiet["val_mse"]
    assert watched["final_train_loss"] == quiet["final_train_loss"]
    assert sorted({t["step"] for t in watched["telemetry"]}) == list(range(7))
    assert sorted({t["step"] for t in quiet["telemetry"]}) == [0, 3, 6]
    assert (watched["monitor_every"], quiet["monitor_every"]) == (1, 3)
    assert watched["blowup_step"] is None and watched["monitor_first_warning_step"] is None
    diverged = train_run(replace(base, lr=1e12, eval_every=0, monitor_every=1))
    # the first step's loss is finite (the update comes after it); the absurd update makes the next one blow up
    assert diverged["blowup_step"] == 2 and diverged["steps"] == 2


def _protocol(c: RunConfig) -> tuple:
    return (c.lr, c.d_model, c.batch_size, c.steps, c.d_state, c.revin, c.loss, c.amp)


def test_presets_keep_their_values():
    from qlint.cli.verify import SCALE_NAMES

    assert SCALE_NAMES == tuple(G.SCALES)
    small, v1 = G.SCALES["small"], G.SCALES["small-v1"]
    # issue 15 regime: d_model 16, batch 16, Adam lr 1e-2 constant, 600 steps, H {96, 192}, L {3, 8}, 3 seeds
    assert (small.lr, small.d_model, small.batch_size, small.steps) == (1e-2, {"mamba": 16, "patchtst": 16}, 16, 600)
    assert (small.horizons, small.depths, small.seeds) == ((96, 192), (3, 8), (0, 1, 2))
    # the first small grid (results/etth1-small-v1) stays reachable with its settings
    assert (v1.lr, v1.d_model, v1.batch_size, v1.steps) == (1e-3, {"mamba": 16, "patchtst": 16}, 16, 200)
    assert (v1.horizons, v1.depths, v1.seeds, v1.eval_every, v1.max_eval_windows) == ((96, 192), (3, 8), (0, 1), 100, 384)
    runs = G.build_grid(v1, ["/x/ETTh1.csv"])
    assert len(runs) == 72
    assert {_protocol(c) for c in runs if c.backbone == "mamba"} == {(1e-3, 16, 16, 200, 8, False, "mse", "fp32")}
    assert {_protocol(c) for c in runs if c.backbone == "patchtst"} == {(1e-3, 16, 16, 200, None, False, "mse", "fp32")}
    assert len(G.build_grid(small, ["/x/ETTh1.csv"])) == 108


def test_protocol_flags_override_the_preset():
    runs = G.build_grid(G.SCALES["small-v1"], ["/x/ETTh1.csv"], lr=1e-2, d_model=24, batch_size=8, steps=7,
                        d_state=4, revin=True, loss="l1", amp="fp16")
    assert {_protocol(c) for c in runs if c.backbone == "mamba"} == {(1e-2, 24, 8, 7, 4, True, "l1", "fp16")}
    # d_state is Mamba's: PatchTST has none
    assert {_protocol(c) for c in runs if c.backbone == "patchtst"} == {(1e-2, 24, 8, 7, None, True, "l1", "fp16")}
    # distinct models get distinct lint entries; records without d_state / revin keep the old key
    assert G.lint_key({"backbone": "mamba", "variant": "free", "depth": 3, "d_model": 16}) == "mamba/free/L3/d16"
    assert G._lint_key(runs[0]) == "mamba/free/L3/d24/s4/revin"


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_autocast_run(amp):
    from qlint.verify.train import train_run

    cfg = RunConfig("mamba", "rmsnorm", "synthetic", "synthetic:600:3:0", horizon=8, depth=1, seed=0,
                    steps=2, batch_size=4, d_model=8, seq_len=16, eval_every=0, max_eval_windows=8, amp=amp,
                    loss="l1", revin=True, d_state=4)
    rec = train_run(cfg)
    assert (rec["amp"], rec["loss"], rec["revin"], rec["d_state"]) == (amp, "l1", True, 4)
    assert rec["steps"] == 2 and math.isfinite(rec["val_mse"]) and not rec["blew_up_final"]


def test_fp16_overflow_is_skipped_by_the_scaler_and_blows_up_at_the_end():
    """Under fp16 an overflowing forward does not stop training (the GradScaler skips the step, the
    fp32 master weights stay finite); the fp16 evaluation overflows, so the run blew up by both rules."""
    from qlint.verify.train import train_run

    cfg = RunConfig("patchtst", "free", "synthetic", "synthetic:600:3:0", horizon=8, depth=1, seed=0,
                    steps=3, batch_size=4, d_model=8, seq_len=16, eval_every=2, max_eval_windows=8,
                    model_kwargs=(("n_heads", 2), ("d_ff", 8)), lr=1e12, amp="fp16")
    rec = train_run(cfg)
    assert rec["steps"] == 3 and rec["nonfinite_train_losses"] == 2  # steps 2 and 3 overflowed, both skipped
    assert rec["val_history"] == [None]
    assert (rec["blew_up_final"], rec["blew_up_any"]) == (True, True)
    assert rec["blowup_reason"] == "non-finite final validation MSE"
    json.dumps(rec, allow_nan=False)


def test_cli_protocol_flags_reach_every_row(tmp_path):
    """--lr/--d-model/--batch-size/--steps/--d-state/--revin/--loss/--bf16 through the CLI, real runs."""
    from click.testing import CliRunner

    from qlint.cli import main

    out = tmp_path / "knobs"
    args = ["verify", "grid", "--scale", "smoke", "--out", str(out), "--backbone", "mamba", "--backbone", "patchtst",
            "--variant", "free", "--depth", "3", "--no-figures", "--lr", "0.005", "--d-model", "12",
            "--batch-size", "4", "--steps", "3", "--d-state", "4", "--revin", "--loss", "l1", "--bf16"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    recs = sorted(G.read_runs(out / "runs.jsonl"), key=lambda r: r["backbone"])
    assert [r["backbone"] for r in recs] == ["mamba", "patchtst"]
    for r in recs:
        assert (r["lr"], r["d_model"], r["batch_size"], r["steps_budget"], r["steps"]) == (0.005, 12, 4, 3, 3)
        assert (r["revin"], r["loss"], r["amp"], r["scale"]) == (True, "l1", "bf16", "smoke")
        assert r["blew_up_final"] is False and r["blew_up_any"] is False
    assert [r["d_state"] for r in recs] == [4, None]
    assert recs[0]["q"] == 5.0 and recs[1]["q"] == 1.0  # linted with the knobs: q is the architecture's
    clash = CliRunner().invoke(main, args[:-1] + ["--bf16", "--amp", "fp16"])
    assert clash.exit_code == 2 and "--bf16 contradicts --amp fp16" in clash.output


def _figure_runs():
    """Mamba on two data sets, cells H96 × L{3, 8}, 2 seeds: free velocity loses one seed at
    L=3 (∇) and both at L=8 (×); Peri-LN is +48.5 % off on weather L=3 (clipped)."""
    mse = {"rmsnorm": 0.5, "preln": 0.505, "periln": 0.502, "linear": 0.495}
    runs = []
    for ds, free_survivor in (("weather", 0.52), ("ETTm1", 0.51)):
        for depth in (3, 8):
            for seed in range(2):
                blew = depth == 8 or seed == 0
                runs.append(_rec("mamba", "free", 5.0, ds, 96, depth, seed, blew, free_survivor))
                for v, m in mse.items():
                    far = v == "periln" and ds == "weather" and depth == 3
                    runs.append(_rec("mamba", v, 1.0 if v == "linear" else 0.0, ds, 96, depth, seed, False,
                                     0.75 if far else m))
    return runs


def test_figure3_marks_blowups_and_clips_the_far_variant(tmp_path):
    pytest.importorskip("matplotlib")
    from qlint.verify.figures import figure_mse

    fig = figure_mse(_figure_runs(), "mamba", tmp_path / "f3.png")
    assert (tmp_path / "f3.png").stat().st_size > 10_000
    assert fig.datasets == ["weather", "ETTm1"]
    assert fig.variants == ["free", "rmsnorm", "preln", "periln", "linear"]
    assert fig.some_blown == [("weather", "L=3 H96", "free"), ("ETTm1", "L=3 H96", "free")]
    assert fig.all_blown == [("weather", "L=8 H96", "free"), ("ETTm1", "L=8 H96", "free")]
    assert fig.clipped == [("weather", "L=3 H96", "periln", pytest.approx(100 * (0.75 / 0.505 - 1)))]
    # weather's range is set by free velocity's +2.97 % (the largest within 3 × the bulk), not by Peri-LN
    assert fig.half_range["weather"] == pytest.approx(1.25 * 100 * (0.52 / 0.505 - 1))
    assert fig.half_range["ETTm1"] == pytest.approx(1.25 * 100 * (0.51 / 0.502 - 1))


def test_write_figures_skips_a_figure_of_two_variants(tmp_path):
    pytest.importorskip("matplotlib")
    from qlint.verify.figures import write_figures

    with open(tmp_path / "runs.jsonl", "w") as fh:
        for r in _figure_runs():
            if r["variant"] in ("free", "rmsnorm"):
                fh.write(json.dumps(r) + "\n")
            fh.write(json.dumps({**r, "backbone": "patchtst"}) + "\n")  # PatchTST: all 5 variant names
    logged = []
    assert write_figures(tmp_path, log=logged.append) == [tmp_path / "figure4_patchtst.png"]
    assert not (tmp_path / "figure3_mamba.png").exists()
    assert logged == ["skipped figure3_mamba.png: 2 Mamba variant(s) (free, rmsnorm); with fewer than 3 "
                      "the per-cell median says nothing"]


def _telemetry(steps, norm, gain1, gain4, blocks=("layers.0", "layers.1")):
    return [{"step": s, "block": b, "stream_norm": norm(s, k), "gain": {"1": gain1(s, k), "4": gain4(s, k)}}
            for s in steps for k, b in enumerate(blocks)]


def test_stream_figure_draws_the_deepest_blown_run_beside_its_controls(tmp_path):
    pytest.importorskip("matplotlib")
    from qlint.verify.figures import _telemetry_series, figure_stream

    steps = (0, 100, 200)
    def blown(depth, seed, stopped):
        r = _rec("mamba", "free", 5.0, "ETTh1", 96, depth, seed, True)
        r["steps"] = stopped
        r["telemetry"] = _telemetry(steps, lambda s, k: 40.0 + s * (k + 1), lambda s, k: 0.2, lambda s, k: 0.4 + s)
        return r
    def control(variant, q, depth, seed):
        r = _rec("mamba", variant, q, "ETTh1", 96, depth, seed, False)
        r["telemetry"] = _telemetry(steps, lambda s, k: 40.0, lambda s, k: 0.3, lambda s, k: 0.1)
        return r
    runs = [blown(3, 0, 250), control("rmsnorm", 0.0, 3, 0),
            blown(8, 1, 150), control("rmsnorm", 0.0, 8, 1), control("linear", 1.0, 8, 1),
            control("preln", 0.0, 8, 2),            # another seed: not a control of seed 1
            _rec("mamba", "rmsnorm", 0.0, "ETTh1", 96, 8, 1, False) | {"horizon": 192},  # another cell
            blown(8, 3, 150)]                         # as deep and as long, but no control in its cell
    fig = figure_stream(runs, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000
    assert fig.run == ("mamba", "free", "ETTh1", 96, 8, 1) and fig.controls == ["rmsnorm", "linear"]
    assert fig.blew_up_at == 150
    # each panel's series: the largest over the blocks at each step, non-finite values left out
    assert _telemetry_series(runs[2], lambda r: r["stream_norm"]) == ([0, 100, 200], [40.0, 240.0, 440.0])
    runs[2]["telemetry"][-1]["gain"]["4"] = None
    runs[2]["telemetry"][-2]["gain"]["4"] = float("inf")
    assert _telemetry_series(runs[2], lambda r: r["gain"]["4"]) == ([0, 100], [0.4, 100.4])
    # no blown-up run with a control: no figure
    assert figure_stream([r for r in runs if not r["blew_up_final"] or r["depth"] == 8 and r["seed"] == 3],
                         tmp_path / "none.png") is None


def test_figures_name_the_verify_extra_when_matplotlib_is_missing(monkeypatch):
    import sys

    from qlint.verify import figures as F

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(RuntimeError, match=r"^qlint verify figures need the \[verify\] extra \(matplotlib is not installed\): "
                                           r"pip install 'torch-qlint\[verify\]'$"):
        F._pyplot()
