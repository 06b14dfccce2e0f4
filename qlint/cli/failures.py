"""How the CLI fails: one line on stderr and exit code 2, never a raw traceback unless asked for."""

from __future__ import annotations

import contextlib
import sys
import traceback
from typing import Iterator

import click

from qlint.core.errors import QlintError


@contextlib.contextmanager
def fail_cleanly(show_traceback: bool = False) -> Iterator[None]:
    """Turn failures into ``qlint: error: ...`` and exit code 2.

    Expected failures (:class:`~qlint.core.errors.QlintError`: load, trace, config,
    baseline, probe) carry a one-line message; anything else is an internal error,
    also reported in one line. ``--traceback`` prints the traceback first and keeps
    the exit code; Ctrl-C is one line and exit 130, as a shell expects.
    """
    try:
        yield
    except (click.exceptions.Exit, click.ClickException, SystemExit):
        raise
    except KeyboardInterrupt:
        click.echo("qlint: interrupted", err=True)
        sys.exit(130)
    except QlintError as exc:
        _fail(str(exc), show_traceback)
    except OSError as exc:  # e.g. -o into a folder that does not exist
        _fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), show_traceback)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _fail(f"{type(exc).__name__}: {first}" + ("" if show_traceback else " (rerun with --traceback for details)"),
              show_traceback)


def _fail(message: str, show_traceback: bool) -> None:
    """The one line (after the traceback when asked for it), and exit 2 either way."""
    if show_traceback:
        traceback.print_exc()
    click.echo(f"qlint: error: {message}", err=True)
    sys.exit(2)
