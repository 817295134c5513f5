"""The Python packages a cluster's executors need, packed once and shipped with each run.

A copy task runs replicator's code (and psycopg, pydantic, ...) inside the executors' Python,
which on a real cluster has none of it. pyspark's answer is an archive in `spark.archives`:
Spark unpacks it into each executor's working directory, and the executors' PYTHONPATH
points there. The archive holds replicator and the installed files of every distribution it
depends on, except pyspark and py4j (the cluster's Spark brings its own). It carries no
interpreter: the executors' `python3` must be the driver's minor version, which pyspark
demands anyway, and the compiled wheels (psycopg's binary, pydantic-core) must suit their
platform, so the archive's name carries both.

Built in the cache folder of the JVM archive (replicator/base/cache.py), under a temporary name
and renamed; the key covers every shipped distribution's version and replicator's own source,
so an edited checkout ships its edits. Without a cache folder it is built in a temporary one.
Archives unused for a week are removed when a new one is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..base.cache import cache_dir

ALIAS = "replicator-python"  # the folder it unpacks to, relative to the executor's cwd
# pandas: only the Spark Connect client (this process) needs it, and the tasks' UDFs are
# not Arrow-optimised (task_job.py): with numpy it would triple the archive. numpy itself
# serves only the log's drain (cdc/rows/copy_block.py), which runs here, never in a task.
NOT_SHIPPED = frozenset({"pyspark", "py4j", "replicator", "pandas", "numpy"})
_ROOT = Path(__file__).resolve().parent.parent  # the replicator package folder


def dependencies(root: str = "replicator") -> list[metadata.Distribution]:
    """The installed distributions `root` needs at run time, extras followed, none twice."""
    found: dict[str, metadata.Distribution] = {}
    pending: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras = pending.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        distribution = metadata.distribution(name)
        if name not in NOT_SHIPPED:
            found[name] = distribution
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if _applies(requirement, extras):
                dep = canonicalize_name(requirement.name)
                if dep not in NOT_SHIPPED:
                    pending.append((dep, frozenset(requirement.extras)))
    return sorted(found.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras or {""})


def platform_tag() -> str:
    """What the compiled files in the archive are built for, e.g. `cp311-linux-x86_64`."""
    implementation = sys.implementation.name[:2] if sys.implementation.name != "cpython" else "cp"
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    return f"{implementation}{version}-{sysconfig.get_platform().replace('.', '_')}"


def _members(distributions: list[metadata.Distribution]) -> Iterator[tuple[Path, str]]:
    """Every file to pack, with its path inside the archive."""
    for path in sorted(_ROOT.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path, f"replicator/{path.relative_to(_ROOT).as_posix()}"
    for distribution in distributions:
        for file in distribution.files or []:
            if file.parts and file.parts[0] == "..":  # console scripts beside the venv
                continue
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                yield path, file.as_posix()


def _key(members: list[tuple[Path, str]], distributions: list[metadata.Distribution]) -> str:
    digest = hashlib.sha256(platform_tag().encode())
    for distribution in distributions:
        digest.update(f"\0{distribution.metadata['Name']}=={distribution.version}".encode())
    for path, name in members:
        if name.startswith("replicator/"):
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def executor_archive() -> Path:
    """The archive for this replicator and platform: from the cache, else built now."""
    distributions = dependencies()
    members = list(_members(distributions))
    folder = cache_dir() or Path(tempfile.mkdtemp(prefix="replicator-"))
    final = folder / f"replicator-python-{platform_tag()}-{_key(members, distributions)}.tar.gz"
    if final.is_file():
        os.utime(final)  # in use: _remove_stale keeps it
        return final
    _remove_stale(folder)
    pending = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        # Level 1: twice the size of level 9 saved nothing worth the build's seconds.
        with tarfile.open(pending, "w:gz", compresslevel=6) as archive:
            for path, name in members:
                archive.add(path, arcname=name, recursive=False)
        os.replace(pending, final)
    finally:
        pending.unlink(missing_ok=True)
    return final


STALE_SECONDS = 7 * 86_400


def _remove_stale(folder: Path) -> None:
    """Archives of other versions no run has shipped for a week (about 17 MB each). A recent
    one may be another installation's, whose run is serving it to executors right now."""
    for old in folder.glob("replicator-python-*.tar.gz*"):
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > STALE_SECONDS:
                old.unlink()
