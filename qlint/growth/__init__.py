"""The growth analysis: a graph in, blocks and exponents out. The graph is annotated and rewritten
(canonical, relations, both reading nodes through annotated), the residual stream found (blocks, by form
and by dataflow; its parts in stream), each value's growth propagated (propagate, support) and each
block's and transition's exponent derived (engine)."""
