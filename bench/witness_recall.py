"""How many unsafe cases of a labelled corpus the witness alone would catch.

For each ``expect = "unsafe"`` case the model is analysed with the witness off, then every block
and transition is marked certified, as if the exponent arithmetic had certified the model falsely,
and the witness (:mod:`qlint.probe.block_witness`, default budget) is run on that analysis. A case
is *caught* when the witness refutes the eager model or a block. Cases qlint cannot trace are
counted apart (nothing to measure).

Usage:  python bench/witness_recall.py [FILE.toml ...]
Prints per corpus and family: caught / unsafe, then the cases missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import tomllib
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def caught(spec: str) -> tuple[str, str]:
    """("caught" | "missed" | "untraced", what was measured or why)."""
    from qlint.analysis import Options, load_model, run
    from qlint.capture.trace import TraceFailure
    from qlint.probe.block_witness import witness

    options = Options(witness=False)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            loaded = load_model(spec, options)
            analysis = run(loaded.model, loaded.inputs, spec=spec, options=options)
    except (TraceFailure, Exception) as exc:  # noqa: BLE001  (a refusal: nothing for the witness to measure)
        return "untraced", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    report = analysis.report
    for part in [*report.blocks, *report.transitions]:
        part.status = "ok"
    report.uncovered = []
    if not report.blocks:
        return "untraced", "no residual block found"
    result = witness(analysis)
    if result.refuted:
        return "caught", result.refuted[0].measurement[:160]
    return "missed", result.summary()[:160]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpora", nargs="*", type=Path,
                        default=sorted((ROOT / "fixtures" / "adversarial").glob("CASES*.toml")))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the corpus's own models warn (std of one entry); the figures are what is printed
    start = time.perf_counter()
    totals = [0, 0, 0]
    for corpus in args.corpora:
        families: dict[int, list[int]] = {}
        missed = []
        for spec, entry in tomllib.loads(corpus.read_text())["cases"].items():
            if entry["expect"] != "unsafe":
                continue
            outcome, detail = caught(str((corpus.parent / spec).resolve()))
            counts = families.setdefault(int(entry["family"]), [0, 0, 0])  # unsafe, caught, untraced
            counts[0] += 1
            counts[1] += outcome == "caught"
            counts[2] += outcome == "untraced"
            if outcome == "missed":
                missed.append(f"  missed  {spec} (q_true {entry['q_true']}): {detail}")
        for family, (unsafe, hit, untraced) in sorted(families.items()):
            print(f"{corpus.name:16} family {family:3}: witness alone catches {hit}/{unsafe - untraced}"
                  + (f" ({untraced} not traced)" if untraced else ""))
            totals = [totals[0] + unsafe - untraced, totals[1] + hit, totals[2] + untraced]
        print("\n".join(missed))
    share = totals[1] / totals[0] if totals[0] else 0.0
    print(f"total: the witness alone catches {totals[1]}/{totals[0]} traced unsafe cases ({share:.0%}); "
          f"{totals[2]} not traced; {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
