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

FIXABLE = (ROOT / "fixtures/fixable.py").read_text()


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


def _fix(repo: Path, spec: str, path: str, fixed_line: str) -> tuple[str, str]:
    """``--fix SPEC``: exit 0 and ``fixed_line`` said; the re-lint's report and the fixed file's text."""
    fixed = _qlint(repo, spec, "--fix", "--unsafe-fixes")
    assert fixed.returncode == 0, fixed.stderr
    assert fixed_line in fixed.stderr
    return fixed.stdout, (repo / path).read_text()


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
    repo = _repo(tmp_path, {"fixable.py": FIXABLE})
    report, text = _fix(repo, "fixable.py:cubic", "fixable.py",
                        "fixed fixable.py (lipschitz_activation certifies `Cubic`)")
    assert "│ Cubic │ 1 │ ok" in report  # the re-lint after the fix
    assert "return x + self.down(nn.functional.gelu(h))" in text
    assert "# the hidden state, cubed (keep this comment)" in text
    assert "h = self.up( x )   # odd spacing stays too" in text
    assert text.replace("self.down(nn.functional.gelu(h))", "self.down(h ** 3)") == FIXABLE  # nothing else moved
    again = _qlint(repo, "fixable.py:cubic", "--diff")
    assert (again.returncode, again.stdout) == (0, "")  # nothing left to fix
    assert all(torch.isfinite(torch.tensor(_trains(repo / "fixable.py", "cubic"))))


def test_diff_is_a_patch_git_applies_and_exits_one(tmp_path):
    repo = _repo(tmp_path, {"models/fixable.py": FIXABLE})
    shown = _qlint(repo, "models/fixable.py:exp_block", "--diff")
    assert shown.returncode == 1, shown.stderr
    assert shown.stdout.startswith("--- a/models/fixable.py\n+++ b/models/fixable.py\n")
    assert "+        return x + self.down(torch.exp(-nn.functional.softplus(self.up(x))))" in shown.stdout
    assert (repo / "models/fixable.py").read_text() == FIXABLE  # --diff writes nothing
    (repo / "fix.patch").write_text(shown.stdout)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    assert _qlint(repo, "models/fixable.py:exp_block").returncode == 0


def test_fix_on_a_copy_of_the_bundled_mamba_certifies_and_trains(tmp_path):
    repo = _repo(tmp_path, _zoo_copy(tmp_path))
    report, text = _fix(repo, "models.py:native", "zoo/mamba.py",
                        "fixed zoo/mamba.py (linear_growth certifies `layers.0`, `layers.1`)")
    assert "max q = 1 over 2 blocks" in report
    # only the branch the trace ran is edited, and a conditional whose branches became equal folds
    assert "params = self.x_proj(F.normalize(x, dim=-1))\n" in text
    assert "gate = torch.sigmoid(z)\n" in text
    assert "# S4D-real" in text  # the file's comments stay
    losses = _trains(repo / "models.py", "native")
    assert all(torch.isfinite(torch.tensor(losses)))


def test_fix_on_a_swiglu_without_norm_swaps_the_gate(tmp_path):
    repo = _repo(tmp_path, _zoo_copy(tmp_path))
    _, text = _fix(repo, "models.py:swiglu", "zoo/transformer.py",
                   "fixed zoo/transformer.py (gate_sigmoid certifies `SwiGLUResidual`)")
    assert "return self.down_proj(torch.sigmoid(self.gate_proj(x)) * self.up_proj(x))" in text
    assert all(torch.isfinite(torch.tensor(_trains(repo / "models.py", "swiglu"))))


