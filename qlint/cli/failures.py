"""How the CLI fails: one line on stderr and exit code 2, never a raw traceback unless asked for."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click

from qlint.core.errors import QlintError


@contextlib.contextmanager
def fail_cleanly(show_traceback: bool = False) -> Iterator[None]:
    """Turn failures into ``qlint: error: ...`` and exit code 2.

    Expected failures (:class:`~qlint.core.errors.QlintError`: load, trace, config,
    baseline, probe) carry a one-line message; anything else is an internal error,
    also reported in one line unless ``--traceback`` asks for the traceback.
    """
    try:
        yield
    except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
        raise
    except QlintError as exc:
        if show_traceback:
            raise
        click.echo(f"qlint: error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # e.g. -o into a folder that does not exist
        if show_traceback:
            raise
        click.echo(f"qlint: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), err=True)
        sys.exit(2)
    except Exception as exc:
        if show_traceback:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        click.echo(f"qlint: error: {type(exc).__name__}: {first} (rerun with --traceback for details)", err=True)
        sys.exit(2)
