"""How fast qlint is on real model sizes, and how much memory it needs.

For each model, in fresh subprocesses (so that every figure includes torch's cold
start, as a user sees it):

- ``export``: torch.export (non-strict) of the model alone: the bare trace;
- ``qlint``: ``qlint.analysis.run`` on the same model: trace + blocks + exponents + checks;
- ``overhead``: qlint / export - 1 (target: at most 50 %);
- ``CLI``: ``qlint SPEC --format json`` end to end (imports and model building included),
  its wall and CPU seconds and its peak RSS (target for the 7B config: < 15 s, < 2 GB).

Wall time on a shared machine counts other people's work; CPU time (user + sys of the
child) does not, and is the better estimate of the wall time on an idle machine.
Also times ``qlint --help`` (target < 0.5 s).

    python bench/bench_speed.py [--repeat 1] [--with-70b]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # label -> fixture spec
    "GPT-2 small (CPU)": "fixtures/hf.py:gpt2_small",
    "LLaMA-2-7B config (meta)": "fixtures/hf.py:llama_7b",
}
LARGE = {"LLaMA-2-70B config (meta)": "fixtures/hf.py:llama_70b"}

WORKER = """
import json, sys, time
from qlint.loader import load
loaded = load(sys.argv[2])
model, inputs = loaded.model, loaded.inputs
if sys.argv[1] == "export":
    import torch
    if hasattr(getattr(model, "config", None), "use_cache"):
        model.config.use_cache = False  # a KV cache object is not a valid export output
    wall, cpu = time.perf_counter(), time.process_time()
    torch.export.export(model, inputs, strict=False)
else:
    from qlint.analysis import Options, run
    wall, cpu = time.perf_counter(), time.process_time()
    run(model, inputs, spec=sys.argv[2], options=Options())
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))
"""


def measure(command: list[str]) -> dict:
    """Run a child; its stdout, exit code, wall seconds, CPU seconds and peak RSS (wait4)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"stdout": out.read(), "stderr": err.read(), "code": child.returncode, "wall": wall,
                "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


class Failed(Exception):
    """A child exited non-zero; the message is its last line of stderr."""


def timed_region(kind: str, spec: str) -> dict:
    """{"wall", "cpu"} seconds of the export alone or of qlint's whole analysis."""
    result = measure([sys.executable, "-c", WORKER, kind, spec])
    if result["code"] != 0:
        raise Failed(f"{kind}: {last_line(result['stderr'])}")
    return json.loads(result["stdout"].strip().splitlines()[-1])


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "no output"


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (the median is shown)")
    parser.add_argument("--with-70b", action="store_true", help="also the 70B config (about 2.5x the 7B time)")
    args = parser.parse_args()
    models = {**MODELS, **(LARGE if args.with_70b else {})}
    qlint = [sys.executable, "-m", "qlint"]
    rows = []
    for label, spec in models.items():
        try:
            export = [timed_region("export", spec) for _ in range(args.repeat)]
            analysis = [timed_region("qlint", spec) for _ in range(args.repeat)]
            cli = [measure([*qlint, spec, "--format", "json", "--isolated", "--exit-zero"]) for _ in range(args.repeat)]
            failed = [run for run in cli if run["code"] != 0]
            if failed:
                raise Failed(f"CLI: {last_line(failed[0]['stderr'])}")
        except Failed as failure:
            rows.append((label, str(failure)))
            continue
        rows.append((label, export, analysis, cli))
    helps = [measure([*qlint, "--help"])["wall"] for _ in range(max(args.repeat, 3))]

    print(f"qlint speed (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f};"
          f" median of {args.repeat}; wall / CPU seconds)")
    header = (f"{'model':<27} {'export':>12} {'qlint':>12} {'overhead':>9} {'CLI end to end':>15} {'peak RSS MB':>12}")
    print(header)
    print("-" * len(header))
    for label, *figures in rows:
        if len(figures) == 1:
            print(f"{label:<27} failed: {figures[0]}")
            continue
        export, analysis, cli = figures
        overhead = median(analysis, "cpu") / median(export, "cpu") - 1
        print(f"{label:<27} {median(export, 'wall'):>5.1f} / {median(export, 'cpu'):>4.1f} "
              f"{median(analysis, 'wall'):>5.1f} / {median(analysis, 'cpu'):>4.1f} {overhead:>9.0%} "
              f"{median(cli, 'wall'):>7.1f} / {median(cli, 'cpu'):>5.1f} {max(run['rss_mb'] for run in cli):>12.0f}")
    print("overhead = qlint CPU / export CPU - 1 (target <= 50 %); 7B CLI target < 15 s and < 2048 MB")
    print(f"qlint --help: {min(helps):.2f} s wall (best of {len(helps)}; target < 0.5 s)")


if __name__ == "__main__":
    main()