def test_a_patch_that_does_not_recertify_is_never_shown(tmp_path, monkeypatch):
    """The graph remedy certifies, but its source edit is wrong (the cube stays): the re-check drops it, and
    the next-ranked remedy, which does re-certify, is the one offered."""
    from qlint.api import configure
    from qlint.fixes import edits, source_patches

    repo = _repo(tmp_path, {"fixable.py": FIXABLE})
    monkeypatch.chdir(repo)
    def wrong(expression, names):  # h ** 3 -> torch.abs(h ** 3): still cubic
        return edits._call("torch.abs", expression)

    monkeypatch.setitem(edits.SOURCE_EDITS, "lipschitz_activation",
                        lambda context, root: [edits._expression(context, context.dominant(), root, wrong)])
    fixes = source_patches(configure(["fixable.py:cubic"], isolated=True, no_cache=True, witness=False),
                           "fixable.py:cubic")
    (patch,) = fixes.patches
    assert patch.kinds == ("preln",) and "torch.abs" not in patch.patched
    assert "lipschitz_activation: the patched source leaves the block at q = 3" in fixes.dropped["Cubic"][0]


@pytest.mark.parametrize(("folder", "named"), [("vendor", "/vendor/vendor_models.py`"),
                                              ("repo/.venv/lib/python3.11/site-packages", "`vendor_models.py`")])
def test_code_outside_the_repository_gets_the_reason_not_a_patch(tmp_path, folder, named):
    """A block whose code is library code: a module outside the repository on sys.path, or one installed
    in a virtual environment inside the repository (named from its package on)."""
    vendor = tmp_path / folder
    vendor.mkdir(parents=True)
    (vendor / "vendor_models.py").write_text(FIXABLE)
    repo = _repo(tmp_path / "repo", {"models.py": "from vendor_models import cubic as build_model\n"})
    shown = subprocess.run([sys.executable, "-m", "qlint", "models.py:build_model", "--no-cache", "--diff"], cwd=repo,
                           env={**ENV, "PYTHONPATH": str(vendor)}, capture_output=True, text=True, timeout=900)
    assert (shown.returncode, shown.stdout) == (0, ""), shown.stderr
    assert f"{named} is library code: qlint patches only files in your repository" in shown.stderr
    assert shown.stderr.count("is library code") == 1  # said once, not once per remedy kind
    by_hand = "block `Cubic`, by hand (re-checked on the graph): lipschitz_activation (h ** 3 in Cubic): h ** 3"
    assert by_hand in shown.stderr  # the prose remedy stands where no patch is offered


def test_remedy_as_patch_needs_a_spec_and_returns_the_patches(tmp_path, monkeypatch):
    import qlint

    repo = _repo(tmp_path, {"fixable.py": FIXABLE})
    monkeypatch.chdir(repo)
    with pytest.raises(ValueError, match="as_patch=True needs the model as a spec"):
        qlint.remedy(torch.nn.Linear(2, 2), as_patch=True)
    (patch,) = qlint.remedy("fixable.py:cubic", as_patch=True)
    assert (patch.path, patch.kinds, patch.q_after) == ("fixable.py", ("lipschitz_activation",), {"Cubic": 1.0})
    assert "+        return x + self.down(nn.functional.gelu(h))" in patch.diff


def test_without_libcst_the_flags_fail_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "libcst", None)
    from qlint.fixes import FixError, source_patches

    with pytest.raises(FixError,
                       match=r"needs the \[fix\] extra \(libcst is not installed\): pip install 'torch-qlint\[fix\]'"):
        source_patches(None, "fixable.py:cubic", tmp_path)


def test_git_is_not_needed_outside_a_repository(tmp_path):
    shutil.rmtree(_repo(tmp_path, {"fixable.py": FIXABLE}) / ".git")
    shown = _qlint(tmp_path, "fixable.py:cubic", "--diff")
    assert shown.returncode == 1 and shown.stdout.startswith("--- a/fixable.py\n")


