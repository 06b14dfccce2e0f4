"""What qlint.monitor costs a training run of ``qlint verify grid``.

The same run (the ``small`` preset on ETTh1, one seed, a shortened step budget) is trained with
the monitor measuring the fixed batch at evaluations only (``monitor_every=0``) and every N steps;
the two alternate, ``--repeat`` pairs, each in a fresh process on one thread. Figures: CPU seconds
per run (user + sys of the child, which other work on a shared machine does not inflate), their
median, and the median per-pair ratio. The training itself is identical either way (the monitor
runs under a forked RNG, in eval mode, without gradients; ``tests/verify`` checks it).

    python bench/bench_monitor.py [--backbone mamba] [--depth 8] [--steps 200] [--every 25] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = """
import dataclasses, sys
from qlint.verify import grid as G
from qlint.verify.data import default_data_path
from qlint.verify.train import train_run
backbone, depth, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = G.build_grid(G.SCALES["small"], [default_data_path()], backbones=[backbone], variants=["free"], horizons=[96],
                   depths=[depth], seeds=[0], steps=steps, monitor_every=every)[0]
train_run(dataclasses.replace(cfg, threads=1))
"""


def cpu_seconds(args: list[str]) -> float:
    """User + sys CPU of one child process running CHILD with ``args``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the run failed: {args}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="mamba", choices=("mamba", "patchtst"))
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--repeat", type=int, default=2)
    options = parser.parse_args()
    common = [options.backbone, str(options.depth), str(options.steps)]
    pairs = [(cpu_seconds(common + ["0"]), cpu_seconds(common + [str(options.every)])) for _ in range(options.repeat)]
    quiet, watched = [p[0] for p in pairs], [p[1] for p in pairs]
    print(f"{options.backbone} L={options.depth}, {options.steps} steps, {options.repeat} pairs (CPU s):")
    print(f"  monitor at evaluations only: {', '.join(f'{t:.1f}' for t in quiet)} (median {statistics.median(quiet):.1f})")
    print(f"  monitor every {options.every} steps: {', '.join(f'{t:.1f}' for t in watched)} "
          f"(median {statistics.median(watched):.1f})")
    print(f"  ratio (median per pair): {statistics.median(w / q for q, w in pairs):.3f}")


if __name__ == "__main__":
    main()
