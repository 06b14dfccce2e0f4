"""Subcommands of the ``qlint`` CLI, one module each, imported on demand."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click


@contextlib.contextmanager
def fail_cleanly(show_traceback: bool = False) -> Iterator[None]:
    """Turn expected failures into one line on stderr and exit code 2.

    Load, trace and configuration errors carry a one-line message; anything else is
    an internal error, also reported in one line unless ``--traceback`` asks for it.
    """
    from qlint.loader import LoadError
    from qlint.core.trace import TraceFailure

    expected: tuple[type[BaseException], ...] = (LoadError, TraceFailure)
    try:
        from qlint.ci.config import ConfigError

        expected += (ConfigError,)
    except ImportError:
        pass
    try:
        yield
    except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
        raise
    except expected as exc:
        if show_traceback:
            raise
        click.echo(f"qlint: error: {exc}", err=True)
        sys.exit(2)
    except Exception as exc:
        if show_traceback:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        click.echo(f"qlint: error: {type(exc).__name__}: {first} (rerun with --traceback for details)", err=True)
        sys.exit(2)
