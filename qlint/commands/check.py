"""``qlint check SPEC...``: trace, certify and report; exit 0 / 1 / 2."""

from __future__ import annotations

import json
import sys
from typing import Optional

import click

from qlint.commands import fail_cleanly


@click.command("check")
@click.argument("specs", nargs=-1, metavar="SPEC...")
@click.option("--format", "--output-format", "output_format", type=click.Choice(["full", "json"]), default="full", show_default=True, help="Report format.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="2,96,7", help="Shape of an example input when the spec gives none (repeatable).")
@click.option("--input-dtype", default="float32", show_default=True, help="dtype of the --input-shape tensors.")
@click.option("--mode", type=click.Choice(["train", "eval"]), default=None, help="Analyse in this mode (default: the model's own).")
@click.option("--tracer", type=click.Choice(["symbolic_trace", "export", "make_fx"]), default=None, help="Try this tracer first.")
@click.option("--device", default=None, help="Build and trace on this device, e.g. `meta` (no weights in memory).")
@click.option("--threshold", type=float, default=1.0, show_default=True, help="Largest certified exponent q.")
@click.option("--show-derivation", is_flag=True, help="Print the derivation of every block, not only failing ones.")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the Python traceback of a failure.")
def command(
    specs: tuple[str, ...],
    output_format: str,
    input_shapes: tuple[str, ...],
    input_dtype: str,
    mode: Optional[str],
    tracer: Optional[str],
    device: Optional[str],
    threshold: float,
    show_derivation: bool,
    show_traceback: bool,
) -> None:
    """Trace each SPEC (path/model.py:build_model or pkg.module:attr) and certify its blocks."""
    with fail_cleanly(show_traceback):
        from qlint.analysis import Options, check

        if not specs:
            raise click.UsageError("give at least one SPEC, e.g. `qlint fixtures/mamba.py:native`")
        options = Options(mode=mode, tracer=tracer, device=device, threshold=threshold, input_shapes=input_shapes, input_dtype=input_dtype)
        report = check(specs, options)
    if output_format == "json":
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        from qlint.render import print_report

        print_report(report, show_all_derivations=show_derivation)
    sys.exit(1 if report.count("error") else 0)
