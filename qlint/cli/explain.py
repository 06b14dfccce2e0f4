"""``qlint explain CODE``: a rule's documentation, like ``ruff rule``."""

from __future__ import annotations

import sys

import click


@click.command("explain")
@click.argument("code", required=False)
@click.option("--all", "show_all", is_flag=True, help="Print every rule.")
def command(code: str | None, show_all: bool) -> None:
    """Print what rule CODE checks, why, an example and what to use instead."""
    from rich.console import Console
    from rich.markdown import Markdown

    from qlint.lint.rule import rules as all_rules

    rules = all_rules()
    if show_all:
        codes = sorted(rules)
    elif code:
        matches = [c for c in sorted(rules) if c.upper() == code.upper()]
        if not matches:
            click.echo(f"qlint: error: unknown rule {code!r}; known: {', '.join(sorted(rules))}", err=True)
            sys.exit(2)
        codes = matches
    else:
        raise click.UsageError("give a rule code, e.g. `qlint explain QL101`, or --all")
    console = Console()  # prose: rich's 80 columns off a terminal read well
    for rule_code in codes:
        console.print(Markdown(rules[rule_code].doc()))
