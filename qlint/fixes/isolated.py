"""The child process of ``--diff`` / ``--fix``: ``python -m qlint.fixes.isolated JOB OUT``.

The model's code runs here, not in qlint's process: an ``os._exit()``, a crash or a stray print in
it is that model's failure, never qlint's exit code or output (as ``qlint check``'s supervised
workers do for the analysis). OUT receives the pickled :class:`~qlint.fixes.Fixes`, or the error.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(job_path: str, out_path: str) -> None:
    from qlint.core.errors import QlintError
    from qlint.fixes import FixError, source_patches

    job = pickle.loads(Path(job_path).read_bytes())
    try:
        result: object = source_patches(job["settings"], job["spec"], job["root"])
    except FixError as exc:
        result = ("fix", str(exc))
    except QlintError as exc:
        result = ("model", str(exc))
    except (Exception, SystemExit) as exc:
        result = ("model", f"{job['spec']}: {type(exc).__name__}: {exc}")
    Path(out_path).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
