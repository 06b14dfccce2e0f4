"""How many times one analysis walks the traced graph's node list, and how many fx.Interpreters it makes.

    python bench/graph_walks.py                    # this checkout
    PYTHONPATH=OTHER python bench/graph_walks.py   # another checkout (0.1 needs rules/ importable as qlint.rules)

The model is an 8-block pre-norm MLP stack (traced by symbolic_trace, the common case).
A *walk* is one iteration over ``graph.nodes`` of the analysed graph (any length: a walk
that stops early counts too); the count includes the trace's own passes (fx codegen,
ShapeProp, the graph check). Figures are counts, not times: they do not depend on the machine.
"""

from __future__ import annotations

import collections

import torch
import torch.fx as fx
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, depth: int = 8, d: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def main() -> None:
    walks: collections.Counter[str] = collections.Counter()
    interpreters = [0]
    node_list = type(fx.Graph().nodes)
    original_iter, original_init = node_list.__iter__, fx.Interpreter.__init__

    def counting_iter(self):  # type: ignore[no-untyped-def]
        walks[f"{len(self)} nodes"] += 1
        return original_iter(self)

    def counting_init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        interpreters[0] += 1
        original_init(self, *args, **kwargs)

    torch.manual_seed(0)
    model, inputs = Stack(), (torch.randn(2, 4, 16),)
    try:
        import qlint.core  # noqa: F401  (0.2: the layered package)
        from qlint.analysis import Options, run

        call = lambda: run(model, inputs, spec="Stack", options=Options())  # noqa: E731
    except ImportError:  # 0.1
        from qlint.analysis import analyze

        call = lambda: analyze(model, inputs)  # noqa: E731
    call()  # warm: imports, registry
    node_list.__iter__, fx.Interpreter.__init__ = counting_iter, counting_init
    try:
        call()
    finally:
        node_list.__iter__, fx.Interpreter.__init__ = original_iter, original_init
    largest = max(walks, key=lambda key: int(key.split()[0]))
    print(f"8-block stack: {walks[largest]} walks of the analysed graph ({largest}), "
          f"{sum(walks.values())} node-list walks in all, {interpreters[0]} fx.Interpreter instances")


if __name__ == "__main__":
    main()
