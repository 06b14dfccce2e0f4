"""Transfers of the entries in ``rules/primitives/unbounded.toml``: ops registered only so
that a report can say why qlint does not bound them (poles, NaN domains, super-polynomial
special functions, linear algebra), save the few arguments proved inside their domain.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from qlint.core import domain
from qlint.core.domain import Growth, Range, unknown
from qlint.core.ops import Call
from qlint.registry.transfers.base import transfer
from qlint.registry.transfers.combinators import hazard


@transfer("unbounded")
def unbounded(call: Call, entry: Any) -> Any:
    """Registered only to be named: poles, NaN domains and super-polynomial special functions.

    Of a value that does not depend on the input (a parameter expression) it is a hazard,
    as log and sqrt of one are: asin(p) is NaN for every |p| > 1, atanh(p) infinite at 1.
    """
    inside = _within_domain(call)
    if inside is not None:
        return inside
    if not any(g.depends for g in call.every()):
        return hazard(f"{call.label()} of a parameter expression (a pole or a NaN domain for some parameter values)")
    return unknown(f"{call.label()} has no polynomial bound ({entry.q.removeprefix('none (').rstrip(')')})")


def _within_domain(call: Call) -> Optional[Growth]:
    """asin / acos of a value proved in [-1, 1] (acos(tanh z) of a Chebyshev KAN) lie in [-pi/2, pi/2] /
    [0, pi]: bounded; acosh of a value proved >= 1 is at most that value (acosh x <= x there)."""
    x = call.growth("input")
    if x is None or x.real is not True:
        return None
    r = x.range
    if call.op in ("asin", "arcsin", "acos", "arccos") and r.lo >= -1 and r.hi <= 1:
        bounds = (0.0, math.pi) if call.op in ("acos", "arccos") else (-math.pi / 2, math.pi / 2)
        return Growth(0.0, depends=x.depends, range=domain.interval(*bounds))
    if call.op in ("acosh", "arccosh") and r.lo >= 1:
        return Growth(x.q if x.depends else 0.0, depends=x.depends, range=Range(lo=0.0), culprit=x.culprit)
    return None
