"""The base floor both the capture and the growth analysis stand on: the exponent algebra, the value
domain, op binding, graph facts, the result dataclasses, the measured growth curves, errors. Nothing
here imports the registry, the lint rules, configuration, click or rich: the registry is passed in."""
