"""The engine: the exponent algebra, the value domain, tracing, graph facts, the stream of
blocks, propagation and the result dataclasses. Nothing here imports the registry, the
lint rules, configuration, click or rich: the registry is passed in."""
