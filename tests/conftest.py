"""Shared test helpers: run qlint on a fixture spec and index its blocks by name."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

# The result cache stays out of the checkout and out of tests that do not test it (the
# CLI subprocesses inherit this); tests/ci/test_cache.py turns it on in their own folders.
os.environ["QLINT_NO_CACHE"] = "1"


def qlint_json(specs: list[str], expected_exit: tuple[int, ...] = (1,), **env: str) -> list[dict]:
    """One ``qlint --format json --isolated --no-cache`` process over ``specs`` (one thread, ``env`` added): the
    report of each model, in order; the exit code must be one of ``expected_exit``."""
    proc = subprocess.run([sys.executable, "-m", "qlint", *specs, "--format", "json", "--isolated", "--no-cache"],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1", **env),
                          timeout=1200)
    assert proc.returncode in expected_exit, proc.stderr[-2000:]
    return json.loads(proc.stdout)["models"]


def fixture_spec(name: str) -> str:
    """'mamba.py:native' -> absolute spec of a bundled fixture."""
    return str(FIXTURES / name)


def load_module(path: Path, name: str) -> ModuleType:
    """Import a script or fixture file by its path, registered under ``name`` in sys.modules
    (dataclasses resolve their module by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# A supercritical block (x + W2 (W1 x)^3, q = 3) for tests that write model files; the `**`
# is on line CUBIC_LINE. Tests append the factory they need.
CUBIC_MODULE = '''\
import torch
from torch import nn


class Cubic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.w2(self.w1(x) ** 3)
'''
CUBIC_LINE = 11


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


@pytest.fixture
def repo(tmp_path: Path, monkeypatch) -> Path:
    """A fake git work tree (the SARIF/GitHub root) with the cwd inside it."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("x\n" * 50)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# The bundled zoo fixtures (fixtures/<family>.py): every factory, for the zoo's and layer reuse's tests.
FACTORIES = {
    "mamba": ["native", "rmsnorm", "preln", "periln", "linear_growth", "build_model"],
    "patchtst": ["free", "rmsnorm", "preln", "periln"],
    "gpt2": ["build_model"],
    "llama": ["with_norm", "without_norm", "swiglu_block_with_norm", "swiglu_block_without_norm"],
    "hymba": ["build_model", "ssm_unnormed"],
    "toy": ["poly_mlp", "sinh", "exp_unbounded", "unknown_op", "bounded_exp", "lipschitz_mlp"],
}
ALL_FACTORIES = [(f, n) for f, names in FACTORIES.items() for n in names]


def load_fixture(family):
    """Load fixtures/<family>.py by path, with its folder on sys.path, as qlint does."""
    sys.path.insert(0, str(FIXTURES))
    try:
        module = load_module(FIXTURES / f"{family}.py", f"zoo_fixture_{family}")
    finally:
        sys.path.remove(str(FIXTURES))
    return module


def fixture(family, name):
    return getattr(load_fixture(family), name)()
