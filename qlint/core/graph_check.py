"""Check a traced graph against the model it stands for: the graph must compute what the eager model
computes, on the example inputs, on them scaled, with the parameters redrawn, and on other input shapes.

The analysis reads the graph, not the model, so a graph that agrees on today's values only (a branch
on a parameter's value, state kept across calls) would certify what the model does not compute.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch
import torch.fx as fx

from qlint.core import shapes
from qlint.core.trace import (argument_names, first_line, grad_state, has_meta, quiet, restore, snapshot,
                              tensor_outputs, tensors)

def shape_coverage(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple],
                   tracer: str) -> Optional[shapes.ShapeCoverage]:
    """The shapes the graph computes the model on (:mod:`qlint.core.shapes`); None for symbolic_trace,
    whose graph records no shape (a branch on a size stops it), or without values to compare."""
    if tracer == "symbolic_trace" or inputs is None or has_meta(model, inputs):
        return None

    def runs(other: tuple) -> bool:
        return eager_failure(model, other) is None

    return shapes.probe(model, inputs, bool(module.meta.get("qlint_dynamic")),
                        list(module.meta.get("qlint_shape_guards", [])),
                        shapes.symbolic_axes(module, inputs), runs, lambda other: computes(model, module, other),
                        argument_names(model, len(inputs)))


def computes(model: torch.nn.Module, module: fx.GraphModule, inputs: tuple) -> bool:
    """Whether the graph runs on ``inputs`` and gives the eager model's output there (in the
    analysed mode's grad state; the model's state and the RNG are restored)."""
    saved, state = snapshot(model), torch.random.get_rng_state()
    try:
        with quiet(), grad_state(model.training):
            _compare_again(module, model, inputs, "on inputs of another shape")
        return True
    except GraphMismatch:
        return False
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)


def eager_failure(model: torch.nn.Module, inputs: tuple) -> Optional[BaseException]:
    """What the eager model raises on ``inputs``, if anything (no gradients; the parameters,
    buffers and RNG state are restored). Not on meta tensors: there a value read raises too,
    so a tracer's failure could not be told from inputs the model does not accept."""
    saved = snapshot(model)
    state = torch.random.get_rng_state()
    try:
        with quiet(), torch.no_grad():
            _eager(model, inputs)
    except Exception as exc:  # noqa: BLE001  (returned: the caller reports it)
        return exc
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    return None


class GraphMismatch(Exception):
    """The traced graph does not compute what the eager model computes."""


def compare_with_eager(model: torch.nn.Module, module: fx.GraphModule, inputs: Optional[tuple], *,
                       shape_only: bool = False) -> str:
    """Run the graph and the eager model and compare their outputs: on the example inputs,
    on them scaled up, and with the parameters redrawn.

    The analysis reads the graph, so the graph must compute what the model computes for
    every input size and every parameter value, not only today's: a forward that
    branches on a parameter's value (``if self.gate.item():``), bakes one in
    (``x ** float(self._parameters["p"])``), notices the tracer, or keeps state across
    calls gives a graph that matches on the example and differs here. Also records each
    node's shape and dtype on symbolic_trace graphs (ShapeProp), which the shape-dependent
    proofs use. Raises GraphMismatch when the outputs differ; the model's parameters,
    buffers and RNG state are restored afterwards.
    """
    if inputs is None:
        return "not compared: no example inputs"
    from torch.fx.passes.shape_prop import ShapeProp

    if has_meta(model, inputs):
        if shape_only:
            ShapeProp(module).propagate(*inputs)
        return "not compared: meta tensors have no values"
    saved = snapshot(model)
    state = torch.random.get_rng_state()
    try:
        with grad_state(model.training):
            torch.manual_seed(0)
            graph_out = ShapeProp(module).propagate(*inputs) if shape_only else module(*inputs)
            first = _eager(model, inputs)
            # buffers the forward writes (BatchNorm's statistics in training)
            module.meta["qlint_written_buffers"] = frozenset(
                b.untyped_storage().data_ptr() for name, b in model.named_buffers()
                if b.numel() and not _same_tensor(b, saved[name]))
            _require_same(graph_out, first, "on the example inputs")
            if not _agree(first, _eager(model, inputs)):
                raise GraphMismatch("the model's output changes between identical calls (state kept across calls, "
                                    "or unseeded randomness): no graph can stand for it")
            floats = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs)
            if model.training and floats:  # in training every block after the first reads a value that requires grad
                wanting = tuple(x.detach().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
                                else x
                                for x in inputs)
                if _eager_runs(model, wanting):  # a model that cannot take them (no CPU backward) never runs so
                    _compare_again(module, model, wanting, "on inputs that require grad (as in training)")
            for scale in SCALES if floats else ():
                scaled = tuple(x * scale if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                               for x in inputs)
                _compare_again(module, model, scaled, f"on the inputs scaled by {scale:g}", scaled=True)
            if not shares_parameters(module, model):  # redrawing the model's would not redraw the graph's
                raise GraphMismatch("the graph holds its own copy of the parameters: it cannot be checked with redrawn "
                                    "ones")
            for redraw in _redraws(model, saved):  # each redraw overwrites every float parameter
                _compare_again(module, model, inputs, f"with the parameters {redraw}")
                restore(model, saved, buffers_only=True)  # what the forward may have updated (BatchNorm's statistics)
    finally:
        restore(model, saved)
        torch.random.set_rng_state(state)
    count = len(tensors(graph_out))
    return (f"matches the eager model on the example inputs, scaled by {', '.join(f'{s:g}' for s in SCALES)}, "
            f"and with redrawn parameters ({count} output{'s' if count != 1 else ''})")


