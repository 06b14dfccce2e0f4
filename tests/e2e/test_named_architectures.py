"""Issue 26: precise on real models. Exact per-block verdicts for named architectures of the third
zoo (fixtures/zoo3.py) that qlint used to refuse with a false alarm, pinned through the command line.

Each factory's docstring gives the verdict the paper's exponent arithmetic predicts, block by block
(composition multiplies, a sum takes the max, a Hadamard product adds, residual wrapping gives
max(1, q), a norm gives 0), and what qlint (c08a447) said instead: a QL106 "older value of its own
stream" on a dense read that is linear in the joint state (detr, gcvit, tnt, volo, nextvit, dpt,
gemma3n), a QL102 on an fx-wrapped call (mambaout, focalnet, tv_convnext, tv_swin), a QL102 on a
frozen BatchNorm written out (detr), a division by knot differences (kan), or q = 3 from the
Cox-de Boor product (kan_uniform). Every one of them is certified now (fpn, right before too, is
here for its detection backbone and the scope of its certificate), and this file pins, per
model: the verdict, max q, the number of transitions (all of them ok), every block as
{name: (q, status, form)}, and the QL1xx findings with their blocks; for detr and fpn also the
scope of the certificate over input sizes, and for dpt and volo the lengths a loop was unrolled at.

No factory in zoo3.py has an unsafe truth, so the test that fails the other way is a real architecture
whose truth is supercritical: fixtures/hf.py's Mamba with its pre-norm removed, every block q = 5.
minimax (Post-LN with the norm at each sublayer's input) is pinned by its blocks and findings in a run
of its own: its verdict also depends on shape coverage (the lightning attention dispatches on the length).

Each CLI run analyses its models once, in one process per group (transformers; timm and
torchvision). Random init, tiny sizes, no download. Needs ``pip install -e .[zoo]`` and torchvision;
a model whose library is missing is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from conftest import ROOT, qlint_json

pytestmark = pytest.mark.zoo
HAVE = {name: importlib.util.find_spec(name) is not None for name in ("transformers", "timm", "torchvision")}


@dataclass(frozen=True)
class Expected:
    group: str  # which CLI run analyses it: "hf" or "vision"
    needs: tuple  # libraries the factory imports (zoo3.py itself imports transformers)
    verdict: str
    max_q: float
    transitions: int
    blocks: dict  # block name -> (q, status, form)
    findings: list = field(default_factory=list)  # sorted (code, block) of every QL1xx finding
    spec: str = "fixtures/zoo3.py"


def same(q: float, *names: str, status: str = "ok", form: str = "additive") -> dict:
    return {name: (q, status, form) for name in names}


def each(code: str, names) -> list:
    return sorted((code, name) for name in names)


HF, TIMM, TV = ("transformers",), ("transformers", "timm"), ("transformers", "torchvision")

DETR_POST_LN = ["encoder.layers.0:self_attn", "encoder.layers.0:mlp", "encoder.layers.1:self_attn",
                "encoder.layers.1:mlp", "decoder.layers.0", "decoder.layers.1:self_attn",
                "decoder.layers.1:encoder_attn", "decoder.layers.1:mlp"]
FPN_BLOCKS = ["model.body.layer1.0", "model.body.layer1.1", "model.body.layer2.1", "model.body.layer3.1",
              "model.body.layer4.1"]
DEPTHS_1121 = ((0, 0), (1, 0), (2, 0), (2, 1), (3, 0))  # (stage, block) of a depths=(1, 1, 2, 1) backbone
NEXTVIT_NCB = [f"stages.{s}.blocks.{b}:{part}" for s, b in ((0, 0), (2, 0), (2, 1), (2, 2), (2, 3))
               for part in ("mhca", "mlp")]
NEXTVIT_NTB = [f"stages.{s}.blocks.{b}:{part}" for s, b in ((1, 0), (2, 4), (3, 0))
               for part in ("e_mhsa", "mhca+projection", "mlp")]

EXPECTED = {
    # DETR: frozen-BN ResNet stage-0 block relu(x + f(x)) q 1 (QL105); Post-LN encoder and decoder LN(X + f(X)):
    # bounded maps, velocity LN(X + f(X)) - X q 1 (QL104), the cross-attention's too (its branch alone is q 0,
    # values from the bounded encoder memory): certified, max q 1.
    "detr": Expected("hf", HF, "certified", 1.0, 12, {
        **same(1.0, "backbone.model.encoder.stages.0.layers.0", form="post-activation"),
        **same(1.0, *DETR_POST_LN, form="post-norm")},
        sorted(each("QL104", DETR_POST_LN) + [("QL105", "backbone.model.encoder.stages.0.layers.0")]
               # the frozen BatchNorm's statistics are float buffers, so parameters: rsqrt(var + eps) a QL108 hazard
               + [("QL108", "backbone.model.encoder.stages.0.layers.0")] * 2
               + [("QL108", "backbone.model.encoder.stages.0.layers.0 -> encoder.layers.0:self_attn "
                            "(backbone.model.encoder.stages.0.layers.0.activation)")] * 9
               + [("QL108", "input -> backbone.model.encoder.stages.0.layers.0 "
                            "(backbone.model.embedder.embedder.convolution)")])),
    # Gemma 3n: AltUp predict / correct and the per-layer gate are q 1, the shared K/V a bounded read of an
    # older stream value: certified, max q 1. (The RoPE k cos + rot(k) sin of layer 0's shared keys,
    # modeling_gemma3n.py:1215, is read as a scaled update of its own, q 1.)
    # The per-layer projection adds into the AltUp predictions other than the first in place
    # (corrected[1:] += first): a partial update found by dataflow, scaled, q 1.
    "gemma3n": Expected("hf", HF, "certified", 1.0, 10, {
        **same(1.0, "model.layers.0:altup", "model.layers.0:altup+mlp+self_attn+laurel", "model.layers.1:altup",
               "model.layers.1:altup+mlp+self_attn+laurel"),
        **same(1.0, "model.layers.0.self_attn", "model.layers.0:per_layer_projection",
               "model.layers.1:per_layer_projection", form="scaled")}),
    # DPT: Pre-LN ViT encoder q 0; fusion h + R1(r_k), R1 a q-1 residual unit of an earlier (linear) readout,
    # then R2(h) q 1: certified, max q 1.
    "dpt": Expected("hf", HF, "certified", 1.0, 9, {
        **same(0.0, *(f"model.dpt.encoder.layer.{i}{part}" for i in range(4) for part in ("", ".output"))),
        **same(1.0, "model.neck.fusion_stage.layers.0.residual_layer2",
               *(f"model.neck.fusion_stage.layers.{i}{part}" for i in (1, 2, 3)
                 for part in ("", ".residual_layer2")))}),
    # efficient-KAN, x + KAN(x): W_b silu(x) q 1 plus W_s B(x) with B in [0, 1] (the grid a buffer the forward
    # never writes, knots distinct): every block q 1.
    # The grid is a float buffer, so a parameter: the division by knot differences is a QL108 hazard (0 where two
    # knots meet), six per layer; the knots still bound the support proof's intervals.
    "kan": Expected("hf", HF, "certified", 1.0, 2, same(1.0, "ResidualKAN#1", "ResidualKAN#2"),
                    sorted([("QL108", "ResidualKAN#1")] * 6 + [("QL108", "ResidualKAN#2")] * 6)),
    # the same with the uniform denominators k * h: the indicator confines x - t_i to one knot interval, q 1, not 3.
    "kan_uniform": Expected("hf", HF, "certified", 1.0, 2, same(1.0, "ResidualKAN#1", "ResidualKAN#2")),
    # the control that must stay refused: Mamba's selective SSM on the raw stream, dt * B * x, C, gate: q = 5.
    "mamba_without_norm": Expected("hf", HF, "supercritical", 5.0, 2,
                                   same(5.0, "layers.0", "layers.1", status="supercritical"),
                                   each("QL101", ["layers.0", "layers.1"]), spec="fixtures/hf.py"),
    # GC ViT: Pre-LN window attention / MLP q 0, MBConv updates q 1, the global query read through a softmax
    # only (q 0): certified, max q 1.
    "gcvit": Expected("vision", TIMM, "certified", 1.0, 11, {
        **same(1.0, "stem.down.conv_block", "stages.1.downsample.conv_block", "stages.2.downsample.conv_block",
               "stages.2.global_block.blocks.conv1", "stages.3.downsample.conv_block"),
        **same(0.0, *(f"stages.{s}.blocks.{b}:{part}" for s, b in DEPTHS_1121 for part in ("attn", "mlp")))}),
    # TNT: inner and outer Pre-LN updates q 0, the outer stream's update a LayerNorm of the inner: q 0.
    "tnt": Expected("vision", TIMM, "certified", 0.0, 4,
                    same(0.0, *(f"blocks.{i}:{part}" for i in range(2)
                                for part in ("attn_in", "mlp_in", "attn_out", "mlp")))),
    # Next-ViT: NCB / NTB updates with eval BatchNorm (affine) q 1; cat([x1, y']) linear in the joint state.
    "nextvit": Expected("vision", TIMM, "certified", 1.0, 5, same(1.0, *NEXTVIT_NCB, *NEXTVIT_NTB)),
    # MambaOut: x + fc2(act(g) * cat(i, dwconv c)), all factors from fc1(ln x): q 0.
    "mambaout": Expected("vision", TIMM, "certified", 0.0, 5,
                         same(0.0, *(f"stages.{s}.blocks.{b}" for s, b in DEPTHS_1121))),
    # FocalNet: focal modulation, products of q-0 factors of ln x, and a Pre-LN MLP: q 0.
    "focalnet": Expected("vision", TIMM, "certified", 0.0, 5,
                         same(0.0, *(f"layers.{s}.blocks.{b}:{part}" for s, b in DEPTHS_1121
                                     for part in ("modulation", "mlp")))),
    # VOLO: outlooker and Pre-LN blocks q 0; class attention updates the class token, cls = x[:, :1] +
    # attn(norm(x)) and then + mlp(norm(cls)), cat([cls, x[:, 1:]]) carrying the patches: partial updates
    # found by dataflow, in the scaled form, q = max(1, 0) = 1.
    "volo": Expected("vision", TIMM, "certified", 1.0, 6, {
        **same(0.0, *(f"network.{s}.0:{part}" for s in (0, 2, 3, 4) for part in ("attn", "mlp"))),
        **same(1.0, *(f"post_network.{i}:{part}" for i in (0, 1) for part in ("attn", "mlp")), form="scaled")}),
    # torchvision ConvNeXt: x + ls * stochastic_depth(mlp(ln(dwconv x))), identity in eval: q 0.
    "tv_convnext": Expected("vision", TV, "certified", 0.0, 3,
                            same(0.0, "features.1.0", "features.1.1", "features.3.0", "features.3.1")),
    # torchvision Swin: Pre-LN window attention and MLP q 0, patch merging a transition.
    "tv_swin": Expected("vision", TV, "certified", 0.0, 3,
                        same(0.0, *(f"features.{s}.{b}:{part}" for s in (1, 3) for b in range(2)
                                    for part in ("attn", "mlp")))),
    # ResNet-18 + FPN: relu(x + f(x)) q 1 (QL105), projected shortcuts transitions, the FPN a linear head.
    "fpn": Expected("vision", TV, "certified", 1.0, 6, same(1.0, *FPN_BLOCKS, form="post-activation"),
                    each("QL105", FPN_BLOCKS)),
}


def analyse(group: str) -> dict:
    """One CLI run over the group's models whose libraries are installed: name -> (model JSON, exit code)."""
    names = [name for name, e in EXPECTED.items() if e.group == group and all(HAVE[lib] for lib in e.needs)]
    if not names:
        return {}
    specs = [f"{EXPECTED[name].spec}:{name}" for name in names]
    refused = any(EXPECTED[name].verdict != "certified" for name in names)
    models = qlint_json(specs, (1,) if refused else (0,), HF_HUB_OFFLINE="1")
    assert [m["spec"].rsplit(":", 1)[1] for m in models] == names
    return dict(zip(names, models))


