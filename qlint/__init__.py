"""qlint: a static architecture linter for the sublinear-growth principle.

Every residual block X_{k+1} = X_k + v(X_k) of a PyTorch model is certified when
its velocity grows at most linearly, ||v(x)|| <= c*||x||**q + b with q <= 1.

The public API is imported lazily so that ``qlint --help`` does not import torch:
``qlint.check(specs)`` and ``qlint.analyze(model, inputs)`` (:mod:`qlint.api`, the same
configuration as the command line), ``qlint.register(cls, q=..., why=...)``
(:mod:`qlint.registry`), ``qlint.remedy(...)`` (:mod:`qlint.remedies`; with ``as_patch=True``
the re-certified source patches of :mod:`qlint.fixes`) and
``qlint.monitor(model, inputs)`` (:mod:`qlint.monitor`: stream norms and block gains during
training). Probes are in the :mod:`qlint.probe` package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qlint._version import __version__

__all__ = ["__version__", "analyze", "check", "monitor", "register", "remedy"]

_LAZY = {
    "analyze": "qlint.api",
    "check": "qlint.api",
    "monitor": "qlint.monitor",
    "register": "qlint.registry",
    "remedy": "qlint.fixes",
}

if TYPE_CHECKING:  # pragma: no cover
    from qlint.api import analyze, check
    from qlint.fixes import remedy
    from qlint.monitor.stream import monitor
    from qlint.registry import register


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if module.__name__ == f"qlint.{name}" else getattr(module, name)  # qlint.monitor: a package
    raise AttributeError(f"module 'qlint' has no attribute {name!r}")
