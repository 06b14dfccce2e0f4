"""The README is true to a newcomer: the abridged demo output is what `make demo` prints, the
derivation its prose walks through is the one the demo shows, the CPU-index recipe is the
Makefile's, and no example pins a git tag this repository does not have."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT

README = ROOT / "README.md"


def _demo_block() -> list[str]:
    """The ```text block of the Quick start that shows `$ qlint ...` and its output."""
    text = README.read_text(encoding="utf-8")
    quick = text[text.index("## Quick start"):text.index("## Using it")]
    blocks = re.findall(r"```text\n(.*?)```", quick, flags=re.S)
    [block] = [b for b in blocks if b.startswith("$ qlint ")]
    return block.rstrip("\n").splitlines()


def _normal(line: str) -> str:
    """A line as compared: trailing blanks dropped, runs of blanks (a table's padding) as one,
    and the line number of a `file.py:N` reference left out (the code it names is compared)."""
    return re.sub(r"\s+", " ", re.sub(r"(\.py):\d+", r"\1:N", line)).strip()


def _demo_command() -> list[str]:
    """`make demo`'s qlint arguments, read from the Makefile's recipe."""
    recipe = re.search(r"^demo:.*\n\t@?\$\(VENV\)/bin/qlint ([^;\n]+)", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe, "the Makefile's demo recipe runs $(VENV)/bin/qlint"
    return shlex.split(recipe.group(1))


@functools.lru_cache(maxsize=1)
def _run_demo() -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    env.update(QLINT_NO_CACHE="1", PYTHONPATH=str(ROOT), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "qlint", *_demo_command()], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=900)


def test_the_readme_demo_is_what_make_demo_prints():
    shown = _demo_block()
    assert shlex.split(shown[0][2:])[1:] == _demo_command(), "the README shows the command `make demo` runs"
    demo = _run_demo()
    assert demo.returncode == 1, demo.stderr  # q = 5: findings
    printed = [_normal(line) for line in demo.stdout.splitlines()]
    position = 0
    for line in shown[1:]:  # abridged: each line the README shows is printed, in this order
        wanted = _normal(line)
        if not wanted:
            continue
        assert wanted in printed[position:], f"README.md shows a line the demo does not print (after line {position}): {line!r}"
        position = printed.index(wanted, position) + 1


def test_the_readme_prose_walks_the_derivation_the_demo_prints():
    text = README.read_text(encoding="utf-8")
    prose = text[text.index("prints the report of the native Mamba"):text.index("Afterwards use `.venv/bin/qlint`")]
    claimed_block_q = re.search(r"q = (\d+) with the paper's accounting", prose)
    claimed_steps = [int(q) for q in re.findall(r"q=(\d+)", prose)]
    demo = _run_demo()
    out = demo.stdout
    derivation = out[out.index("derivation of layers.0"):out.index("derivation of layers.1")]
    steps = [int(q) for q in re.findall(r"→ q =\s+(\d+)", derivation)]
    assert claimed_block_q and f"(q = {claimed_block_q.group(1)})" in derivation.splitlines()[0]
    assert claimed_steps == steps, f"the README's walk {claimed_steps} is not the derivation {steps}"


def test_the_cpu_wheel_recipe_is_the_makefiles_and_the_cost_is_stated():
    makefile = (ROOT / "Makefile").read_text()
    readme = README.read_text(encoding="utf-8")
    recipe = "make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
    assert recipe in readme and recipe in makefile
    assert "--index-url $(TORCH_INDEX_URL)" in makefile and "$(TORCH_INDEX) $(PINS)" in makefile
    assert "avoids" not in makefile and "multi-GB CUDA build" not in makefile  # the pin does not choose the build
    for text in (readme, makefile):
        assert "CUDA build" in text and "6.1 GB" in text


def test_no_example_pins_a_tag_this_repository_lacks():
    tags = subprocess.run(["git", "tag", "--list"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for doc in (README, ROOT / "docs" / "ci.md"):
        for rev in re.findall(r"^\s*rev:\s*(\S+)", doc.read_text(encoding="utf-8"), flags=re.M):
            assert rev.startswith("<") or rev in tags or re.fullmatch(r"[0-9a-f]{40}", rev), f"{doc.name}: rev {rev}"
    readme = README.read_text(encoding="utf-8")
    assert "git tag -a v" in readme and "git push origin v" in readme  # the release procedure stays documented