@pytest.fixture(scope="module")
def hf_report() -> dict:
    return analyse("hf")


@pytest.fixture(scope="module")
def vision_report() -> dict:
    return analyse("vision")


def model_of(request, name: str) -> dict:
    missing = [lib for lib in EXPECTED[name].needs if not HAVE[lib]]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (the [zoo] extra)")
    return request.getfixturevalue(f"{EXPECTED[name].group}_report")[name]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verdict_and_every_block(request, name):
    expected, model = EXPECTED[name], model_of(request, name)
    findings = sorted((f["code"], f["block"]) for f in model["findings"] if f["code"].startswith("QL1"))
    assert (model["verdict"], model["max_q"]) == (expected.verdict, expected.max_q), json.dumps(findings)
    assert {b["name"]: (b["q"], b["status"], b["form"]) for b in model["blocks"]} == expected.blocks
    assert findings == expected.findings
    assert len(model["transitions"]) == expected.transitions
    assert all(t["status"] == "ok" for t in model["transitions"]), [t["name"] for t in model["transitions"]]
    assert model["uncovered"] == []


def test_the_supercritical_control_names_its_dominant_product(request):
    model = model_of(request, "mamba_without_norm")
    messages = [f["message"] for f in model["findings"] if f["code"] == "QL101"]
    assert len(messages) == 2 and all("q = 5 > 1 (dominant: Hadamard product" in m for m in messages)
    assert model["witness"] == "not run: no certified block"


