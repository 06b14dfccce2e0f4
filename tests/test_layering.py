"""The house has floors: imports only go down, never in a circle, and the top floors stay light.

The floors are those of docs/architecture.md (``scripts/import_graph.py`` holds them):
core <- capture <- growth <- registry <- lint <- analysis <- ci / probe / remedies <- api / fixes / monitor
<- verify <- cli. Inside capture the modules import one way (``CAPTURE_ORDER``: the stages in the order
the pipeline runs them); no folder holds more than 12 modules and no module of the package more than 800 lines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_module


def _import_graph():
    return load_module(ROOT / "scripts" / "import_graph.py", "import_graph")


def test_no_import_cycles_and_no_upward_arrows():
    tool = _import_graph()
    g = tool.graph(ROOT)
    assert g.number_of_edges() > 100  # the scan sees the package (a broken scan would pass vacuously)
    assert tool.cycles(g) == []
    assert tool.violations(g) == []


def test_the_checks_catch_an_upward_import_a_stage_calling_back_and_a_crowded_folder(tmp_path):
    """The checks above pass on a house that breaks each rule: a planted one shows each check sees its fault."""
    tool = _import_graph()
    for folder in ("qlint/core", "qlint/cli", "qlint/capture", "tests/crowded"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "qlint/__init__.py").write_text("")
    (tmp_path / "qlint/cli/main.py").write_text("import qlint.core.algebra\n")
    (tmp_path / "qlint/core/algebra.py").write_text("from qlint.cli import main\n")  # floor 0 -> floor 9
    (tmp_path / "qlint/capture/trace.py").write_text("from qlint.capture.pipeline import run\n")
    (tmp_path / "qlint/capture/pipeline.py").write_text("run = None\n")
    for i in range(13):
        (tmp_path / f"tests/crowded/test_{i}.py").write_text("")
    g = tool.graph(tmp_path)
    assert tool.violations(g) == [("qlint.core.algebra", "qlint.cli.main")]
    assert tool.cycles(g) == [["qlint.cli.main", "qlint.core.algebra"]]
    assert tool.capture_order_violations(g) == [("qlint.capture.trace", "qlint.capture.pipeline")]
    assert tool.crowded_folders(tmp_path) == {"tests/crowded": 13}


def test_the_capture_stages_import_one_way():
    """qlint/capture/'s modules import only the ones below them in CAPTURE_ORDER (the pipeline last, the
    stages in the order it runs them); a new capture module must be given its place there."""
    tool = _import_graph()
    assert tool.capture_order_violations(tool.graph(ROOT)) == []
    assert {p.stem for p in (ROOT / "qlint" / "capture").glob("*.py") if p.name != "__init__.py"} == set(tool.CAPTURE_ORDER)


def test_no_folder_holds_more_than_12_modules():
    """A floor of twenty files says nothing about what is in it: every folder of qlint/ and of tests/ holds
    at most 12 Python modules, not counting __init__.py (fixtures/ is data: case files keyed by path)."""
    tool = _import_graph()
    assert tool.MAX_MODULES_PER_FOLDER == 12
    crowded = tool.crowded_folders(ROOT)
    assert crowded == {}, f"split these folders by what their modules do: {crowded}"


def test_no_module_of_the_package_is_over_800_lines():
    """A module too long to hold in one's head is two modules; qlint/ keeps each to 800 lines."""
    limit = 800
    long = {str(path.relative_to(ROOT)): n for path in sorted((ROOT / "qlint").rglob("*.py")) if "__pycache__" not in path.parts
            for n in [len(path.read_text(encoding="utf-8").splitlines())] if n > limit}
    assert long == {}, f"modules over {limit} lines: {long}"


def test_every_module_has_a_floor():
    tool = _import_graph()
    assert [m for m in tool.graph(ROOT).nodes if tool.floor(m) < 0] == []


def test_rules_folder_is_declarative():
    """rules/ holds the registry and the lint rules as data: no Python module there can import a layer."""
    assert sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "rules").rglob("*.py")) == []
    assert {p.parent.name for p in (ROOT / "rules").rglob("*.toml")} == {"primitives", "checks"}


