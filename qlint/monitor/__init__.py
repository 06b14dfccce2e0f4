"""``qlint.monitor``: the residual stream's growth measured during a user's own training, in one package:
:mod:`~qlint.monitor.stream` (the monitor), :mod:`~qlint.monitor.callbacks` (the Hugging Face ``Trainer``
and Lightning callbacks) and :mod:`~qlint.monitor.logs` (the CSV and TensorBoard sinks).

``qlint.monitor(model, inputs, ...)`` is :func:`qlint.monitor.stream.monitor`: the package is callable, so
the call reads the same whether ``qlint.monitor`` names the function or, once imported, the package.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from qlint.monitor.stream import (DEFAULT_SCALES, ESCAPE_MARGIN, RUNAWAY_EXPONENT, MonitorError, StreamMonitor,
                                  escape_scale, first_warning, monitor, overflow_depth, top_exponent, warning_for)


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> StreamMonitor:
        return monitor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["DEFAULT_SCALES", "ESCAPE_MARGIN", "MonitorError", "RUNAWAY_EXPONENT", "StreamMonitor", "escape_scale",
           "first_warning", "monitor", "overflow_depth", "top_exponent", "warning_for"]
