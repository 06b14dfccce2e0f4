"""The abstract value qlint propagates through a graph: a growth bound plus facts.

Besides the exponent ``q`` (see :mod:`qlint.algebra`), three facts let rules bound
things the exponent alone cannot: whether the value depends on the block input at
all (a parameter does not), its sign (``exp`` of a non-positive argument is bounded)
and whether it stays above a positive constant (so dividing by it is safe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from qlint.algebra import Exponent

NONNEG, NONPOS, ANY_SIGN = 1, -1, 0


@dataclass(frozen=True)
class Growth:
    """What qlint knows about one value, relative to the block input X_k.

    q:        exponent of ||value|| in ||X_k|| (None: unknown, inf: super-polynomial)
    depends:  False for values independent of X_k (parameters, buffers, constants)
    sign:     NONNEG, NONPOS or ANY_SIGN, entrywise
    floor:    True when every entry is >= some c > 0 (safe denominator)
    culprit:  the op that made q unknown or infinite, for the report
    """

    q: Exponent
    depends: bool = True
    sign: int = ANY_SIGN
    floor: bool = False
    culprit: Optional[str] = None

    @property
    def bounded(self) -> bool:
        return self.q == 0

    @property
    def known(self) -> bool:
        return self.q is not None and not math.isinf(self.q)

    def with_q(self, q: Exponent, culprit: Optional[str] = None) -> "Growth":
        return replace(self, q=q, culprit=culprit or self.culprit)


CONSTANT = Growth(q=0.0, depends=False)
STREAM = Growth(q=1.0, depends=True)


def constant(value: object = None) -> Growth:
    """The growth of a constant; Python numbers also carry their sign."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return CONSTANT
    if value > 0:
        return Growth(q=0.0, depends=False, sign=NONNEG, floor=True)
    if value == 0:
        return Growth(q=0.0, depends=False, sign=NONNEG)
    return Growth(q=0.0, depends=False, sign=NONPOS)
