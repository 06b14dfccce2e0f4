"""The experiment grid: datasets × horizons × depths × seeds × backbones × variants.

* Every (backbone, variant, depth) is linted once with ``qlint.analyze`` before any
  training; the exponent is cached in ``DIR/lint.json`` and written into each run.
* Finished runs are appended to ``DIR/runs.jsonl`` one JSON line each (flush + fsync),
  so an interrupted grid resumes: runs whose key (backbone, variant, dataset, horizon,
  depth, seed) is already there are skipped; a truncated last line is dropped.
* ``shard=(k, n)`` keeps run *i* of the full, deterministically ordered grid iff
  ``i % n == k - 1``, so n machines split one grid exactly.
* ``workers > 1`` runs independent runs in a spawn-context ProcessPoolExecutor (on
  cuda: at most one process per GPU, each pinned to its own device).
* ``backend="ray"`` runs each run as a Ray task instead (:mod:`qlint.verify.ray_backend`).
  Whatever the backend, only this driver process appends to runs.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from qlint.core.algebra import format_q
from qlint.verify.train import KEY_FIELDS, RunConfig, run_key

BACKBONES: dict[str, tuple[str, ...]] = {
    "mamba": ("free", "rmsnorm", "preln", "periln", "linear"),
    "patchtst": ("free", "rmsnorm", "preln", "periln"),
}

BACKENDS = ("local", "ray")

MAMBA_D_STATE = 8
"""The zoo's MambaMixer default: every run recorded before --d-state existed used it."""


@dataclass(frozen=True)
class Scale:
    """One preset of the grid. ``data=None`` means "the caller must pass --data"."""

    name: str
    data: Optional[tuple[str, ...]]
    horizons: tuple[int, ...]
    depths: tuple[int, ...]
    seeds: tuple[int, ...]
    steps: int
    batch_size: int
    d_model: dict[str, int]
    seq_len: int = 96
    eval_every: int = 100
    monitor_every: int = 0  # qlint.monitor's measurements during training (0: at evaluations only)
    max_eval_windows: int = 512
    lr: float = 1e-3
    d_state: int = MAMBA_D_STATE  # Mamba's SSM state size
    revin: bool = False
    loss: str = "mse"
    amp: str = "fp32"
    seeds_by_kind: dict[str, tuple[int, ...]] = field(default_factory=dict)
    model_kwargs: dict[str, tuple] = field(default_factory=dict)

    def seeds_for(self, data_path: str) -> tuple[int, ...]:
        from qlint.verify.data import infer_kind

        return self.seeds_by_kind.get(infer_kind(data_path), self.seeds)


