"""A class-data archive (AppCDS) for Spark's driver JVM: with one, a `sync` of a small table
through local Spark starts its JVM in a fraction of the time (bench/RESULTS.md).

No run waits for it to be written. A run that finds none has its JVM list the classes it
loads (`-XX:DumpLoadedClassList`, which costs nothing measurable); as the run ends, a
detached process (archive_build.py) dumps those classes into a static archive at low
priority, while the run's command has already exited. (Asking the JVM to write a dynamic
archive at its exit instead made that run's exit slow enough that a loaded machine killed
it, so every run paid it again.)

The archive is keyed by everything that must match (Java binary, pyspark version, the Spark
home its class path comes from, jars, JVM flags), lives in `$REPLICATOR_CACHE_DIR` (default
`~/.cache/replicator`), and is written under a temporary name and renamed, so a run never
maps half an archive. One run, then its builder, at a time makes it: the file that says so
carries their pid. `REPLICATOR_CACHE_DIR=off` disables it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..base.cache import cache_dir
from ..base.processes import alive
from ..base.readable import readable
from .session import DRIVER_GC, DRIVER_HEAP, QUICK_JIT

# What the driver loads and how it runs, in words: the copy jobs' classes are in the list
# only when it is taken after them (a run's list is taken as it ends). "static": the format,
# so that an archive of an earlier kind is never taken for one; "RDD": the classes of a run
# without Spark SQL (task_job.py), about 8,700 instead of 13,700; then the JVM options every
# driver gets (the config's own are part of the key apart).
LOADS = f"SparkContext, Python RDD jobs; static; {QUICK_JIT} {DRIVER_GC} {DRIVER_HEAP}"
# Unified-logging warnings (a stale archive, say) would go to stdout: errors only.
QUIET_CDS = "-Xlog:cds=error,cds+dynamic=error"
# The main class pyspark's launcher starts: the JVM's options are the arguments before it.
MAIN_CLASS = "org.apache.spark.deploy.SparkSubmit"
_LIST_OPTION = "-XX:DumpLoadedClassList="
_BUILDER = Path(__file__).with_name("archive_build.py")
# All the builder's java needs of the run's environment: the rest (the databases' URLs and
# passwords among it) does not outlive the command in a process that has no use for it. The
# JVM options from the environment are kept: the dump must be made with the run's flags.
BUILDER_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME")
BUILDER_ENVIRONMENT += ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")
_TAKEN_WAIT_S = 10.0  # for the builder to copy the list (it starts in about 20 ms)
log = logging.getLogger(__name__)
# A run's class list, a builder's copy of it, the archive a builder dumps: each names the pid
# of the process that owns it.
_IN_PROGRESS = re.compile(r"^spark-driver-[0-9a-f]+\.jsa\.(?:classes|tmp)-(\d+)$")


@dataclass(frozen=True)
class ArchivePlan:
    """The JVM options for this run and, when it lists its classes for a build, where the
    list goes (`pending`) and where the archive will be (`final`)."""

    options: str
    pending: Path | None = None
    final: Path | None = None


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(java).resolve() if java else None


def plan_archive(jars: str, java_options: str) -> ArchivePlan:
    """Map the archive if it exists; else list the loaded classes for a build, unless
    another run or its builder is already making it."""
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
    if _in_progress(folder, final.name):
        return ArchivePlan("")
    pending = final.with_name(f"{final.name}.classes-{os.getpid()}")
    pending.touch()  # says so to other runs; the JVM writes the list into it
    return ArchivePlan(f"{_LIST_OPTION}{pending}", pending, final)


def _in_progress(folder: Path, name: str) -> bool:
    """Whether a live process is making this archive. Files left by a process that is gone
    (killed, or a machine restarted) are removed: a dumped archive is about 85 MB."""
    busy = False
    for path in folder.glob("spark-driver-*.jsa.*-*"):
        match = _IN_PROGRESS.match(path.name)
        if match is None:
            continue
        if alive(int(match.group(1))):
            busy = busy or path.name.startswith(f"{name}.")
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return busy


def build_archive_later(plan: ArchivePlan, jvm_pid: int | None) -> bool:
    """Hand the run's class list to a detached builder, which dumps the archive after the
    command has exited; True when one took it. The JVM may go on (a process that runs
    several commands keeps it): the builder copies the list as it stands."""
    if plan.pending is None or plan.final is None:
        return False
    try:
        if plan.final.is_file():  # made meanwhile (say, copied in): nothing to build
            return False
        command = _jvm_command(jvm_pid)
        return command is not None and _start_builder(plan, command)
    finally:
        discard_archive(plan)  # the builder has its own copy by now, or there is none


def _jvm_command(pid: int | None) -> list[str] | None:
    """The driver JVM's java binary and options, as it was started (Linux's /proc: the
    launcher builds them; a dump must use the same class path and flags)."""
    if pid is None:
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except (OSError, UnicodeDecodeError):
        return None
    if MAIN_CLASS not in argv:
        return None
    return [arg for arg in argv[: argv.index(MAIN_CLASS)] if not arg.startswith(_LIST_OPTION)]


def _start_builder(plan: ArchivePlan, command: list[str]) -> bool:
    """Start archive_build.py in a session of its own (a signal to the run's process group
    does not reach it) and wait until it says it holds its copy of the list."""
    assert plan.pending is not None and plan.final is not None
    try:
        files = [str(plan.final), str(plan.pending)]
        builder = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_BUILDER), *files, *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=builder_environment(os.environ),
        )
    except OSError:
        return False
    assert builder.stdout is not None
    with builder.stdout:
        if not readable(builder.stdout.fileno(), _TAKEN_WAIT_S):
            return False  # it goes on without the list, and gives up
        if builder.stdout.readline().strip() != b"taken":
            return False
    log.debug(
        "Spark: process %d writes the driver's class archive %s after this run (%s.log)",
        builder.pid,
        plan.final,
        plan.final.name,
    )
    return True


def builder_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the run's environment the builder gets (BUILDER_ENVIRONMENT)."""
    return {name: environ[name] for name in BUILDER_ENVIRONMENT if name in environ}


def discard_archive(plan: ArchivePlan) -> None:
    """No build from this run's list (it was interrupted, or a builder took a copy): the
    file no longer says the run is making the archive."""
    if plan.pending is not None:
        plan.pending.unlink(missing_ok=True)
