"""``qlint verify``: reproduce the reference experiments (training blow-ups vs q).

It needs the ``verify`` extra (numpy; matplotlib for figures), which the core linter
does not: without it each subcommand exits 2 with one line saying what to install.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import click

# = tuple(qlint.verify.grid.SCALES), spelled out so that `--help` needs no numpy (tested)
SCALE_NAMES = ("smoke", "small", "small-v1", "paper")


def extra_hint(extra: str) -> str:
    """How to add ``extra`` where qlint is installed: pip takes the extra's packages from the installed
    torch-qlint's metadata (no package index has torch-qlint itself)."""
    return f"pip install 'torch-qlint[{extra}]'"


def require(*modules: str, why: str = "", extra: str = "verify", also: str = "") -> None:
    """Exit 2 with one line naming the extra to install when one of ``modules`` cannot be imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            click.echo(f"qlint: error: qlint verify{why} needs the [{extra}] extra ({name} is not installed): "
                       f"{extra_hint(extra)}{also}", err=True)
            sys.exit(2)


@click.group("verify")
def command() -> None:
    """Reproduce the paper's experiments: train the zoo's Mamba / PatchTST variants,
    count blow-ups per cell (Table 2) and compare with the q that qlint predicts.

    \b
    Examples:
      qlint verify grid --scale smoke --out /tmp/smoke
      qlint verify grid --scale small --out results/etth1-small --workers 2
      qlint verify grid --scale small --lr 1e-3 --steps 1000 --amp fp16 --out /tmp/fp16
      qlint verify grid --scale paper --data ETTm1.csv --data weather.csv --device cuda --workers 8
      qlint verify grid --scale paper --data ETTm1.csv --backend ray --address auto --gpus-per-run 0.25
      qlint verify figure1 --out figure1.png
    """


@command.command("grid")
@click.option("--scale", type=click.Choice(SCALE_NAMES), default="small", show_default=True,
              help="smoke: synthetic, seconds (CI); small: ETTh1 on a CPU, lr 1e-2, 600 steps, 3 seeds; "
                   "small-v1: the first small grid (lr 1e-3, 200 steps, 2 seeds); paper: ETTm1 + Weather, GPU.")
@click.option("--data", "data", multiple=True, type=click.Path(dir_okay=False),
              help="Data CSV (repeatable; ETTh*/ETTm*/other from the file name). Default: the scale's, "
                   "else $QLINT_DATA, else ../shared/data/ETT-small/ETTh1.csv.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Output folder (runs.jsonl, table2.md/csv, figures). Default: results/<scale>.")
@click.option("--device", type=click.Choice(("auto", "cpu", "cuda")), default="auto", show_default=True)
@click.option("--lr", type=float, default=None, help="Adam learning rate (constant). Default: the scale's.")
@click.option("--d-model", "d_model", type=int, default=None, help="Model width, both backbones. Default: the scale's.")
@click.option("--batch-size", "batch_size", type=int, default=None,
              help="Training windows per step. Default: the scale's.")
@click.option("--steps", type=int, default=None, help="Adam steps per run. Default: the scale's.")
@click.option("--d-state", "d_state", type=int, default=None, help="Mamba's SSM state size. Default: the scale's (8).")
@click.option("--revin/--no-revin", default=None,
              help="RevIN instance normalisation around the model. Default: the scale's (off).")
@click.option("--loss", type=click.Choice(("mse", "l1")), default=None,
              help="Training loss (evaluation is MSE). Default: mse.")
@click.option("--amp", type=click.Choice(("fp32", "fp16", "bf16")), default=None,
              help="fp16: autocast fp16 with a GradScaler (overflows at 65504); bf16: autocast bf16. Default: fp32.")
@click.option("--bf16", is_flag=True, help="Same as --amp bf16.")
@click.option("--scan", type=click.Choice(("auto", "loop", "chunked")), default="auto", show_default=True,
              help="Mamba's recurrence: the Python loop over time, or the chunked prefix scan (same numbers "
                   "within float rounding); auto: chunked on cuda, loop on cpu.")
@click.option("--shard", default=None, metavar="k/n", help="Run only run i with i % n == k-1 of the grid.")
@click.option("--backend", type=click.Choice(("local", "ray")), default="local", show_default=True,
              help="local: this process or a process pool (--workers); ray: one Ray task per run "
                   "(pip install 'torch-qlint[distributed]').")
@click.option("--address", default=None,
              help="Ray cluster to join (e.g. auto, ray://head:10001). Default: start a local one.")
@click.option("--gpus-per-run", "gpus_per_run", type=float, default=0.25, show_default=True,
              help="Ray: fraction of a GPU per run when training on cuda.")
@click.option("--max-retries", "max_retries", type=int, default=3, show_default=True,
              help="Ray: retries of a run whose worker died.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Parallel runs (local: spawned processes, on cuda at most one per GPU; "
                   "ray: CPUs of a fresh local cluster, default all of them).")
@click.option("--threads", type=int, default=0, help="torch threads per run (0: 1 on cpu, else cores / workers).")
@click.option("--backbone", "backbones", multiple=True, type=click.Choice(("mamba", "patchtst")),
              help="Restrict to these backbones (default: both).")
@click.option("--variant", "variants", multiple=True,
              type=click.Choice(("free", "rmsnorm", "preln", "periln", "linear")),
              help="Restrict to these variants (default: all).")
@click.option("--horizon", "horizons", multiple=True, type=int, help="Override the scale's horizons.")
@click.option("--depth", "depths", multiple=True, type=int, help="Override the scale's depths.")
@click.option("--seeds", "seed_args", multiple=True, metavar="N|LIST",
              help="N: seeds 0..N-1; a list (0,2), a range (3-5) or the flag repeated: exactly those seeds.")
@click.option("--monitor-every", "monitor_every", type=int, default=None,
              help="qlint.monitor measures the fixed batch every N training steps (0: at evaluations only). "
                   "Default: the scale's.")
@click.option("--no-progress", is_flag=True, help="Plain log lines instead of a progress bar.")
@click.option("--no-figures", is_flag=True, help="Skip the PNG figures.")
def grid(scale, data, out, device, lr, d_model, batch_size, steps, d_state, revin, loss, amp, bf16, scan, shard,
         backend, address, gpus_per_run, max_retries, workers, threads, backbones, variants, horizons, depths,
         seed_args, monitor_every, no_progress, no_figures):
    """Train the grid (resumable: finished runs in OUT/runs.jsonl are skipped), then write
    Table 2 and the Figure 3/4 MSE plots. Every protocol flag overrides the scale's value
    and is recorded in each run's row."""
    require("numpy")
    if not no_figures:
        require("matplotlib", why=" grid", also=", or pass --no-figures")
    if backend == "ray":
        require("ray", why=" --backend ray", extra="distributed")
    if bf16:
        if amp not in (None, "bf16"):
            raise click.UsageError(f"--bf16 contradicts --amp {amp}")
        amp = "bf16"
    from qlint.verify import grid as G
    from qlint.verify.data import default_data_path
    from qlint.verify.tables import write_tables

    sc = G.SCALES[scale]
    if data:
        paths = [str(Path(p).resolve()) for p in data]
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            raise click.UsageError(f"data file not found: {', '.join(missing)}")
    elif sc.data:
        paths = list(sc.data)
    elif scale == "paper":
        raise click.UsageError("--scale paper needs --data ETTm1.csv --data weather.csv (local paths)")
    else:
        default = default_data_path()
        if default is None:
            raise click.UsageError(
                "no data: pass --data ETTh1.csv, set QLINT_DATA, or place ../shared/data/ETT-small/ETTh1.csv"
            )
        paths = [default]
    try:
        k, n = G.parse_shard(shard)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shard") from None
    try:
        n_seeds, seeds = G.parse_seeds(seed_args)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None
    if monitor_every is not None and monitor_every < 0:
        raise click.BadParameter(f"must be 0 or a positive number of steps, not {monitor_every}",
                                 param_hint="--monitor-every")
    out = Path(out or Path("results") / scale)
    configs = G.build_grid(sc, paths, device=device, backbones=backbones or None, variants=variants or None,
                           horizons=horizons or None, depths=depths or None, n_seeds=n_seeds, seeds=seeds, steps=steps,
                           lr=lr,
                           d_model=d_model, batch_size=batch_size, d_state=d_state, revin=revin, loss=loss, amp=amp,
                           scan=scan, monitor_every=monitor_every)
    if not configs:
        raise click.UsageError("the selection is empty")
    configs = G.shard(configs, k, n)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    log(f"qlint verify grid --scale {scale}: data {', '.join(paths)}; shard {k}/{n}; backend {backend}; out {out}")
    error = None
    try:
        G.run_grid(configs, out, workers=workers, threads=threads, scale_name=scale,
                   progress=not no_progress and sys.stderr.isatty(), log=log, backend=backend, address=address,
                   gpus_per_run=gpus_per_run, max_retries=max_retries)
    except G.ProtocolMismatch as exc:  # raised before any run started
        click.echo(f"qlint: error: {exc}", err=True)
        sys.exit(2)
    except G.GridError as exc:
        error = exc
    md = write_tables(out, title=f"scale {scale}")
    if not no_figures:
        from qlint.verify.figures import write_figures

        for p in write_figures(out):
            log(f"wrote {p}")
    log(f"wrote {out / 'runs.jsonl'}, {out / 'table2.md'}, {out / 'table2.csv'} ({time.perf_counter() - t0:.1f}s)")
    click.echo(md)
    if error is not None:
        raise click.ClickException(str(error))


