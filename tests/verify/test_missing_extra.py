"""The ``verify`` extra: without numpy / matplotlib, ``qlint verify`` says what to install
in one line and exits 2; the core linter runs without numpy at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _without(module: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter in which ``import <module>`` raises ImportError."""
    shim = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run([sys.executable, "-c", shim + code], cwd=REPO, capture_output=True, text=True, timeout=300)


def _qlint(*args: str) -> str:
    return f"from qlint.cli import main; main({list(args)!r}, prog_name='qlint')"


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "grid", "--scale", "smoke", "--out", "OUT"),
        ("verify", "grid", "--scale", "smoke", "--out", "OUT", "--no-figures"),
        ("verify", "table", "--out", "."),
        ("verify", "figure1", "--out", "OUT/f.png"),
    ],
)
def test_verify_without_numpy_exits_2_with_one_line(args, tmp_path):
    args = tuple(a.replace("OUT", str(tmp_path)) for a in args)
    proc = _without("numpy", _qlint(*args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "qlint: error: qlint verify needs the [verify] extra (numpy is not installed): pip install 'torch-qlint[verify]'"
    ]
    assert not any(tmp_path.iterdir())  # nothing was started


def test_verify_without_matplotlib_names_the_extra_and_the_way_out(tmp_path):
    proc = _without("matplotlib", _qlint("verify", "grid", "--scale", "smoke", "--out", str(tmp_path)))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "qlint: error: qlint verify grid needs the [verify] extra (matplotlib is not installed): "
        "pip install 'torch-qlint[verify]', or pass --no-figures"
    ]
    proc = _without("matplotlib", _qlint("verify", "figure1", "--out", str(tmp_path / "f.png")))
    assert proc.returncode == 2 and "pip install 'torch-qlint[verify]'" in proc.stderr


def test_ray_backend_without_ray_names_the_distributed_extra(tmp_path):
    proc = _without("ray", _qlint("verify", "grid", "--scale", "smoke", "--out", str(tmp_path), "--backend", "ray"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "qlint: error: qlint verify --backend ray needs the [distributed] extra (ray is not installed): "
        "pip install 'torch-qlint[distributed]'"
    ]


def test_verify_help_needs_no_numpy():
    proc = _without("numpy", _qlint("verify", "grid", "--help"))
    assert proc.returncode == 0, proc.stderr
    assert "--amp [fp32|fp16|bf16]" in proc.stdout and "--backend [local|ray]" in proc.stdout


def test_core_linter_runs_without_numpy():
    code = """
import torch
from torch import nn
from qlint.api import analyze

class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        return x + self.f(x)

report = analyze(Residual(), (torch.randn(2, 4),))
print(report.verdict, report.max_q, sys.modules["numpy"])
"""
    proc = _without("numpy", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["certified", "1.0", "None"]


def test_extras_are_declared():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["verify"] == ["numpy>=1.24", "matplotlib>=3.7"]
    assert extras["distributed"] == ["ray>=2.9"]
    assert '-e ".[test,zoo,verify' in (REPO / "Makefile").read_text()