def test_a_plain_checkout_imports_the_pipeline():
    result = subprocess.run([sys.executable, "-c", "import qlint.analysis, qlint.registry; print(len(qlint.registry.default().primitives))"],
                            cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 100


_TORCH_FREE = """
import sys
from click.testing import CliRunner
from qlint.cli import main
results = [CliRunner().invoke(main, args) for args in {args!r}]
print(json.dumps({{"codes": [r.exit_code for r in results], "torch": "torch" in sys.modules, "out": [r.output for r in results]}}))
"""


@pytest.mark.parametrize(
    "args, codes",
    [
        ([["explain", "QL101"]], [0]),
        ([["rules"]], [0]),
        ([["rules", "--json"]], [0]),
        ([["explain", "QL999"]], [2]),
        ([["--version"]], [0]),
        ([["clean", "--cache-dir", "/nonexistent/qlint-cache"]], [0]),
        ([["no_such_file.py:build"], ["fixtures"], ["fixtures/toy.py:1bad"]], [2, 2, 2]),
    ],
)
def test_docs_and_rule_listings_do_not_import_torch(args, codes):
    result = subprocess.run([sys.executable, "-c", "import json" + _TORCH_FREE.format(args=args)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["codes"] == codes, out["out"]
    assert out["torch"] is False


def test_config_errors_do_not_import_torch(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.qlint]\nselect = ["QL1O1"]\n')
    script = "import json" + _TORCH_FREE.format(args=[["fixtures/toy.py:poly_mlp"]])
    result = subprocess.run([sys.executable, "-c", f"import os; os.chdir({str(tmp_path)!r})\n" + script], cwd=ROOT, capture_output=True, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["codes"] == [2] and "QL1O1" in out["out"][0], out["out"]
    assert out["torch"] is False


@pytest.mark.parametrize("spec", ["missing.py:build", "fixtures", "fixtures/toy.py:not-a-name"])
def test_spec_errors_do_not_import_torch(tmp_path, spec):
    script = "import json" + _TORCH_FREE.format(args=[[str(ROOT / spec) if spec != "missing.py:build" else spec, "--isolated"]])
    result = subprocess.run([sys.executable, "-c", f"import os; os.chdir({str(tmp_path)!r})\n" + script], cwd=ROOT, capture_output=True,
                            text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["codes"] == [2] and "qlint: error:" in out["out"][0], out["out"]
    assert out["torch"] is False


def test_a_built_wheel_carries_the_rules(tmp_path):
    """A non-editable install finds rules/ as qlint/_rules: the catalogue and the QL codes load from the wheel alone."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("torch_qlint-*.whl")
    import zipfile

    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = "import sys, json; from qlint.registry import entries, rules_dir; from qlint.lint.rule import rules; " \
            "print(json.dumps([str(rules_dir()), len(entries()), len(rules()), 'torch' in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(unpacked), "PATH": ""}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    where, primitives, codes, torch_imported = json.loads(result.stdout)
    assert where == str(unpacked / "qlint" / "_rules")
    assert primitives == len(list(_entries())) and codes == len(_rule_codes()) and torch_imported is False


def _entries():
    from qlint.registry import entries

    return entries()


def _rule_codes():
    """Every rule of the checkout's rules/checks/, which the wheel must carry too."""
    from qlint.lint.rule import rules

    return rules()


def _python_310() -> str | None:
    """A working Python 3.10 (a pyenv shim that is not active does not count)."""
    candidates = [shutil.which("python3.10"), *sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.10*/bin/python3.10"))]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 10)":
            return candidate
    return None


@pytest.mark.skipif(_python_310() is None, reason="no Python 3.10 interpreter on this machine")
def test_python_310_runs_the_torch_free_commands(tmp_path):
    """requires-python >= 3.10: config parsing (tomli there), explain and rules work on 3.10."""
    venv = tmp_path / "py310"
    subprocess.run([_python_310(), "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "tomli", "click", "rich", "networkx"], check=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    explain = subprocess.run([python, "-m", "qlint", "explain", "QL101"], capture_output=True, text=True, env=env, timeout=120)
    assert explain.returncode == 0 and "QL101" in explain.stdout, explain.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.qlint]\nslect = ["QL1"]\n')
    bad = subprocess.run([python, "-m", "qlint", "check", "m.py:f"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "did you mean 'select'" in bad.stderr, bad.stderr


def test_no_line_in_the_package_is_over_120_characters():
    """A line too wide to read beside another file hides its end; the whole package keeps to 120."""
    limit = 120
    offenders = [f"{path.relative_to(ROOT)}:{number} ({len(line)})"
                 for path in sorted((ROOT / "qlint").rglob("*.py")) if "__pycache__" not in path.parts
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > limit]
    assert not offenders, f"{len(offenders)} line(s) over {limit} characters:\n" + "\n".join(offenders)


def test_every_package_folder_ships_in_the_wheel():
    """setuptools installs only the packages pyproject.toml lists: a new folder of qlint/ left out
    works from a checkout and is missing from every installed copy."""
    from qlint.core.toml import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "qlint").rglob("__init__.py")}
    missing = sorted(folders - listed)
    assert not missing, f"add {missing} to `packages` under [tool.setuptools] in pyproject.toml"
