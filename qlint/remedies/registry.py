"""The remedy kinds: each a planner function registered under its kind by :func:`plan`.

A new kind is one decorated function in a module of this package; ``qlint.remedies``
imports every module of the package, so the registry, and with it the kinds
``qlint.remedy`` accepts, is complete without a list kept by hand. Kinds are tried in
the order they were registered, which breaks ties between equally ranked remedies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from qlint.core.results import Source
from qlint.remedies.context import BlockContext
from qlint.remedies.surgery import Surgery


@dataclass(frozen=True)
class Plan:
    """A candidate before it is checked: what it changes and how to edit a copy."""

    kind: str
    target: str
    source: Optional[Source]
    sketch: str
    edit: Callable[[Surgery], None]


Planner = Callable[[BlockContext, str], Plan]  # (the block, the kind it is registered as) -> its plan
PLANS: dict[str, Planner] = {}


def plan(kind: str) -> Callable[[Planner], Planner]:
    """Register the decorated function as the planner of remedy ``kind``."""

    def register(planner: Planner) -> Planner:
        if kind in PLANS:
            raise ValueError(f"remedy kind {kind!r} is registered twice")
        PLANS[kind] = planner
        return planner

    return register


def make_plan(context: BlockContext, kind: str) -> Plan:
    """The candidate of this kind for the block, or NotApplicable."""
    return PLANS[kind](context, kind)
