"""A class-data archive (AppCDS) for Spark's driver JVM: starts it in about 2 s, not 5.

The JVM writes the archive when it exits cleanly after a run without one; later runs map
it. It is keyed by everything that must match (Java binary, pyspark version, the Spark home
its class path comes from, jars, JVM flags), lives in `$REPLICATOR_CACHE_DIR` (default
`~/.cache/replicator`), and is written under a temporary name and renamed, so a concurrent
run never maps half an archive. One run at a time records it: a run that starts while
another one records goes without. `REPLICATOR_CACHE_DIR=off` disables it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..base.cache import cache_dir

# What the driver loads, in words: an archive written before the copy jobs went through a
# SparkSession lacks Spark SQL's classes (the session then starts in 2.8 s instead of 1.3).
LOADS = "SparkContext, SparkSession, Python UDF jobs"
# Unified-logging warnings (a stale archive, say) would go to stdout: errors only.
QUIET_CDS = "-Xlog:cds=error,cds+dynamic=error"


@dataclass(frozen=True)
class ArchivePlan:
    """The JVM options for this run and, when creating the archive, where it goes."""

    options: str
    pending: Path | None = None
    final: Path | None = None


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(java).resolve() if java else None


def plan_archive(jars: str, java_options: str) -> ArchivePlan:
    """Use the archive if it exists, else ask the JVM to write one at exit."""
    folder, java = cache_dir(), _java()
    if folder is None or java is None:
        return ArchivePlan("")
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    # The JVM maps an archive only for the class path it was written with: Spark's jars
    # where this pyspark is installed (another virtualenv's archive is silently ignored, and
    # every driver then starts without one)
    identity = "\0".join(
        [
            str(java),
            str(java.stat().st_mtime_ns),
            pyspark.__version__,
            _find_spark_home(),
            jars,
            java_options,
            LOADS,
        ]
    )
    final = folder / f"spark-driver-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsa"
    if final.is_file():
        return ArchivePlan(f"-XX:SharedArchiveFile={final} {QUIET_CDS}")
    _remove_orphans(folder)
    if any(folder.glob(f"{final.name}.tmp-*")):
        # a run still going records it: this one starts without (recording slows a JVM's
        # start, its job and its exit, and concurrent runs would each pay for it)
        return ArchivePlan("")
    pending = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    pending.touch()  # says so to other runs; the JVM replaces it as it exits
    return ArchivePlan(f"-XX:ArchiveClassesAtExit={pending} {QUIET_CDS}", pending, final)


def _remove_orphans(folder: Path) -> None:
    """Archives a JVM wrote for a run that never published them (it was interrupted or
    killed): about 150 MB each, or the empty file a run left to say it was recording. The pid
    in the name says whether that run is still going."""
    for orphan in folder.glob("spark-driver-*.jsa.tmp-*"):
        pid = orphan.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                orphan.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def publish_archive(plan: ArchivePlan) -> None:
    """After the JVM exited cleanly (it writes the archive as it exits): make it the one
    later runs map."""
    if plan.pending is None or plan.final is None:
        return
    if plan.pending.is_file() and plan.pending.stat().st_size > 0:
        os.replace(plan.pending, plan.final)
    else:
        discard_archive(plan)


def discard_archive(plan: ArchivePlan) -> None:
    """No archive from this run (it was interrupted, or its JVM did not exit by itself): the
    next run records one."""
    if plan.pending is not None:
        plan.pending.unlink(missing_ok=True)
