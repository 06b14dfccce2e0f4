"""qlint's rules: the primitive registry (``primitives``) and the lint rules (``checks``).

This folder is installed as ``qlint.rules``.
"""
