"""``qlint verify``: reproduce the reference experiments (training blow-ups vs q)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

SCALE_NAMES = ("smoke", "small", "paper")


@click.group("verify")
def command() -> None:
    """Reproduce the paper's experiments: train the zoo's Mamba / PatchTST variants,
    count blow-ups per cell (Table 2) and compare with the q that qlint predicts.

    \b
    Examples:
      qlint verify grid --scale smoke --out /tmp/smoke
      qlint verify grid --scale small --out results/etth1-small --workers 2
      qlint verify grid --scale paper --data ETTm1.csv --data weather.csv --device cuda --workers 8
      qlint verify figure1 --out figure1.png
    """


@command.command("grid")
@click.option("--scale", type=click.Choice(SCALE_NAMES), default="small", show_default=True,
              help="smoke: synthetic, seconds (CI); small: ETTh1 on a CPU, ~1 h; paper: ETTm1 + Weather, GPU.")
@click.option("--data", "data", multiple=True, type=click.Path(dir_okay=False),
              help="Data CSV (repeatable; ETTh*/ETTm*/other from the file name). Default: the scale's, "
                   "else $QLINT_DATA, else ../shared/data/ETT-small/ETTh1.csv.")
@click.option("--out", "out", type=click.Path(file_okay=False), default=None,
              help="Output folder (runs.jsonl, table2.md/csv, figures). Default: results/<scale>.")
@click.option("--device", type=click.Choice(("auto", "cpu", "cuda")), default="auto", show_default=True)
@click.option("--bf16", is_flag=True, help="bf16 autocast for forward passes.")
@click.option("--shard", default=None, metavar="k/n", help="Run only run i with i % n == k-1 of the grid.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Parallel runs (spawned processes; on cuda at most one per GPU).")
@click.option("--threads", type=int, default=0, help="torch threads per run (0: 1 on cpu, else cores / workers).")
@click.option("--steps", type=int, default=None, help="Override the scale's step budget.")
@click.option("--backbone", "backbones", multiple=True, type=click.Choice(("mamba", "patchtst")),
              help="Restrict to these backbones (default: both).")
@click.option("--variant", "variants", multiple=True,
              type=click.Choice(("free", "rmsnorm", "preln", "periln", "linear")),
              help="Restrict to these variants (default: all).")
@click.option("--horizon", "horizons", multiple=True, type=int, help="Override the scale's horizons.")
@click.option("--depth", "depths", multiple=True, type=int, help="Override the scale's depths.")
@click.option("--seeds", "n_seeds", type=int, default=None, help="Override the number of seeds (0..N-1).")
@click.option("--no-progress", is_flag=True, help="Plain log lines instead of a progress bar.")
@click.option("--no-figures", is_flag=True, help="Skip the PNG figures.")
def grid(scale, data, out, device, bf16, shard, workers, threads, steps, backbones, variants, horizons, depths,
         n_seeds, no_progress, no_figures):
    """Train the grid (resumable: finished runs in OUT/runs.jsonl are skipped), then write
    Table 2 and the Figure 3/4 MSE plots."""
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
    out = Path(out or Path("results") / scale)
    configs = G.build_grid(sc, paths, device=device, bf16=bf16, steps=steps, backbones=backbones or None,
                           variants=variants or None, horizons=horizons or None, depths=depths or None,
                           n_seeds=n_seeds)
    if not configs:
        raise click.UsageError("the selection is empty")
    configs = G.shard(configs, k, n)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    log(f"qlint verify grid --scale {scale}: data {', '.join(paths)}; shard {k}/{n}; out {out}")
    error = None
    try:
        G.run_grid(configs, out, workers=workers, threads=threads, scale_name=scale,
                   progress=not no_progress and sys.stderr.isatty(), log=log)
    except G.GridError as exc:
        error = exc
    md = write_tables(out, title=f"scale {scale}")
    if not no_figures:
        try:
            from qlint.verify.figures import write_figures

            for p in write_figures(out):
                log(f"wrote {p}")
        except RuntimeError as exc:  # matplotlib missing
            log(str(exc))
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
    from qlint.verify.tables import write_tables

    md = write_tables(out)
    if not no_figures:
        try:
            from qlint.verify.figures import write_figures

            write_figures(out)
        except RuntimeError as exc:
            click.echo(str(exc), err=True)
    click.echo(md)


@command.command("figure1")
@click.option("--out", "out", type=click.Path(dir_okay=False), default="figure1.png", show_default=True)
@click.option("--c", "cs", type=float, multiple=True, default=(1.0,), show_default=True,
              help="Growth coefficient c (repeat for one panel each, e.g. --c 0.05 --c 1).")
@click.option("--r0", type=float, default=1.0, show_default=True)
@click.option("--depth", type=int, default=140, show_default=True, help="Largest layer index plotted.")
def figure1(out, cs, r0, depth):
    """Figure 1: r_{k+1} = r_k + c r_k^q for q in {0.5, 1, 2, 5} against the fp16/bf16/fp32
    maxima, with the overflow depth of each trajectory."""
    from qlint.verify.figures import LIMITS, figure1 as fig1

    try:
        depths = fig1(out, cs=cs, r0=r0, depth=depth)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    for c in cs:
        for q in (0.5, 1.0, 2.0, 5.0):
            cells = ", ".join(
                f"{name} at D={depths[(c, q, name)] if depths[(c, q, name)] is not None else '>10000'}"
                for name in LIMITS
            )
            click.echo(f"c={c:g} q={q:g}: overflows {cells}")
    click.echo(f"wrote {out}")
