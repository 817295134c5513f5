"""`check`'s look at the installation itself: the bytecode of the modules a run imports.

Where the environment sets PYTHONDONTWRITEBYTECODE (many Docker images do), `pip install`
writes no `.pyc` and Python never writes the ones it compiles at an import, so every run of
the tool compiles its modules and its libraries' again, about half a second of a cron run
that has little else to do. The fix is one `compileall` after the install; `make` runs it.
"""

from __future__ import annotations

import os
import shlex
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from .findings import Finding


def install_findings() -> Iterator[Finding]:
    missing = _uncompiled()
    if not missing:
        return
    why = (
        "this environment sets PYTHONDONTWRITEBYTECODE, so Python never writes it"
        if sys.dont_write_bytecode
        else "Python cannot write it there"
    )
    folders = sorted({_package_root(path) for path in missing})
    yield Finding(
        "warn",
        "install",
        f"{len(missing)} module(s) this command imported have no compiled bytecode and "
        f"{why}: every run compiles them again (e.g. {missing[0]})",
        f"compile them once: {shlex.quote(sys.executable)} -m compileall -q -x /pyspark/ "
        + " ".join(shlex.quote(str(f)) for f in folders),
    )


def _uncompiled() -> list[str]:
    """The imported modules' sources whose cached bytecode is not on disk now: after an
    import that could write it, it would be. Only the install's own modules count, those of
    its interpreter and virtualenv and of this package: a process that embeds the command (a
    test runner, a notebook) imports others that no run of the tool loads. pyspark's are
    left out, as `make` and the fix leave them: a run that imports pyspark starts a JVM,
    which dwarfs compiling them, and compiling its thousands of modules was half the install."""
    package = Path(__file__).parents[2]  # replicator/, wherever it is installed
    homes = {Path(sys.prefix), Path(sys.base_prefix), package}
    found = []
    for module in list(sys.modules.values()):
        source, cached = getattr(module, "__file__", None), getattr(module, "__cached__", None)
        if not (source and cached and source.endswith(".py")) or os.path.exists(cached):
            continue
        if homes.intersection(Path(source).parents) and "/pyspark/" not in source:
            found.append(source)
    return sorted(found)


def _package_root(source: str) -> Path:
    """The folder to compile: site-packages for a library, the project's package folder for
    an editable install of replicator."""
    site = Path(sysconfig.get_paths()["purelib"])
    path = Path(source)
    if site in path.parents:
        return site
    top = path.parent
    while (top.parent / "__init__.py").exists():
        top = top.parent
    return top
