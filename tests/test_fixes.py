"""``qlint --diff`` / ``--fix``: remedies written into the user's source, kept only when the patched
source itself re-certifies (qlint.fixes). Every test works on copies in a temporary git repository."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("libcst")

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "QLINT_NO_CACHE": "1"}

CUBIC = '''\
import torch
from torch import nn


class Cubic(nn.Module):
    """x + W2 (W1 x)**3: q = 3."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.w1 = nn.Linear(d, d)
        self.w2 = nn.Linear(d, d)

    def forward(self, x):
        # the hidden state, cubed (keep this comment)
        h = self.w1( x )   # odd spacing stays too
        return x + self.w2(h ** 3)


def build_model():
    torch.manual_seed(0)
    return Cubic(), (torch.randn(4, 8),)
'''

EXP = '''\
import torch
from torch import nn


class ExpBlock(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.w1 = nn.Linear(d, d)
        self.w2 = nn.Linear(d, d)

    def forward(self, x):
        return x + self.w2(torch.exp(self.w1(x)))


def build_model():
    torch.manual_seed(0)
    return ExpBlock(), (torch.randn(4, 8),)
'''


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for command in (["git", "init", "-q"], ["git", "add", "."],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "models"]):
        subprocess.run(command, cwd=tmp_path, check=True)
    return tmp_path


def _qlint(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlint", *args, "--no-cache", "--no-witness"], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=900)


def _zoo_copy(tmp_path: Path) -> dict[str, str]:
    """The bundled Mamba and SwiGLU models, copied as the user's own package ``zoo``."""
    files = {}
    for name in ("__init__.py", "mamba.py", "transformer.py"):
        files[f"zoo/{name}"] = (ROOT / "qlint/zoo" / name).read_text().replace("qlint.zoo", "zoo")
    files["models.py"] = textwrap.dedent('''\
        import torch
        from zoo import mamba, transformer


        def native():
            torch.manual_seed(0)
            return mamba.build("free", d_model=16, seq_len=8, horizon=4, depth=2), mamba.example_inputs(seq_len=8)


        def swiglu():
            torch.manual_seed(0)
            return transformer.SwiGLUResidual(16, 32, norm=False), (torch.randn(2, 8, 16),)
        ''')
    return files


def _trains(path: Path, builder: str, steps: int = 3) -> list[float]:
    """Import the fixed file afresh and take a few optimizer steps: the losses."""
    sys.path.insert(0, str(path.parent))
    try:
        for name in [m for m in sys.modules if m == "zoo" or m.startswith("zoo.")]:
            del sys.modules[name]
        spec = importlib.util.spec_from_file_location(f"fixed_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        model, inputs = getattr(module, builder)()
    finally:
        sys.path.remove(str(path.parent))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        out = model(*inputs)
        loss = (out if isinstance(out, torch.Tensor) else out[0]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_fix_rewrites_the_cubic_keeps_comments_and_formatting_and_the_block_certifies(tmp_path):
    repo = _repo(tmp_path, {"cubic.py": CUBIC})
    fixed = _qlint(repo, "cubic.py:build_model", "--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "fixed cubic.py (lipschitz_activation certifies `Cubic`)" in fixed.stderr
    assert "│ Cubic │ 1 │ ok" in fixed.stdout  # the re-lint after the fix
    text = (repo / "cubic.py").read_text()
    assert "return x + self.w2(nn.functional.gelu(h))" in text
    assert "# the hidden state, cubed (keep this comment)" in text
    assert "h = self.w1( x )   # odd spacing stays too" in text
    assert text.replace("self.w2(nn.functional.gelu(h))", "self.w2(h ** 3)") == CUBIC  # nothing else moved
    again = _qlint(repo, "cubic.py:build_model", "--diff")
    assert (again.returncode, again.stdout) == (0, "")  # nothing left to fix
    assert all(torch.isfinite(torch.tensor(_trains(repo / "cubic.py", "build_model"))))


def test_diff_is_a_patch_git_applies_and_exits_one(tmp_path):
    repo = _repo(tmp_path, {"models/exp_block.py": EXP})
    shown = _qlint(repo, "models/exp_block.py:build_model", "--diff")
    assert shown.returncode == 1, shown.stderr
    assert shown.stdout.startswith("--- a/models/exp_block.py\n+++ b/models/exp_block.py\n")
    assert "+        return x + self.w2(torch.exp(-nn.functional.softplus(self.w1(x))))" in shown.stdout
    assert (repo / "models/exp_block.py").read_text() == EXP  # --diff writes nothing
    (repo / "fix.patch").write_text(shown.stdout)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    assert _qlint(repo, "models/exp_block.py:build_model").returncode == 0


def test_fix_on_a_copy_of_the_bundled_mamba_certifies_and_trains(tmp_path):
    repo = _repo(tmp_path, _zoo_copy(tmp_path))
    fixed = _qlint(repo, "models.py:native", "--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "fixed zoo/mamba.py (linear_growth certifies `layers.0`, `layers.1`)" in fixed.stderr
    assert "max q = 1 over 2 blocks" in fixed.stdout
    text = (repo / "zoo/mamba.py").read_text()
    assert "params = self.x_proj(F.normalize(F.normalize(x, dim=-1) if self.linear_growth else x, dim=-1))" in text
    assert "gate = torch.sigmoid(z) if self.linear_growth else torch.sigmoid(z)" in text
    assert "# S4D-real" in text  # the file's comments stay
    losses = _trains(repo / "models.py", "native")
    assert all(torch.isfinite(torch.tensor(losses)))


def test_fix_on_a_swiglu_without_norm_swaps_the_gate(tmp_path):
    repo = _repo(tmp_path, _zoo_copy(tmp_path))
    fixed = _qlint(repo, "models.py:swiglu", "--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "fixed zoo/transformer.py (gate_sigmoid certifies `SwiGLUResidual`)" in fixed.stderr
    text = (repo / "zoo/transformer.py").read_text()
    assert "return self.down_proj(torch.sigmoid(self.gate_proj(x)) * self.up_proj(x))" in text
    assert all(torch.isfinite(torch.tensor(_trains(repo / "models.py", "swiglu"))))


def test_a_patch_that_does_not_recertify_is_never_shown(tmp_path, monkeypatch):
    """The graph remedy certifies, but its source edit is wrong (the cube stays): the re-check drops it, and
    the next-ranked remedy, which does re-certify, is the one offered."""
    from qlint.api import configure
    from qlint.fixes import edits, source_patches

    repo = _repo(tmp_path, {"cubic.py": CUBIC})
    monkeypatch.chdir(repo)
    wrong = edits.replace_by(lambda names, h: edits._call("torch.abs", h))  # |h| ** 3 is still cubic ...
    monkeypatch.setitem(edits.SOURCE_EDITS, "lipschitz_activation",
                        lambda context, root: [edits._expression(context, context.dominant().args[0], root, wrong)])
    fixes = source_patches(configure(["cubic.py:build_model"], isolated=True, no_cache=True, witness=False),
                           "cubic.py:build_model")
    (patch,) = fixes.patches
    assert patch.kinds == ("preln",) and "torch.abs" not in patch.patched
    assert "lipschitz_activation: the patched source leaves the block at q = 3" in fixes.dropped["Cubic"][0]


def test_code_outside_the_repository_gets_the_reason_not_a_patch(tmp_path):
    """A block whose code is installed library code (here: a module outside the repository on sys.path)."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "vendor_models.py").write_text(CUBIC)
    repo = _repo(tmp_path / "repo", {"models.py": "from vendor_models import build_model\n"})
    shown = subprocess.run([sys.executable, "-m", "qlint", "models.py:build_model", "--no-cache", "--diff"], cwd=repo,
                           env={**ENV, "PYTHONPATH": str(vendor)}, capture_output=True, text=True, timeout=900)
    assert (shown.returncode, shown.stdout) == (0, ""), shown.stderr
    assert "no patch certifies block `Cubic`: lipschitz_activation: `" in shown.stderr
    assert "vendor_models.py` is library code: qlint patches only files in your repository" in shown.stderr


def test_remedy_as_patch_needs_a_spec_and_returns_the_patches(tmp_path, monkeypatch):
    import qlint

    repo = _repo(tmp_path, {"cubic.py": CUBIC})
    monkeypatch.chdir(repo)
    with pytest.raises(ValueError, match="as_patch=True needs the model as a spec"):
        qlint.remedy(torch.nn.Linear(2, 2), as_patch=True)
    (patch,) = qlint.remedy("cubic.py:build_model", as_patch=True)
    assert (patch.path, patch.kinds, patch.q_after) == ("cubic.py", ("lipschitz_activation",), {"Cubic": 1.0})
    assert "+        return x + self.w2(nn.functional.gelu(h))" in patch.diff


def test_without_libcst_the_flags_fail_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "libcst", None)
    from qlint.fixes import FixError, source_patches

    with pytest.raises(FixError, match=r"needs libcst: pip install 'torch-qlint\[fix\]'"):
        source_patches(None, "cubic.py:build_model", tmp_path)


def test_git_is_not_needed_outside_a_repository(tmp_path):
    shutil.rmtree(_repo(tmp_path, {"cubic.py": CUBIC}) / ".git")
    shown = _qlint(tmp_path, "cubic.py:build_model", "--diff")
    assert shown.returncode == 1 and shown.stdout.startswith("--- a/cubic.py\n")


def test_a_model_that_exits_is_one_error_line_and_the_others_still_get_their_patch(tmp_path):
    exits = "import sys\n\n\ndef build_model():\n    print('chatter')\n    sys.exit(3)\n"
    repo = _repo(tmp_path, {"cubic.py": CUBIC, "exits.py": exits})
    both = _qlint(repo, "exits.py:build_model", "cubic.py:build_model", "--diff")
    assert both.returncode == 1 and both.stdout.startswith("--- a/cubic.py\n")  # chatter kept off the patch
    assert "qlint: error: exits.py:build_model: the model's code called sys.exit(3)" in both.stderr
    alone = _qlint(repo, "exits.py:build_model", "--diff")
    assert (alone.returncode, alone.stdout) == (2, "")


def test_show_remedies_attaches_the_patch_to_the_block(tmp_path):
    import json

    repo = _repo(tmp_path, {"cubic.py": CUBIC})
    shown = _qlint(repo, "cubic.py:build_model", "--show-remedies", "--output-format", "json")
    assert shown.returncode == 1, shown.stderr
    (block,) = json.loads(shown.stdout)["models"][0]["blocks"]
    (patch,) = block["patches"]
    assert (patch["kind"], patch["path"], patch["blocks"], patch["q_after"]) == (
        "lipschitz_activation", "cubic.py", ["Cubic"], 1.0)
    assert "+        return x + self.w2(nn.functional.gelu(h))\n" in patch["diff"]
