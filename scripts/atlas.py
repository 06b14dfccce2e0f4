"""The atlas: every architecture of transformers, timm and torchvision linted by name (catalogue specs).

    python scripts/atlas.py sweep [--library hf|timm|torchvision] [--shard K/N] [--jobs N] [--limit-s S]
                                  [--only NAME ...] [--max N]
    python scripts/atlas.py render        # docs/atlas.md from atlas/*.jsonl

``sweep`` runs ``qlint SPEC --format json --no-cache`` for each entry of the catalogue, one process per
entry, ``--jobs`` at a time, each under a time limit, and appends one JSON line per entry to
``atlas/<library>.jsonl`` as it finishes, so a sweep that stops resumes where it was (entries already
there are skipped) and shards (``--shard 2/4``: every fourth entry from the second) can run on other
machines and be concatenated. ``render`` writes the page from the committed data alone.

Entries: every transformers model type that has a base model class; one timm model per family (the
module that registers it; its first "tiny" or "small" model, else its first); every torchvision
classification, detection and segmentation model.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "atlas"
PAGE = ROOT / "docs" / "atlas.md"
LIBRARIES = ("hf", "timm", "torchvision")


def entries(library: str) -> list[str]:
    """The catalogue specs of one library, sorted."""
    if library == "hf":
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        return sorted(f"hf:{model_type}" for model_type in MODEL_MAPPING_NAMES)
    if library == "timm":
        import timm
        from timm.models import _registry

        families: dict[str, list[str]] = defaultdict(list)
        for name in timm.list_models():
            families[_registry._model_to_module.get(name, name)].append(name)
        return sorted(f"timm:{_representative(names)}" for names in families.values())
    from torchvision import models

    names = set()
    for module in (models, models.detection, models.segmentation):
        names.update(models.list_models(module=module))
    return sorted(f"torchvision:{name}" for name in names)


def _representative(names: list[str]) -> str:
    for size in ("tiny", "small"):
        for name in names:
            if size in name:
                return name
    return names[0]


def run_one(spec: str, limit_s: float) -> dict:
    """One entry's line: what qlint said, or why it did not finish."""
    started = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    try:
        proc = subprocess.run([sys.executable, "-m", "qlint", spec, "--format", "json", "--no-cache",
                               "--timeout", str(limit_s)], cwd=ROOT, capture_output=True, text=True,
                              timeout=limit_s + 60, env=env)
    except subprocess.TimeoutExpired:
        return {"spec": spec, "verdict": "timeout", "seconds": round(time.monotonic() - started, 1),
                "failure": f"did not finish in {limit_s:g} s"}
    seconds = round(time.monotonic() - started, 1)
    try:
        [model] = json.loads(proc.stdout)["models"]
    except (ValueError, KeyError, TypeError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"spec": spec, "verdict": "failed", "seconds": seconds, "failure": last[:400]}
    if model.get("failure"):
        verdict = "timeout" if "did not finish within" in model["failure"] else "failed"
        return {"spec": spec, "verdict": verdict, "seconds": seconds, "failure": model["failure"][:400]}
    errors = [f for f in model["findings"] if f["severity"] == "error"]
    return {
        "spec": spec, "verdict": model["verdict"], "seconds": seconds, "max_q": model["max_q"],
        "tracer": model["tracer"], "built": model.get("built", ""),
        "blocks": {b["name"]: b["q"] for b in model["blocks"]},
        "codes": dict(sorted(Counter(f["code"] for f in model["findings"]).items())),
        "errors": [{"code": f["code"], "block": f.get("block"), "message": f["message"][:300],
                    "source": _source(f.get("source"))} for f in errors[:5]],
    }


def _source(source: dict | None) -> str:
    if not source:
        return ""
    file = source["file"].split("site-packages/")[-1]
    return f"{file}:{source['line']}"


