"""``qlint clean``: remove the result cache, like ``ruff clean``."""

from __future__ import annotations

import click

from qlint.cli.failures import fail_cleanly


@click.command("clean")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="The cache to remove (default: the project's, as `qlint check` finds it).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Read cache-dir from this config file instead of discovery.")
def command(cache_dir: str | None, config_file: str | None) -> None:
    """Remove the result cache (.qlint_cache at the project root, or cache-dir)."""
    from qlint.api import configure
    from qlint.ci.cache import ResultCache

    with fail_cleanly():
        settings = configure(None, config=config_file, cache_dir=cache_dir)
        path = settings.cache_path()
        removed = ResultCache(path).clear()  # CacheError (exit 2) for a folder that is no qlint cache
        click.echo(f"qlint: removed {path} ({removed} entr{'y' if removed == 1 else 'ies'})" if removed or path.exists()
                   else f"qlint: no cache at {path}")