SCALES: dict[str, Scale] = {
    # CI: synthetic sines, tiny models, every backbone/variant, depths 3 and 8, a few steps.
    "smoke": Scale(
        name="smoke",
        data=("synthetic:1200:7:0",),
        horizons=(24,),
        depths=(3, 8),
        seeds=(0,),
        steps=6,
        batch_size=8,
        d_model={"mamba": 8, "patchtst": 8},
        # Linting unrolls the Mamba scan over time (~30 s a model at seq_len 96 on one core);
        # an 8-step window keeps the 18 lints + 18 runs of CI to ~40 s of CPU.
        seq_len=8,
        eval_every=3,
        monitor_every=2,
        max_eval_windows=32,
        model_kwargs={"patchtst": (("n_heads", 2), ("d_ff", 16), ("patch_len", 4), ("stride", 2))},
    ),
    # 2-core CPU: ETTh1, H in {96, 192}, L in {3, 8}, 3 seeds, 600 Adam steps of 16 windows at a
    # constant lr 1e-2 (~1.1 epoch). Measured in a pilot (free Mamba, seeds 0-2, 900 steps): its
    # parameters went non-finite between steps 319 and 772 in 10 of 12 runs, 7 of them before
    # step 600, while RMSNorm / linear-growth Mamba and free / Pre-LN PatchTST at L = 8 stayed
    # finite through 900 steps; at step 300 none had stopped and 2 had a val MSE past 1e3.
    "small": Scale(
        name="small",
        data=None,  # default: ETTh1 beside the repo (see data.default_data_path)
        horizons=(96, 192),
        depths=(3, 8),
        seeds=(0, 1, 2),
        steps=600,
        batch_size=16,
        d_model={"mamba": 16, "patchtst": 16},
        lr=1e-2,
        eval_every=100,
        monitor_every=25,  # the warning and its lead to 25 steps: 9 % more CPU on Mamba L=8 (bench/bench_monitor.py)
        max_eval_windows=384,
    ),
    # The first small grid (results/etth1-small-v1): as "small" but lr 1e-3, 200 steps, 2 seeds;
    # nothing blew up in it. ~1 h on 2 cores (a Mamba L=8 step is ~0.4 s on one EPYC core).
    "small-v1": Scale(
        name="small-v1",
        data=None,
        horizons=(96, 192),
        depths=(3, 8),
        seeds=(0, 1),
        steps=200,
        batch_size=16,
        d_model={"mamba": 16, "patchtst": 16},
        eval_every=100,
        max_eval_windows=384,
    ),
    # The paper's grid (GPU): ETTm1 (6 seeds) and Weather (3 seeds), all four horizons.
    "paper": Scale(
        name="paper",
        data=None,  # required: --data ETTm1.csv --data weather.csv
        horizons=(96, 192, 336, 720),
        depths=(3, 8),
        seeds=(0, 1, 2),
        seeds_by_kind={"ETTm": (0, 1, 2, 3, 4, 5), "ETTh": (0, 1, 2, 3, 4, 5)},
        steps=10_000,
        batch_size=32,
        d_model={"mamba": 128, "patchtst": 128},
        eval_every=1000,
        monitor_every=250,
        max_eval_windows=0,
        model_kwargs={"patchtst": (("n_heads", 16), ("d_ff", 256))},
    ),
}


def build_grid(
    scale: Scale,
    data_paths: Iterable[str],
    *,
    device: str = "cpu",
    backbones: Optional[Iterable[str]] = None,
    variants: Optional[Iterable[str]] = None,
    horizons: Optional[Iterable[int]] = None,
    depths: Optional[Iterable[int]] = None,
    n_seeds: Optional[int] = None,
    seeds: Optional[Iterable[int]] = None,
    steps: Optional[int] = None,
    lr: Optional[float] = None,
    d_model: Optional[int] = None,
    batch_size: Optional[int] = None,
    d_state: Optional[int] = None,
    revin: Optional[bool] = None,
    loss: Optional[str] = None,
    amp: Optional[str] = None,
    scan: str = "auto",
    monitor_every: Optional[int] = None,
) -> list[RunConfig]:
    """The full grid in its canonical order (seed outermost, so a partial grid covers
    every cell once before any cell twice). Each protocol knob (``steps`` ... ``amp``)
    left at None takes the scale's value; ``d_model`` applies to both backbones and
    ``d_state`` to Mamba only. ``n_seeds`` keeps seeds 0..n-1, ``seeds`` exactly those seeds (in
    their order here). Neither ``monitor_every`` (the monitor measures under a forked RNG, in eval
    mode, without gradients) nor ``scan`` (Mamba's recurrence, see ``resolve_scan``; both forms
    compute the same numbers within float rounding) is a protocol knob."""
    from qlint.verify.data import dataset_name
    from qlint.verify.train import resolve_scan

    scan = resolve_scan(scan, device)

    def pick(override, preset):
        return preset if override is None else override

    backbones = tuple(backbones or BACKBONES)
    variants = set(variants) if variants else None
    horizons = tuple(horizons or scale.horizons)
    depths = tuple(depths or scale.depths)
    data_paths = list(data_paths)
    chosen = tuple(seeds) if seeds else tuple(range(n_seeds)) if n_seeds else None

    def seeds_of(path: str) -> tuple[int, ...]:
        return chosen if chosen is not None else scale.seeds_for(path)

    max_seeds = max(len(seeds_of(p)) for p in data_paths)
    configs = []
    for si in range(max_seeds):
        for path in data_paths:
            seeds = seeds_of(path)
            if si >= len(seeds):
                continue
            name = "synthetic" if path.startswith("synthetic") else dataset_name(path)
            for horizon in horizons:
                for depth in depths:
                    for backbone in backbones:
                        for variant in BACKBONES[backbone]:
                            if variants and variant not in variants:
                                continue
                            configs.append(
                                RunConfig(
                                    backbone=backbone,
                                    variant=variant,
                                    dataset=name,
                                    data=path,
                                    horizon=horizon,
                                    depth=depth,
                                    seed=seeds[si],
                                    steps=pick(steps, scale.steps),
                                    batch_size=pick(batch_size, scale.batch_size),
                                    lr=pick(lr, scale.lr),
                                    d_model=pick(d_model, scale.d_model[backbone]),
                                    d_state=pick(d_state, scale.d_state) if backbone == "mamba" else None,
                                    revin=pick(revin, scale.revin),
                                    loss=pick(loss, scale.loss),
                                    amp=pick(amp, scale.amp),
                                    seq_len=scale.seq_len,
                                    eval_every=scale.eval_every,
                                    monitor_every=pick(monitor_every, scale.monitor_every),
                                    max_eval_windows=scale.max_eval_windows,
                                    device=device,
                                    scan=scan,
                                    model_kwargs=scale.model_kwargs.get(backbone, ()),
                                )
                            )
    return configs


