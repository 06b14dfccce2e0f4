"""Shared test helpers: run qlint on a fixture spec and index its blocks by name."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"


def fixture_spec(name: str) -> str:
    """'mamba.py:native' -> absolute spec of a bundled fixture."""
    return str(FIXTURES / name)


@pytest.fixture(autouse=True, scope="session")
def single_thread():
    """Test models are tiny: intra-op threads only add contention on a 2-core CPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def lint():
    """Analyse a fixture spec once per session (tracing costs up to a second)."""
    from qlint.analysis import Options, run_specs

    cache: dict[tuple, object] = {}

    def run(name: str, **options):
        key = (name, tuple(sorted(options.items())))
        if key not in cache:
            cache[key] = run_specs([fixture_spec(name)], Options(**options)).models[0]
        return cache[key]

    return run