def sweep(args: argparse.Namespace) -> int:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in ("torch-qlint", "torch", "transformers", "timm", "torchvision"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    DATA.mkdir(exist_ok=True)
    for library in args.library or LIBRARIES:
        path = DATA / f"{library}.jsonl"
        done = {line["spec"] for line in read(library)}
        todo = [spec for spec in entries(library) if spec not in done
                and (not args.only or spec.partition(":")[2] in args.only)]
        shard, shards = (int(part) for part in args.shard.split("/"))
        todo = todo[shard - 1::shards][: args.max or None]
        print(f"{library}: {len(done)} done, {len(todo)} to run", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, path.open("a") as out:
            for line in pool.map(lambda spec: run_one(spec, args.limit_s), todo):
                line["versions"] = versions
                out.write(json.dumps(line, sort_keys=True) + "\n")
                out.flush()
                print(f"  {line['spec']}: {line['verdict']} ({line['seconds']} s)", flush=True)
    return 0


def read(library: str) -> list[dict]:
    """A library's lines, the last run of each entry; a line a stopped sweep left half written is skipped (that
    entry runs again on resume)."""
    path = DATA / f"{library}.jsonl"
    lines = [line for line in map(_parsed, path.read_text().splitlines()) if line] if path.exists() else []
    return sorted({line["spec"]: line for line in lines}.values(), key=lambda line: line["spec"])  # the last run wins


def _parsed(text: str) -> dict | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


def render() -> str:
    """The page, from atlas/*.jsonl alone."""
    out = ["# The atlas", "",
           "Every architecture of transformers, timm and torchvision linted by name (`qlint hf:NAME`, `qlint timm:NAME`,",
           "`qlint torchvision:NAME`): built from the library's default config with random weights, shrunk (see the",
           "README's catalogue specs), and checked as `qlint SPEC` checks it. Generated by `python scripts/atlas.py",
           "render` from `atlas/*.jsonl`; do not edit by hand.", "",
           "| library | entries | certified | supercritical | uncertified | failed | timed out | sweep time |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    sections = []
    for library in LIBRARIES:
        lines = read(library)
        if not lines:
            continue
        verdicts = Counter(line["verdict"] for line in lines)
        minutes = sum(line["seconds"] for line in lines) / 60
        out.append(f"| {library} | {len(lines)} | {verdicts['certified']} | {verdicts['supercritical']} | "
                   f"{verdicts['uncertified']} | {verdicts['failed']} | {verdicts['timeout']} | {minutes:.0f} min |")
        sections += ["", f"## {library}", "", "| entry | verdict | max q | blocks | what stops it |", "|---|---|---:|---:|---|"]
        for line in lines:
            q = "" if line.get("max_q") is None else format(line["max_q"], "g")
            sections.append(f"| `{line['spec']}` | {line['verdict']} | {q} | {len(line.get('blocks', {}))} | "
                            f"{_why(line)} |")
    versions = next((line.get("versions") for library in LIBRARIES for line in read(library)), {})
    out += ["", "Library versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + "."]
    return "\n".join(out + sections) + "\n"


def _why(line: dict) -> str:
    if line.get("failure"):
        return line["failure"].replace("|", "\\|").replace("\n", " ")[:200]
    first = (line.get("errors") or [None])[0]
    if first is None:
        return ""
    where = f" ({first['source']})" if first.get("source") else ""
    return f"{first['code']} `{first['block']}`{where}".replace("|", "\\|")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("sweep")
    run.add_argument("--library", action="append", choices=LIBRARIES)
    run.add_argument("--shard", default="1/1")
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    run.add_argument("--limit-s", type=float, default=300.0)
    run.add_argument("--only", nargs="*", default=None)
    run.add_argument("--max", type=int, default=0)
    commands.add_parser("render")
    args = parser.parse_args(argv)
    if args.command == "sweep":
        return sweep(args)
    from qlint.ci.files import write_text

    write_text(PAGE, render(), what="the atlas page")  # whole: a temporary file, then a rename
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