def parse_seeds(values: Iterable[str]) -> tuple[Optional[int], Optional[tuple[int, ...]]]:
    """``--seeds`` as ``(n_seeds, seeds)``: one bare number N is a count (seeds 0..N-1, as before); a list
    ``0,2``, a range ``3-5``, or the flag given more than once names the seeds themselves."""
    values = [v.strip() for v in values if v.strip()]
    if not values:
        return None, None
    if len(values) == 1 and _is_number(values[0]):
        if int(values[0]) < 1:
            raise ValueError(f"a seed count must be at least 1, not {values[0]} (seed {values[0]} alone: {values[0]},)")
        return int(values[0]), None
    seeds: list[int] = []
    for part in (p.strip() for v in values for p in v.split(",") if p.strip()):
        low, dash, high = part.partition("-")
        if not _is_number(low) or (dash and (not _is_number(high) or int(high) < int(low))):
            raise ValueError(f"not a seed, list (0,2) or increasing range (3-5): {part!r}")
        seeds += range(int(low), int(high) + 1) if dash else [int(low)]
    if not seeds:
        raise ValueError(f"no seeds in {', '.join(values)!r}")
    return None, tuple(dict.fromkeys(seeds))


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def parse_shard(text: Optional[str]) -> tuple[int, int]:
    """``"k/n"`` -> (k, n) with 1 <= k <= n; None -> (1, 1)."""
    if not text:
        return 1, 1
    try:
        k, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like k/n, got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"--shard k/n needs 1 <= k <= n, got {text!r}")
    return k, n


def shard(configs: list, k: int, n: int) -> list:
    """Run i of the full grid belongs to shard k iff i % n == k - 1."""
    return [c for i, c in enumerate(configs) if i % n == k - 1]


# ---------------------------------------------------------------- runs.jsonl


