"""Where qlint's time goes on a model, phase by phase, as a whole process.

Each spec is run twice over, in fresh processes, ``--repeat`` times, interleaved:

- ``qlint SPEC --no-cache --format json`` end to end (the supervising process and its worker,
  CPU = user + sys of both, from wait4), the figure a user sees;
- the same pipeline in one process (:func:`qlint.api._one`, as the worker runs it) with a timer
  around each phase, wall and CPU seconds:

  ``start``     the interpreter's own start (CPU before the first line of the script);
  ``import``    torch, qlint (``import torch``, ``qlint.api``, ``qlint.analysis``, the rules);
  ``spec``      importing the spec's file (transformers, the model's module);
  ``build``     the factory (the model's constructor, its init);
  ``trace``     torch.export / make_fx / symbolic_trace, the identical-layer copies;
  ``check``     the graph check: graph against eager model (example, scaled, redrawn
                parameters) and the probing of other input shapes;
  ``analysis``  blocks, exponents, propagation, every rule;
  ``witness``   the block witness (measuring every certified block and the eager model);
  ``report``    the report as JSON;
  ``other``     the rest of the run (configuration, loading glue, suppressions).

The timers are wrappers put around qlint's own functions by this script (nothing in qlint
knows of them); a phase nested in another (a shape probe's trace) counts for the inner one.
Medians of ``--repeat`` runs. ``--baseline-tree DIR`` (a checkout of the code before a change,
e.g. ``git worktree add /tmp/before HEAD``) measures it too, interleaved with this checkout round
by round, and adds the ratio after / before (the totals: the median of the per-round ratios); the
JSON reports of every run must be identical (the checkout's own path taken out).

    python bench/bench_phases.py [SPEC ...] [--repeat 3] [--cli] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_speed import measure  # noqa: E402  (bench/ is the script's folder)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["fixtures/zoo3.py:qwen3_next", "fixtures/zoo3.py:gemma3n", "fixtures/zoo3.py:kimi_linear"]
PHASES = ["start", "import", "spec", "build", "trace", "check", "analysis", "witness", "report", "other"]

WORKER = r"""
import sys, time
CPU0, WALL0, T0 = time.process_time(), time.perf_counter(), time.time()
STARTED = float(sys.argv[2])
totals = {}
stack = [["other", CPU0, WALL0]]

def _switch(phase):
    cpu, wall = time.process_time(), time.perf_counter()
    top = stack[-1]
    spent = totals.setdefault(top[0], [0.0, 0.0])
    spent[0] += cpu - top[1]
    spent[1] += wall - top[2]
    return cpu, wall

def enter(phase):
    cpu, wall = _switch(phase)
    stack.append([phase, cpu, wall])

def leave():
    cpu, wall = _switch(None)
    stack.pop()
    stack[-1][1], stack[-1][2] = cpu, wall

def timed(phase, function):
    def wrapper(*args, **kwargs):
        enter(phase)
        try:
            return function(*args, **kwargs)
        finally:
            leave()
    wrapper.__wrapped__ = function
    return wrapper

def patch(module, name, phase):
    setattr(module, name, timed(phase, getattr(module, name)))

enter("import")
import contextlib
import qlint.api
eased = contextlib.ExitStack()  # the collector as the CLI's worker process has it (qlint.api._worker)
eased.enter_context(getattr(qlint.api, "collections_eased", contextlib.nullcontext)())
import torch
import qlint.analysis, qlint.loader, qlint.lint
import qlint.capture.pipeline as capture, qlint.capture.graph_check as graph_check, qlint.growth.engine as engine
import qlint.probe.block_witness as block_witness
leave()
spec = sys.argv[1]
location, attribute = qlint.loader.check_spec(spec)
enter("spec")
module = qlint.loader.import_target(location)
leave()
owner = module
for part in attribute.split(".")[:-1]:
    owner = getattr(owner, part)
patch(owner, attribute.split(".")[-1], "build")
for name in ("symbolic_trace_module", "export_module", "make_fx_module"):
    patch(capture, name, "trace")
for name in ("compare_with_eager", "shape_coverage", "eager_failure"):
    patch(capture, name, "check")
patch(graph_check, "computes", "check")  # shape_coverage's own calls, and the analysis's over other shapes
qlint.analysis.computes = graph_check.computes
patch(qlint.analysis, "analyse_graph", "analysis")
patch(qlint.analysis, "run_checks", "analysis")
patch(block_witness, "witness", "witness")
import qlint.lint as lint
patch(lint, "run_checks", "analysis")  # QL107 after the witness
settings = qlint.api.configure([spec], isolated=True, no_cache=True)
report = qlint.api.analyse_configured(settings, supervised=False)
enter("report")
from qlint.ci.formats import write_output
import io, contextlib
buffer = io.StringIO()
with contextlib.redirect_stdout(buffer):
    write_output(report, "json", output_file=None)
