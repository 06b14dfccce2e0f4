"""The one base class of expected failures: a model that cannot be loaded, traced, configured or probed.

Each carries a one-line message; the CLI prints it and exits 2 (``qlint.cli.failures``).
It lives on the lowest floor and imports nothing, so the CLI can catch every expected
failure without importing torch.
"""


class QlintError(Exception):
    """An expected failure, reported as ``qlint: error: <message>`` with exit code 2."""
