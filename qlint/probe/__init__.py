"""Measure what the static analysis claims: per-block growth exponents, the constants c,
b and L, the stability bounds of paper 000, initialization diagnostics (source 001) and
looped-recurrence spectra (source 003). ``qlint probe`` is the command; the functions
are in :mod:`qlint.probe.measure` and :mod:`qlint.probe.loops`, their linear algebra in
:mod:`qlint.probe.spectral`, the terminal report in :mod:`qlint.probe.report`."""
