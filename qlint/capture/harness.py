"""How every capture stage runs the user's model: quietly (torch's tracing chatter silenced), in the
grad mode of the analysed mode, its outputs flattened to tensors, its parameters and buffers saved
and put back, and what it is (a Hugging Face model, meta tensors, the names of its inputs). The
stages above (:mod:`qlint.capture.eager_record`, :mod:`~qlint.capture.trace`,
:mod:`~qlint.capture.graph_check`) share it; it knows none of them.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import warnings
from typing import Any, Iterator

import torch


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model output, in order; anything else (a KV cache object) is dropped."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):  # Hugging Face ModelOutput is an OrderedDict
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in tensors(item)]
    return []


def is_hugging_face(model: torch.nn.Module) -> bool:
    """A transformers PreTrainedModel (checked by name: transformers is not imported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
               for c in type(model).__mro__)


@contextlib.contextmanager
def tensor_outputs(model: torch.nn.Module) -> Iterator[None]:
    """Make ``model`` return a flat tuple of tensors while it is traced.

    torch.export and make_fx reject outputs that are not pytrees, such as the
    ``DynamicCache`` Hugging Face models return; the analysis only needs the graph, so
    non-tensor outputs are dropped. A forward hook registered last does it: the model's
    own forward and hooks (a root hook included) see its real output first, and every
    node's module path stays relative to the model itself. A Hugging Face model does
    not build that cache at all (``use_cache=False``): it is an output only.
    """
    handle = model.register_forward_hook(lambda module, args, output: tuple(tensors(output)))
    config = getattr(model, "config", None) if is_hugging_face(model) else None
    caching = getattr(config, "use_cache", False) is True
    if caching:
        config.use_cache = False
    try:
        yield
    finally:
        if caching:
            config.use_cache = True
        handle.remove()


def grad_state(training: bool) -> Any:
    """The grad mode the analysed mode runs in: training computes gradients, evaluation is
    inference. The graph is traced and checked in it, so a forward that branches on
    ``torch.is_grad_enabled()`` or ``x.requires_grad`` is seen taking the path it takes there."""
    return torch.enable_grad() if training else torch.no_grad()


def has_meta(model: torch.nn.Module, inputs: tuple) -> bool:
    """Meta inputs or parameters: shapes without values."""
    return any(isinstance(x, torch.Tensor) and x.is_meta for x in inputs) or any(p.is_meta for p in model.parameters())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence tracing chatter: torch logs warnings and prints partial graphs to stderr on
    failure; qlint explains a failure in one line instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()



def argument_names(model: torch.nn.Module, count: int) -> list[str]:
    """The names export's guards give the positional inputs (``L['x']``): the forward's parameters."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:count]


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer (a forward in train mode updates BatchNorm's)."""
    return {name: tensor.detach().clone() for name, tensor in model_state(model).items()}


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def restore(model: torch.nn.Module, saved: dict[str, torch.Tensor], *, buffers_only: bool = False) -> None:
    """Put the saved values back; a tensor the forward replaced by one of another shape (a table of
    positions regrown for a longer input) is replaced by the saved one again."""
    state = dict(model.named_buffers()) if buffers_only else model_state(model)
    with torch.no_grad():
        for name, tensor in state.items():
            if name not in saved:
                continue  # registered by the forward itself: nothing to go back to
            if tensor.shape == saved[name].shape:
                tensor.copy_(saved[name])
                continue
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner)
            if leaf in module._buffers:
                module._buffers[leaf] = saved[name].clone()
            else:
                tensor.data = saved[name].clone()


# the global modes a forward can read, as contexts the graph check runs the model in


@contextlib.contextmanager
def compiling_mode() -> Iterator[None]:
    """The forward as torch.compile traces it: ``torch.compiler.is_compiling()`` and ``is_dynamo_compiling()``
    True (torch.export's graph was traced so already)."""
    import torch.compiler as compiler

    flag, dynamo = compiler._is_compiling_flag, compiler.is_dynamo_compiling
    compiler._is_compiling_flag, compiler.is_dynamo_compiling = True, lambda: True
    try:
        yield
    finally:
        compiler._is_compiling_flag, compiler.is_dynamo_compiling = flag, dynamo


@contextlib.contextmanager
def cuda_autocast_mode() -> Iterator[None]:
    """CUDA autocast on, as a GPU's mixed-precision training loop runs the forward: it casts none of the CPU's
    tensors, so only a forward that asks about it (``torch.is_autocast_enabled("cuda")``) sees it."""
    previous = torch.is_autocast_enabled("cuda")
    torch.set_autocast_enabled("cuda", True)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", previous)


@contextlib.contextmanager
def float64_default_mode() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def medium_matmul_mode() -> Iterator[None]:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextlib.contextmanager
def deterministic_mode() -> Iterator[None]:
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


__all__ = ["argument_names", "compiling_mode", "cuda_autocast_mode", "deterministic_mode", "first_line",
           "float64_default_mode", "grad_state", "has_meta", "is_hugging_face", "medium_matmul_mode", "model_state",
           "quiet", "restore", "snapshot", "tensor_outputs", "tensors"]
