"""Issue 29: the registry gaps real code hits, torchvision's models first.

torchvision fx-wraps a few functions (``stochastic_depth``, Swin's ``_patch_merging_pad``,
``_get_relative_position_bias`` and ``shifted_window_attention``, the RoI ops), so
``symbolic_trace`` keeps each as one call the registry must know; ``torch.split`` is recorded as
its Python wrapper ``torch.functional.split(tensor, ...)``. Each new entry's transfer is checked
here on its own calls with the laws of tests/registry/test_registry.py (which reaches ATen overloads only),
and every op the small torchvision models below trace to is registered or deliberately unknown
(the pattern of tests/e2e/test_model_zoo.py's op-coverage test).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Callable

import pytest
import torch
import torch.fx as fx
from torch import nn

from qlint.analysis import Options, run
from qlint.core.domain import Growth
from qlint.core.graph import annotate, facts
from qlint.growth.propagate import run_transfer
from qlint.registry import default

needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="needs torchvision")

REGISTRY = default()


def _image(size: int = 32) -> tuple:
    torch.manual_seed(1)
    return (torch.randn(1, 3, size, size),)


# --- small torchvision models ------------------------------------------------------------------------


def convnext(stochastic_depth_prob: float = 0.1):
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 2)], stochastic_depth_prob=stochastic_depth_prob).eval(), _image()


def convnext_tiny_shrunk():
    """torchvision.models.convnext_tiny(weights=None) with its stage widths and depths shrunk."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    settings = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 24, 1), CNBlockConfig(24, 32, 1), CNBlockConfig(32, None, 1)]
    return ConvNeXt(settings, stochastic_depth_prob=0.1, num_classes=10).eval(), _image()


def swin():
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    return SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], stochastic_depth_prob=0.1).eval(), _image()


def vit():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32).eval(), _image()


def efficientnet():
    """EfficientNet (V1 MBConv with SqueezeExcitation, V2 FusedMBConv; Conv2dNormActivation,
    StochasticDepth) at a small width and depth."""
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig

    torch.manual_seed(0)
    setting = [FusedMBConvConfig(1, 3, 1, 16, 16, 2), MBConvConfig(4, 3, 2, 16, 24, 2)]
    return EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=10, last_channel=64).eval(), _image()


def mobilenet_v3():
    """MobileNetV3 (inverted residuals with SqueezeExcitation's hardsigmoid gate, Hardswish)."""
    from torchvision.models.mobilenetv3 import InvertedResidualConfig as C
    from torchvision.models.mobilenetv3 import MobileNetV3

    torch.manual_seed(0)
    setting = [C(16, 3, 16, 16, True, "RE", 1, 1, 1.0), C(16, 3, 48, 24, True, "HS", 2, 1, 1.0), C(24, 3, 72, 24, True, "HS", 1, 1, 1.0)]
    return MobileNetV3(setting, last_channel=64, num_classes=10).eval(), _image()


MODELS: dict[str, Callable[[], tuple]] = {"convnext": convnext, "convnext_tiny_shrunk": convnext_tiny_shrunk, "swin": swin,
                                          "vit": vit, "efficientnet": efficientnet, "mobilenet_v3": mobilenet_v3}


@functools.cache
def analysed(name: str, tracer: Any = None, mode: Any = None) -> tuple[Any, tuple[str, ...]]:
    """The report and the graph's calls no registry entry, declaration or relation covers."""
    model, inputs = MODELS[name]()
    analysis = run(model, inputs, spec=name, options=Options(tracer=tracer, mode=mode))
    unregistered = tuple(sorted({f"{facts(n).label} ({n.op})" for n in analysis.module.graph.nodes
                                 if n.op in ("call_function", "call_method", "call_module")
                                 and facts(n).primitive is None and facts(n).declared is None and facts(n).relation is None}))
    return analysis.report, unregistered


def blocks(report) -> list[tuple[str, float]]:
    return [(b.name, b.q) for b in report.blocks]


@needs_torchvision
@pytest.mark.parametrize("name", ["convnext", "convnext_tiny_shrunk"])
def test_convnext_under_symbolic_trace_is_certified_with_no_unknown_op(name):
    report, unregistered = analysed(name, "symbolic_trace")
    assert report.tracer == "symbolic_trace"
    assert unregistered == ()
    assert report.verdict == "certified"
    expected = {"convnext": ["features.1.0", "features.1.1", "features.3.0", "features.3.1"],
                "convnext_tiny_shrunk": ["features.1.0", "features.3.0", "features.5.0", "features.7.0"]}[name]
    assert blocks(report) == [(b, 0.0) for b in expected]  # x + layer_scale * stochastic_depth(mlp(ln(dwconv x)))
    assert [f for f in report.findings if f.code.startswith("QL1")] == []


