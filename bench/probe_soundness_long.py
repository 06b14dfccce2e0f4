"""Longer run of the probe's soundness law (tests/test_soundness.py runs a bounded one).

    .venv/bin/python bench/probe_soundness_long.py --minutes 5

Draws random residual architectures (qlint.probe.architectures) for the given time
and, for each, compares the measured exponent of every block with the static one:
a measured exponent above static + tolerance is a soundness failure; on a tight
architecture a measured exponent below static - tolerance is a tightness failure;
samples that overflowed are counted apart. Failures are printed (not shrunk) and
the exit status is 1 when there is any.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from hypothesis import HealthCheck, given, settings

from qlint.probe.measure import ProbeSettings, measure_model
from qlint.probe.architectures import architectures, build


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-leaves", type=int, default=8)
    parser.add_argument("--directions", type=int, default=4, help="random directions per block")
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    probe_settings = ProbeSettings(random_directions=arguments.directions)
    deadline = time.monotonic() + 60 * arguments.minutes
    counts = {"examples": 0, "tight": 0, "unsound": 0, "not tight": 0, "overflowed samples": 0, "static differs from reference": 0}

    @settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(architectures(arguments.max_leaves))
    def run(architecture):
        if time.monotonic() > deadline:
            return
        expression, seed = architecture
        model, inputs = build(expression, seed)
        blocks = measure_model(model, inputs, probe_settings)
        counts["examples"] += 1
        counts["tight"] += expression.tight()
        for block in blocks:
            if block.failed_samples:
                counts["overflowed samples"] += 1
            if block.q_static != expression.exponent():
                counts["static differs from reference"] += 1
            if block.agrees is False:
                counts["unsound"] += 1
                print(f"UNSOUND {block.name}: static {block.q_static}, measured max {block.q_measured_max:.3f}: {expression!r} seed {seed}", flush=True)
            elif expression.tight() and block.agreement != "exact":
                counts["not tight"] += 1
                print(f"NOT TIGHT {block.name}: static {block.q_static}, measured max {block.q_measured_max}: {expression!r} seed {seed}", flush=True)

    while time.monotonic() < deadline:
        run()
    print(", ".join(f"{name}: {count}" for name, count in counts.items()))
    return 1 if counts["unsound"] or counts["not tight"] else 0


if __name__ == "__main__":
    sys.exit(main())
