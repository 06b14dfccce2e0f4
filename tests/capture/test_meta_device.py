"""Analysis on the meta device: shapes without weights, so model size costs no memory."""

import importlib.util
import json
import textwrap

import pytest
from click.testing import CliRunner

from qlint.analysis import Options, load_model, run
from qlint.analysis import run_specs as check
from qlint.cli import main
from conftest import fixture_spec

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the [zoo] extra")


def lint_json(*args):
    result = CliRunner().invoke(main, [*args, "--format", "json", "--select", "QL1", "--isolated"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)["models"][0]


def test_device_meta_gives_the_cpu_verdict():
    spec = fixture_spec("llama.py:with_norm")
    on_cpu = check([spec], Options()).models[0]
    code, on_meta = lint_json(spec, "--device", "meta")
    assert code == 0
    assert [(b["name"], b["q"]) for b in on_meta["blocks"]] == [(b.name, b.q) for b in on_cpu.blocks]
    assert {b["q"] for b in on_meta["blocks"]} == {0.0}


def test_device_meta_builds_without_storage():
    loaded = load_model(fixture_spec("mamba.py:native"), Options(device="meta"))
    assert all(p.is_meta for p in loaded.model.parameters())
    assert all(x.is_meta for x in loaded.inputs)
    report = run(loaded.model, loaded.inputs, spec="mamba", options=Options()).report
    assert [b.q for b in report.blocks] == [5.0, 5.0]


META_FACTORY = textwrap.dedent(
    """
    import torch
    from qlint.zoo import transformer


    def build_model():
        with torch.device("meta"):
            model = transformer.LlamaModel(vocab=64, d_model=32, n_layers=2, n_heads=4, d_ff=86, norm=False, max_len=16)
        return model, (torch.randint(0, 64, (2, 8)),)  # CPU inputs: qlint moves them to the model
    """
)


def test_a_factory_that_builds_on_meta_needs_no_flag(tmp_path, monkeypatch):
    (tmp_path / "big.py").write_text(META_FACTORY)
    monkeypatch.chdir(tmp_path)
    code, model = lint_json("big.py")
    assert code == 1  # without its norms every block is q = 2 (SwiGLU)
    assert [(b["name"], b["q"]) for b in model["blocks"]] == [
        ("layers.0:self_attn", 1.0),
        ("layers.0:mlp", 2.0),
        ("layers.1:self_attn", 1.0),
        ("layers.1:mlp", 2.0),
    ]


@pytest.mark.zoo
@pytest.mark.slow
@needs_transformers
@pytest.mark.parametrize(("factory", "layers"), [("llama_7b", 32), ("llama_70b", 80)])
def test_llama_sized_configs_lint_on_meta(factory, layers):
    """7B / 70B sizes: every pre-RMSNorm block q = 0, and no parameter is ever materialised."""
    loaded = load_model(fixture_spec(f"hf.py:{factory}"), Options())
    report = run(loaded.model, loaded.inputs, spec=factory, options=Options()).report
    assert report.tracer == "export"
    assert len(report.blocks) == 2 * layers
    assert [b.name for b in report.blocks[:2]] == ["layers.0:self_attn", "layers.0:mlp"]
    assert {b.q for b in report.blocks} == {0.0}
    assert all(p.is_meta for p in loaded.model.parameters())
