"""The Python state a forward can keep across calls (qlint.capture.call_state.python_state): whatever holds a
count -- a deque, a dict keyed by a shape, a function's default argument, an iterator, a float tensor held as a
plain attribute -- shows a change; an untouched model compares equal to itself (NaN included)."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from torch import nn

from qlint.capture.call_state import python_state


def _default_counter(calls=[0]):  # noqa: B006  (the mutable default is the point)
    calls[0] += 1


class _Slotted:
    __slots__ = ("n",)

    def __init__(self):
        self.n = 0


class _Registry:
    count = 0

    def bump(self):
        self.count += 1


def _with_attribute():
    def fn():
        return None
    fn.calls = 0
    return fn


def _bump(fn):
    fn.calls += 1


def _holding(**attributes) -> nn.Module:
    model = nn.Linear(2, 2)
    for name, value in attributes.items():
        setattr(model, name, value)
    return model


MOVES = {  # what a forward holds, and one step of its count
    "deque": (lambda: collections.deque(maxlen=4), lambda held: held.append(1.0)),
    "dict keyed by a shape": (lambda: {torch.Size([2, 3]): 1}, lambda held: held.update({torch.Size([2, 3]): 2})),
    "default argument": (lambda: _default_counter, lambda held: held()),
    "iterator": (lambda: itertools.count(), next),
    "set": (lambda: {1}, lambda held: held.add(2)),
    "float tensor attribute": (lambda: torch.zeros(()), lambda held: held.add_(1.0)),
    "float tensor in a list": (lambda: [torch.zeros(3)], lambda held: held[0].mul_(2.0).add_(1.0)),
    # review r18
    "__slots__": (_Slotted, lambda held: setattr(held, "n", held.n + 1)),
    "range iterator": (lambda: iter(range(10)), next),
    "a function's attribute": (_with_attribute, _bump),
    "a bound method's object": (lambda: _Registry().bump, lambda held: held()),
    "a class attribute": (lambda: _Registry, lambda held: setattr(held, "count", held.count + 1)),
    "a count's next method": (lambda: itertools.count().__next__, lambda held: held()),
}


@pytest.mark.parametrize("holder", list(MOVES))
def test_a_count_in_any_holder_changes_the_state(holder):
    make, step = MOVES[holder]
    model = _holding(held=make())
    before = python_state(model)
    assert python_state(model) == before
    step(model.held)
    assert python_state(model) != before


def test_an_untouched_model_is_equal_to_itself_nan_included():
    model = _holding(mask=torch.tensor([0.0, float("nan"), float("-inf")]), names=collections.deque(["a"]),
                     by_shape={torch.Size([1]): torch.ones(1)})
    assert python_state(model) == python_state(model)
    assert "mask" in python_state(model)  # compared by value, not left out as a parameter would be
