"""The velocity of one block as a function of its input, on the real weights: a forward pass of the
example inputs with every node's value kept (:class:`Trajectory`), and the block's join re-run from
X_k := X with everything else as recorded (:class:`VelocityField`), in float64 when asked. The probe
(:mod:`qlint.probe.measure`), the witness (:mod:`qlint.probe.block_witness`) and the training monitor
measure it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.fx as fx

from qlint.core.graph import run_cone
from qlint.growth.stream import StreamBlock


class Trajectory:
    """One forward pass of the example inputs with every node's value kept."""

    def __init__(self, module: fx.GraphModule, inputs: tuple) -> None:
        self.module = module
        interpreter = fx.Interpreter(module, garbage_collect_values=False)
        with torch.no_grad():
            interpreter.run(*inputs)
        self.values: dict[fx.Node, Any] = interpreter.env


class VelocityField:
    """v(X) = F(X) - X: the block's join (a Post-LN block's: its norm) re-run with X_k := X, all else as recorded.

    Only the block's region is re-run; every other node (embeddings, token ids, the
    values the block reads from elsewhere) keeps its recorded value, so v is a function
    of X_k alone, the paper's definition (for X + v(X) this is exactly v; for a scaled
    join it is the velocity F - id the static analysis bounds). ``wide``: computed in float64
    whatever the graph's dtype (its parameters, submodules and recorded values widened for this
    block alone), so a float32 range is no limit on what is measured.
    """

    def __init__(self, trajectory: Trajectory, block: StreamBlock, *, wide: bool = False) -> None:
        self.block = block
        self.trajectory = trajectory
        self.wide = wide
        self.interpreter = (_WideInterpreter if wide else fx.Interpreter)(trajectory.module,
                                                                           garbage_collect_values=False)
        self.recorded = _Widened(trajectory.values) if wide else trajectory.values
        self.evaluations = 0

    @property
    def stream(self) -> torch.Tensor:
        """X_k on the recorded trajectory."""
        return self.trajectory.values[self.block.stream]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """v(x); random ops (dropout in train mode) draw the same numbers at every call. A join that
        widens the stream (cat([x, g(x)])) returns F(x) itself: ||v|| = ||g(x)|| <= ||F(x)||."""
        self.evaluations += 1
        x = widen(x) if self.wide else x
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            torch.manual_seed(0)
            local = run_cone(self.interpreter, {self.block.stream: x}, self.block.region + self.block.post_region,
                             self.recorded)
        out = local[self.block.output]
        return out - x if out.shape == x.shape else out


def widen(value: Any) -> Any:
    """A floating or complex tensor in float64 / complex128; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.is_complex():
        return value.to(torch.complex128)
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    return value


class _Widened(dict):
    """A trajectory's recorded values, each read in float64 (converted once, on first read)."""

    def __init__(self, values: dict) -> None:
        super().__init__()
        self.values = values

    def __missing__(self, node: Any) -> Any:
        value = self[node] = widen(self.values[node])
        return value

    def __contains__(self, node: object) -> bool:
        return node in self.values


class _WideInterpreter(fx.Interpreter):
    """Reads the graph's parameters in float64, and runs its leaf modules as float64 copies."""

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        return widen(super().get_attr(target, args, kwargs))

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        copies = self.__dict__.setdefault("_wide_copies", {})
        if target not in copies:
            copies[target] = copy.deepcopy(self.fetch_attr(target)).to(torch.float64)
        return copies[target](*args, **kwargs)


__all__ = ["Trajectory", "VelocityField", "widen"]
