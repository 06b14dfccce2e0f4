"""The child process of a re-check: ``python -m qlint.fixes.recheck JOB OUT``.

JOB (a pickle) holds the settings, the specs and ``redirects``: original file -> patched copy in a
temporary folder. Before anything of the user's is imported, every source loader is made to
compile the patched copy wherever the original would be loaded (a file spec loaded by path and
``import pkg.module`` alike), so the model is built from the patched source itself. The verdict
of every block of every spec, and the findings, go to OUT as JSON.
"""

from __future__ import annotations

import json
import pickle
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path


def redirect(redirects: dict[str, str]) -> None:
    """Load the patched copy in place of each original (compiled under the copy's name, so the
    lines a traceback or a noqa lookup reads are the patched ones)."""
    original_get_code = SourceFileLoader.get_code

    def get_code(self: SourceFileLoader, fullname: str):  # type: ignore[no-untyped-def]
        patched = redirects.get(str(Path(self.path).resolve()))
        if patched is None:
            return original_get_code(self, fullname)
        return compile(Path(patched).read_bytes(), patched, "exec", dont_inherit=True)

    SourceFileLoader.get_code = get_code  # type: ignore[method-assign]
    stale = [name for name, module in sys.modules.items()
             if str(Path(getattr(module, "__file__", None) or "/").resolve()) in redirects]
    for name in stale:  # imported before the redirect (qlint's own modules): import them again
        del sys.modules[name]


def main(job_path: str, out_path: str) -> None:
    job = pickle.loads(Path(job_path).read_bytes())
    redirect(job["redirects"])
    from qlint.api import analyse_one
    from qlint.fixes import verdicts

    checked = {}
    for spec in job["specs"]:
        try:
            report = analyse_one(job["settings"], spec, False)
        except (Exception, SystemExit) as exc:  # that model's failure, not the other models' verdicts
            checked[spec] = {"failure": f"{type(exc).__name__}: {exc}", "blocks": {}, "findings": []}
            continue
        checked[spec] = {"failure": report.failure, **verdicts(report)}
    Path(out_path).write_text(json.dumps(checked))


if __name__ == "__main__":
    main(*sys.argv[1:3])
