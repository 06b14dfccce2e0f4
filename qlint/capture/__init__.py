"""Capture: a model in, a checked graph out. :func:`qlint.capture.pipeline.capture` runs the stages
top to bottom (preconditions, the eager record, then per tracer: group identical layers, trace, expand
the copies, check against the model, shape coverage; then the modes the forward reads). A stage's
module imports only the modules below it, never the pipeline; what they all share is :mod:`.harness`."""