def test_a_model_that_exits_is_one_error_line_and_the_others_still_get_their_patch(tmp_path):
    exits = "import sys\n\n\ndef build_model():\n    print('chatter')\n    sys.exit(3)\n"
    repo = _repo(tmp_path, {"fixable.py": FIXABLE, "exits.py": exits})
    both = _qlint(repo, "exits.py:build_model", "fixable.py:cubic", "--diff")
    assert both.returncode == 1 and both.stdout.startswith("--- a/fixable.py\n")  # chatter kept off the patch
    assert "qlint: error: exits.py:build_model: the model's code called sys.exit(3)" in both.stderr
    alone = _qlint(repo, "exits.py:build_model", "--diff")
    assert (alone.returncode, alone.stdout) == (2, "")


def test_show_remedies_attaches_the_patch_to_the_block(tmp_path):
    import json

    repo = _repo(tmp_path, {"fixable.py": FIXABLE})
    shown = _qlint(repo, "fixable.py:cubic", "--show-remedies", "--output-format", "json")
    assert shown.returncode == 1, shown.stderr
    (block,) = json.loads(shown.stdout)["models"][0]["blocks"]
    (patch,) = block["patches"]
    assert (patch["kind"], patch["path"], patch["blocks"], patch["q_after"]) == (
        "lipschitz_activation", "fixable.py", ["Cubic"], 1.0)
    assert "+        return x + self.down(nn.functional.gelu(h))\n" in patch["diff"]


def test_two_different_failing_blocks_each_get_their_remedy_in_one_patch(tmp_path):
    """The cubic block's patch is kept though the exp block beside it stays at q = inf (not worse),
    then the exp block's builds on it: one file, both remedies, and the re-run certifies."""
    two = textwrap.dedent('''\
        import torch
        from torch import nn

        from fixable import Cubic, ExpBlock


        def build_model():
            torch.manual_seed(0)
            return nn.Sequential(Cubic(), ExpBlock()), (torch.randn(4, 8),)
        ''')
    repo = _repo(tmp_path, {"fixable.py": FIXABLE, "two.py": two})
    report, text = _fix(repo, "two.py:build_model", "fixable.py",
                        "fixed fixable.py (lipschitz_activation, bounded_exp certifies `0`, `1`)")
    assert "max q = 1 over 2 blocks" in report
    assert "return x + self.down(nn.functional.gelu(h))" in text
    assert "return x + self.down(torch.exp(-nn.functional.softplus(self.up(x))))" in text
    assert all(torch.isfinite(torch.tensor(_trains(repo / "two.py", "build_model"))))


def test_a_recheck_is_judged_on_every_block_and_on_the_findings_that_fail_the_run():
    from qlint.fixes import _problem

    before = {"blocks": {"a": (3.0, "supercritical"), "b": (float("inf"), "supercritical"), "c": (1.0, "ok")},
              "findings": [("QL101", "error", "a"), ("QL103", "error", "b")]}

    def after(blocks, findings=()):
        return {"failure": None, "blocks": {**before["blocks"], **blocks}, "findings": [("QL103", "error", "b"),
                                                                                         *findings]}

    def fails(severity):
        return severity == "error"

    assert _problem(after({"a": (1.0, "ok")}), before, "a", fails) is None  # b stays at inf: not worse
    assert _problem(after({"a": (2.0, "supercritical")}), before, "a", fails) == (
        "the patched source leaves the block at q = 2.0")
    assert _problem(after({"a": (1.0, "ok"), "c": (2.0, "supercritical")}), before, "a", fails) == (
        "block `c` would no longer certify")
    assert _problem(after({"a": (1.0, "ok"), "b": (None, "uncertified")}), before, "a", fails) == (
        "block `b` would get worse (q = inf -> None)")
    assert _problem(after({"a": (1.0, "ok")}, [("QL106", "error", None)]), before, "a", fails) == (
        "the patched source adds QL106")
    assert _problem(after({"a": (1.0, "ok")}, [("QL204", "warning", "a")]), before, "a", fails) is None


