"""The ``qlint`` command: a thin click layer over the Python API.

Subcommands live in ``qlint.cli.<name>`` and are imported only when invoked,
so ``qlint --help`` never imports torch. ``qlint SPEC ...`` means ``qlint check SPEC ...``.
"""

from __future__ import annotations

import difflib
import importlib
import warnings

import click

from qlint._version import __version__

# Warnings raised inside torch and the model libraries while qlint imports, traces or probes a
# model (torch's "Failed to initialize NumPy" where numpy is absent, its deprecations) are about
# their internals, not the user's model: a CI log shows qlint's report and nothing else. Set when
# the CLI is imported, so --jobs worker processes (which import it again) are quiet too.
THIRD_PARTY_MODULES = r"(torch|torchvision|transformers|timm|huggingface_hub|safetensors|numpy|sympy)(\.|$)"
warnings.filterwarnings("ignore", module=THIRD_PARTY_MODULES)

# name -> (module in qlint.cli, one-line help shown by ``qlint --help``)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "Trace models and certify every residual block (default)."),
    "explain": ("explain", "Print a rule's documentation, e.g. `qlint explain QL101`."),
    "rules": ("rules", "Print the primitive catalogue (Table 1 and beyond)."),
    "coverage": ("coverage", "List the ops a model uses and whether the registry knows them."),
    "probe": ("probe", "Measure each block's growth exponent and the stability bounds."),
    "verify": ("verify", "Reproduce the reference experiments (training blow-ups vs q)."),
    "clean": ("clean", "Remove the result cache (.qlint_cache)."),
}


def width_option(command: click.Command) -> click.Command:
    """``--width N`` for the commands that print rich tables (check, probe, coverage, rules)."""
    return click.option(
        "--width", type=click.IntRange(min=20), default=None, metavar="N",
        help="Lay the report out at N columns, wrapping messages at word boundaries (default: the terminal's "
             "width; off a terminal, tables fit COLUMNS or 200 columns and messages are never wrapped).",
    )(command)


class QlintGroup(click.Group):
    """A group whose subcommands load lazily and whose default subcommand is ``check``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, _ = SUBCOMMANDS[name]
        try:
            module = importlib.import_module(f"qlint.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"qlint.cli.{module_name}":
                return None
            raise
        return module.command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] not in SUBCOMMANDS and not args[0].startswith("-"):
            guess = difflib.get_close_matches(args[0], SUBCOMMANDS, n=1, cutoff=0.75)
            if guess and not any(c in args[0] for c in ":./\\"):  # `qlint expain` is a typo, not a module named expain
                raise click.UsageError(f"no such command '{args[0]}'; did you mean '{guess[0]}'?")
            args = ["check", *args]
        return super().resolve_command(ctx, args)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # A bare `qlint` (or `qlint --format json`) checks the models in [tool.qlint]; while
        # completing a word (resilient parsing) an empty line still offers the subcommands.
        if ((not args and not ctx.resilient_parsing)
                or (args and args[0].startswith("-") and args[0] not in ("--help", "-h", "--version"))):
            args = ["check", *args]
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in SUBCOMMANDS.items()])


@click.group(cls=QlintGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qlint")
def main() -> None:
    """qlint certifies that every residual block of a PyTorch model grows at most
    linearly in its input (q <= 1), the sublinear-growth principle.

    \b
    Examples:
      qlint fixtures/mamba.py:native            # q = 5, with its derivation
      qlint check mypkg.model:build_model --format json
      qlint explain QL101
    """