@needs_torchvision
def test_convnext_in_train_mode_takes_stochastic_depth_as_a_scaled_mask():
    report, unregistered = analysed("convnext", "symbolic_trace", "train")
    assert (report.tracer, report.mode, unregistered) == ("symbolic_trace", "train", ())
    assert report.verdict == "certified" and [q for _, q in blocks(report)] == [0.0] * 4


@needs_torchvision
def test_swin_under_symbolic_trace_knows_its_wrapped_functions():
    report, unregistered = analysed("swin", "symbolic_trace")
    assert report.tracer == "symbolic_trace" and unregistered == ()
    assert report.verdict == "certified"
    assert blocks(report) == [(f"features.{s}.{i}:{b}", 0.0) for s in (1, 3) for i in (0, 1) for b in ("attn", "mlp")]
    assert [t.name for t in report.transitions][1] == "features.1.1:mlp -> features.3.0:attn (features.2)"  # patch merging
    # shifted_window_attention computes its logits internally, scaled q·k without QK-norm: QL201
    ql201 = [f for f in report.findings if f.code == "QL201"]
    assert [f.block for f in ql201] == [f"features.{s}.{i}.attn" for s in (1, 3) for i in (0, 1)]
    assert "`shifted_window_attention` computes its logits internally without QK-norm or soft-capping" in ql201[0].message


@needs_torchvision
def test_swin_findings_point_into_torchvision():
    from qlint.ci.formats import display_path

    report, _ = analysed("swin", "symbolic_trace")
    ql201 = [f for f in report.findings if f.code == "QL201"]
    assert display_path(ql201[0].source.file) == "torchvision/models/swin_transformer.py"
    assert [display_path(b.source.file) for b in report.blocks] == ["torchvision/models/swin_transformer.py"] * 8


@needs_torchvision
@pytest.mark.parametrize("name", list(MODELS))
def test_every_traced_op_of_torchvision_models_is_in_the_registry(name):
    """As tests/e2e/test_model_zoo.py's op-coverage test, on torchvision (the tracer qlint picks: symbolic_trace
    where it goes through, export for the BatchNorm models)."""
    report, unregistered = analysed(name)
    assert unregistered == (), f"ops outside the registry in {name}: {unregistered}"
    assert report.verdict == "certified", [f.message for f in report.findings if f.code in ("QL102", "QL106")]


# --- the new entries' transfers, on their own calls ----------------------------------------------------


def _graph(target: Callable, names: tuple[str, ...], arguments: Callable[..., tuple]) -> tuple[fx.Node, list[fx.Node]]:
    """One call of ``target`` as symbolic_trace records an fx-wrapped function (or a torch
    function): a placeholder per name, ``arguments(*placeholders)`` -> (args, kwargs); annotated."""
    graph = fx.Graph()
    placeholders = [graph.placeholder(name) for name in names]
    args, kwargs = arguments(*placeholders)
    node = graph.call_function(target, tuple(args), kwargs)
    graph.output(node)
    annotate(fx.GraphModule(nn.Module(), graph), REGISTRY)
    return node, placeholders


def _q(value: Any):
    values = value if isinstance(value, tuple) else (value,)
    if any(v.q is None for v in values):
        return None
    return max(v.q for v in values)


def _apply(node: fx.Node, env: dict) -> Any:
    return run_transfer(node, facts(node), env, training=False)[0]


def _laws(node: fx.Node, placeholders: list[fx.Node], parameters: frozenset = frozenset()) -> Growth:
    """Every input-dependent argument read, monotone in each, an unknown one contagious; the base result."""
    base = {p: Growth(0.0, depends=False) if p.name in parameters else Growth(1.0) for p in placeholders}
    value, call = run_transfer(node, facts(node), base, training=False)
    assert _q(value) is not None, getattr(value, "culprit", value)
    for p in placeholders:
        if p.name in parameters:
            continue
        assert _q(_apply(node, {**base, p: Growth(3.0)})) >= _q(value), f"raising `{p.name}` lowered q"
        assert _q(_apply(node, {**base, p: Growth(None, culprit="test")})) is None, f"unknown `{p.name}` was certified away"
    for p in placeholders:
        if p.name in parameters:  # a weight computed from the input is accounted for or makes the result unknown
            raised = _apply(node, {**base, p: Growth(2.0)})
            assert _q(raised) is None or _q(raised) >= _q(value)
    return value