@command.command("table")
@click.option("--out", "out", type=click.Path(file_okay=False, exists=True), required=True,
              help="A grid's output folder (with runs.jsonl).")
@click.option("--no-figures", is_flag=True)
def table(out, no_figures):
    """Rebuild table2.md / table2.csv (and figures) from OUT/runs.jsonl."""
    require("numpy")
    if not no_figures:
        require("matplotlib", why=" table", also=", or pass --no-figures")
    from qlint.verify.tables import write_tables

    md = write_tables(out)
    if not no_figures:
        from qlint.verify.figures import write_figures

        write_figures(out)
    click.echo(md)


@command.command("figure1")
@click.option("--out", "out", type=click.Path(dir_okay=False), default="figure1.png", show_default=True)
@click.option("--q", "qs", type=float, multiple=True, default=(0.0, 1.0, 2.0, 5.0), show_default=True,
              help="Growth exponent q (repeat; one colour each).")
@click.option("--c", "cs", type=float, multiple=True, default=(0.01, 0.1, 1.0), show_default=True,
              help="Growth coefficient c (repeat; one line style each, the smallest also in the linear panel).")
@click.option("--r0", type=float, default=1.0, show_default=True)
@click.option("--depth", type=int, default=60, show_default=True, help="Largest layer index plotted.")
def figure1(out, qs, cs, r0, depth):
    """Figure 1: r_{k+1} = r_k + c r_k^q (default q in {0, 1, 2, 5}, c in {0.01, 0.1, 1}) against the
    fp16/bf16/fp32 maxima, with the first layer at which each trajectory exceeds each of them."""
    require("numpy", "matplotlib")
    from qlint.verify.figures import LIMITS, figure1 as fig1

    depths = fig1(out, cs=cs, qs=qs, r0=r0, depth=depth)
    for c in cs:
        for q in qs:
            cells = ", ".join(
                f"{name} at D={depths[(c, q, name)] if depths[(c, q, name)] is not None else '>10000'}"
                for name in LIMITS
            )
            click.echo(f"c={c:g} q={q:g}: overflows {cells}")
    click.echo(f"wrote {out}")
