"""QL202-QL205: where the normalizations sit and how residual branches are scaled (source 001).

Paper 000 certifies one block at a time; source 001 adds what a *stack* of blocks
needs: a clean identity path (Pre-LN, not Post-LN), a final norm after a pre-norm
stack, branches scaled down with depth, and normalizers that really normalize
(BatchNorm in eval mode is an affine map).

The graph helpers at the end (data dependence, normalizers, constant folding)
are shared with the attention and looped-recurrence rules.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import networkx as nx
import torch
import torch.fx as fx
from torch import nn

from qlint import algebra
from qlint.analysis import Analysis, source_of
from qlint.blocks import _CARRIERS, _NORMS, ResidualBlock, to_networkx
from qlint.report import Finding
from qlint.rules.checks import Rule, check, define
from qlint.rules.primitives.handwritten_norms import op_name
from qlint.trace import module_path

DEEP_STACK = 8  # residual blocks (branches) from which an unscaled stack is reported

POST_LN_STACK = define(
    Rule(
        code="QL202",
        name="post-ln-stack",
        severity="warning",
        summary="""
            A stack of two or more Post-LN blocks X_{k+1} = LN(X_k + f(X_k)), including
            torch.nn.Transformer*Layer with norm_first=False.
        """,
        rationale="""
            In Post-LN the normalizer sits on the identity path: the gradient passes
            through a LayerNorm at every layer, and that Jacobian scales like
            sqrt(d)/||x||. A large early update grows the LN inputs and collapses the
            gradient through every layer at once; at initialization the gradients of
            different depths are badly unbalanced (Xiong et al.). This is why Post-LN
            needs learning-rate warmup and Pre-LN does not (source 001, Part IV;
            DeepNet traces the full causal chain in Part V).
        """,
        example="""
            for layer in self.layers:
                x = self.norm1(x + self.attn(x))
                x = self.norm2(x + self.mlp(x))
        """,
        remedy="""
            Move the norm into the branch (Pre-LN), which keeps the identity path clean:

                x = x + self.attn(self.norm1(x))

            or keep Post-LN with learning-rate warmup and DeepNorm scaling
            (x * alpha + f(x), branch weights initialised times beta).
        """,
    )
)

MISSING_FINAL_NORM = define(
    Rule(
        code="QL203",
        name="missing-final-norm",
        severity="warning",
        summary="""
            A stack of two or more pre-norm blocks X + f(LN(X)) whose stream reaches
            the model's output (or head) without a final normalization.
        """,
        rationale="""
            Pre-LN normalizes each branch's input, not the stream: every block adds
            an O(1) update, so the stream grows like sqrt(L) with depth, and trained
            models concentrate massive activations in a few of its dimensions. The
            unembedding then sees a depth-dependent scale; a final LN before the head
            is part of the Pre-LN recipe (source 001, Part IV, "The stream still grows").
        """,
        example="""
            for block in self.blocks:
                x = x + block.mlp(block.norm(x))
            return self.head(x)
        """,
        remedy="""
            Normalize the stream once after the last block:

                return self.head(self.norm_f(x))
        """,
    )
)

UNSCALED_BRANCHES = define(
    Rule(
        code="QL204",
        name="unscaled-deep-residual",
        severity="warning",
        summary=f"""
            A stack of at least {DEEP_STACK} residual blocks whose branches enter the
            stream at full scale: no LayerScale / ReZero factor, no DeepNorm beta and no
            1/sqrt(2L) initialization of the branch's output projection. A branch counts
            as scaled when (its output multiplier) x (the gain std(W)·sqrt(fan_in) of
            its last Linear or convolution, relative to PyTorch's default 1/sqrt(3)) is
            at most 2/sqrt(N) for N blocks (N = 2L for L attention + MLP layers).
            Measured on the weights qlint is given: lint the freshly initialised model.
        """,
        rationale="""
            With standard initialization the change one optimizer step makes to the
            output accumulates over the sublayers: ||ΔF|| = O(sum_i ||Δθ_i||), so doubling
            the depth doubles how far the function moves per step (DeepNet, Theorem 4.2).
            Branch scaling makes each block's contribution shrink with depth so the
            total does not grow with L: GPT-2's sigma/sqrt(2L) output projections,
            DeepNorm's alpha/beta, LayerScale, ReZero (source 001, Part V).
        """,
        example="""
            self.blocks = nn.ModuleList(PreLNBlock(d) for _ in range(24))   # default init
            ...
            x = x + self.proj(self.act(self.fc(self.norm(x))))
        """,
        remedy="""
            Initialise each branch's output projection at std / sqrt(2L):

                nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * n_layers))

            or multiply the branch by a LayerScale gamma initialised small:

                x = x + self.gamma * self.proj(...)      # gamma = 1e-5 .. 0.1
        """,
    )
)

BATCHNORM_EVAL = define(
    Rule(
        code="QL205",
        name="batchnorm-eval-affine",
        severity="warning",
        summary="""
            A model analysed in eval mode whose residual block relies on BatchNorm with
            running statistics: there BatchNorm is the affine map
            gamma·(x - mu_run)/sigma_run + beta, not a normalizer, and the block is
            q > 0 where batch statistics would have bounded it.
        """,
        rationale="""
            Only a normalizer dividing by statistics of its own input collapses the
            exponent (paper 000, Theorem 9(v)). In eval mode BatchNorm divides by
            constants frozen during training, so it passes the growth of its input
            straight through (q = 1 in the primitive registry); the bound that held
            in training does not hold at inference, when inputs drift from the training
            distribution (source 001 counts normalization among the mechanisms that
            keep the stream in range, Part IV).
        """,
        example="""
            model.eval()
            ...
            return x + self.bn2(self.fc2(torch.relu(self.bn1(self.fc1(x)))))
        """,
        remedy="""
            Use a normalizer that computes its statistics per sample (LayerNorm,
            GroupNorm, RMSNorm) where the block's bound depends on it:

                return x + self.fc2(torch.relu(self.fc1(self.norm(x))))
        """,
    )
)


# --- QL202 ---------------------------------------------------------------------------------


def _post_ln_layers(analysis: Analysis) -> tuple[list[str], list[fx.Node]]:
    """Module paths of Post-LN sublayers: graph blocks plus opaque torch.nn layers."""
    paths, nodes = [], []
    for block in analysis.residual_blocks:
        if block.form == "post-norm":
            paths.append(module_path(block.root))
            nodes.append(block.root)
    for node in analysis.traced.graph.nodes:
        if node.op != "call_module":
            continue
        for name, layer in analysis.traced.module.get_submodule(node.target).named_modules():
            if isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)) and not layer.norm_first:
                sublayers = 2 if isinstance(layer, nn.TransformerEncoderLayer) else 3
                paths.extend([".".join(filter(None, (str(node.target), name)))] * sublayers)
                nodes.append(node)
    return paths, nodes


@check("QL202")
def post_ln_stack(analysis: Analysis) -> Iterable[Finding]:
    paths, nodes = _post_ln_layers(analysis)
    if len(paths) < 2:
        return
    stack = common_path(paths) or type(analysis.model).__name__
    yield Finding(
        "QL202",
        "warning",
        f"Post-LN stack `{stack}` of {len(paths)} blocks: LayerNorm on the identity path rescales the gradient by "
        "sqrt(d)/||x|| at every block; needs learning-rate warmup (or Pre-LN)",
        stack,
        source_of(nodes[0]),
    )


# --- QL203 ---------------------------------------------------------------------------------


def _pre_norm(block: ResidualBlock, analysis: Analysis) -> bool:
    """The velocity starts with a normalization of the stream X_k."""
    return any(is_normalizer(node, analysis) and _normalised_input(node, analysis) is block.stream for node in block.cone)


def _normalised_input(node: fx.Node, analysis: Analysis) -> Optional[fx.Node]:
    handwritten = analysis.interpreter.normalizations.get(node)
    value = handwritten[1] if handwritten else (node.args[0] if node.args else None)
    if not isinstance(value, fx.Node):
        return None
    value = carried(value)
    if handwritten and op_name(value) == "sub" and isinstance(value.args[0], fx.Node):  # (x - mean) / std
        value = carried(value.args[0])
    return value


@check("QL203")
def missing_final_norm(analysis: Analysis) -> Iterable[Finding]:
    # any form: a top-level loop whose last add feeds the final norm reads as post-norm to find_blocks
    pre_norm = [b for b in analysis.residual_blocks if _pre_norm(b, analysis)]
    if len(pre_norm) < 2:
        return
    graph = analysis.traced.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    last = max(pre_norm, key=lambda b: order[b.root])
    dag = to_networkx(graph)
    dag.remove_nodes_from([n for n in graph.nodes if is_normalizer(n, analysis) or is_metadata(n)])
    output = next(n for n in graph.nodes if n.op == "output")
    if not nx.has_path(dag, last.root, output):
        return
    stack = common_path([module_path(b.root) for b in pre_norm]) or type(analysis.model).__name__
    yield Finding(
        "QL203",
        "warning",
        f"pre-norm stack `{stack}` of {len(pre_norm)} blocks reaches the output without a final norm after "
        f"`{last.name}`: the stream grows like sqrt(L)",
        stack,
        source_of(last.root),
    )


# --- QL204 ---------------------------------------------------------------------------------

_DEFAULT_GAIN = 1 / math.sqrt(3)  # std(W)·sqrt(fan_in) of nn.Linear / nn.ConvNd's default init
_PASS_THROUGH = _CARRIERS | {"dropout", "native_dropout", "dropout_"}
_PROJECTIONS = ("linear", "conv1d", "conv2d", "conv3d", "convolution")


def branch_scale(term: fx.Node, analysis: Analysis, dependent: set[fx.Node]) -> float:
    """How much smaller than a default-initialised branch this velocity term enters the stream.

    The product of the constant or parameter factors at the branch's end (LayerScale,
    ReZero) and of its last projection's gain relative to the default init.
    """
    scale, node = 1.0, term
    while True:
        name = op_name(node)
        if name in _PASS_THROUGH and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        data = [a for a in node.args[:2] if isinstance(a, fx.Node) and a in dependent]
        if name in ("mul", "div") and len(node.args) == 2 and len(data) == 1:
            data_first = node.args[0] is data[0]
            value = constant_value(node.args[1] if data_first else node.args[0], analysis)
            if value is None or value.numel() == 0 or (name == "div" and not data_first):
                return scale
            magnitude = value.abs()
            scale *= float(magnitude.max()) if name == "mul" else 1 / max(float(magnitude.min()), 1e-30)
            node = data[0]
            continue
        weight = _projection_weight(node, analysis)
        if weight is not None:
            fan_in = weight[0].numel() if weight.shape[0] else 1
            gain = float(weight.float().std()) * math.sqrt(fan_in) if weight.numel() > 1 else float(weight.abs().max())
            return scale * gain / _DEFAULT_GAIN
        return scale


def _projection_weight(node: fx.Node, analysis: Analysis) -> Optional[torch.Tensor]:
    if node.op == "call_module":
        module = analysis.traced.module.get_submodule(node.target)
        if isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
            return module.weight.detach()
        return None
    name = op_name(node)
    if name == "addmm" and len(node.args) >= 3:  # x @ W + b with W (fan_in, fan_out): HF's Conv1D
        weight = constant_value(node.args[2], analysis)
        return weight.t() if weight is not None and weight.dim() == 2 else None
    if name in _PROJECTIONS and len(node.args) >= 2:
        return constant_value(node.args[1], analysis)
    return None


@check("QL204")
def unscaled_deep_residual(analysis: Analysis) -> Iterable[Finding]:
    blocks = analysis.residual_blocks
    if len(blocks) < DEEP_STACK:
        return
    if any(p.is_meta for p in analysis.traced.module.parameters()):
        return  # built on meta: the initialisation has no values to inspect
    dependent = data_dependent(analysis.traced.graph)
    limit = 2 / math.sqrt(len(blocks))
    unscaled = [b for b in blocks if max(branch_scale(t, analysis, dependent) for t in b.terms) > limit]
    if not unscaled:
        return
    stack = common_path([module_path(b.root) for b in blocks]) or type(analysis.model).__name__
    yield Finding(
        "QL204",
        "warning",
        f"deep residual stack `{stack}`: {len(unscaled)} of {len(blocks)} branches enter the stream unscaled "
        f"(relative scale > 2/sqrt({len(blocks)}) = {limit:.2f}; first: `{unscaled[0].name}`); use 1/sqrt(2L) init, "
        "LayerScale or DeepNorm",
        stack,
        source_of(unscaled[0].root),
    )


# --- QL205 ---------------------------------------------------------------------------------

_RUNNING_STATS_OPS = {"_native_batch_norm_legit_no_training", "_batch_norm_no_update"}
_BATCH_STATS_OPS = {"_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_batch_norm_with_update"}
_BATCH_NORM_FUNCTIONS = {"batch_norm", "native_batch_norm"}  # training flag is argument 5


def uses_running_stats(node: fx.Node, analysis: Analysis) -> Optional[bool]:
    """True for a BatchNorm on running statistics (an affine map), False on batch statistics, None if not BatchNorm."""
    if node.op == "call_module":
        module = analysis.traced.module.get_submodule(node.target)
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            return None
        return module.track_running_stats and not module.training
    name = op_name(node)
    if name in _RUNNING_STATS_OPS or name in _BATCH_STATS_OPS:
        return name in _RUNNING_STATS_OPS
    if name in _BATCH_NORM_FUNCTIONS:
        training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", False)
        return not training
    return None


@check("QL205")
def batchnorm_eval(analysis: Analysis) -> Iterable[Finding]:
    if analysis.report.mode != "eval":
        return
    for residual, block in zip(analysis.residual_blocks, analysis.report.blocks):
        if block.q is not None and block.q == 0:
            continue
        env = analysis.envs[residual.name]
        affine = [
            module_path(node) or str(node.target)
            for node in residual.cone
            if uses_running_stats(node, analysis) and _carries_signal(env.get(node))
        ]
        if affine:
            yield Finding(
                "QL205",
                "warning",
                f"block `{block.name}`: BatchNorm `{affine[0]}` uses running statistics in eval mode, an affine map "
                f"that does not bound the block (q = {algebra.format_q(block.q)} here; batch statistics would normalize it)",
                block.name,
                block.source,
            )


def _carries_signal(value) -> bool:
    while isinstance(value, tuple):
        value = value[0] if value else None
    return value is not None and value.depends and (value.q is None or value.q > 0)


# --- graph helpers shared with the attention and looped-recurrence rules --------------------


_METADATA_OPS = {"size", "sym_size", "dim", "numel", "sym_numel", "stride", "sym_stride"}
_METADATA_ATTRIBUTES = {"shape", "dtype", "device", "ndim", "layout", "is_cuda", "requires_grad"}


def is_metadata(node: fx.Node) -> bool:
    """``x.shape``, ``x.size(1)``, ``x.dtype``: facts about a tensor, not its values."""
    name = op_name(node)
    if name == "getattr":
        return len(node.args) > 1 and node.args[1] in _METADATA_ATTRIBUTES
    return name in _METADATA_OPS


def data_dependent(graph: fx.Graph) -> set[fx.Node]:
    """Nodes whose values are computed from the model's inputs.

    Parameters, buffers, constants and values derived from input shapes or dtypes
    (``x.shape[1]``, ``x.dtype``) are not.
    """
    dependent: set[fx.Node] = set()
    for node in graph.nodes:
        if is_metadata(node):
            continue
        if node.op == "placeholder" or any(parent in dependent for parent in node.all_input_nodes):
            dependent.add(node)
    return dependent


def carried(node: fx.Node) -> fx.Node:
    """The value a node carries through casts and reshapes."""
    while op_name(node) in _CARRIERS and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def is_normalizer(node: fx.Node, analysis: Analysis) -> bool:
    """LayerNorm, RMSNorm, GroupNorm, L2 normalization, hand-written or not.

    BatchNorm only counts with batch statistics (train mode): with running statistics
    it is an affine map (QL205).
    """
    if node in analysis.interpreter.normalizations or op_name(node) in _NORMS:
        return True
    if node.op == "call_module":
        module = analysis.traced.module.get_submodule(node.target)
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)):
            return True
    return uses_running_stats(node, analysis) is False


def constant_value(value, analysis: Analysis) -> Optional[torch.Tensor]:
    """Evaluate a value that depends on parameters, buffers and constants only (None otherwise)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value))
    if not isinstance(value, fx.Node):
        return None
    needed, stack = set(), [value]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    if any(n.op == "placeholder" for n in needed):
        return None
    interpreter = fx.Interpreter(analysis.traced.module)
    with torch.no_grad():
        for node in analysis.traced.graph.nodes:
            if node in needed:
                interpreter.env[node] = interpreter.run_node(node)
    result = interpreter.env[value]
    return result.detach() if isinstance(result, torch.Tensor) else None


def common_path(paths: list[str]) -> str:
    """The longest dotted prefix shared by module paths ('layers' for layers.0, layers.1)."""
    split = [p.split(".") for p in paths if p]
    if not split or len(split) < len(paths):
        return ""
    prefix = []
    for parts in zip(*split):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    return ".".join(prefix)