def test_a_norm_added_above_does_not_shift_the_next_blocks_edit(tmp_path):
    """Pre-LN for the bilinear block adds a line to its __init__; the cubic block below is still edited at
    its own line (every edit is made on the original text), and the one diff git applies certifies both."""
    two = textwrap.dedent('''\
        import torch
        from torch import nn


        class Bilinear(nn.Module):
            def __init__(self, d: int = 8):
                super().__init__()
                self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

            def forward(self, x):
                return x + self.c(self.a(x) * self.b(x))


        class Cubic(nn.Module):
            def __init__(self, d: int = 8):
                super().__init__()
                self.up, self.down = nn.Linear(d, d), nn.Linear(d, d)

            def forward(self, x):
                return x + self.down(self.up(x) ** 3)


        def build_model():
            torch.manual_seed(0)
            return nn.Sequential(Bilinear(), Cubic()), (torch.randn(4, 8),)
        ''')
    repo = _repo(tmp_path, {"two.py": two})
    shown = _qlint(repo, "two.py:build_model", "--diff")
    assert shown.returncode == 1, shown.stderr
    assert "# two.py:build_model: preln, lipschitz_activation certifies `0`, `1`" in shown.stderr
    assert "+        self.qlint_preln = nn.LayerNorm(d)\n" in shown.stdout  # the constructor's own width
    assert "+        return x + self.down(nn.functional.gelu(self.up(x)))\n" in shown.stdout
    (repo / "fix.patch").write_text(shown.stdout)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    assert _qlint(repo, "two.py:build_model").returncode == 0


def test_a_conditional_whose_branches_an_edit_made_equal_folds_keeping_its_parentheses():
    import libcst as cst

    from qlint.fixes.edits import _folded

    def fold(code: str) -> str:
        expression = cst.parse_expression(code)
        if isinstance(expression, cst.Attribute):  # ``(...).sum``: fold the conditional inside
            expression = expression.with_changes(value=_folded(expression.value))
        else:
            expression = _folded(expression)
        return cst.Module([]).code_for_node(expression)

    assert fold("torch.sigmoid(z) if self.linear_growth else torch.sigmoid(z)") == "torch.sigmoid(z)"
    assert fold("(a * b if flag else a * b).sum") == "(a * b).sum"
    assert fold("a if self.flag() else a") == "a if self.flag() else a"  # the test may do something
    assert fold("a if flag else b") == "a if flag else b"


def test_a_remedy_kind_without_a_source_edit_is_reported_not_patched(tmp_path):
    from qlint.fixes.edits import EditError, edits_for

    with pytest.raises(EditError, match="no source edit for remedy kind 'rotate_the_stream' yet"):
        edits_for(None, "rotate_the_stream", tmp_path)


HEADER = "import torch\nfrom torch import nn\n\n\n"
BUILD = ("\n\ndef build_model():\n    torch.manual_seed(0)\n"
         "    return nn.Sequential(Block(8), Block(8)), (torch.randn(2, 4, 8),)\n")


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param('''class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up, self.down = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.down(self.up(x).pow(3))
''', "+        return x + self.down(nn.functional.gelu(self.up(x)))\n", id="a method power: the receiver"),
    pytest.param('''class Square(nn.Module):
    def forward(self, h):
        return h * h


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), Square(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.mlp(x)
''', "+        return x + self.mlp(self.qlint_preln(x))\n", id="Pre-LN around an nn.Sequential branch"),
    pytest.param('''import torch.nn.functional as nnf


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(d, d)), nn.Parameter(torch.randn(d, d))

    def forward(self, x):
        a = nnf.linear(x, self.w1)
        return x + a * nnf.linear(a, self.w2)
''', "+        return x + a * nnf.linear(nnf.normalize(a, dim=-1), self.w2)\n", id="functional under another name"),
    pytest.param('''class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a, self.b = nn.Linear(2 * d, d), nn.Linear(2 * d, d)

    def forward(self, x):
        h = torch.cat([x, torch.roll(x, 1, -1)], dim=-1)
        return x + self.a(h) * self.b(h)
''', "+        return x + self.qlint_norm(self.a(h) * self.b(h))\n", id="the input inside a list: the next remedy"),
])
def test_the_patch_lands_where_the_traced_op_was_written(tmp_path, body, expected):
    repo = _repo(tmp_path, {"m.py": HEADER + body + BUILD})
    shown = _qlint(repo, "m.py:build_model", "--diff")
    assert shown.returncode == 1, shown.stderr
    assert expected in shown.stdout
    (repo / "fix.patch").write_text(shown.stdout)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    assert _qlint(repo, "m.py:build_model").returncode == 0