@pytest.mark.parametrize("name", ["detr", "fpn"])
def test_the_certificate_says_which_sizes_it_holds_for(request, name):
    """Export specialises where an inner size becomes 1 or two sizes meet: those are named, not certified."""
    shapes = model_of(request, name)["shapes"]
    assert shapes.startswith("dynamic export, checked against the model on ")
    assert "; not analysed: " in shapes and "input 0 axis 2 of size 2, " in shapes
    assert shapes.endswith("(the export specialises those, as it does inputs of size 1): "
                           "the certificate holds for the sizes analysed")
    assert "traced and analysed there too (certified)" in shapes and "(uncertified)" not in shapes


@pytest.mark.parametrize("name, example", [("dpt", "(1, 3, 32, 32) float32"), ("volo", "(1, 3, 64, 64) float32")])
def test_an_unrolled_loop_certifies_the_lengths_analysed(request, name, example):
    shapes = model_of(request, name)["shapes"]
    assert shapes.startswith("static export")
    assert f"a loop is unrolled over an axis: the certificate holds for the lengths analysed ({example}; " in shapes


def test_minimax_is_a_post_ln_stack_with_the_norm_at_each_sublayers_input():
    """h = norm(x); x' = a h + f(h): each block's map a norm(x) + f(norm x) is bounded, velocity q 1 (not the SwiGLU
    expert's 2 on a free input): QL104 on every block, QL202 on the stack, no QL101."""
    if not HAVE["transformers"]:
        pytest.skip("needs transformers (the [zoo] extra)")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "qlint", "fixtures/zoo3.py:minimax", "--format", "json", "--isolated",
                           "--no-cache"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    [model] = json.loads(proc.stdout)["models"]
    names = [f"layers.{i}:{part}" for i in range(2) for part in ("self_attn", "mlp")]
    found = [(b["name"], b["q"], b["status"], b["form"]) for b in model["blocks"]]
    assert found == [(n, 1.0, "ok", "post-norm") for n in names]
    found = sorted((f["code"], f["block"]) for f in model["findings"] if f["code"] in ("QL101", "QL104", "QL202"))
    assert found == sorted(("QL104", n) for n in names) + [("QL202", "layers")]
