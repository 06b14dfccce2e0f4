"""The version, on the lowest floor: every layer may name it without importing the package facade."""

__version__ = "0.3.0"
DISTRIBUTION = "torch-qlint"  # the name on PyPI ("qlint" there is an unrelated project)
