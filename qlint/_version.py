"""The version, on the lowest floor: every layer may name it without importing the package facade."""

__version__ = "0.1.0"
