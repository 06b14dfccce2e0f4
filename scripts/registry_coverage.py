"""How much of the IR qlint targets the primitive registry bounds.

Two op sets: the core ATen ops (an overload tagged ``torch.Tag.core``; torch.export
graphs are made of them, plus a few non-core composites the registry also keys) and
the ``torch.nn.functional`` functions fx records. Prints a table, or JSON with
``--format json``; ``--missing`` lists the ops without an entry.

    python scripts/registry_coverage.py [--format json] [--missing]
"""

from __future__ import annotations

import argparse
import json

import torch

from qlint.coverage import registry_coverage
from qlint.registry import default as load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--missing", action="store_true", help="list the ops that have no registry entry")
    args = parser.parse_args()
    sets = registry_coverage(load())
    if args.format == "json":
        print(json.dumps({"torch": torch.__version__, "sets": [s.to_dict() for s in sets]}, indent=2))
        return
    print(f"registry coverage (torch {torch.__version__})")
    print(f"{'op set':<40} {'covered':>8} {'total':>6} {'share':>7}")
    for op_set in sets:
        print(f"{op_set.name:<40} {len(op_set.covered):>8} {len(op_set.ops):>6} {op_set.share:>7.1%}")
    if args.missing:
        for op_set in sets:
            print(f"\nmissing from {op_set.name}:\n  " + " ".join(op_set.missing))


if __name__ == "__main__":
    main()
