"""The CLI end to end: exit codes, the JSON schema, loading conventions, errors."""

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from qlint.cli import main
from conftest import ROOT, fixture_spec


def run(*args, cwd=None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def qlint_process(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "qlint", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_supercritical_model_exits_1_and_shows_the_derivation():
    result = run(fixture_spec("mamba.py:native"))
    assert result.exit_code == 1
    assert "q = 5" in result.output and "derivation of layers.0" in result.output
    assert "QL101" in result.output and "tracer: export" in result.output and "mode: train" in result.output


def test_certified_model_exits_0():
    result = run("check", fixture_spec("gpt2.py:build_model"), "--select", "QL1")
    assert result.exit_code == 0, result.output
    assert "certified, max q = 0" in result.output and "All checks passed" in result.output
    # warnings (attention-logit growth) do not fail the run by default: every default-on rule runs here
    default = run("check", fixture_spec("gpt2.py:build_model"), "--format", "concise")
    assert default.exit_code == 0, (f"a new default-on rule fails GPT-2, the reference certified model:\n"
                                    f"{default.output}if it is right, update this expectation")


@pytest.mark.parametrize("flags, skipped", [
    (("--device", "meta"), "not checked: graph against the model (meta tensors have no values), witness (the weights "
                           "are on the meta device (no values to measure))"),
    (("--no-witness",), "not checked: witness (off)"),
])
def test_a_weaker_run_says_what_it_skipped_on_the_verdict_line(flags, skipped):
    result = run("check", fixture_spec("toy.py:lipschitz_mlp"), *flags)
    assert result.exit_code == 0, result.output
    assert f"lipschitz_mlp: certified; {skipped}, max q = 1" in result.output
    assert "All checks passed" not in result.output and "No findings, but not every check ran" in result.output
    concise = run("check", fixture_spec("toy.py:lipschitz_mlp"), *flags, "--format", "concise")
    assert concise.output.strip().endswith("No findings, but not every check ran (see the verdicts).")


def test_json_document_follows_the_schema():
    """About the schema, not the rule set: the rules it reads are selected, so a new rule leaves it alone."""
    result = run(fixture_spec("llama.py:without_norm"), fixture_spec("toy.py:unknown_op"), "--format", "json",
                 "--select", "QL101,QL102")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert set(doc) >= {"qlint_version", "models", "summary"}
    assert doc["summary"] == {"models": 2, "errors": 3, "warnings": 0, "infos": 0, "suppressed": 0, "failed": 0}
    llama, unknown = doc["models"]
    assert set(llama) >= {"spec", "tracer", "mode", "verdict", "max_q", "blocks", "findings"}
    assert (llama["verdict"], llama["max_q"], llama["mode"], llama["tracer"]) == ("supercritical", 2, "train",
                                                                                  "symbolic_trace")
    block = llama["blocks"][1]
    assert set(block) >= {"name", "index", "q", "status", "derivation"}
    assert (block["name"], block["index"], block["q"], block["status"]) == ("layers.0:mlp", 1, 2, "supercritical")
    step = block["derivation"][-1]
    assert set(step) >= {"node", "primitive", "q", "source"} and set(step["source"]) == {"file", "line"}
    finding = llama["findings"][0]
    assert set(finding) >= {"code", "severity", "message", "block", "source"}
    assert (finding["code"], finding["severity"], finding["block"]) == ("QL101", "error", "layers.0:mlp")
    assert unknown["verdict"] == "uncertified" and unknown["max_q"] is None
    assert unknown["blocks"][0]["q"] is None and unknown["findings"][0]["code"] == "QL102"


def test_mode_is_overridable_and_reported():
    result = run(fixture_spec("gpt2.py:build_model"), "--mode", "eval", "--format", "json")
    assert json.loads(result.output)["models"][0]["mode"] == "eval"


@pytest.fixture()
def user_code(tmp_path):
    """A user's project folder with a model module importing a sibling helper."""
    (tmp_path / "helpers.py").write_text("import torch\nWIDTH = 6\n")
    (tmp_path / "net.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from helpers import WIDTH

            class Loop(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(WIDTH, WIDTH)

                def forward(self, x):
                    for t in range(x.shape[1]):  # Python control flow over a shape
                        x = x + self.fc(x) ** 2
                    return x

            def build_model():
                return Loop()

            model_instance = Loop()
            not_a_model = 42
            """
        )
    )
    (tmp_path / "broken.py").write_text("import torch\nimport does_not_exist_anywhere\n")
    return tmp_path


def test_spec_path_imports_with_its_folder_on_sys_path(user_code):
    result = run(str(user_code / "net.py:build_model"), "--input-shape", "2,3,6", "--format", "json")
    assert result.exit_code == 1
    model = json.loads(result.output)["models"][0]
    assert model["tracer"] == "export"
    assert [b["q"] for b in model["blocks"]] == [2, 2, 2]


def test_instance_spec_and_default_attribute(user_code):
    result = run(str(user_code / "net.py:model_instance"), "--input-shape", "1,2,6", "--format", "json")
    assert [b["q"] for b in json.loads(result.output)["models"][0]["blocks"]] == [2, 2]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("broken.py:build_model", "import failed inside the module: No module named 'does_not_exist_anywhere'"),
        ("missing.py:build_model", "no such file"),
        ("net.py:nope", "has no attribute 'nope'"),
        ("net.py:not_a_model", "neither an nn.Module nor a factory"),
        ("net.py:build_model", "could not trace Loop"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(user_code, spec, message):
    completed = qlint_process(str(user_code / spec))
    assert completed.returncode == 2
    assert message in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1 and "Traceback" not in completed.stderr


def test_untraceable_model_names_the_construct(user_code):
    completed = qlint_process(str(user_code / "net.py:build_model"))
    assert "give --input-shape" in completed.stderr and "net.py" in completed.stderr


def test_traceback_flag_shows_the_trace_and_keeps_exit_2(user_code):
    completed = qlint_process(str(user_code / "broken.py:build_model"), "--traceback")
    assert completed.returncode == 2 and "Traceback" in completed.stderr
    trace, last = completed.stderr.strip().rsplit("\n", 1)
    assert 'broken.py", line' in trace  # the user's own frame
    assert last.startswith("qlint: error: ")


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    (tmp_path / "slow.py").write_text("def build_model():\n    raise KeyboardInterrupt\n")
    completed = qlint_process(str(tmp_path / "slow.py:build_model"))
    assert completed.returncode == 130 and completed.stderr.strip() == "qlint: interrupted"


def test_dotted_module_spec():
    result = run("qlint.zoo.toy:PolyMLP", "--input-shape", "2,3,4", "--format", "json")
    # PolyMLP is a class: a zero-argument factory would need d; the loader reports it
    assert result.exit_code == 2 or json.loads(result.output)


def test_invalid_input_shape_is_a_usage_error(user_code):
    completed = qlint_process(str(user_code / "net.py:build_model"), "--input-shape", "2,x,6")
    assert completed.returncode == 2 and "invalid --input-shape" in completed.stderr


def test_explain_and_rules(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table's width (a test worker's terminal is not the user's)
    result = run("explain", "QL101")
    assert result.exit_code == 0 and "supercritical" in result.output and "Use instead" in result.output
    assert run("explain", "QL999").exit_code == 2
    result = run("rules")
    assert result.exit_code == 0
    for row in ("LayerNorm", "Polynomial", "Self-attention", "Exponential"):
        assert row in result.output
    assert "clamps to [lo, hi]" in " ".join(result.output.replace("│", " ").split())  # brackets are text, not markup
    rows = json.loads(run("rules", "--json").output)
    assert {r["primitive"]: r["q"] for r in rows}["Polynomial activation x^p"] == "p * q"


def test_a_folder_spec_is_one_clear_line():
    completed = qlint_process("fixtures/")
    assert completed.returncode == 2
    assert completed.stderr.strip() == ("qlint: error: fixtures is a folder; give a Python file or module and its "
                                        "factory, e.g. fixtures/model.py:build_model")


def test_a_mistyped_subcommand_gets_a_did_you_mean():
    result = run("expain", "QL101")
    assert result.exit_code == 2 and "no such command 'expain'; did you mean 'explain'?" in result.output
