"""Issue 42, part 1: catalogue specs (``hf:NAME``, ``timm:NAME``, ``torchvision:NAME``) build a library's
architecture from its default config, shrunk, offline, and lint it like a factory; a spec that names
nothing, or a config that does not build, is one line and exit 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from qlint import catalogue

HAVE = {name: importlib.util.find_spec(name) is not None for name in ("transformers", "timm", "torchvision")}


def _qlint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qlint", *args, "--no-cache", "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("spec,expected", [
    ("hf:llama", ("hf", "llama", {})),
    ("hf:llama?layers=4&hidden=128", ("hf", "llama", {"layers": "4", "hidden": "128"})),
    ("timm:convnext_tiny?full-size", ("timm", "convnext_tiny", {"full-size": ""})),
    ("torchvision:resnet18", ("torchvision", "resnet18", {})),
])
def test_a_catalogue_spec_is_library_name_and_options(spec, expected):
    parsed = catalogue.parse(spec)
    assert (parsed.library, parsed.name, parsed.options) == expected


@pytest.mark.parametrize("spec", ["fixtures/mamba.py:native", "qlint.zoo.toy:build", "model.py", "hf.py:build"])
def test_other_specs_are_no_catalogue_specs(spec):
    assert catalogue.parse(spec) is None


def test_full_size_is_added_once_and_only_to_catalogue_specs():
    assert catalogue.with_full_size("hf:llama") == "hf:llama?full-size"
    assert catalogue.with_full_size("hf:llama?layers=4") == "hf:llama?layers=4&full-size"
    assert catalogue.with_full_size("hf:llama?full-size") == "hf:llama?full-size"
    assert catalogue.with_full_size("fixtures/mamba.py:native") == "fixtures/mamba.py:native"


def _blocks(report: dict) -> dict:
    return {block["name"]: block["q"] for block in report["blocks"]}


@pytest.mark.skipif(not HAVE["transformers"], reason="needs transformers")
def test_hf_llama_is_built_small_and_certified():
    proc = _qlint("hf:llama")
    assert proc.returncode == 0, proc.stderr
    [report] = json.loads(proc.stdout)["models"]
    assert report["verdict"] == "certified"
    assert _blocks(report) == {"layers.0:self_attn": 0, "layers.0:mlp": 0, "layers.1:self_attn": 0, "layers.1:mlp": 0}
    assert report["built"].startswith("transformers ")
    assert "LlamaModel, random weights, default config with num_hidden_layers 32->2" in report["built"]
    assert "hidden_size 4096->64" in report["built"]


@pytest.mark.skipif(not HAVE["transformers"], reason="needs transformers")
def test_options_set_sizes_and_a_class_name_picks_the_class():
    proc = _qlint("hf:LlamaForCausalLM?layers=3&hidden=32", "--no-witness")
    assert proc.returncode == 0, proc.stderr
    [report] = json.loads(proc.stdout)["models"]
    assert len(report["blocks"]) == 6  # three layers, attention and MLP each
    assert "LlamaForCausalLM" in report["built"] and "num_hidden_layers 32->3" in report["built"]
    assert "hidden_size 4096->32" in report["built"]


@pytest.mark.skipif(not HAVE["transformers"], reason="needs transformers")
def test_full_size_on_meta_keeps_the_librarys_sizes():
    proc = _qlint("hf:gpt2", "--full-size", "--device", "meta")
    assert proc.returncode == 0, proc.stderr
    [report] = json.loads(proc.stdout)["models"]
    assert report["spec"] == "hf:gpt2?full-size"
    assert len(report["blocks"]) == 24 and set(_blocks(report).values()) == {0}  # 12 pre-LN layers
    assert report["built"].endswith("GPT2Model, random weights, default config")


@pytest.mark.skipif(not HAVE["transformers"], reason="needs transformers")
def test_a_width_that_does_not_build_is_undone_and_depth_kept():
    """Mamba-2's head count times head size must equal its expanded width: the small width does not build,
    so the width is left as it is and the depth is still cut (the model is then built and run once)."""
    built = catalogue.build("hf:mamba2")
    assert "num_hidden_layers 64->2" in built.description
    assert "hidden_size" not in built.description
    assert len(built.model.layers) == 2


@pytest.mark.skipif(not (HAVE["timm"] and HAVE["torchvision"]), reason="needs timm and torchvision")
def test_timm_and_torchvision_models_are_linted_by_name():
    proc = _qlint("timm:convnext_tiny", "torchvision:resnet18")
    assert proc.returncode == 0, proc.stderr
    convnext, resnet = json.loads(proc.stdout)["models"]
    assert convnext["verdict"] == "certified" and set(_blocks(convnext).values()) == {0}
    assert len(convnext["blocks"]) == 4 and "depths=(1, 1, 1, 1)" in convnext["built"]
    assert resnet["verdict"] == "certified" and set(_blocks(resnet).values()) == {1}
    assert len(resnet["blocks"]) == 5 and resnet["built"].endswith("resnet18, random weights, default config")


@pytest.mark.parametrize("spec,message", [
    ("hf:", "hf:: no model name after hf:, e.g. hf:llama"),
    ("hf:no_such_model", "'no_such_model' is neither a transformers model type (e.g. llama) nor a model class"),
    ("hf:llama?no_such_key=1", "option 'no_such_key': LlamaConfig has no such key"),
    ("hf:llama?layers=zero", "option layers='zero': expected a positive integer"),
    ("timm:no_such_model", "timm has no model 'no_such_model'"),
    ("torchvision:no_such_model", "torchvision has no model 'no_such_model'"),
])
def test_a_spec_that_names_nothing_is_one_line_and_exit_2(spec, message):
    library = {"hf": "transformers"}.get(spec.partition(":")[0], spec.partition(":")[0])
    if not HAVE[library]:
        pytest.skip(f"needs {library}")
    proc = subprocess.run([sys.executable, "-m", "qlint", spec, "--no-cache"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
