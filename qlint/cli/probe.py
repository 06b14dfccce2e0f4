"""``qlint probe SPEC...``: measure each block's exponent and the stability bounds.

Exit 0 when every measured exponent is within its static bound, 1 when one is not, a
sample is inf or nan under a finite bound, or the traced graph stops computing what the
eager model computes (a soundness bug), 2 when a spec cannot be loaded, traced or probed.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Callable, Iterator, Optional

import click

from qlint.cli import width_option
from qlint.cli.failures import fail_cleanly


@click.command("probe")
@click.argument("specs", nargs=-1, metavar="SPEC...")
@click.option("--format", "--output-format", "output_format", type=click.Choice(["full", "json", "html"]),
              default="full", show_default=True,
              help="Report format (html: the page of `qlint --output-format html` with each block's measured growth).")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Also write the measured growth curves, one log-log panel per block beside the slope of its "
                   "static q, as a PNG (needs matplotlib: the plot extra).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random probe directions.")
@click.option("--directions", type=click.IntRange(min=0), default=8, show_default=True,
              help="Random directions per block (plus the worst-case ones: constant, alternating, one-hot and equal "
                   "rows, null spaces of the block's weights).")
@click.option("--tolerance", type=float, default=0.05, show_default=True, help="Absolute tolerance on exponents.")
@click.option("--no-perturb", "no_perturb", is_flag=True,
              help="Measure the parameters as built only (skip the redrawn, negated and scaled-up settings).")
@click.option("--iterations", type=click.IntRange(min=1), default=20, show_default=True,
              help="Power iterations for each Jacobian norm L_k.")
@click.option("--threads", type=click.IntRange(min=0), default=0,
              help="torch intra-op threads (0: torch's default); 1 is fastest for small models on a busy machine.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="2,96,7",
              help="Shape of an example input, replacing the factory's example inputs (repeatable: one per input).")
@click.option("--input-dtype", default=None,
              help="dtype of the --input-shape tensors (default: float32; probed in float64).")
@click.option("--mode", type=click.Choice(["train", "eval"]), default=None,
              help="Probe in this mode (default: the model's own).")
@click.option("--tracer", type=click.Choice(["symbolic_trace", "export", "make_fx"]), default=None,
              help="Use only this tracer; if it fails the model is not analysed (exit 2). Default: symbolic_trace, "
                   "then export, then make_fx.")
@click.option("--device", default=None, help="Build and probe on this device (not `meta`: probing needs weights).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="Use this config file instead of discovering pyproject.toml.")
@click.option("--isolated", is_flag=True, help="Ignore every configuration file.")
@click.option("--loop", "loop", is_flag=True,
              help="Instead, iterate each weight-shared loop to its fixed point: residuals, rho_spec(J_G), ||J_G||_2 "
                   "(after 'LayerNorm as Implicit Gain Control in Looped Transformers').")
@width_option
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the Python traceback of a failure.")
def command(
    specs: tuple[str, ...],
    output_format: str,
    seed: int,
    directions: int,
    tolerance: float,
    iterations: int,
    no_perturb: bool,
    threads: int,
    input_shapes: tuple[str, ...],
    input_dtype: Optional[str],
    mode: Optional[str],
    tracer: Optional[str],
    device: Optional[str],
    config_file: Optional[str],
    isolated: bool,
    width: Optional[int],
    show_traceback: bool,
    loop: bool,
    plot_file: Optional[str],
) -> None:
    """Evaluate each block's velocity at scaled inputs in float64, on the traced graph and on
    the model's own submodule, under the parameters as built and adversarial ones; fit its
    growth exponent over the top decades and compare it with the static q (an inf or nan
    sample under a finite q is a violation); estimate c_k, b_k, L_k and print
    the forward (eq. 38) and backward (eq. 39) bounds, the overflow depths per number format,
    initialization diagnostics and the init logs QL401-QL405 (max attention logit, attention
    entropy, min per-token spread, max carry, stream RMS growth; warnings, exit code unchanged)."""
    if loop and (plot_file is not None or output_format == "html"):
        raise click.UsageError("--plot and --format html draw the measured growth of blocks; --loop measures loops")
    with fail_cleanly(show_traceback):
        from qlint import api

        configured = dict(config=config_file, isolated=isolated, mode=mode, tracer=tracer, device=device,
                          input_shapes=list(input_shapes) or None, input_dtype=input_dtype)
        api.models_to_run(list(specs) or None, **configured)  # option and spec errors before torch is imported
        if plot_file is not None:
            _require_matplotlib()
        import torch

        from qlint.ci.render import make_console
        from qlint.probe.measure import ProbeSettings, as_report

        if threads:
            torch.set_num_threads(threads)
        if loop:
            from qlint.probe.loops import LoopSettings, as_json, print_loops

            loops = api.probe_loops(list(specs) or None, settings=LoopSettings(seed=seed), **configured)
            if output_format == "json":
                click.echo(json.dumps(as_json(loops), indent=2))
            else:
                print_loops(loops, make_console(width=width))
            sys.exit(0)
        settings = ProbeSettings(seed=seed, random_directions=directions, tolerance=tolerance,
                                 power_iterations=iterations, perturb=not no_perturb)
        with _progress(enabled=output_format == "full" and sys.stderr.isatty()) as on_block:
            results = api.probe(list(specs) or None, settings=settings, on_block=on_block, **configured)
        if plot_file is not None:
            _plot(results, plot_file)
    if output_format == "json":
        click.echo(json.dumps(as_report(results).to_dict(), indent=2))
    elif output_format == "html":
        from qlint.ci.formats import render

        click.echo(render(as_report(results), "html"), nl=False)
    else:
        from qlint.probe.report import print_probe

        print_probe(results, make_console(width=width))
    sys.exit(1 if any(result.unsound for result in results) else 0)


def _require_matplotlib() -> None:
    """Exit 2 with one line naming the extra, before any model is probed, when --plot cannot draw."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        click.echo("qlint: error: qlint probe --plot needs the [plot] extra (matplotlib is not installed): "
                   "pip install 'torch-qlint[plot]'", err=True)
        sys.exit(2)


def _plot(results: list, path: str) -> None:
    """Write the growth curves of every probed model to ``path``, one panel per block."""
    from qlint.core.curves import curves
    from qlint.probe.plot import write_png

    write_png([(result.report.spec, curve) for result in results for curve in curves(result.report)], path)


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int, str], None]]:
    """A transient progress bar over the blocks on stderr (only on a terminal)."""
    if not enabled:
        yield lambda done, total, name: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("probing blocks", total=None)

        def advance(done: int, total: int, name: str) -> None:
            progress.update(task, completed=done, total=total, description=f"probed {name}")

        yield advance
