"""``qlint check SPEC...``: trace, certify and report; exit 0 / 1 / 2.

Settings come from ``[tool.qlint]`` (see docs/ci.md) with the command-line flags on
top; a bare ``qlint`` checks the configured ``models``. Findings then go through rule
selection, ``per-block-ignores`` and ``# qlint: noqa`` comments, and the baseline.
Exit codes: 0 when no remaining finding reaches ``--fail-on`` (or ``--exit-zero``,
or ``--write-baseline``), 1 when one does (also when another model could not be
analysed: that one is reported as failed), 2 when qlint could not run, or could not
analyse a model and no finding fails the run. Every other model is still analysed and
reported; the models run in supervised worker processes, so nothing a model's code does
(``sys.exit``, ``os._exit``, a crash, a print) changes this.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

import click

from qlint.ci.formats import OUTPUT_FORMATS
from qlint.cli import width_option
from qlint.cli.failures import fail_cleanly



def _codes(values: tuple[str, ...]) -> Optional[list[str]]:
    """``("QL1,QL2", "QL3")`` -> ``["QL1", "QL2", "QL3"]``; None when not given."""
    if not values:
        return None
    return [code.strip() for value in values for code in value.split(",") if code.strip()]


@click.command("check")
@click.argument("specs", nargs=-1, metavar="SPEC...")
@click.option("--format", "--output-format", "output_format", type=click.Choice(OUTPUT_FORMATS), default=None,
              envvar="QLINT_OUTPUT_FORMAT", show_envvar=True,
              help="Report format (default: full, or output-format in [tool.qlint]).")
@click.option("-o", "--output-file", type=click.Path(dir_okay=False), default=None,
              help="Write the report to this file instead of stdout (a summary still goes to stderr).")
@click.option("--output", "extra_outputs", multiple=True, metavar="FORMAT:PATH",
              help="Also write the report in FORMAT to PATH, e.g. sarif:qlint.sarif (repeatable).")
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule instead of the findings.")
@click.option("--exit-zero", is_flag=True,
              help="Exit 0 even when findings fail the run (2 still means qlint could not run).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "info"]), default=None,
              help="Lowest severity that makes the run fail (default: error).")
@click.option("--select", multiple=True, metavar="CODES",
              help="Rule codes or prefixes to enable (comma-separated; replaces the selection).")
@click.option("--extend-select", multiple=True, metavar="CODES",
              help="Rule codes or prefixes to enable on top of the selection.")
@click.option("--ignore", multiple=True, metavar="CODES", help="Rule codes or prefixes to disable.")
@click.option("--baseline", type=click.Path(dir_okay=False), default=None,
              help="Report only findings not recorded in this baseline file.")
@click.option("--write-baseline", type=click.Path(dir_okay=False), default=None,
              help="Record the current findings in this baseline file and exit 0.")
@click.option("--prune-baseline", is_flag=True,
              help="Drop the baseline's entries that match no finding (rewrites the baseline file).")
@click.option("--config", "config_args", multiple=True, metavar="PATH | KEY=VALUE",
              help="A config file to use instead of discovery, or an inline TOML override such as \"fail-on = "
                   "'warning'\".")
@click.option("--isolated", is_flag=True, help="Ignore every configuration file.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="2,96,7",
              help="Shape of an example input, replacing the factory's example inputs (repeatable: one per input).")
@click.option("--input-dtype", default=None, help="dtype of the --input-shape tensors (default: float32).")
@click.option("--mode", type=click.Choice(["train", "eval"]), default=None,
              help="Analyse in this mode (default: the model's own).")
@click.option("--tracer", type=click.Choice(["symbolic_trace", "export", "make_fx"]), default=None,
              help="Use only this tracer; if it fails the model is not analysed (exit 2). Default: symbolic_trace, "
                   "then export, then make_fx.")
@click.option("--device", default=None, help="Build and trace on this device, e.g. `meta` (no weights in memory).")
@click.option("--full-size", is_flag=True,
              help="Build catalogue specs (hf:, timm:, torchvision:) at the library's sizes, not shrunk "
                   "(with --device meta for a large model).")
@click.option("--threshold", type=float, default=None, help="Largest certified exponent q (default: 1.0).")
@click.option("--show-derivation", is_flag=True, help="Print the derivation of every block, not only failing ones.")
@click.option("--show-remedies", is_flag=True,
              help="Propose changes that certify each failing block, each re-checked (re-analyses per candidate).")
@click.option("--diff", "show_diff", is_flag=True,
              help="Print, as unified diffs `git apply` takes, the source patches that certify failing blocks, each "
                   "re-checked on the patched source; exit 1 when there is one, 0 when there is none.")
@click.option("--fix", is_flag=True,
              help="Apply those re-checked source patches to your files (atomically), then lint again; a patch "
                   "that changes what the model computes only with --unsafe-fixes.")
@click.option("--unsafe-fixes", is_flag=True, default=None,
              help="Let --fix apply patches that change the function the model computes (a norm added, an "
                   "activation replaced: trained weights do not carry over); also `unsafe-fixes = true`.")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              help="Colour the full report: auto (a terminal, unless NO_COLOR is set; FORCE_COLOR forces it), always, "
                   "never.")
@width_option
@click.option("-q", "--quiet", is_flag=True, help="Print the findings only: no tables, derivations or summary.")
@click.option("-v", "--verbose", is_flag=True,
              help="Also print, for each model, the tracer used, the tracers tried and the graph check.")
@click.option("--show-settings", is_flag=True,
              help="Print the effective settings (config file, models, enabled rules) and exit.")
@click.option("--add-noqa", is_flag=True,
              help="Append `# qlint: noqa: CODES` to the line of every finding in this repository, and exit 0.")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Analyse this many models at once, in worker processes (0: one per CPU).")
@click.option("--no-cache", is_flag=True, default=None,
              help="Neither read nor write the result cache (also QLINT_NO_CACHE=1).")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the result cache here (default: .qlint_cache at the project root; also QLINT_CACHE_DIR).")
@click.option("--no-witness", "no_witness", is_flag=True, default=None,
              help="Do not measure the certified blocks and the model before certifying them (the witness, QL107).")
@click.option("--witness-budget", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds the witness may spend on one model (default: 10).")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Seconds one model may take before it is stopped and reported as failed (default: 1200; 0: none).")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show the Python traceback of a failure.")
def command(
    specs: tuple[str, ...],
    output_format: Optional[str],
    output_file: Optional[str],
    extra_outputs: tuple[str, ...],
    statistics: bool,
    exit_zero: bool,
    fail_on: Optional[str],
    select: tuple[str, ...],
    extend_select: tuple[str, ...],
    ignore: tuple[str, ...],
    baseline: Optional[str],
    write_baseline: Optional[str],
    prune_baseline: bool,
    config_args: tuple[str, ...],
    isolated: bool,
    input_shapes: tuple[str, ...],
    input_dtype: Optional[str],
    mode: Optional[str],
    tracer: Optional[str],
    device: Optional[str],
    full_size: bool,
    threshold: Optional[float],
    show_derivation: bool,
    show_remedies: bool,
    show_diff: bool,
    fix: bool,
    unsafe_fixes: Optional[bool],
    color: str,
    width: Optional[int],
    quiet: bool,
    verbose: bool,
    show_settings: bool,
    add_noqa: bool,
    jobs: int,
    no_cache: Optional[bool],
    cache_dir: Optional[str],
    no_witness: Optional[bool],
    witness_budget: Optional[float],
    timeout: Optional[float],
    show_traceback: bool,
) -> None:
    """Trace each SPEC (path/model.py:build_model, pkg.module:attr, or hf:NAME / timm:NAME / torchvision:NAME)
    and certify its blocks.

    Without SPEC, checks the `models` listed in [tool.qlint] (pyproject.toml).
    """
    with fail_cleanly(show_traceback):
        outputs = [parse_output(value) for value in extra_outputs]
        config = _configure(
            specs, config_args, isolated,
            select=_codes(select), extend_select=_codes(extend_select), ignore=_codes(ignore),
            fail_on=fail_on, threshold=threshold, mode=mode, tracer=tracer, device=device,
            input_dtype=input_dtype, input_shapes=list(input_shapes) or None,
            output_format=output_format, baseline=baseline, no_cache=no_cache, cache_dir=cache_dir,
            witness=None if no_witness is None else not no_witness, witness_budget=witness_budget, timeout=timeout,
        )  # fmt: skip
        if full_size:
            from qlint.catalogue import with_full_size

            config.models = [with_full_size(spec) for spec in config.models]
        if show_settings:
            click.echo(config.describe())
            sys.exit(0)
        _check_writable(output_file, outputs, write_baseline, config.output_format)  # before the analysis, not after
        if show_diff or fix:
            patched, failed = _source_fixes(config, write=fix, verbose=verbose,
                                            unsafe=config.unsafe_fixes if unsafe_fixes is None else unsafe_fixes)
            if show_diff:
                sys.exit(1 if patched else 2 if failed else 0)
        report = _analyse(config, remedies=show_remedies, show_traceback=show_traceback, verbose=verbose,
                          jobs=jobs or os.cpu_count() or 1)
        if show_remedies:
            _attach_source_patches(config, report)
        if verbose:
            for model in report.models:
                tried = "; ".join(model.extra.get("trace_attempts", [])) or "none before it"
                replayed = "; replayed from the result cache" if model.spec in report.from_cache else ""
                if model.extra.get("layers_replayed"):
                    replayed += f"; {model.extra['layers_replayed']} layer(s) copied from an identical traced one"
                if model.extra.get("layer_reuse_abandoned"):
                    replayed += f"; identical layers traced one by one ({model.extra['layer_reuse_abandoned']})"
                click.echo(f"qlint: {model.spec}: tracer {model.tracer or '-'} (failed before it: {tried}); "
                           f"graph {model.extra.get('graph_check', '-')}{replayed}", err=True)
        if add_noqa:
            from qlint.ci.suppress import add_noqa as add

            lines, files = add(report)
            click.echo(f"qlint: added a noqa to {lines} line(s) in {files} file(s)", err=True)
            sys.exit(2 if report.failures else 0)
        if write_baseline is not None and not report.failures:
            from qlint.ci.baseline import write_baseline as write

            count = write(report, write_baseline)
            click.echo(f"qlint: wrote {count} finding(s) to {write_baseline}", err=True)
        elif config.baseline is not None:
            report = _apply_baseline(report, config.baseline, prune=prune_baseline)
        elif prune_baseline:
            raise click.UsageError("--prune-baseline needs a baseline (--baseline PATH or baseline = ... in "
                                   "[tool.qlint])")
        from qlint.ci.formats import summary_line, write_output

        options = {"color": _color(color), "quiet": quiet, "width": width}
        if not (len(report.failures) == len(report.models) and config.output_format in ("full", "concise")
                and output_file is None):
            # else only the errors
            _write(report, config.output_format, output_file, statistics, show_derivation, write_output, **options)
        for fmt, path in outputs:
            _write(report, fmt, path, statistics, show_derivation, write_output)
        if output_file is not None or (outputs and config.output_format != "full"):
            written = ", ".join(f"{fmt} to {path}" for fmt, path in [(config.output_format, output_file), *outputs]
                                if path)
            click.echo(f"qlint: {summary_line(report)} Wrote {written}.", err=True)
    failing = not exit_zero and write_baseline is None and any(config.fails(f.severity) for f in report.findings)
    if report.failures:
        for model in report.failures:
            click.echo(f"qlint: error: {model.failure_line()}", err=True)
        if write_baseline is not None:
            click.echo(f"qlint: error: {write_baseline} not written: a baseline of a run where a model failed would "
                       "drop its entries", err=True)
        sys.exit(1 if failing else 2)  # findings that fail the run decide; else a model not analysed is exit 2
    if failing:
        sys.exit(1)
    sys.exit(0)


def _source_fixes(config: Any, *, write: bool, verbose: bool, unsafe: bool) -> tuple[int, int]:
    """Print (``--diff``) or write (``--fix``) the re-certified patches of every model: how many patches,
    and how many models could not be analysed (each named in one line; the others still get theirs).
    A patch that changes the function the model computes is written only when ``unsafe`` (``--unsafe-fixes``,
    as in ruff): the count held back is said."""
    from qlint.core.errors import QlintError
    from qlint.fixes import FixError, isolated_patches, repository_root, write_patch

    root = repository_root()
    chosen: dict[str, tuple[str, Any]] = {}  # path -> (spec, patch)
    failed = 0
    for spec in config.models:
        try:
            fixes = isolated_patches(config, spec, root)
        except FixError:
            raise
        except Exception as exc:  # this model's failure: the others still get their patches
            click.echo(f"qlint: error: {exc}" if isinstance(exc, QlintError) else
                       f"qlint: error: {spec}: {type(exc).__name__}: {exc}", err=True)
            failed += 1
            continue
        for patch in fixes.patches:
            if patch.path in chosen and chosen[patch.path][1].patched != patch.patched:
                click.echo(f"qlint: {spec}: {patch.path} is patched for {chosen[patch.path][0]} already; run again "
                           "after applying it", err=True)
                continue
            chosen[patch.path] = (spec, patch)
        for block, reasons in fixes.unpatched.items():
            messages = {reason.split(": ", 1)[-1] for reason in reasons}  # "kind: why"; one why said once
            why = messages.pop() if len(messages) == 1 else "; ".join(reasons)
            click.echo(f"qlint: {spec}: no patch certifies block `{block}`: {why}", err=True)
            for sketch in fixes.prose.get(block, ()):
                click.echo(f"qlint: {spec}: block `{block}`, by hand (re-checked on the graph): {sketch}", err=True)
        if verbose:
            for block, reasons in fixes.dropped.items():
                click.echo(f"qlint: {spec}: block `{block}`: better-ranked remedies passed over: {'; '.join(reasons)}",
                           err=True)
    held_back = 0
    for spec, patch in chosen.values():
        what = f"{', '.join(patch.kinds)} certifies {', '.join(f'`{b}`' for b in patch.blocks)}"
        if patch.unsafe and not write:
            what += " (unsafe: it changes what the model computes, and trained weights do not carry over)"
        if write and patch.unsafe and not unsafe:
            held_back += 1
            continue
        if write:
            try:
                write_patch(root, patch)
            except FixError as exc:
                click.echo(f"qlint: error: {exc}", err=True)
                continue
            click.echo(f"qlint: fixed {patch.path} ({what})", err=True)
        else:
            click.echo(f"# {spec}: {what}, re-checked on the patched source", err=True)
            click.echo(patch.diff, nl=False)
    if held_back:
        click.echo(f"qlint: {held_back} unsafe fix(es) held back: each changes what the model computes (trained "
                   "weights do not carry over); see them with --diff, apply them with --fix --unsafe-fixes", err=True)
    return len(chosen), failed


def _attach_source_patches(config: Any, report: Any) -> None:
    """With --show-remedies, the re-certified source patches of each model's failing blocks (when
    libcst is installed and the blocks' code is in this repository); a model whose patches cannot be
    computed keeps its prose remedies."""
    try:
        import libcst  # noqa: F401
    except ImportError:
        return
    from qlint.fixes import attach_patches, isolated_patches, repository_root

    root = repository_root()
    for model in report.models:
        if model.failure or all(b.status == "ok" for b in model.blocks):
            continue
        try:
            attach_patches(model, isolated_patches(config, model.spec, root))
        except Exception as exc:  # the analysis itself succeeded: its report stands
            click.echo(f"qlint: {model.spec}: no source patches: {type(exc).__name__}: {exc}", err=True)


def _apply_baseline(report: Any, path: Path, *, prune: bool) -> Any:
    """Accept the baselined findings; report stale entries, or drop them with --prune-baseline."""
    from qlint.ci.baseline import filter_new, prune_baseline

    report = filter_new(report, path)
    stale = sum(entry["count"] for entry in report.stale_baseline)
    if prune and report.failures:
        click.echo(f"qlint: error: {path} not pruned: entries of the model that failed would be dropped", err=True)
    elif prune:
        prune_baseline(report, path)
        click.echo(f"qlint: pruned {stale} stale entr{'y' if stale == 1 else 'ies'} from {path}", err=True)
    elif stale:
        click.echo(f"qlint: warning: {stale} baseline entr{'y' if stale == 1 else 'ies'} in {path} match no finding "
                   "(fixed, or changed beyond recognition): drop them with --prune-baseline", err=True)
    return report


def parse_output(value: str) -> tuple[str, str]:
    """``"sarif:qlint.sarif"`` -> ``("sarif", "qlint.sarif")``; a usage error names the mistake."""
    fmt, sep, path = value.partition(":")
    if not sep or not path or fmt not in OUTPUT_FORMATS:
        raise click.BadParameter(
            f"expected FORMAT:PATH with FORMAT one of {', '.join(OUTPUT_FORMATS)}, got {value!r}",
            param_hint="'--output'",
        )
    return fmt, path


def _configure(specs: tuple[str, ...], config_args: tuple[str, ...], isolated: bool, **flags: Any) -> Any:
    from qlint.api import configure

    files = [a for a in config_args if not _is_inline(a)]
    inline = [a for a in config_args if _is_inline(a)]
    if len(files) > 1:
        raise click.UsageError("--config PATH may be given once (inline KEY = VALUE overrides may repeat)")
    config = configure(list(specs) or None, config=files[0] if files else None, isolated=isolated, overrides=inline,
                       **flags)
    if not config.models:
        raise click.UsageError(
            "give at least one SPEC, e.g. `qlint fixtures/mamba.py:native`, "
            "or list them in pyproject.toml: [tool.qlint] models = [...]"
        )
    return config


def _is_inline(arg: str) -> bool:
    """``--config`` takes a file, or ``KEY = VALUE`` TOML when no such file exists (as ruff)."""
    return "=" in arg and not Path(arg).is_file()


def _check_writable(output_file: Optional[str], outputs: list[tuple[str, str]], write_baseline: Optional[str],
                    output_format: str) -> None:
    """Every file the run will write, checked before any model is analysed: parent folders are
    created (as ruff does), a folder or an unwritable place is an error naming the path."""
    from qlint.ci.files import prepare_output

    if output_file is not None:
        prepare_output(output_file, what=f"the {output_format} report")
    for fmt, path in outputs:
        prepare_output(path, what=f"the {fmt} report")
    if write_baseline is not None:
        prepare_output(write_baseline, what="baseline")


def _analyse(config: Any, *, remedies: bool, show_traceback: bool, verbose: bool, jobs: int) -> Any:
    """Every model, each failure kept in the report (and its traceback printed with --traceback).

    The models run in supervised worker processes (``-j 1``: one), never in this process,
    which owns stdout and the exit code: a model that exits, prints or dies is reported as that
    model's failure, the same under every ``-j``."""
    from qlint.api import analyse_configured

    def note(level: str, text: str) -> None:
        if level == "warning":
            click.echo(f"qlint: warning: {text}", err=True)
        elif verbose:
            click.echo(f"qlint: {text}", err=True)

    def print_traceback(spec: str, exc: BaseException) -> None:
        if not show_traceback:
            return
        if hasattr(exc, "traceback_text"):  # raised in a --jobs worker process
            click.echo(exc.traceback_text, err=True, nl=False)
        else:
            traceback.print_exception(type(exc), exc, exc.__traceback__)

    report = analyse_configured(config, remedies=remedies, jobs=jobs, on_failure=print_traceback, supervised=True,
                                faulthandler=show_traceback, on_note=note)
    if show_traceback:  # a rule that crashed is a finding; its traceback is kept in the model's extra
        for model in report.models:
            for error in model.extra.get("internal_errors", []):
                click.echo(f"qlint: {model.spec}: {error['code']}: {error['message']}\n{error['traceback']}", err=True,
                           nl=False)
    return report


def _write(report: Any, fmt: str, output_file: Optional[str], statistics: bool, show_derivation: bool,
           write_output: Any,
           *, color: Optional[bool] = None, quiet: bool = False, width: Optional[int] = None) -> None:
    if quiet and fmt in ("full", "concise") and not statistics:
        fmt, options = "concise", {"summary": False}
    else:
        options = {"show_all_derivations": show_derivation, "width": width} if fmt == "full" else {}
    write_output(report, fmt, output_file=output_file, statistics=statistics, color=color, **options)


def _color(choice: str) -> Optional[bool]:
    """--color: always / never; auto is a terminal, turned off by NO_COLOR and on by FORCE_COLOR."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None