def read_runs(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every well-formed record of a runs.jsonl (a truncated or corrupt line is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and all(k in rec for k in KEY_FIELDS):
                out.append(rec)
    return out


def protocol(run: dict[str, Any]) -> dict[str, Any]:
    """The training protocol of a record or ``asdict(RunConfig)``. A knob that did not exist
    when a record was written gets the value every run had then; one a record does not
    state is None."""
    amp = run.get("amp") or ("bf16" if run.get("bf16") else "fp32")
    return {
        "lr": run.get("lr"),
        "d_model": run.get("d_model"),
        "batch_size": run.get("batch_size"),
        "steps": run.get("steps_budget", run.get("steps")),
        "seq_len": run.get("seq_len"),
        "d_state": run.get("d_state", MAMBA_D_STATE if run["backbone"] == "mamba" else None),
        "revin": run.get("revin", False),
        "loss": run.get("loss", "mse"),
        "amp": amp,
    }


class ProtocolMismatch(ValueError):
    """runs.jsonl holds some of the requested runs, trained under another protocol."""


def check_protocol(configs: list[RunConfig], runs: list[dict[str, Any]], runs_path: os.PathLike) -> None:
    """Refuse to resume into a runs.jsonl whose finished runs used other settings: skipping
    them as done would put two protocols into one table."""
    wanted = {c.key: protocol(asdict(c)) for c in configs}
    for rec in runs:
        want = wanted.get(run_key(rec))
        if want is None:
            continue
        for name, value in protocol(rec).items():
            if value is not None and value != want[name]:
                raise ProtocolMismatch(
                    f"{runs_path} already holds run {'/'.join(map(str, run_key(rec)))} with {name} = {value}, "
                    f"but this grid asks for {want[name]}: pass --out to a new folder, or the flags that match"
                )


def repair_tail(path: str | os.PathLike) -> None:
    """Drop a partial last line (a run killed mid-write) so appends start on a fresh line."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(cut)


def append_run(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync)."""
    line = json.dumps(record, sort_keys=False, allow_nan=False)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# ---------------------------------------------------------------------- lint


def lint_key(run: dict[str, Any]) -> str:
    """The lint.json key of a run (a record or ``asdict(RunConfig)``): one per distinct model.

    Records written before d_state / revin were knobs lack them and keep their old key.
    """
    key = f"{run['backbone']}/{run['variant']}/L{run['depth']}/d{run.get('d_model')}"
    if run.get("d_state") is not None:
        key += f"/s{run['d_state']}"
    if run.get("revin"):
        key += "/revin"
    if run["backbone"] == "mamba" and run.get("scan", "loop") != "loop":
        key += f"/{run['scan']}"  # another traced graph: linted on its own
    return key


def _lint_key(cfg: RunConfig) -> str:
    return lint_key(asdict(cfg))


def lint_config(cfg: RunConfig, n_vars: int) -> dict[str, Any]:
    """``qlint.analyze`` on the model of ``cfg`` (once per distinct model, see :func:`lint_key`)."""
    import torch

    from qlint.api import analyze
    from qlint.verify.train import build_for

    torch.manual_seed(0)
    model = build_for(cfg, n_vars)
    model.eval()
    inputs = (torch.randn(2, cfg.seq_len, n_vars),)
    report = analyze(model, inputs)
    q = report.max_q
    return {
        "q": None if q is None or (isinstance(q, float) and math.isinf(q)) else float(q),
        "verdict": report.verdict,
        "block_q": [None if b.q is None or math.isinf(b.q) else float(b.q) for b in report.blocks],
    }


def lint_all(
    configs: list[RunConfig],
    cache_path: str | os.PathLike,
    n_vars_of: Callable[[str], int],
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Lint every distinct (backbone, variant, depth, d_model) of ``configs``; cached on disk.

    A failing lint (e.g. ``qlint.analyze`` unavailable) is recorded as ``q = None`` with
    the error, and retried on the next invocation.
    """
    cache_path = Path(cache_path)
    cache: dict[str, dict[str, Any]] = {}
    if cache_path.exists():
        try:
            cache = json.loads(cache_path.read_text())
        except json.JSONDecodeError:
            cache = {}
    changed = False
    for cfg in configs:
        key = _lint_key(cfg)
        if key in cache and cache[key].get("q") is not None:
            continue
        if key in cache and cache[key].get("_tried_this_call"):
            continue
        t0 = time.perf_counter()
        try:
            entry = lint_config(cfg, n_vars_of(cfg.data))
            entry["seconds"] = round(time.perf_counter() - t0, 2)
            log(f"lint {key}: q = {format_q(entry['q'])} ({entry['verdict']}) [{entry['seconds']:.1f}s]")
        except Exception as exc:  # noqa: BLE001 - the grid must go on; q stays unknown
            entry = {"q": None, "verdict": None, "error": f"{type(exc).__name__}: {exc}"[:500]}
            log(f"lint {key}: FAILED ({entry['error'][:120]})")
        entry["_tried_this_call"] = True
        cache[key] = entry
        changed = True
    for entry in cache.values():
        entry.pop("_tried_this_call", None)
    if changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    return cache


# ---------------------------------------------------------------------- workers

_WORKER_DEVICE: Optional[str] = None


def _worker_init(gpu_queue, threads: int) -> None:
    """Spawned-worker setup: pin a GPU (one per process) and the CPU thread count."""
    global _WORKER_DEVICE
    import torch

    if threads:
        torch.set_num_threads(threads)
    if gpu_queue is not None:
        idx = gpu_queue.get()
        torch.cuda.set_device(idx)
        _WORKER_DEVICE = f"cuda:{idx}"


def _worker_run(cfg: RunConfig) -> dict[str, Any]:
    from qlint.verify.train import train_run

    if _WORKER_DEVICE is not None and cfg.device.startswith("cuda"):
        cfg = replace(cfg, device=_WORKER_DEVICE)
    return train_run(cfg)


def run_grid(
    configs: list[RunConfig],
    out_dir: str | os.PathLike,
    *,
    workers: int = 1,
    threads: int = 0,
    scale_name: str = "",
    progress: bool = True,
    log: Callable[[str], None] = print,
    run_fn: Optional[Callable[[RunConfig], dict]] = None,
    backend: str = "local",
    address: Optional[str] = None,
    gpus_per_run: float = 0.25,
    max_retries: int = 3,
) -> list[dict[str, Any]]:
    """Run every config whose key is not yet in ``out_dir/runs.jsonl``; return the new records.

    ``backend="local"``: in this process (``workers == 1``) or a process pool;
    ``backend="ray"``: one Ray task per run (see :func:`qlint.verify.ray_backend.ray_outcomes`
    for ``address``, ``gpus_per_run``, ``max_retries``; ``workers > 1`` sizes a fresh local
    cluster). ``run_fn`` (default :func:`qlint.verify.train.train_run`) is replaceable for
    tests, in-process and on Ray (not in the process pool). Records are appended here, by
    the driver, as the runs finish.
    """
    from qlint.verify.data import load_dataset
    from qlint.verify.train import resolve_device, train_run

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    repair_tail(runs_path)
    finished = read_runs(runs_path)
    check_protocol(configs, finished, runs_path)
    done = {run_key(r) for r in finished}
    todo = [c for c in configs if c.key not in done]
    log(f"grid: {len(configs)} runs in this shard, {len(configs) - len(todo)} already done, {len(todo)} to run")
    if not todo:
        return []

    lint = lint_all(todo, out / "lint.json", lambda p: load_dataset(p, todo[0].seq_len).n_vars, log)

    fn = run_fn or train_run
    if backend == "ray":
        from qlint.verify.ray_backend import ray_outcomes

        outcomes = ray_outcomes(todo, fn, address=address, num_cpus=workers if workers > 1 else None,
                                threads=threads, gpus_per_run=gpus_per_run, max_retries=max_retries, log=log)
    else:
        device = resolve_device(todo[0].device)
        todo = [replace(c, device=device) for c in todo]
        if workers <= 1:
            if threads or device == "cpu":
                import torch

                # These models are tiny: intra-op threads barely help and thrash on a shared
                # CPU, so a CPU run uses one thread unless --threads says otherwise.
                torch.set_num_threads(threads or 1)
            outcomes = _inline_outcomes(todo, fn)
        else:
            outcomes = _pool_outcomes(todo, workers, threads, device)

    retries: dict[str, int] = {}

    def finish(cfg: RunConfig, rec: dict[str, Any]) -> dict[str, Any]:
        key = _lint_key(cfg)
        if lint.get(key, {}).get("q") is None and retries.get(key, 0) < 2:
            # the lint failed before training (e.g. qlint's core mid-edit): try again
            retries[key] = retries.get(key, 0) + 1
            lint.update(lint_all([cfg], out / "lint.json", lambda p: load_dataset(p, cfg.seq_len).n_vars, log))
        entry = lint.get(key, {})
        full = {k: rec[k] for k in ("backbone", "variant")}
        full["q"] = entry.get("q")
        full.update({k: v for k, v in rec.items() if k not in full})
        full["verdict"] = entry.get("verdict")
        full["scale"] = scale_name
        full["steps_budget"] = cfg.steps
        append_run(runs_path, full)
        return full

    def describe(rec: dict[str, Any]) -> str:
        mse = rec.get("val_mse")
        if rec.get("blew_up_final"):
            status = f"BLEW UP ({rec['blowup_reason']})"
        elif rec.get("blew_up_any"):
            status = f"ok at the end ({rec['blowup_reason']})"
        else:
            status = "ok"
        return (
            f"{rec['backbone']}/{rec['variant']} q={format_q(rec.get('q'))} {rec['dataset']} "
            f"H={rec['horizon']} L={rec['depth']} seed={rec['seed']}: "
            f"val {mse if mse is None else f'{mse:.4f}'} {status} [{rec['seconds']:.1f}s]"
        )

    results: list[dict[str, Any]] = []
    failed: list[str] = []
    bar = _Progress(len(todo), enabled=progress, log=log)
    with bar:
        for cfg, outcome in outcomes:
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                rec = finish(cfg, outcome)
            except Exception as exc:  # noqa: BLE001
                # an exception is not a blow-up: nothing is recorded, so a rerun retries the run
                failed.append(f"{'/'.join(map(str, cfg.key))}: {type(exc).__name__}: {exc}")
                bar.advance(f"FAILED {failed[-1]}")
                continue
            results.append(rec)
            bar.advance(describe(rec))
    if failed:
        raise GridError(f"{len(failed)} run(s) failed (rerun to retry them):\n" + "\n".join(failed))
    return results


Outcome = tuple[RunConfig, "dict[str, Any] | BaseException"]
"""A finished run: its config and its record, or the exception it raised."""


def _inline_outcomes(todo: list[RunConfig], fn: Callable[[RunConfig], dict]) -> Iterator[Outcome]:
    for cfg in todo:
        try:
            rec = fn(cfg)
        except Exception as exc:  # noqa: BLE001 - reported by run_grid
            yield cfg, exc
            continue
        yield cfg, rec


def _pool_outcomes(todo: list[RunConfig], workers: int, threads: int, device: str) -> Iterator[Outcome]:
    """The runs in spawned processes (on cuda: at most one per GPU), in order of completion."""
    import concurrent.futures as cf
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    gpu_queue = None
    if device.startswith("cuda"):
        import torch

        gpu_ids = list(range(torch.cuda.device_count()))
        workers = max(1, min(workers, len(gpu_ids)))
        gpu_queue = ctx.Queue()
        for i in gpu_ids[:workers]:
            gpu_queue.put(i)
    per_worker = threads or (1 if device == "cpu" else max(1, (os.cpu_count() or 1) // workers))
    with cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(gpu_queue, per_worker),
    ) as pool:
        futures = {pool.submit(_worker_run, cfg): cfg for cfg in todo}
        for fut in cf.as_completed(futures):
            exc = fut.exception()
            yield futures[fut], exc if exc is not None else fut.result()


class GridError(RuntimeError):
    """Some runs raised; the finished ones are in runs.jsonl, the failed ones are not."""


class _Progress:
    """A rich progress bar (live on a terminal; one log line per run otherwise)."""

    def __init__(self, total: int, enabled: bool = True, log: Callable[[str], None] = print):
        self.total = total
        self.enabled = enabled
        self.log = log
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._console = Console(stderr=True)
            self._progress = Progress(
                TextColumn("[bold]verify grid"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self._console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("runs", total=self.total)
        return self

    def advance(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.log(message)
            self._progress.advance(self._task)
        else:
            self.log(message)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False
