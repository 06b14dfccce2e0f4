"""The growth analysis: a graph in, blocks and exponents out. The graph is annotated and rewritten
(canonical, relations), the residual stream found (blocks, by form and by dataflow), each value's growth
propagated (propagate, support) and each block's and transition's exponent derived (engine)."""
