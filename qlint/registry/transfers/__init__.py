"""Transfers: how each primitive maps the growth of its arguments to its output's.

A transfer reads its arguments by name through :class:`qlint.core.ops.Call`; anything
it does not read and that depends on the input makes the result unknown (the
propagation enforces that, see :func:`qlint.growth.propagate.apply`). Each transfer is
sound for every input and every parameter value; its docstring gives the derivation
(paper 000, Theorem 9 and Table 1, or elementary calculus).

The package mirrors ``rules/primitives/``: ``arithmetic.py`` holds the transfers that the
entries of ``arithmetic.toml`` name, and so on for every TOML file (a transfer named from
several files lives with most of its entries, and its docstring names the others).
``combinators.py`` holds what several of them share, ``base.py`` the table, the decorator
and the :func:`default` transfer. Importing the package imports every module in it, so
:data:`TRANSFERS` is complete whichever module a new transfer is added to.
"""

from __future__ import annotations

import importlib
import pkgutil

from qlint.registry.transfers.base import TRANSFERS, default, transfer

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TRANSFERS", "default", "transfer"]
