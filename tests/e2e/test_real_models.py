"""Real architectures (transformers, timm) built from configs and linted through the CLI.

Random init, no download (HF_HUB_OFFLINE=1): each test asserts the per-block verdict
the paper's exponent arithmetic gives for the architecture. Needs ``pip install -e
.[zoo]``; skipped cleanly without it. Small configs (2 layers) keep the file fast.
"""

import importlib.util
import json
import os

import pytest
from click.testing import CliRunner

from qlint.cli import main
from conftest import fixture_spec

os.environ["HF_HUB_OFFLINE"] = "1"

pytestmark = pytest.mark.zoo
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the [zoo] extra (transformers)")
needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="needs the [zoo] extra (timm)")



def lint(spec, *flags):
    """``qlint SPEC --format json`` restricted to the exponent rules: (exit code, model, findings)."""
    result = CliRunner().invoke(main, [fixture_spec(spec), "--format", "json", "--select", "QL1", "--isolated", *flags])
    assert result.exit_code in (0, 1), result.output
    [model] = json.loads(result.stdout)["models"]
    return result.exit_code, model, model["findings"]


def verdicts(model):
    return {b["name"]: (b["q"], b["status"], b["form"]) for b in model["blocks"]}


def codes(findings):
    return sorted((f["code"], f["block"]) for f in findings)


def decoder_blocks(mlp="mlp", layers=2):
    return [f"layers.{i}:{branch}" for i in range(layers) for branch in ("self_attn", mlp)]


@needs_transformers
def test_gpt2_pre_ln_blocks_are_q0():
    code, model, findings = lint("hf.py:gpt2")
    assert code == 0 and model["tracer"] == "export" and model["verdict"] == "certified"
    assert verdicts(model) == {f"h.{i}:{b}": (0.0, "ok", "additive") for i in range(2) for b in ("attn", "mlp")}
    assert {b["dominant"] for b in model["blocks"]} == {"LayerNorm"}
    assert findings == []


@needs_transformers
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_llama_family_pre_rmsnorm_blocks_are_q0(family):
    code, model, findings = lint(f"hf.py:{family}")
    assert code == 0 and model["tracer"] == "export"
    assert verdicts(model) == {name: (0.0, "ok", "additive") for name in decoder_blocks()}
    assert {b["dominant"] for b in model["blocks"]} == {"x * rsqrt(mean(x^2) + eps) (RMSNorm written out)"}
    assert findings == []


@needs_transformers
def test_mamba_pure_torch_path_with_its_pre_norm_is_q0():
    code, model, findings = lint("hf.py:mamba")
    assert code == 0 and model["tracer"] == "export"
    assert verdicts(model) == {"layers.0": (0.0, "ok", "additive"), "layers.1": (0.0, "ok", "additive")}
    assert findings == []


@needs_transformers
def test_mamba_without_its_norm_is_the_papers_q5():
    """Selective SSM on the raw stream: dt (1) * B (1) * x (1), then C (1), then the gate (1)."""
    code, model, findings = lint("hf.py:mamba_without_norm")
    assert code == 1 and model["verdict"] == "supercritical"
    assert verdicts(model) == {"layers.0": (5.0, "supercritical", "additive"), "layers.1": (5.0, "supercritical", "additive")}
    assert [s["q"] for s in model["blocks"][0]["derivation"]][-2:] == [5.0, 5.0]
    assert codes(findings) == [("QL101", "layers.0"), ("QL101", "layers.1")]


@needs_transformers
def test_patchtst_blocks_are_q1_and_revin_is_not_a_block():
    """Attention and GELU FFN are q = 1 (Table 1); eval-mode BatchNorm is affine, so no norm bounds them.
    The scaler's ``y * scale + loc`` broadcasts ``loc``: it is not a residual update."""
    code, model, findings = lint("hf.py:patchtst")
    assert code == 0
    assert verdicts(model) == {
        f"model.encoder.layers.{i}:{b}": (1.0, "ok", "additive") for i in range(2) for b in ("self_attn", "ff")
    }
    assert findings == []


@needs_transformers
def test_bert_post_ln_updates_are_reported():
    """LN(X + f(X)): f is attention or the GELU FFN (q = 1); QL104 says the update is Post-LN."""
    code, model, findings = lint("hf.py:bert")
    assert code == 0
    names = [f"encoder.layer.{i}.{part}" for i in range(2) for part in ("attention.output", "output")]
    assert verdicts(model) == {name: (1.0, "ok", "post-norm") for name in names}
    assert codes(findings) == sorted(("QL104", name) for name in names)
    assert {f["severity"] for f in findings} == {"info"}


@needs_timm
def test_vit_tiny_pre_ln_blocks_are_q0():
    code, model, findings = lint("timm_models.py:vit_tiny")
    assert code == 0 and model["tracer"] == "symbolic_trace"
    assert verdicts(model) == {f"blocks.{i}:{part}": (0.0, "ok", "additive") for i in range(12) for part in ("attn", "mlp")}
    assert findings == []


RESNET_BLOCKS = ["layer1.0", "layer1.1", "layer2.1", "layer3.1", "layer4.1"]


@needs_timm
def test_resnet18_post_activation_blocks_keep_the_additive_bound():
    """relu(x + f(x)): ||relu(z)|| <= ||z||, so f's q = 1 (eval BatchNorm is affine) still bounds the
    update (QL105 info). layer{2,3,4}.0 add a projected shortcut, not the stream: no residual update."""
    code, model, findings = lint("timm_models.py:resnet18")
    assert code == 0
    assert verdicts(model) == {name: (1.0, "ok", "post-activation") for name in RESNET_BLOCKS}
    assert codes(findings) == [("QL105", name) for name in RESNET_BLOCKS]
    assert "||relu(z)|| <= ||z||" in findings[0]["message"]


@needs_timm
def test_resnet18_in_train_mode_is_reported_with_its_batchnorm_frozen():
    """Batch statistics bound each block (q 0), but a loop that trains ResNet also runs its BatchNorm layers
    frozen (running statistics, affine): that graph's blocks are worse (q 1), so its report is the one shown."""
    code, model, _ = lint("timm_models.py:resnet18", "--mode", "train")
    assert code == 0 and model["mode"] == "train"
    assert verdicts(model) == {name: (1.0, "ok", "post-activation") for name in RESNET_BLOCKS}
    assert "with its BatchNorm layers in eval mode while it trains" in model["modes"]
