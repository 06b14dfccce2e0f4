"""``tomllib`` (Python 3.11+) or its backport ``tomli`` on 3.10: the rules and the configuration are TOML."""

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["tomllib"]
