"""The version, on the lowest floor: every layer may name it without importing the package facade."""

__version__ = "0.3.0"
DISTRIBUTION = "torch-qlint"  # the distribution's name, published on no index ("qlint" on PyPI is another project)
