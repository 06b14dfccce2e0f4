"""Capture: a model in, a checked graph out. :func:`qlint.capture.pipeline.capture` runs the stages
top to bottom (eager record, trace, expand the copied layers, check against the model, shape coverage,
the modes the forward reads); each stage's module knows no later stage and never the pipeline."""
