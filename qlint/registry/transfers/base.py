"""The transfer table, the decorator that fills it, and the default transfer.

An entry of ``rules/primitives/*.toml`` with ``transfer = "name"`` gets ``TRANSFERS["name"]``;
one with only a numeric ``q`` gets :func:`default`. This module is apart from the families so
each of them can register its transfers without importing the package that imports them all.
"""

from __future__ import annotations

from typing import Any, Callable

from qlint.core import algebra
from qlint.core.domain import ANY, CONSTANT, Growth, unknown
from qlint.core.ops import Call
from qlint.registry.transfers.combinators import outputs

TRANSFERS: dict[str, Callable[..., Any]] = {}  # the name a TOML entry's `transfer` key gives -> the function


def transfer(name: str) -> Callable:
    """Register the decorated function as the transfer TOML entries name ``name``."""

    def register(fn: Callable) -> Callable:
        TRANSFERS[name] = fn
        return fn

    return register


def default(call: Call, entry: Any) -> Any:
    """An entrywise map with exponent p of its main argument: q = p * q_x (Theorem 9(i)).

    The declared range holds for real arguments with the entry's parameters at their
    defaults; any other parameter value keeps q (the entry says it does not change the
    exponent) but claims no range.
    """
    call.meta(*entry.meta_args)
    x = call.growth("input")
    at_default = _params_at_default(call, entry)
    if x is None:
        return CONSTANT
    complex_ok = "complex" in entry.family
    if x.real is False and not complex_ok and x.depends:
        return unknown(f"{entry.name} of a complex value (the real-valued bound does not apply)")
    realness = {"real": True, "complex": False}.get(entry.real or "", x.real)
    r = entry.declared_range(x.range) if (at_default and x.real is True) else ANY
    if not x.depends:
        return outputs(call, Growth(0.0, depends=False, real=realness, range=r))
    return outputs(call, Growth(algebra.compose(entry.exponent, x.q), real=realness, range=r, culprit=x.culprit))


def _params_at_default(call: Call, entry: Any) -> bool:
    """Whether every parameter the entry declares is at its schema default (the declared range holds only there)."""
    at_default = True
    names = set(call.arguments) if "*" in entry.params else entry.params
    for name in names:
        if name == "input" or not call.has(name):
            continue
        value = call.value(name)
        if isinstance(value, Growth):
            continue
        if name in call.defaults and value == call.defaults[name]:
            continue
        at_default = False
    return at_default
