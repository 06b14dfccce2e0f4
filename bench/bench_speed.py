"""How fast qlint is on real model sizes, against the capture everyone else pays for.

Every figure comes from fresh subprocesses measured in this one run (torch's cold start
included, as a user sees it), so the ratios compare like with like on a noisy machine:

- ``export``: torch.export (non-strict) of the model alone, the bare trace;
- ``qlint``: ``qlint.analysis.run`` on the same model (trace, blocks, exponents, checks);
- ``ratio``: qlint CPU / export CPU (target for the 7B config: <= 0.5);
- ``CLI``: ``qlint SPEC --format json --no-cache`` end to end, imports and model building
  included (target for the 70B config: < 10 s CPU), and its peak RSS;
- ``whole``: the CLI's CPU against a bare script's as whole processes, for the 7B config: the
  script imports torch and transformers, builds the same model on meta and exports it
  (``torch.export.export(..., strict=False)``), which is all a user would run without qlint; the
  two alternate, ``--repeat`` pairs, and the ratio is the median of the per-pair ratios (target
  <= 0.6). The in-process ``ratio`` above leaves out the imports both pay, and charges the
  export with the part of torch.export's imports that qlint makes before its timer starts;
- the result cache on the bundled fixtures: a miss (cold cache) and a hit (target < 0.5 s);
- ``qlint explain QL101`` (target < 0.3 s), ``qlint rules``, ``--help``, ``--version``.

CPU time is user + sys of the child (wait4), which other people's work on a shared machine
does not inflate; wall time is shown beside it. Medians over ``--repeat`` runs.

    python bench/bench_speed.py [--repeat 1] [--quick] [--models 70B]   # --quick: no 70B, no unrolled Mamba
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {  # label -> spec
    "GPT-2 small (CPU)": "fixtures/hf.py:gpt2_small",
    "LLaMA-2-7B config (meta)": "fixtures/hf.py:llama_7b",
    "LLaMA-2-70B config (meta)": "fixtures/hf.py:llama_70b",
    "Mamba, 8 blocks, 96-step scan": "bench/models.py:mamba_unrolled",
}
SLOW = ("LLaMA-2-70B config (meta)", "Mamba, 8 blocks, 96-step scan")
FIXTURES = ["fixtures/mamba.py:native", "fixtures/mamba.py:rmsnorm", "fixtures/mamba.py:preln",
            "fixtures/mamba.py:periln", "fixtures/mamba.py:linear_growth", "fixtures/gpt2.py:build_model"]

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


def measure(command: list[str], root: Path = ROOT) -> dict:
    """Run a child in ``root``; its stdout, stderr, exit code, wall seconds, CPU seconds (user + sys,
    its children included) and peak RSS (wait4)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=root, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"stdout": out.read(), "stderr": err.read(), "code": child.returncode, "wall": wall,
                "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


class Failed(Exception):
    """A child exited non-zero; the message is its last line of stderr."""


BARE_EXPORT = """
import torch, transformers
config = transformers.LlamaConfig(vocab_size=32000, max_position_embeddings=4096, hidden_size=4096,
                                  intermediate_size=11008,
                                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)
with torch.device("meta"):
    model = transformers.LlamaModel(config).eval()
model.config.use_cache = False  # a KV cache object is not a valid export output
torch.export.export(model, (torch.randint(0, 32000, (1, 8), device="meta"),), strict=False)
"""
# the model of the whole-process comparison; BARE_EXPORT builds it (fixtures/hf.py:llama_7b)
WHOLE = "LLaMA-2-7B config (meta)"


def whole_process(spec: str, repeat: int) -> list[tuple[float, float]]:
    """(bare script CPU, ``qlint SPEC`` CPU) per pair, the two run one after the other."""
    pairs = []
    for _ in range(repeat):
        bare = measure([sys.executable, "-c", BARE_EXPORT])
        if bare["code"] != 0:
            raise Failed(f"bare export: {last_line(bare['stderr'])}")
        qlint = cli(spec, "--format", "json", "--isolated", "--exit-zero", "--no-cache", repeat=1)[0]
        pairs.append((bare["cpu"], qlint["cpu"]))
    return pairs


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


def cli(*args: str, repeat: int) -> list[dict]:
    """``qlint ARGS`` ``repeat`` times; raises Failed on exit code 2."""
    runs = [measure([sys.executable, "-m", "qlint", *args]) for _ in range(repeat)]
    failed = [run for run in runs if run["code"] == 2]
    if failed:
        raise Failed(f"qlint {' '.join(args)}: {last_line(failed[0]['stderr'])}")
    return runs