@needs_torchvision
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("mode", ["row", "batch"])
@pytest.mark.parametrize("p", [0.0, 0.25, 1.0])
def test_stochastic_depth_is_a_dropout_mask(p, mode, training):
    from torchvision.ops import stochastic_depth

    node, placeholders = _graph(stochastic_depth, ("x",), lambda x: ((x, p, mode, training), {}))
    assert facts(node).primitive.id == "stochastic_depth"
    value = _laws(node, placeholders)
    assert value.q == 1.0
    # the range: at most 1/(1 - p) times the input's (unscaled at p = 1, where the output is 0)
    [x] = placeholders
    from qlint.core.domain import interval

    ranged = _apply(node, {x: Growth(1.0, range=interval(-1, 2))})
    if p < 1:
        assert (ranged.range.lo, ranged.range.hi) == (pytest.approx(-1 / (1 - p)), pytest.approx(2 / (1 - p)))


def test_torch_split_as_symbolic_trace_records_it():
    node, placeholders = _graph(torch.functional.split, ("x",), lambda x: ((x, [2, 2]), {"dim": 1}))
    assert facts(node).primitive.id == "view"
    assert _laws(node, placeholders).q == 1.0


def test_broadcast_tensors_is_the_largest_of_its_inputs():
    node, placeholders = _graph(torch.broadcast_tensors, ("a", "b"), lambda a, b: ((a, b), {}))
    assert facts(node).primitive.id == "broadcast_tensors"
    assert _q(_laws(node, placeholders)) == 1.0
    a, b = placeholders
    assert _q(_apply(node, {a: Growth(1.0), b: Growth(2.0)})) == 2.0


def test_broadcast_tensors_aten_overload():
    graph = fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    node = graph.call_function(torch.ops.aten.broadcast_tensors.default, ([a, b],))
    graph.output(node)
    annotate(fx.GraphModule(nn.Module(), graph), REGISTRY)
    assert facts(node).primitive.id == "broadcast_tensors"
    assert _q(_apply(node, {a: Growth(1.0), b: Growth(2.0)})) == 2.0
    assert _q(_apply(node, {a: Growth(None, culprit="test"), b: Growth(1.0)})) is None


@pytest.mark.parametrize("fn", [torch.linalg.cross, torch.cross])
def test_cross_product_is_bilinear(fn):
    node, placeholders = _graph(fn, ("a", "b"), lambda a, b: ((a, b), {"dim": -1}))
    assert facts(node).primitive.id == "cross_product"
    assert _laws(node, placeholders).q == 2.0  # q_a + q_b: a x a = 0 is not used, a x b of two q-1 values is q 2


@needs_torchvision
def test_patch_merging_pad_keeps_entries_or_zero():
    from torchvision.models.swin_transformer import _patch_merging_pad
    from qlint.core.domain import interval

    node, placeholders = _graph(_patch_merging_pad, ("x",), lambda x: ((x,), {}))
    assert facts(node).primitive.id == "patch_merging_pad"
    assert _laws(node, placeholders).q == 1.0
    ranged = _apply(node, {placeholders[0]: Growth(1.0, range=interval(1, 2))})
    assert (ranged.range.lo, ranged.range.hi) == (0.0, 2.0)  # a padded 0 joins the range


@needs_torchvision
def test_relative_position_bias_selects_table_entries():
    from torchvision.models.swin_transformer import _get_relative_position_bias

    node, placeholders = _graph(_get_relative_position_bias, ("table", "index"), lambda t, i: ((t, i, [2, 2]), {}))
    assert facts(node).primitive.id == "relative_position_bias"
    table, index = placeholders
    value = _apply(node, {table: Growth(0.0, depends=False), index: Growth(0.0, depends=False)})
    assert value.q == 0.0 and not value.depends
    assert _q(_apply(node, {table: Growth(None, culprit="test"), index: Growth(0.0, depends=False)})) is None


@needs_torchvision
def test_shifted_window_attention_is_affine_in_its_input():
    from torchvision.models.swin_transformer import shifted_window_attention

    names = ("x", "qkv_weight", "proj_weight", "bias", "qkv_bias", "proj_bias")

    def arguments(x, qkv_weight, proj_weight, bias, qkv_bias, proj_bias):
        return (x, qkv_weight, proj_weight, bias, [4, 4], 2, [2, 2], 0.1, 0.1, qkv_bias, proj_bias, None, True), {}

    node, placeholders = _graph(shifted_window_attention, names, arguments)
    assert facts(node).primitive.id == "window_attention"
    parameters = frozenset(names[1:])
    assert _laws(node, placeholders, parameters).q == 1.0
    env = {p: Growth(0.0, depends=False) if p.name in parameters else Growth(1.0) for p in placeholders}
    by_name = {p.name: p for p in placeholders}
    # a weight computed from the input: the qkv one is a product (bilinear), the output projection unread: unknown
    assert _q(_apply(node, {**env, by_name["qkv_weight"]: Growth(1.0)})) == 2.0
    assert _q(_apply(node, {**env, by_name["proj_weight"]: Growth(1.0)})) is None
    assert _q(_apply(node, {**env, by_name["bias"]: Growth(1.0)})) is None


