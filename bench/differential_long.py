"""The differential soundness law for minutes (tests/probe/test_differential.py runs 100 examples).

    .venv/bin/python bench/differential_long.py --minutes 10

Draws random blocks (qlint.probe.differential) for the given time and, for each one qlint
certifies, measures the eager velocity's growth under adversarial directions and
parameter values. Prints the counts (examples, certified, refused by verdict, violations)
and every violation; exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from qlint.probe.differential import check, examples  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--depth", type=int, default=4, help="recipe size (leaves / 2)")
    parser.add_argument("--full", action="store_true", help="every witness direction and perturbation (slower)")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    deadline = time.monotonic() + 60 * arguments.minutes
    counts: collections.Counter = collections.Counter()
    violations = []

    class TimeUp(Exception):
        pass

    @settings(max_examples=10**9, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(examples(arguments.depth))
    def run(example):
        if time.monotonic() > deadline:
            raise TimeUp
        outcome = check(example, quick=not arguments.full)
        counts["examples"] += 1
        counts[outcome.verdict] += 1
        if not outcome.sound:
            violations.append(outcome)
            print(f"VIOLATION {example}: {outcome.violation}", flush=True)

    try:
        run()
    except TimeUp:
        pass
    elapsed = time.monotonic() - (deadline - 60 * arguments.minutes)
    print(f"{counts['examples']} examples in {elapsed:.0f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "examples")
          + f"; {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
