"""``qlint verify grid --backend ray`` on a local 2-CPU Ray cluster: every run a task, a worker
killed mid-run retried, a resumed grid repeating no finished run, only the driver writing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from qlint.verify import grid as G  # noqa: E402
from qlint.verify.train import RunConfig  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    # the workers unpickle this module's run functions by value (tests/ is not on their path)
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))
    yield
    ray.shutdown()


@pytest.fixture
def no_lint(monkeypatch):
    monkeypatch.setattr(G, "lint_config", lambda cfg, n_vars: {"q": 1.0, "verdict": "certified", "block_q": []})


class AttemptLog:
    """A run function that leaves one marker file per attempt in ``root`` and returns a fake
    record; on the first attempt of ``die_on`` it kills its worker process (os._exit), and
    every attempt of ``raise_on`` raises."""

    def __init__(self, root: Path, die_on: tuple = (), raise_on: tuple = ()):
        self.root, self.die_on, self.raise_on = root, die_on, raise_on

    def attempts(self, key: tuple) -> int:
        return len(list(self.root.glob(_name(key) + ".*")))

    def __call__(self, cfg: RunConfig) -> dict:
        attempt = self.attempts(cfg.key)
        (self.root / f"{_name(cfg.key)}.{attempt}").touch()
        if cfg.key == self.die_on and attempt == 0:
            os._exit(1)  # the worker dies mid-run, as on a lost node or an OOM kill
        if cfg.key == self.raise_on:
            raise RuntimeError("boom")
        return {
            "backbone": cfg.backbone, "variant": cfg.variant, "dataset": cfg.dataset, "horizon": cfg.horizon,
            "depth": cfg.depth, "seed": cfg.seed, "val_mse": 0.5, "test_mse": 0.6, "blew_up_final": False,
            "blew_up_any": False, "blew_up": False, "blowup_reason": "", "steps": cfg.steps, "seconds": 0.0,
            "device": cfg.device, "d_model": cfg.d_model, "threads": cfg.threads, "pid": os.getpid(),
        }


def _name(key: tuple) -> str:
    return "-".join(map(str, key))


def _grid() -> list[RunConfig]:
    return G.build_grid(G.SCALES["smoke"], ["synthetic:600:3:0"], device="cpu")


def _run(configs, out, fn, **kw):
    return G.run_grid(configs, out, progress=False, log=lambda m: None, run_fn=fn, backend="ray", **kw)


def test_killed_worker_is_retried_and_the_driver_writes_once(tmp_path, cluster, no_lint):
    configs = _grid()[:6]
    victim = configs[2].key
    fn = AttemptLog(tmp_path, die_on=victim)
    out = tmp_path / "grid"
    new = _run(configs, out, fn)
    assert sorted(G.run_key(r) for r in new) == sorted(c.key for c in configs)
    assert fn.attempts(victim) == 2  # the first attempt died with its worker, Ray's retry finished it
    assert all(fn.attempts(c.key) == 1 for c in configs if c.key != victim)
    lines = (out / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 6  # one line per run, the retried one included
    recs = G.read_runs(out / "runs.jsonl")
    assert {r["pid"] for r in recs}.isdisjoint({os.getpid()})  # trained in workers, written by the driver
    assert {(r["device"], r["threads"], r["q"]) for r in recs} == {("cpu", 1, 1.0)}


def test_resumed_ray_grid_repeats_no_finished_run(tmp_path, cluster, no_lint):
    configs = _grid()
    fn = AttemptLog(tmp_path)
    out = tmp_path / "grid"
    assert len(_run(configs[:5], out, fn)) == 5
    rest = _run(configs, out, fn)
    assert sorted(G.run_key(r) for r in rest) == sorted(c.key for c in configs[5:])
    assert all(fn.attempts(c.key) == 1 for c in configs)
    assert sorted(G.run_key(r) for r in G.read_runs(out / "runs.jsonl")) == sorted(c.key for c in configs)
    assert _run(configs, out, fn) == []


def test_a_run_that_raises_is_reported_not_recorded_and_not_retried_by_ray(tmp_path, cluster, no_lint):
    configs = _grid()[:3]
    fn = AttemptLog(tmp_path, raise_on=configs[1].key)
    with pytest.raises(G.GridError, match=r"1 run\(s\) failed \(rerun to retry them\):\nmamba/rmsnorm/synthetic/24/3/0: RuntimeError: boom$"):
        _run(configs, tmp_path / "grid", fn)
    assert fn.attempts(configs[1].key) == 1
    assert sorted(G.run_key(r) for r in G.read_runs(tmp_path / "grid" / "runs.jsonl")) == sorted(
        [configs[0].key, configs[2].key])


def test_cli_smoke_grid_on_ray(tmp_path, cluster):
    """Real lint and training through ``qlint verify grid --backend ray`` (the cluster above is reused)."""
    from click.testing import CliRunner

    from qlint.cli import main

    out = tmp_path / "smoke"
    result = CliRunner().invoke(main, ["verify", "grid", "--scale", "smoke", "--out", str(out), "--backend", "ray",
                                       "--variant", "free", "--depth", "3", "--no-figures", "--amp", "bf16"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    recs = sorted(G.read_runs(out / "runs.jsonl"), key=lambda r: r["backbone"])
    assert [(r["backbone"], r["q"], r["amp"], r["steps"]) for r in recs] == [
        ("mamba", 5.0, "bf16", 6), ("patchtst", 1.0, "bf16", 6)]
    assert all(r["val_mse"] is not None and not r["blew_up_final"] for r in recs)
    assert {r["pid"] for r in recs}.isdisjoint({os.getpid()})
    assert "| Mamba | free velocity | 5 | 3 | 0/1 (0/1) | 0/1 (0/1) |" in (out / "table2.md").read_text()
