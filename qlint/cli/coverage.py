"""``qlint coverage SPEC...``: every op a model uses and whether the registry bounds it.

Exit codes: 0 when every op that can change a verdict is known, 1 when an unknown op
lies in a residual block's cone *and* is computed from X_k (that block is
uncertified), 2 when qlint could not run. Unknown ops elsewhere (attention masks,
position ids, the embedding, the head) are listed but do not fail the run: no
block's exponent depends on them.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import click

from qlint.cli import width_option
from qlint.cli.failures import fail_cleanly

STATUS_STYLE = {"known": "green", "declared": "cyan", "unknown": "yellow"}


@click.command("coverage")
@click.argument("specs", nargs=-1, required=True, metavar="SPEC...")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", help="Output format.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="2,96,7",
              help="Shape of an example input, replacing the factory's example inputs (repeatable: one per input).")
@click.option("--input-dtype", default=None, help="dtype of the --input-shape tensors (default: float32).")
@click.option("--mode", type=click.Choice(["train", "eval"]), default=None,
              help="Analyse in this mode (default: the model's own).")
@click.option("--tracer", type=click.Choice(["symbolic_trace", "export", "make_fx"]), default=None,
              help="Use only this tracer; if it fails the model is not analysed (exit 2). Default: symbolic_trace, "
                   "then export, then make_fx.")
@click.option("--device", default=None, help="Build and trace on this device, e.g. `meta` (no weights in memory).")
@click.option("--isolated", is_flag=True, help="Ignore every configuration file ([tool.qlint.primitives] included).")
@width_option
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the Python traceback of a failure.")
def command(
    specs: tuple[str, ...],
    output_format: str,
    input_shapes: tuple[str, ...],
    input_dtype: Optional[str],
    mode: Optional[str],
    tracer: Optional[str],
    device: Optional[str],
    isolated: bool,
    width: Optional[int],
    show_traceback: bool,
) -> None:
    """List the ops of each SPEC with the registry entry that bounds them.

    Exit 1 when an unknown op leaves a residual block uncertified (it lies in the
    block and depends on X_k); unknown ops that no block depends on are listed only.
    """
    with fail_cleanly(show_traceback):
        from qlint.api import models_to_run

        config = models_to_run(
            list(specs), isolated=isolated, mode=mode, tracer=tracer, device=device, input_dtype=input_dtype,
            input_shapes=list(input_shapes) or None,
        )  # fmt: skip
        coverages = [_coverage(spec, config) for spec in config.models]
    if output_format == "json":
        click.echo(json.dumps({"models": [c.to_dict() for c in coverages]}, indent=2))
    else:
        _print(coverages, width)
    sys.exit(1 if any(c.blocking for c in coverages) else 0)


def _coverage(spec: str, config: Any) -> Any:
    from qlint.analysis import run
    from qlint.api import model_code, prepare
    from qlint.coverage import model_coverage

    with model_code(spec):  # its prints go to stderr, its sys.exit() is an error naming it
        loaded, options = prepare(config, spec)
        with model_code(spec, "tracing the model (running its forward)"):
            return model_coverage(run(loaded.model, loaded.inputs, spec=spec, options=options))


def _print(coverages: list[Any], width: Optional[int]) -> None:
    from qlint.ci.render import fit_cells, make_console
    from rich.table import Table
    from rich.text import Text

    console = make_console(width=width)
    for coverage in coverages:
        table = Table(title=f"{coverage.spec}  [dim](tracer: {coverage.tracer})[/dim]", title_justify="left")
        table.add_column("op")
        table.add_column("count", justify="right")
        table.add_column("status")
        table.add_column("registry entry / blocks it leaves uncertified")
        for use in coverage.ops:
            detail = ", ".join(use.blocks) if use.blocking else "; ".join(use.entries)
            status = f"{use.status} (in blocks)" if use.blocking else use.status
            table.add_row(use.op, str(use.count),
                          Text(status, style="bold red" if use.blocking else STATUS_STYLE[use.status]), detail)
        console.print(fit_cells(table))
        unknown = [use for use in coverage.ops if use.status == "unknown"]
        console.print(
            f"{coverage.spec}: {len(coverage.ops)} op kinds, {len(unknown)} unknown, "
            f"{len(coverage.blocking)} of them in a residual block and computed from X_k"
        )
