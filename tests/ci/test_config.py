"""[tool.qlint] configuration: discovery, validation, precedence, rule selection."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from click.testing import CliRunner

from qlint.ci.config import (
    Config,
    ConfigError,
    RuleSelection,
    find_config_file,
    load_config,
    normalize_spec,
    resolve_selected,
)
from qlint.cli import main

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def config_from(tmp_path: Path, body: str, name: str = "pyproject.toml") -> Config:
    header = "[tool.qlint]\n" if name == "pyproject.toml" else ""
    write(tmp_path / name, header + textwrap.dedent(body))
    return load_config(tmp_path)


# -- discovery -----------------------------------------------------------------


def test_nearest_pyproject_with_tool_qlint_is_found_upward(tmp_path, monkeypatch):
    write(tmp_path / "pyproject.toml", '[tool.qlint]\nfail-on = "warning"\n')
    write(tmp_path / "sub" / "pyproject.toml", '[project]\nname = "x"\n')  # no [tool.qlint]: skipped
    (tmp_path / "sub" / "deeper").mkdir()
    cfg = load_config(tmp_path / "sub" / "deeper")
    assert cfg.path == tmp_path / "pyproject.toml"
    assert cfg.fail_on == "warning"
    assert cfg.root == tmp_path.resolve()


def test_qlint_toml_uses_top_level_keys_and_wins_over_pyproject(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.qlint]\nfail-on = "info"\n')
    write(tmp_path / "qlint.toml", 'fail-on = "warning"\n')
    assert load_config(tmp_path).fail_on == "warning"
    write(tmp_path / ".qlint.toml", 'fail-on = "error"\nthreshold = 0.5\n')
    cfg = load_config(tmp_path)
    assert cfg.path.name == ".qlint.toml" and cfg.threshold == 0.5


def test_no_config_gives_defaults(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.qlint]\nfail-on = "info"\n')
    assert find_config_file(tmp_path) == tmp_path / "pyproject.toml"
    cfg = load_config(tmp_path, isolated=True)
    assert cfg.path is None
    assert cfg.models == [] and cfg.fail_on == "error" and cfg.threshold == 1.0
    assert cfg.output_format == "full" and cfg.is_selected("QL101") and cfg.is_selected("QL100")


def test_explicit_config_path_and_inline_overrides(tmp_path):
    other = write(tmp_path / "elsewhere" / "ci.toml", 'fail-on = "warning"\nselect = ["QL1"]\n')
    write(tmp_path / "pyproject.toml", '[tool.qlint]\nfail-on = "info"\n')
    cfg = load_config(tmp_path, config_path=other, overrides=["threshold = 2"])
    assert cfg.path == other and cfg.fail_on == "warning" and cfg.threshold == 2.0
    cfg = load_config(tmp_path, overrides=["fail-on = 'warning'"])
    assert cfg.fail_on == "warning"
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path, config_path=tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="--config"):
        load_config(tmp_path, overrides=["not toml"])


# -- validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('slect = ["QL1"]', r"unknown key 'tool\.qlint\.slect' \(did you mean 'select'\?\)"),
        ('fail_on = "error"', r"unknown key 'tool\.qlint\.fail_on' \(did you mean 'fail-on'\?\)"),
        ('models = "a.py:f"', r"'tool\.qlint\.models' must be an array of non-empty strings"),
        ("threshold = 'one'", r"'tool\.qlint\.threshold' must be a finite number"),
        ("threshold = true", r"'tool\.qlint\.threshold' must be a finite number"),
        ('fail-on = "errors"', r"'tool\.qlint\.fail-on': invalid value 'errors' \(did you mean 'error'"),
        ('mode = "inference"', r"'tool\.qlint\.mode': invalid value"),
        ('tracer = "export_"', r"'tool\.qlint\.tracer': invalid value 'export_' \(did you mean 'export'\?"),
        ('select = ["Q101"]', r"'tool\.qlint\.select': invalid rule selector 'Q101'"),
        ('ignore = ["ql101"]', r"'tool\.qlint\.ignore': invalid rule selector"),
        ('output-format = "xml"', r"'tool\.qlint\.output-format': invalid value 'xml'"),
        ('input-dtype = "float31"', r"'tool\.qlint\.input-dtype': invalid value 'float31' \(did you mean"),
        ('input-shapes = ["2,x,"]', r"'tool\.qlint\.input-shapes': invalid shape"),
        ('per-block-ignores = ["x"]', r"'tool\.qlint\.per-block-ignores' must be a table"),
        ('per-block-ignores = { "layers.*" = ["QLX"] }', r'per-block-ignores\."layers\.\*"\': invalid rule'),
        (
            '[tool.qlint.per-model."m.py:f"]\ninput-shape = ["1,2"]',
            r"unknown key 'tool\.qlint\.per-model\.\"m\.py:f\"\.input-shape' \(did you mean 'input-shapes'\?\)",
        ),
        ('[tool.qlint.per-model."m.py:f"]\nmode = 3', r"per-model\.\"m\.py:f\"\.mode': invalid value 3"),
        (
            'models = ["m.py:build"]\n[tool.qlint.per-model."m.py:buld"]\nmode = "eval"',
            r"per-model\.\"m\.py:buld\"' names no model in 'models'; did you mean 'm\.py:build'\?",
        ),
        ('[tool.qlint.primitives]\n"pkg.Gate" = { q = 0 }', r"primitives\.\"pkg\.Gate\"\.why' is required"),
        ('[tool.qlint.primitives]\n"pkg.Gate" = { q = -1, why = "x" }', r"\.q' must be a number >= 0"),
        ('[tool.qlint.primitives]\n"Gate" = { q = 0, why = "x" }', r"expected a dotted 'module\.Class'"),
        ('[tool.qlint.primitives]\n"pkg.Gate" = { q = 0, why = "x", qq = 1 }', r"unknown key .*\.qq'"),
    ],
)
def test_malformed_config_names_the_key(tmp_path, body, message):
    write(tmp_path / "pyproject.toml", "[tool.qlint]\n" + body + "\n")
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path)


def test_error_messages_name_the_file_and_are_one_line(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.qlint]\nslect = []\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    text = str(info.value)
    assert str(tmp_path / "pyproject.toml") in text and "\n" not in text


def test_invalid_toml_is_a_config_error(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.qlint]\nselect = [\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path)


def test_qlint_toml_errors_use_bare_key_names(tmp_path):
    write(tmp_path / "qlint.toml", "modles = []\n")
    with pytest.raises(ConfigError, match=r"unknown key 'modles' \(did you mean 'models'\?\)"):
        load_config(tmp_path)


# -- values --------------------------------------------------------------------


def test_full_schema_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config_from(
        tmp_path,
        """
        models = ["pkg/model.py:build_model", "mypkg.model:build"]
        select = ["QL1"]
        extend-select = ["QL2"]
        ignore = ["QL104"]
        fail-on = "warning"
        threshold = 1.5
        mode = "train"
        tracer = "make_fx"
        device = "meta"
        input-dtype = "float16"
        input-shapes = ["2,8,7", [4, 3]]
        output-format = "sarif"
        baseline = "qlint-baseline.json"
        per-block-ignores = { "layers.*" = ["QL101"], "head" = ["QL1"] }

        [tool.qlint.per-model."pkg/model.py:build_model"]
        input-shapes = ["1,16"]
        input-dtype = "bfloat16"
        device = "cpu"
        mode = "eval"
        tracer = "export"
        threshold = 2

        [tool.qlint.primitives]
        "mypkg.layers.MyGate" = { q = 0, why = "output in [0, 1]" }
        """,
    )
    assert cfg.models == ["pkg/model.py:build_model", "mypkg.model:build"]
    assert cfg.fail_on == "warning" and cfg.threshold == 1.5 and cfg.mode == "train"
    assert cfg.input_shapes == ((2, 8, 7), (4, 3))
    assert cfg.output_format == "sarif" and cfg.baseline == tmp_path.resolve() / "qlint-baseline.json"
    assert cfg.per_block_ignores == {"layers.*": ("QL101",), "head": ("QL1",)}
    assert cfg.primitives == {"mypkg.layers.MyGate": (0.0, "output in [0, 1]")}
    assert cfg.is_selected("QL101") and cfg.is_selected("QL201") and not cfg.is_selected("QL104")
    assert not cfg.is_selected("QL301") and cfg.is_selected("QL100")  # QL100 is in QL1

    opts = cfg.options_for("pkg/model.py:build_model")
    assert (opts.input_shapes, opts.input_dtype, opts.device, opts.mode, opts.tracer, opts.threshold) == (
        ((1, 16),), "bfloat16", "cpu", "eval", "export", 2.0,
    )  # fmt: skip
    other = cfg.options_for("mypkg.model:build")
    assert (other.input_shapes, other.device, other.mode) == (((2, 8, 7), (4, 3)), "meta", "train")
    assert other.threshold == 1.5


def test_model_specs_resolve_relative_to_the_config_folder(tmp_path, monkeypatch):
    write(tmp_path / "proj" / "pyproject.toml", '[tool.qlint]\nmodels = ["src/m.py:build", "pkg.mod:f"]\n'
          '[tool.qlint.per-model."src/m.py:build"]\ndevice = "meta"\n')  # fmt: skip
    monkeypatch.chdir(tmp_path)
    cfg = load_config(tmp_path / "proj")
    assert cfg.models == ["proj/src/m.py:build", "pkg.mod:f"]
    # The same model named from the cwd gets its per-model settings.
    assert cfg.options_for("proj/src/m.py:build").device == "meta"
    assert cfg.options_for("./proj/src/../src/m.py:build").device == "meta"
    (tmp_path / "proj" / "src").mkdir()
    monkeypatch.chdir(tmp_path / "proj" / "src")
    assert load_config(tmp_path / "proj").models[0] == "m.py:build"


def test_normalize_spec_keeps_module_specs_and_outside_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize_spec("pkg.mod:build", tmp_path / "x") == "pkg.mod:build"
    assert normalize_spec("m.py", tmp_path / "a") == "a/m.py"
    outside = normalize_spec("../m.py:f", tmp_path)
    assert outside == (tmp_path.parent / "m.py").as_posix() + ":f"


# -- CLI precedence ------------------------------------------------------------


def test_cli_flags_override_file_and_per_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = config_from(
        tmp_path,
        """
        models = ["a.py:f", "b.py:g"]
        fail-on = "warning"
        mode = "train"
        [tool.qlint.per-model."a.py:f"]
        mode = "eval"
        input-shapes = ["1,2"]
        """,
    )
    assert cfg.options_for("a.py:f").mode == "eval"
    merged = cfg.merge_cli(models=["c.py:h"], fail_on="error", mode="train", input_shapes=["3,4"], threshold=0)
    assert merged.models == ["c.py:h"] and merged.fail_on == "error"
    opts = merged.options_for("a.py:f")
    assert opts.mode == "train" and opts.input_shapes == ((3, 4),) and opts.threshold == 0.0
    # Nothing given on the command line: the file's settings stay.
    same = cfg.merge_cli()
    assert same.models == ["a.py:f", "b.py:g"] and same.fail_on == "warning"
    assert same.options_for("a.py:f").mode == "eval" and cfg.fail_on == "warning"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"select": ["QLX"]}, r"--select: invalid rule selector 'QLX'"),
        ({"fail_on": "fatal"}, r"--fail-on: invalid value 'fatal'"),
        ({"mode": "test"}, r"--mode: invalid value"),
        ({"input_shapes": ["a,b"]}, r"invalid --input-shape 'a,b'; expected comma-separated"),
        ({"output_format": "text"}, r"--output-format: invalid value 'text'"),
        ({"tracer": "fx"}, r"--tracer: invalid value 'fx'"),
    ],
)
def test_bad_cli_values_raise_config_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        Config().merge_cli(**flags)


# -- rule selection (ruff semantics) ---------------------------------------------


def layers(*specs):
    return [RuleSelection(select=None, extend_select=(), ignore=())] + [
        RuleSelection(
            select=None if s.get("select") is None else tuple(s["select"]),
            extend_select=tuple(s.get("extend_select", ())),
            ignore=tuple(s.get("ignore", ())),
        )
        for s in specs
    ]


@pytest.mark.parametrize(
    ("file", "cli", "code", "expected"),
    [
        ({}, {}, "QL101", True),  # default: ALL
        ({"select": ["QL1"]}, {}, "QL101", True),
        ({"select": ["QL1"]}, {}, "QL201", False),  # select replaces the default set
        ({"extend_select": ["QL2"], "select": ["QL1"]}, {}, "QL201", True),
        ({"select": ["ALL"], "ignore": ["QL101"]}, {}, "QL101", False),
        ({"select": ["ALL"], "ignore": ["QL101"]}, {}, "QL102", True),
        ({"select": ["QL101"], "ignore": ["QL1"]}, {}, "QL101", True),  # more specific wins
        ({"select": ["QL1"], "ignore": ["QL10"]}, {}, "QL101", False),
        ({"select": ["QL1"], "ignore": ["QL10"]}, {}, "QL110", True),
        ({"select": ["QL1"], "ignore": ["QL1"]}, {}, "QL101", False),  # tie: ignore wins
        ({"ignore": ["ALL"], "select": ["QL104"]}, {}, "QL104", True),
        ({"ignore": ["ALL"], "select": ["QL104"]}, {}, "QL101", False),
        ({"ignore": ["QL101"]}, {"select": ["QL101"]}, "QL101", True),  # CLI select overrides file ignore
        ({"select": ["QL1"]}, {"ignore": ["QL101"]}, "QL101", False),  # CLI ignore on top of file select
        ({"select": ["QL1"]}, {"ignore": ["QL101"]}, "QL102", True),
        ({"select": ["QL1"]}, {"select": ["QL2"]}, "QL101", False),  # CLI select replaces
        ({"select": ["QL1"]}, {"extend_select": ["QL3"]}, "QL301", True),
        ({"select": ["QL1"]}, {"extend_select": ["QL3"]}, "QL101", True),
        ({}, {"select": [], "ignore": ["QL1"]}, "QL101", False),  # ignores carried over, as in ruff
        ({"select": [], "ignore": ["QL1"]}, {"extend_select": ["QL101"]}, "QL101", True),
    ],
)
def test_rule_selection_matches_ruff(file, cli, code, expected):
    from qlint.ci.config import DEFAULT_SELECTION

    stack = [DEFAULT_SELECTION, *layers(file, cli)[1:]]
    assert resolve_selected(code, stack) is expected


def test_is_selected_through_config_and_merge_cli(tmp_path):
    cfg = config_from(tmp_path, 'ignore = ["QL104"]\n')
    assert not cfg.is_selected("QL104") and cfg.is_selected("QL101")
    assert cfg.merge_cli(select=["QL104"]).is_selected("QL104")
    assert not cfg.merge_cli(select=["QL104"]).is_selected("QL101")
    assert cfg.merge_cli(extend_select=["QL104"]).is_selected("QL104")
    assert not cfg.merge_cli(ignore=["QL1"]).is_selected("QL101")


@given(
    prefix=st.from_regex(r"QL[0-9]{0,3}", fullmatch=True),
    code=st.from_regex(r"QL[0-9]{3}", fullmatch=True),
)
def test_a_lone_select_is_prefix_matching(prefix, code):
    from qlint.lint.rule import rules

    if not any(known.startswith(prefix) for known in rules()):
        with pytest.raises(ConfigError, match="matches no rule"):
            Config().merge_cli(select=[prefix])
        return
    cfg = Config().merge_cli(select=[prefix])
    assert cfg.is_selected(code) == code.startswith(prefix)
    assert Config().merge_cli(select=["ALL"], ignore=[prefix]).is_selected(code) != code.startswith(prefix)


# -- per-block ignores and fail-on ------------------------------------------------


def test_per_block_ignores_glob(tmp_path):
    cfg = config_from(tmp_path, 'per-block-ignores = { "layers.*" = ["QL101"], "layers.1?" = ["QL1"] }\n')
    assert cfg.block_ignores("layers.3") == {"QL101"}
    assert cfg.block_ignores("layers.12") == {"QL101", "QL1"}
    assert cfg.block_ignores("head") == set() and cfg.block_ignores(None) == set()


@pytest.mark.parametrize(
    ("fail_on", "severity", "fails"),
    [("error", "error", True), ("error", "warning", False), ("warning", "warning", True),
     ("warning", "info", False), ("info", "info", True)],
)  # fmt: skip
def test_fail_on(fail_on, severity, fails):
    assert Config(fail_on=fail_on).fails(severity) is fails


def test_choices_agree_with_the_core():
    from qlint import loader
    from qlint.ci import config
    from qlint.capture import pipeline

    assert config.TRACERS == pipeline.TRACERS
    assert tuple(config.DTYPES) == tuple(loader.DTYPES)


# -- end to end: the check command reads the configuration -------------------------

E2E_MODEL = '''\
import torch
from torch import nn


class Gate(nn.Module):
    def forward(self, h):
        return torch.special.i0(torch.tanh(h))  # bounded, but i0 is not in the registry: uncertified unless declared


class Block(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.w1, self.w2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.norm, self.gate = nn.LayerNorm(8), Gate()

    def forward(self, x):
        if self.kind == "cubic":
            return x + self.w2(self.w1(x) ** 3)
        if self.kind == "post_ln":
            return self.norm(x + self.w2(torch.relu(self.w1(x))))
        if self.kind == "gate":
            return x + self.w2(self.gate(self.w1(x)))
        return x + self.w2(torch.relu(self.w1(self.norm(x))))


def cubic():
    return Block("cubic"), (torch.randn(2, 4, 8),)


def post_ln():
    return Block("post_ln"), (torch.randn(2, 4, 8),)


def gate():
    return Block("gate"), (torch.randn(2, 4, 8),)


def certified():
    return Block("pre_ln"), (torch.randn(2, 4, 8),)
'''


def project(tmp_path: Path, monkeypatch, config: str = "", name: str = "proj") -> Path:
    root = tmp_path / name
    write(root / "src" / "toymodel.py", E2E_MODEL)
    write(root / "pyproject.toml", '[project]\nname = "toy"\n\n[tool.qlint]\n' + textwrap.dedent(config))
    monkeypatch.chdir(root)
    return root


def qlint(*args: str):
    from click.testing import CliRunner

    from qlint.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_bare_qlint_checks_the_configured_models(tmp_path, monkeypatch):
    root = project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:cubic", "src/toymodel.py:certified"]\n')
    result = qlint("--output-format", "concise")
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[0].startswith("src/toymodel.py:19: QL101 ")
    # From a subfolder the specs still resolve against the config file's folder.
    monkeypatch.chdir(root / "src")
    result = qlint("--output-format", "json")
    assert result.exit_code == 1
    import json

    specs = [m["spec"] for m in json.loads(result.stdout)["models"]]
    assert specs == ["toymodel.py:cubic", "toymodel.py:certified"]


def test_spec_arguments_replace_the_configured_models(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:cubic"]\n')
    assert qlint("src/toymodel.py:certified").exit_code == 0


def test_malformed_config_exits_2_with_one_line(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:cubic"]\nslect = ["QL1"]\n')
    result = qlint()
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "unknown key 'tool.qlint.slect' (did you mean 'select'?)" in result.stderr


def test_no_models_anywhere_is_a_usage_error(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, "")
    result = qlint()
    assert result.exit_code == 2 and "[tool.qlint] models" in result.stderr


def test_selection_and_fail_on_precedence(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:cubic"]\nignore = ["QL101"]\n')
    assert qlint().exit_code == 0  # the file ignores QL101
    assert qlint("--select", "QL101").exit_code == 1  # the CLI's select wins
    assert qlint("--isolated", "src/toymodel.py:cubic").exit_code == 1
    assert qlint("--config", "ignore = []").exit_code == 1  # inline override


def test_fail_on_info(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:post_ln"]\n')
    result = qlint("--format", "concise")
    assert result.exit_code == 0 and " QL104 " in result.stdout  # info does not fail by default
    assert qlint("--fail-on", "info").exit_code == 1
    assert qlint("--config", "fail-on = 'info'").exit_code == 1


def test_threshold_file_per_model_and_cli(tmp_path, monkeypatch):
    project(
        tmp_path,
        monkeypatch,
        """
        models = ["src/toymodel.py:cubic"]
        [tool.qlint.per-model."src/toymodel.py:cubic"]
        threshold = 3
        """,
    )
    assert qlint().exit_code == 0  # per-model threshold 3: q = 3 is certified
    assert qlint("--threshold", "1").exit_code == 1  # the CLI beats the per-model table


def test_declared_primitives_are_used(tmp_path, monkeypatch):
    project(tmp_path, monkeypatch, 'models = ["src/toymodel.py:gate"]\n')
    result = qlint("--format", "concise")
    assert result.exit_code == 1 and " QL102 " in result.stdout
    write(
        Path("pyproject.toml"),
        '[tool.qlint]\nmodels = ["src/toymodel.py:gate"]\n'
        '[tool.qlint.primitives]\n"toymodel.Gate" = { q = 0, why = "test: treat i0 as bounded" }\n',
    )
    result = qlint("--format", "concise")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--select", "QL9"], "command line --select: rule selector 'QL9' matches no rule; did you mean"),
        (["--select", "QL999"], "command line --select: rule selector 'QL999' matches no rule"),
        (["--select", ""], "command line --select is empty: no rule would run"),
        (["--ignore", "QL7"], "command line --ignore: rule selector 'QL7' matches no rule"),
    ],
)
def test_a_selector_that_matches_no_rule_is_an_error_not_a_pass(args, message):
    """A typo in --select must not turn the gate off with "All checks passed!"."""
    result = CliRunner().invoke(main, [str(ROOT / "fixtures/toy.py:poly_mlp"), "--isolated", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"qlint: error: {message}") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("table", ['select = []', 'select = ["QL8"]', 'ignore = ["QL19"]'])
def test_a_config_selector_that_matches_no_rule_is_an_error(tmp_path, monkeypatch, table):
    (tmp_path / "pyproject.toml").write_text(f"[tool.qlint]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [str(ROOT / "fixtures/toy.py:poly_mlp")])
    assert result.exit_code == 2 and "tool.qlint" in result.stderr and "no rule" in result.stderr
