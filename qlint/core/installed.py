"""Which files belong to an installed package (torch-free: the CLI's report formats ask too)."""

from __future__ import annotations

import functools
import os
import site
import sysconfig

_PACKAGE_ROOTS = tuple(os.path.join(root, "") for root in {
    *site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]} if root)


@functools.lru_cache(maxsize=4096)
def installed(file: str) -> bool:
    """A file of an installed package: it exists in one of this interpreter's package folders (a project folder
    named site-packages, or a code object compiled under such a name, is the model's own)."""
    path = os.path.abspath(file)
    return path.startswith(_PACKAGE_ROOTS) and os.path.isfile(path)


__all__ = ["installed"]
