"""The other histories a tensor can have, for a forward that reads one (capture/graph_check._other_histories).

A forward that reads what a tensor has been through rather than its value (its autograd state, how it lies in
memory: :data:`qlint.capture.eager_record.HISTORY_READS`) takes the path that history gives, and training gives it
others: no gradients in a calibration pass, frozen layers, a sliced or transposed batch. Each history here is a
context given the inputs, which sets the model's state and yields the inputs to run on, and puts the state back.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from typing import Any, Callable, Iterator

import torch

from qlint.capture.harness import grad_state

def same_values(given: tuple, inputs: tuple) -> bool:
    return all(not isinstance(a, torch.Tensor) or (a.shape == b.shape and bool(torch.equal(a.detach(), b.detach())))
               for a, b in zip(given, inputs))


def contiguous(given: tuple) -> tuple:
    """The same values in fresh memory: the path they take laid out plainly (an expanded batch's reference)."""
    return tuple(x.detach().contiguous().clone() if isinstance(x, torch.Tensor) else x for x in given)


# a context given the inputs: another history for the model, yielding the inputs (with whether they are the same)
History = Callable[[tuple], Any]
MAX_FROZEN_ALONE = 32  # modules whose parameters are frozen alone, and all but them (fine-tuning freezes some)


def grad_histories(model: torch.nn.Module, inputs: tuple) -> list[tuple[str, History, bool]]:
    """Gradients off and on; inputs that require grad, or were computed (a block in the middle of a network);
    and, with gradients on and off each: the parameters frozen (all of them, each module's alone, all but each
    module's: a head fine-tuned; each parameter of a module that holds several alone, and all but it: a bias
    tuned), after a backward (gradients held), with gradient hooks on every parameter
    (data-parallel training, an optimizer in the backward)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    holders = parameter_owners(model)
    owners = [(name or type(owner).__name__, [p for p in owner.parameters(recurse=False) if p.requires_grad])
              for name, owner in model.named_modules() if owner in holders]

    @contextlib.contextmanager
    def mode(grad: bool, given: tuple) -> Iterator[tuple]:
        with grad_state(grad):
            yield given

    @contextlib.contextmanager
    def inputs_wanting_grad(computed: bool, given: tuple) -> Iterator[tuple]:
        with torch.enable_grad():
            yield tuple(_wanting_grad(x, computed) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                        for x in given)

    @contextlib.contextmanager
    def frozen(held: list[torch.nn.Parameter], grad: bool, given: tuple) -> Iterator[tuple]:
        with grad_state(grad):
            for p in held:
                p.requires_grad_(False)
            try:
                yield given
            finally:
                for p in held:
                    p.requires_grad_(True)

    @contextlib.contextmanager
    def after_backward(grad: bool, given: tuple) -> Iterator[tuple]:
        before = [p.grad for p in parameters]
        with grad_state(grad):
            for p in parameters:
                p.grad = torch.zeros_like(p)
            try:
                yield given
            finally:
                for p, held in zip(parameters, before):
                    p.grad = held

    @contextlib.contextmanager
    def hooked(grad: bool, given: tuple) -> Iterator[tuple]:
        handles = [hook for p in parameters for hook in (p.register_hook(lambda g: g),
                                                          p.register_post_accumulate_grad_hook(lambda p: None))]
        with grad_state(grad):
            try:
                yield given
            finally:
                for handle in handles:
                    handle.remove()

    states: list[tuple[str, Callable[..., Any]]] = []
    if parameters:
        states += [("with its parameters frozen (requires_grad False)", functools.partial(frozen, parameters)),
                   ("after a backward (every parameter holding a gradient)", after_backward),
                   ("with gradient hooks on every parameter", hooked)]
    # frozen alone, and all but them: each module's parameters, and each parameter of a module holding several (a
    # weight frozen while its bias trains: BitFit)
    groups = [(f"the parameters of `{name}`", f"`{name}`'s", held) for name, held in owners] if len(owners) > 1 else []
    groups += [(f"`{name}.{key}`", f"`{name}.{key}`", [p]) for name, owner in model.named_modules()
               if owner in holders for key, p in owner.named_parameters(recurse=False)
               if p.requires_grad and len([q for q in owner.parameters(recurse=False) if q.requires_grad]) > 1]
    states += [state for alone, others, held in groups for state in (
        (f"with {alone} frozen alone", functools.partial(frozen, held)),
        (f"with every parameter but {others} frozen", functools.partial(
            frozen, [p for p in parameters if all(p is not q for q in held)])))]
    floats = any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs)
    return [("with gradients off", functools.partial(mode, False), True),
            ("with gradients on", functools.partial(mode, True), True),
            *([("on inputs that require grad", functools.partial(inputs_wanting_grad, False), False),
               ("on inputs computed with gradients (a block inside a network)",
                functools.partial(inputs_wanting_grad, True), False)] if floats else []),
            *[(what + suffix, functools.partial(state, grad), True)
              for what, state in states for grad, suffix in ((True, ""), (False, ", with gradients off"))]]


def parameter_owners(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that hold trainable parameters themselves (what fine-tuning freezes one by one)."""
    return [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]


def _wanting_grad(x: torch.Tensor, computed: bool) -> torch.Tensor:
    leaf = x.detach().requires_grad_(True)
    return leaf * 1 if computed else leaf


def layout_histories(model: torch.nn.Module, inputs: tuple) -> list[tuple[str, History, bool]]:
    """The inputs laid out as a batch may come: transposed in memory, channels-last, a slice of a larger batch
    (an offset into a larger storage, a view), expanded along the batch (stride 0)."""

    def laid_out(form: Callable[[torch.Tensor], torch.Tensor]) -> History:
        @contextlib.contextmanager
        def given_so(given: tuple) -> Iterator[tuple]:
            yield tuple(form(x) if isinstance(x, torch.Tensor) and x.numel() else x for x in given)
        return given_so

    return [(f"on {what}", laid_out(form), False) for what, form in (
        ("non-contiguous inputs", transposed), ("channels-last inputs", channels_last),
        ("inputs sliced from a larger batch", _sliced_from_larger), ("inputs expanded along the batch", _expanded),
        ("inputs sliced from wider rows (a chunk of a fused projection)", _column_slice))]


def _sliced_from_larger(x: torch.Tensor) -> torch.Tensor:
    """The same values, the second half of a storage twice their size: an offset, a view, a larger storage."""
    return torch.cat([x.detach().clone(), x.detach()]).narrow(0, x.shape[0], x.shape[0]) if x.dim() else x


def _column_slice(x: torch.Tensor) -> torch.Tensor:
    """The same values, the first half of rows twice as wide: not contiguous, the last axis' stride still 1."""
    return torch.cat([x.detach(), x.detach()], -1)[..., : x.shape[-1]] if x.dim() else x


def _expanded(x: torch.Tensor) -> torch.Tensor:
    """The first sample expanded along the batch: stride 0 (other values, compared with their contiguous copy)."""
    return x[:1].expand_as(x) if x.dim() and x.shape[0] > 1 else x


MAX_FLAGS_COMBINED = 4  # training flags one module's code reads together, every combination of them tried


def mode_histories(model: torch.nn.Module, combined: list[list[str]]) -> list[tuple[str, History, bool]]:
    """Every combination of modes of the modules in each of ``combined`` (a module's code that reads another's
    training flag decides on the pair: a submodule in eval while the model trains, the frozen-BatchNorm recipe),
    the mode of each module flipped. Flags of more than :data:`MAX_FLAGS_COMBINED`
    modules read together are the caller's to refuse."""
    modules = dict(model.named_modules())

    @contextlib.contextmanager
    def flipped(names: tuple[str, ...], given: tuple) -> Iterator[tuple]:
        before = [(modules[name], modules[name].training) for name in names]
        for module, training in before:
            module.training = not training
        try:
            yield given
        finally:
            for module, training in before:
                module.training = training

    chosen = dict.fromkeys(subset for names in combined for size in range(1, len(names) + 1)
                           for subset in itertools.combinations(sorted(names), size))
    return [(f"with the mode of {', '.join(f'`{name or type(model).__name__}`' for name in names)} flipped "
             "(the rest as analysed)", functools.partial(flipped, names), True) for names in chosen]


def frozen_norm_histories(model: torch.nn.Module) -> list[tuple[str, History, bool]]:
    """A model that trains with BatchNorm layers (or InstanceNorm with running statistics) put in eval mode: the
    frozen-BatchNorm recipe of fine-tuning. There a norm is the affine map of its running statistics (q 1) where
    batch statistics bound it (q 0), so a square of it is q 2. The exponent algebra is monotone, so all of them in
    eval bounds every mix of frozen and training ones; a dropout's mode cannot raise an exponent (a bounded mask),
    so it is left as analysed."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.training
             and m.track_running_stats and m.running_mean is not None]

    @contextlib.contextmanager
    def frozen(given: tuple) -> Iterator[tuple]:
        for norm in norms:
            norm.training = False
        try:
            yield given
        finally:
            for norm in norms:
                norm.training = True

    return [("with its BatchNorm layers in eval mode while it trains (frozen statistics)", frozen, True)] if norms \
        else []


HISTORIES = {"autograd": grad_histories, "layout": layout_histories}
FACTS = {"autograd": "a tensor's autograd state", "layout": "how a tensor lies in memory",
         "training": "the training flags of several modules together"}


def transposed(x: torch.Tensor) -> torch.Tensor:
    """The same values, laid out transposed in memory (a view of a transposed copy): not contiguous."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2) if x.dim() >= 2 and x.shape[-1] > 1 else x


def channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 and x.shape[1] > 1 else x


# the forms of its floating inputs a forward can read (x.dtype, x.is_contiguous(), a memory format): what,
# and the input in that form


__all__ = ["FACTS", "HISTORIES", "MAX_FLAGS_COMBINED", "MAX_FROZEN_ALONE", "channels_last", "contiguous",
           "frozen_norm_histories", "grad_histories", "layout_histories", "mode_histories", "parameter_owners",
           "same_values", "transposed"]
