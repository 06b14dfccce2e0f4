"""``qlint rules``: the primitive catalogue (Table 1 and beyond) as a table."""

from __future__ import annotations

import json
from typing import Optional

import click

from qlint.cli import width_option


@click.command("rules")
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
@click.option("--table1", is_flag=True, help="Only the rows of the paper's Table 1.")
@width_option
def command(as_json: bool, table1: bool, width: Optional[int]) -> None:
    """Print every primitive qlint knows: its exponent q, coefficient and why it holds.

    Read from rules/primitives/*.toml without importing torch.
    """
    from qlint.registry import entries

    primitives = [p for p in entries() if p.get("table1") or not table1]
    if as_json:
        rows = [{"id": p["id"], "primitive": p["name"], "q": str(p["q"]), "coefficient": p.get("coefficient", ""),
                 "table1": bool(p.get("table1")), "why": " ".join(p["why"].split()), "ops": list(p.get("ops", [])),
                 "targets": list(p.get("targets", [])) + [f"module:{m}" for m in p.get("modules", [])],
                 "source": p["source"]}
                for p in primitives]
        click.echo(json.dumps(rows, indent=2))
        return
    from qlint.ci.render import fit_cells, make_console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="qlint primitive catalogue (★ = a row of Table 1 of the paper: README, Sources)",
                  show_lines=True)
    table.add_column("primitive", style="bold")
    table.add_column("q", justify="center")
    table.add_column("coefficient c")
    table.add_column("justification")
    for p in primitives:
        cells = (("★ " if p.get("table1") else "") + p["name"], str(p["q"]), p.get("coefficient", ""),
                 " ".join(p["why"].split()))
        table.add_row(*map(escape, cells))  # "[lo, hi]" is text, not rich markup
    make_console(width=width).print(fit_cells(table))