def test_fix_holds_back_a_patch_that_changes_what_the_model_computes(tmp_path):
    """ruff's split: h ** 3 -> gelu(h) certifies the block but a trained checkpoint no longer computes what it
    did, so --fix alone writes nothing and says so; --diff marks the patch; the config key allows it."""
    (tmp_path / "fixable.py").write_text(FIXABLE)
    repo = _repo(tmp_path, {})
    held = _qlint(repo, "fixable.py:cubic", "--fix")
    assert held.returncode == 1 and (repo / "fixable.py").read_text() == FIXABLE
    assert ("qlint: 1 unsafe fix(es) held back: each changes what the model computes (trained weights do not carry "
            "over); see them with --diff, apply them with --fix --unsafe-fixes") in held.stderr
    shown = _qlint(repo, "fixable.py:cubic", "--diff")
    assert "(unsafe: it changes what the model computes, and trained weights do not carry over)" in shown.stderr
    (repo / "pyproject.toml").write_text("[tool.qlint]\nunsafe-fixes = true\n")
    assert _qlint(repo, "fixable.py:cubic", "--fix").returncode == 0
    assert "nn.functional.gelu(h)" in (repo / "fixable.py").read_text()


def test_crlf_and_a_coding_line_are_kept_and_only_the_edited_line_changes(tmp_path):
    latin = ("# -*- coding: latin-1 -*-\n# Autor: J\xfcrgen\n" + FIXABLE).replace("\n", "\r\n").encode("latin-1")
    (tmp_path / "fixable.py").write_bytes(latin)
    repo = _repo(tmp_path, {})
    shown = subprocess.run([sys.executable, "-m", "qlint", "fixable.py:cubic", "--no-cache", "--diff"], cwd=repo,
                           env=ENV, capture_output=True, timeout=900)  # bytes: the patch's "\r\n" as written
    assert b"-        return x + self.down(h ** 3)\r\n" in shown.stdout
    (repo / "fix.patch").write_bytes(shown.stdout)
    assert subprocess.run(["git", "apply", "--check", "fix.patch"], cwd=repo).returncode == 0
    assert _qlint(repo, "fixable.py:cubic", "--fix", "--unsafe-fixes").returncode == 0
    stat = subprocess.run(["git", "diff", "--numstat"], cwd=repo, capture_output=True, text=True).stdout
    assert stat.split()[:3] == ["1", "1", "fixable.py"]
    fixed = (repo / "fixable.py").read_bytes()
    assert fixed == latin.replace(b"self.down(h ** 3)", b"self.down(nn.functional.gelu(h))")


def test_a_patch_that_breaks_another_model_of_the_run_is_not_kept(tmp_path):
    """Block takes no argument, so its norm's width is the number its layers are built with; a subclass of
    it in another model of the run rebuilds them wider, and the norm Block gains would break it."""
    wide = BUILD.replace("build_model", "build_wide").replace("Block(8)", "Wide()").replace("4, 8", "4, 16")
    body = '''class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return x + self.a(x) * self.b(x)


class Wide(Block):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Identity(), nn.Identity()
'''
    build = BUILD.replace("Block(8)", "Block()")
    repo = _repo(tmp_path, {"m.py": HEADER + body + build + wide})
    shown = _qlint(repo, "m.py:build_model", "m.py:build_wide", "--fix", "--unsafe-fixes")
    assert "`m.py:build_wide` would no longer analyse" in shown.stderr
    assert "fixed m.py" not in shown.stderr and (repo / "m.py").read_text() == HEADER + body + build + wide