def cache_runs(repeat: int) -> tuple[list[dict], list[dict]]:
    """Cold-cache runs (each in an empty cache) and warm ones, on the bundled fixtures."""
    misses, hits = [], []
    folder = Path(tempfile.mkdtemp(prefix="qlint-bench-cache-"))
    try:
        for _ in range(repeat):
            shutil.rmtree(folder / "cache", ignore_errors=True)
            misses += cli(*FIXTURES, "--format", "json", "--isolated", "--cache-dir", str(folder / "cache"), repeat=1)
            hits += cli(*FIXTURES, "--format", "json", "--isolated", "--cache-dir", str(folder / "cache"), repeat=1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return misses, hits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (the median is shown)")
    parser.add_argument("--quick", action="store_true", help="skip the 70B config and the unrolled Mamba")
    parser.add_argument("--models", default="", help="only the models whose label contains this text (e.g. 70B)")
    args = parser.parse_args()
    models = {label: spec for label, spec in MODELS.items()
              if not (args.quick and label in SLOW) and args.models.lower() in label.lower()}
    rows, ratios, ends = [], {}, {}
    for label, spec in models.items():
        try:
            export = [timed_region("export", spec) for _ in range(args.repeat)]
            analysis = [timed_region("qlint", spec) for _ in range(args.repeat)]
            end_to_end = cli(spec, "--format", "json", "--isolated", "--exit-zero", "--no-cache", repeat=args.repeat)
        except Failed as failure:
            rows.append(f"{label:<31} failed: {failure}")
            continue
        ratios[label] = median(analysis, "cpu") / median(export, "cpu")
        ends[label] = median(end_to_end, "cpu")
        rows.append(f"{label:<31} {median(export, 'cpu'):>7.2f} {median(analysis, 'cpu'):>7.2f} {ratios[label]:>6.2f}"
                    f" {ends[label]:>8.2f} ({median(end_to_end, 'wall'):>5.1f}) "
                    f"{max(r['rss_mb'] for r in end_to_end):>8.0f}")
    whole = None
    if WHOLE in models:
        try:
            whole = whole_process(models[WHOLE], max(args.repeat, 3))
        except Failed as failure:
            rows.append(f"{'whole process, ' + WHOLE:<31} failed: {failure}")
    misses, hits = cache_runs(args.repeat)
    explain = cli("explain", "QL101", repeat=max(args.repeat, 3))
    commands = {
        f"cache miss, {len(FIXTURES)} bundled fixtures": misses,
        f"cache hit, {len(FIXTURES)} bundled fixtures": hits,
        "qlint explain QL101": explain,
        "qlint rules": cli("rules", repeat=max(args.repeat, 3)),
        "qlint --help": cli("--help", repeat=max(args.repeat, 3)),
        "qlint --version": cli("--version", repeat=max(args.repeat, 3)),
    }

    print(f"qlint speed (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f};"
          f" median of {args.repeat}; seconds)")
    header = f"{'model':<31} {'export':>7} {'qlint':>7} {'ratio':>6} {'CLI CPU (wall)':>16} {'RSS MB':>8}"
    print(header)
    print("-" * len(header))
    print("\n".join(rows))
    whole_ratio = None
    if whole:
        whole_ratio = statistics.median(q / b for b, q in whole)
        print(f"\nwhole processes, {WHOLE}: bare export script {statistics.median(b for b, _ in whole):.2f} s CPU, "
              f"qlint CLI {statistics.median(q for _, q in whole):.2f} s CPU, ratio {whole_ratio:.2f} "
              f"(median of {len(whole)} pairs: {', '.join(f'{q / b:.2f}' for b, q in whole)})")
    print()
    header = f"{'command':<31} {'CPU':>7} {'wall':>7} {'RSS MB':>8}"
    print(header)
    print("-" * len(header))
    for label, runs in commands.items():
        print(f"{label:<31} {median(runs, 'cpu'):>7.2f} {median(runs, 'wall'):>7.2f} "
              f"{max(r['rss_mb'] for r in runs):>8.0f}")
    print(f"{'cache hit / miss (CPU)':<31} {median(hits, 'cpu') / median(misses, 'cpu'):>7.3f}")
    print()
    targets = [
        ("7B config: qlint / export CPU", ratios.get("LLaMA-2-7B config (meta)"), 0.5),
        ("7B config: CLI / bare export, whole", whole_ratio, 0.6),
        ("70B config: CLI end to end CPU s", ends.get("LLaMA-2-70B config (meta)"), 10.0),
        ("cache hit on the fixtures, wall s", median(hits, "wall"), 0.5),
        ("qlint explain QL101, wall s", median(explain, "wall"), 0.3),
    ]
    for name, value, target in targets:
        if value is None:
            print(f"target {name:<36} not measured (--quick or failed)")
            continue
        verdict = "met" if value <= target else f"MISSED by {value - target:.2f} ({value / target:.1f}x the target)"
        print(f"target {name:<36} {value:>7.2f} <= {target:<5g} {verdict}")


if __name__ == "__main__":
    main()