SCALES = (1e3, 1e6)


def _run(module: fx.GraphModule, inputs: tuple) -> Any:
    torch.manual_seed(0)
    return module(*inputs)


def _eager(model: torch.nn.Module, inputs: tuple) -> Any:
    torch.manual_seed(0)
    with tensor_outputs(model):
        return model(*inputs)


def _eager_runs(model: torch.nn.Module, inputs: tuple) -> bool:
    try:
        _eager(model, inputs)
        return True
    except Exception:  # noqa: BLE001
        return False


def _compare_again(module: fx.GraphModule, model: torch.nn.Module, inputs: tuple, where: str, *,
                   scaled: bool = False) -> None:
    try:
        graph_out, eager_out = _run(module, inputs), _eager(model, inputs)
    except Exception as exc:  # e.g. an assert in the model on other values: fail closed
        raise GraphMismatch(f"the graph and the model could not be compared {where}: {first_line(exc)}") from exc
    _require_same(graph_out, eager_out, where, scaled=scaled)


def _agree(a: Any, b: Any, *, scaled: bool = False) -> bool:
    mine, theirs = tensors(a), tensors(b)
    if len(mine) != len(theirs):
        return False
    for x, y in zip(mine, theirs):
        if x.shape != y.shape:
            return False
        if (scaled and (x.is_floating_point() or x.is_complex())
            and not (torch.isfinite(x).all() and torch.isfinite(y).all())):
            continue  # overflow at this scale: inconclusive, not a mismatch
        if not _close(x, y):
            return False
    return True


def _require_same(graph_out: Any, eager_out: Any, where: str, *, scaled: bool = False) -> None:
    mine, theirs = tensors(graph_out), tensors(eager_out)
    if len(mine) != len(theirs):
        raise GraphMismatch(f"the graph returns {len(mine)} tensors, the model {len(theirs)}")
    if not _agree(graph_out, eager_out, scaled=scaled):
        raise GraphMismatch(f"the traced graph's output differs from the eager model's {where}")


def shares_parameters(module: fx.GraphModule, model: torch.nn.Module) -> bool:
    """Whether every parameter of the graph is a parameter of the model (same storage), so that
    redrawing the model's redraws the graph's (symbolic_trace, export and make_fx all share)."""
    owned = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return all(p.untyped_storage().data_ptr() in owned for p in module.parameters())


def _redraws(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> Iterator[str]:
    """Put other values into the floating-point parameters, in place (the graph shares them):
    each one plus noise of its own spread, then negated plus noise. A zero-initialised gate
    becomes non-zero, a positive scalar negative."""
    generator = torch.Generator().manual_seed(1)
    parameters = [(p, saved[name]) for name, p in model.named_parameters() if p.is_floating_point()]
    if not parameters:
        return
    with torch.no_grad():
        spreads = [float(original.abs().max()) if original.numel() else 0.0 for _, original in parameters]
    for sign, label in ((1.0, "redrawn"), (-1.0, "negated and redrawn")):
        with torch.no_grad():
            for (parameter, original), spread in zip(parameters, spreads):  # in place, in the parameter's dtype
                parameter.normal_(0.0, 0.1 * max(spread, 0.1), generator=generator).add_(original, alpha=sign)
        yield label


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype
            and bool(torch.equal(a, b)
                     or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True, rtol=0, atol=0))))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype and not (a.is_floating_point() and b.is_floating_point()):
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a.to(b.dtype), b, rtol=1e-4, atol=1e-5, equal_nan=True))
    return bool(torch.equal(a, b))


__all__ = ["GraphMismatch", "compare_with_eager", "computes", "eager_failure", "shape_coverage", "shares_parameters"]