def test_a_file_changed_while_qlint_worked_is_not_written(tmp_path):
    from qlint.fixes import FixError, Patch, write_patch

    (tmp_path / "m.py").write_text("x = 2  # the user's edit\n")
    patch = Patch("m.py", "x = 1\n", "x = 3\n", ("preln",), ("b",), {"b": 0.0})
    with pytest.raises(FixError, match="m.py changed while qlint worked on it: not written"):
        write_patch(tmp_path, patch)
    assert (tmp_path / "m.py").read_text() == "x = 2  # the user's edit\n"


def test_a_model_that_ends_the_process_cannot_decide_the_exit_code(tmp_path):
    """--diff runs each model's code in a child: an os._exit() there is that model's failure."""
    ends = "import os\n\n\ndef build_model():\n    os._exit(0)\n"
    repo = _repo(tmp_path, {"fixable.py": FIXABLE, "ends.py": ends})
    both = _qlint(repo, "ends.py:build_model", "fixable.py:cubic", "--diff")
    assert both.returncode == 1 and both.stdout.startswith("--- a/fixable.py\n"), both.stderr
    assert "qlint: error: ends.py:build_model: the model's code ended the process (exit code 0)" in both.stderr
    alone = _qlint(repo, "ends.py:build_model", "--diff")
    assert (alone.returncode, alone.stdout) == (2, "")


WIDTHS = textwrap.dedent('''\
    import torch
    from torch import nn


    class Bilinear(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d)
            self.c = nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.c(self.a(x) * self.b(x))


    class Widen(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.d = d

        def forward(self, x):
            return torch.cat([x, x], dim=-1) / 2 ** 0.5


    def build_model():
        torch.manual_seed(0)
        return nn.Sequential(Bilinear(8), Widen(8), Bilinear(16)), (torch.randn(4, 8),)


    class Square(nn.Module):
        def __init__(self, d, gain=1.0):
            super().__init__()
            self.gain = gain

        def forward(self, x):
            s = x.abs()
            h = x * s
            return x + self.gain * h


    def square():
        return nn.Sequential(Square(8), nn.LayerNorm(8)), (torch.randn(4, 8),)
    ''')


def test_a_norm_takes_its_width_from_the_constructor_so_every_instantiation_fits(tmp_path):
    """Issue 41: Bilinear built with d = 8 and d = 16 in the run; the fixed class also builds at d = 32."""
    repo = _repo(tmp_path, {"widths.py": WIDTHS})
    shown = _qlint(repo, "widths.py:build_model", "--diff", "--unsafe-fixes")
    assert shown.returncode == 1, shown.stderr
    assert "+        self.qlint_preln = nn.LayerNorm(d)\n" in shown.stdout  # read from nn.Linear(d, 2 * d)
    assert "LayerNorm(8)" not in shown.stdout and "LayerNorm(16)" not in shown.stdout
    (repo / "fix.patch").write_text(shown.stdout)
    subprocess.run(["git", "apply", "fix.patch"], cwd=repo, check=True)
    assert _qlint(repo, "widths.py:build_model").returncode == 0
    spec = importlib.util.spec_from_file_location("fixed_widths", repo / "widths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    outside = module.Bilinear(32)  # a width the run never built
    assert outside(torch.randn(3, 32)).shape == (3, 32)


def test_a_norm_whose_width_no_constructor_argument_gives_is_refused_with_the_reason(tmp_path):
    repo = _repo(tmp_path, {"widths.py": WIDTHS})
    shown = _qlint(repo, "widths.py:square", "--diff", "--unsafe-fixes")
    assert "is not written from `__init__`'s arguments" in shown.stderr, shown.stderr
    assert "LayerNorm(8)" not in shown.stdout