leave()
eased.close()
_switch(None)
totals["start"] = [CPU0, T0 - STARTED]  # CPU before the first line; the wall from the spawn to it
import json, os
failed = [m.failure_line() for m in report.failures]
sys.stdout.flush()
os.write(1, (json.dumps({"phases": totals, "failed": failed, "report": buffer.getvalue()}) + "\n").encode())
os._exit(0)
"""


def phases(spec: str, root: Path) -> dict:
    """One whole process with phase timers (qlint imported from ``root``): {phase: (cpu, wall)}, the JSON report."""
    result = measure([sys.executable, "-c", WORKER, spec, repr(time.time())], root)
    if result["code"] != 0:
        raise SystemExit(f"{spec}: the phase worker failed in {root}:\n{result['stderr'][-3000:]}")
    data = json.loads(result["stdout"].strip().splitlines()[-1])
    timed = {name: tuple(values) for name, values in data["phases"].items()}
    timed["total"] = (result["cpu"], result["wall"])
    return {"phases": timed, "report": comparable(data["report"], root)}


def cli(spec: str, root: Path) -> dict:
    """``qlint SPEC --no-cache --format json`` end to end (its worker process included)."""
    result = measure([sys.executable, "-m", "qlint", spec, "--no-cache", "--format", "json", "--isolated",
                      "--exit-zero"], root)
    if result["code"] == 2:
        raise SystemExit(f"{spec}: qlint failed in {root}:\n{result['stderr'][-3000:]}")
    return {"cpu": result["cpu"], "wall": result["wall"], "report": comparable(result["stdout"], root)}


def comparable(report: str, root: Path) -> str:
    """The JSON report as text, the checkout's own path taken out (two checkouts give the same text)."""
    return report.replace(str(root.resolve()) + os.sep, "")


def run(specs: list[str], trees: dict[str, Path], repeat: int, with_cli: bool) -> dict:
    """{tree: {spec: {"runs": [{phase: (cpu, wall)}], "cli": [(cpu, wall)], "reports": set}}}, every
    measurement of one round taken back to back (tree after tree), the rounds repeated."""
    out = {tree: {spec: {"runs": [], "cli": [], "reports": set()} for spec in specs} for tree in trees}
    for index in range(repeat):
        for spec in specs:
            for tree, root in trees.items():
                data = out[tree][spec]
                one = phases(spec, root)
                data["runs"].append(one["phases"])
                data["reports"].add(one["report"])
                line = f"  round {index + 1}/{repeat} {spec} [{tree}]: {one['phases']['total'][0]:.1f} s CPU"
                if with_cli:
                    whole = cli(spec, root)
                    data["cli"].append((whole["cpu"], whole["wall"]))
                    data["reports"].add(whole["report"])
                    line += f", CLI {whole['cpu']:.1f} s CPU"
                print(line, file=sys.stderr, flush=True)
    return out


def medians(runs: list[dict], name: str) -> tuple[float, float]:
    return tuple(statistics.median(r.get(name, (0.0, 0.0))[k] for r in runs) for k in (0, 1))  # type: ignore[return-value]


def show(results: dict, specs: list[str], repeat: int) -> None:
    trees = list(results)
    print(f"qlint phases (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"CPU seconds, wall in parentheses; medians of {repeat})")
    for spec in specs:
        print(f"\n{spec}")
        header = f"{'phase':<9}" + "".join(f" {tree + ' CPU (wall)':>22}" for tree in trees)
        if len(trees) == 2:
            header += f" {'CPU ratio':>10}"
        print(header)
        print("-" * len(header))
        names = [p for p in [*PHASES, "total"] if any(p in r for tree in trees for r in results[tree][spec]["runs"])]
        rows = {name: [medians(results[tree][spec]["runs"], name) for tree in trees] for name in names}
        if all(results[tree][spec]["cli"] for tree in trees):
            rows["CLI"] = [tuple(statistics.median(c[k] for c in results[tree][spec]["cli"]) for k in (0, 1))
                           for tree in trees]
        for name, values in rows.items():
            line = f"{name:<9}" + "".join(f" {cpu:>12.2f} ({wall:>7.2f})" for cpu, wall in values)
            if len(trees) == 2:
                if name in ("total", "CLI"):  # paired: the median of the per-round ratios
                    runs = [results[t][spec]["runs"] if name == "total" else results[t][spec]["cli"] for t in trees]
                    pick = (lambda r: r["total"][0]) if name == "total" else (lambda r: r[0])
                    ratio = f"{statistics.median(pick(b) / pick(a) for a, b in zip(*runs)):.2f}"
                else:
                    ratio = f"{values[1][0] / values[0][0]:.2f}" if values[0][0] >= 0.05 else "-"
                line += f" {ratio:>10}"
            print(line)
        reports = set().union(*(results[tree][spec]["reports"] for tree in trees))
        print(f"JSON reports identical across every run{' and tree' if len(trees) > 1 else ''}: {len(reports) == 1}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="a checkout of the code before a change: each round measures it first, then this one")
    parser.add_argument("--cli", action="store_true", help="also time `qlint SPEC --no-cache --format json` end to end")
    args = parser.parse_args()
    trees = {"before": args.baseline_tree.resolve(), "after": ROOT} if args.baseline_tree else {"qlint": ROOT}
    show(run(args.specs, trees, args.repeat, args.cli), args.specs, args.repeat)


if __name__ == "__main__":
    main()
