"""qlint's verdict on every case of a labelled corpus, against its label: false certifications,
under-estimates and false alarms, per family.

A corpus is a TOML file of ``[cases."FILE.py:FACTORY"]`` entries (``expect`` safe / unsafe,
``q_true``, ``family``), as fixtures/adversarial/CASES*.toml and fixtures/controls/CASES.toml.
All specs are checked in one ``qlint --format json --isolated`` run (the test suite's way).

Usage:  python bench/corpus_verdicts.py [FILE.toml ...] [--qlint-root DIR] [--list]
Prints one line per family and the cases that are wrong; exits 1 if anything unsafe is certified.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(specs: list[str], root: Path) -> tuple[dict, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "qlint", *specs, "--format", "json", "--isolated", "--no-cache"],
                          cwd=root, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    text = proc.stdout[proc.stdout.index("{"):] if "{" in proc.stdout else "{}"
    models = json.JSONDecoder().raw_decode(text)[0].get("models", [])
    if len(models) != len(specs):  # the report names specs relative to the folder it ran in: match by order
        return {}, seconds
    return dict(zip(specs, models)), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", type=Path,
                        default=sorted((ROOT / "fixtures" / "adversarial").glob("CASES*.toml")))
    parser.add_argument("--qlint-root", type=Path, default=ROOT,
                        help="run the qlint found here (a worktree of another commit)")
    parser.add_argument("--list", action="store_true", help="print every case, not only the wrong ones")
    args = parser.parse_args(argv)
    cases = {}
    for corpus in args.corpora:
        for spec, entry in tomllib.loads(corpus.read_text())["cases"].items():
            # a spec is relative to fixtures/adversarial, wherever its CASES file lies (pending/ too), or else to
            # its CASES file's own folder (a review's cases, before they join the suite)
            path = ROOT / "fixtures" / "adversarial" / spec
            if not path.with_name(path.name.split(":")[0]).exists():
                path = corpus.resolve().parent / spec
            cases[str(path.resolve())] = (corpus.name, entry)
    report, seconds = run(list(cases), args.qlint_root)
    families: dict[tuple[str, int], list[int]] = {}
    wrong = []
    for spec, (corpus, entry) in cases.items():
        model = report.get(spec, {"verdict": "missing"})
        verdict, q = model.get("verdict"), model.get("max_q")
        unsafe = entry["expect"] == "unsafe"
        # unsafe, false cert, safe, false alarm
        counts = families.setdefault((corpus, int(entry["family"])), [0, 0, 0, 0])
        counts[0 if unsafe else 2] += 1
        bad = (unsafe and verdict == "certified") or (not unsafe and verdict != "certified")
        counts[1 if unsafe else 3] += bad
        if bad or args.list:
            reason = "; ".join(f"{f['code']} {f['message'][:110]}" for f in model.get("findings", []) if f["code"] in
                               ("QL101", "QL102", "QL103", "QL106", "QL107")) or model.get("error", "")
            wrong.append(f"{'FALSE CERT' if bad and unsafe else 'FALSE ALARM' if bad else 'ok'}  {Path(spec).name}:"
                         f"{spec.rsplit(':', 1)[1] if ':' in spec else ''} q_true={entry['q_true']} -> {verdict} "
                         f"q={q}  {reason[:220]}")
    for (corpus, family), (u, fc, s, fa) in sorted(families.items()):
        print(f"{corpus:16} family {family:3}: {fc}/{u} unsafe certified, {fa}/{s} safe not certified")
    total = [sum(c[i] for c in families.values()) for i in range(4)]
    print(f"total: {total[1]}/{total[0]} false certifications, {total[3]}/{total[2]} false alarms "
          f"({100 * total[3] / max(total[2], 1):.0f}%), {len(cases)} cases in {seconds:.0f} s")
    print("\n".join(wrong))
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main())