def test_fake_quantize_is_bounded_by_a_scale_independent_of_the_input():
    node, placeholders = _graph(torch.fake_quantize_per_tensor_affine, ("x", "s", "z"), lambda x, s, z: ((x, s, z, 0, 255), {}))
    assert facts(node).primitive.id == "fake_quantize"
    x, s, z = placeholders
    value = _apply(node, {x: Growth(1.0), s: Growth(0.0, depends=False), z: Growth(0.0, depends=False)})
    assert value.q == 0.0 and value.range.below and value.range.above
    value = _apply(node, {x: Growth(1.0), s: Growth(1.0), z: Growth(0.0, depends=False)})
    assert value.q is None and "may approach 0" in value.culprit  # a scale from x may be 0: NaN there


@needs_torchvision
def test_roi_align_is_deliberately_unknown_with_a_reason():
    from torchvision.ops import roi_align

    node, placeholders = _graph(roi_align, ("x", "boxes"), lambda x, boxes: ((x, boxes, [2, 2]), {}))
    assert facts(node).primitive.id == "roi_pooling"
    value = _apply(node, {p: Growth(1.0) for p in placeholders})
    assert value.q is None and "no rule reads the boxes" in value.culprit
    aten = REGISTRY.lookup("call_function", torch.ops.torchvision.roi_align.default)
    assert aten is not None and aten.id == "roi_pooling" and aten.unbounded


@needs_torchvision
def test_every_new_entry_says_why():
    for entry_id in ("stochastic_depth", "window_attention", "broadcast_tensors", "patch_merging_pad", "relative_position_bias",
                     "cross_product", "fake_quantize", "roi_pooling", "detection_ops"):
        primitive = REGISTRY.by_id[entry_id]
        assert len(primitive.why) > 150 and primitive.targets, entry_id
    assert REGISTRY.by_id["view"].aliases == (("tensor", "input"),)  # torch.functional.split's first argument


def test_functional_multi_head_attention_has_the_exponent_of_its_value():
    """Table 1: sum_h W_O^h softmax(.) W_V^h value, the projections parameters: q = q_V, every input read."""
    import torch.nn.functional as F

    names = ("query", "key", "value", "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias")
    node, placeholders = _graph(F.multi_head_attention_forward, names, lambda q, k, v, w, b, ow, ob: (
        (q, k, v, 8, 2, w, b, None, None, False, 0.0, ow, ob), {"training": False, "need_weights": False}))
    assert facts(node).primitive.id == "mha_functional"
    weights = frozenset(names[3:])
    base = _laws(node, placeholders, parameters=weights)
    assert _q(base) == 1.0
    cubic_value = {p: Growth(3.0 if p.name == "value" else 1.0) for p in placeholders if p.name not in weights}
    constants = {p: Growth(0.0, depends=False) for p in placeholders if p.name in weights}
    assert _q(_apply(node, {**cubic_value, **constants})) == 3.0


def test_symbolic_scalars_take_the_largest_input():
    node, placeholders = _graph(torch.sym_max, ("a", "b"), lambda a, b: ((a, b), {}))
    assert facts(node).primitive.id == "symbolic"
    assert _q(_laws(node, placeholders)) == 1.0
    assert _q(_apply(node, {placeholders[0]: Growth(2.0), placeholders[1]: Growth(1.0)})) == 2.0


@needs_torchvision
def test_detection_ops_are_deliberately_unknown_with_a_reason():
    import torchvision  # noqa: F401  (registers torch.ops.torchvision)

    node, placeholders = _graph(torch.ops.torchvision.nms.default, ("boxes", "scores"), lambda b, s: ((b, s, 0.5), {}))
    assert facts(node).primitive.id == "detection_ops"
    value = _apply(node, {p: Growth(1.0) for p in placeholders})
    assert value.q is None
    for op in (torch.ops.torchvision.nms.default, torch.ops.torchvision.deform_conv2d.default):
        entry = REGISTRY.lookup("call_function", op)
        assert entry is not None and entry.id == "detection_ops" and entry.unbounded
