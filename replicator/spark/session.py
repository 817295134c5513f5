"""The run's Spark context: built lazily, once, only when a table needs data moved.

Where the PostgreSQL JDBC driver comes from: $REPLICATOR_JDBC_JAR, else Debian's
libpostgresql-jdbc-java (/usr/share/java/postgresql.jar), else `spark.jars.packages`
(Maven Central) unless the config already sets `spark.jars` or `spark.jars.packages`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..base.errors import ReplicatorError
from .jvm_output import JvmOutput

if TYPE_CHECKING:
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

JDBC_JAR_ENV = "REPLICATOR_JDBC_JAR"
DEBIAN_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"
DEFAULT_MASTER = "local[*]"
# Neither the driver's nor an executor's JVM moves bytes (the Python workers stream COPY
# through psycopg): C1 alone starts them sooner (a standalone run's executors were ready
# about a third sooner).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The driver holds no data either: the serial collector, unless the config names another
# (two would stop the JVM at its start). A local run's JVM starts, runs its job and stops
# sooner with it (bench/RESULTS.md: Spark without Spark SQL).
DRIVER_GC = "-XX:+UseSerialGC"
# Nor does it need the first heap the JVM sizes from the machine's memory (1/64 of it): its
# young generation filled up before a first collection. A small one keeps the driver about
# 50 MB smaller, in the same time (bench/RESULTS.md); the config's own -Xms comes after it,
# so it wins.
DRIVER_HEAP = "-Xms64m"
_NAMES_A_GC = re.compile(r"-XX:\+Use\w*GC\b")
_UTC_JAVA = "-Duser.timezone=UTC"
JAVA_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
DAEMON_MODULE_KEY = "spark.python.daemon.module"
LOCAL_DAEMON_MODULE = "replicator.spark.worker_daemon"
ARCHIVES_KEY = "spark.archives"
EXECUTOR_PATH_KEY = "spark.executorEnv.PYTHONPATH"
EXECUTOR_PYTHON_KEY = "spark.pyspark.python"

# Exactness and quiet by default; anything from the config's spark.conf wins.
BASE_CONF: Mapping[str, str] = {
    "spark.app.name": "replicator",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": _UTC_JAVA,
    "spark.executor.extraJavaOptions": f"{_UTC_JAVA} {QUICK_JIT}",
    "spark.sql.shuffle.partitions": "8",
    # The only SQL a Connect session runs is a job over a few task numbers (task_job.py; a
    # JVM here runs none): code generation and adaptive planning slow the first job down
    # and save nothing.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}


def jdbc_jar() -> Path | None:
    """The local JDBC driver jar, if this machine has one."""
    override = os.environ.get(JDBC_JAR_ENV)
    if override:
        return Path(override)
    return DEBIAN_JDBC_JAR if DEBIAN_JDBC_JAR.is_file() else None


def spark_conf(
    master: str | None,
    conf: Mapping[str, str],
    *,
    quiet: bool = True,
    driver_options: str = "",
    executor_archive: Path | None = None,
) -> dict[str, str]:
    """Every setting the session starts with: defaults, the driver jar, then the config's,
    then the shipped Python environment (executor_env.py) when there is one.

    Java options from the config are appended to ours (UTC, logging), never replace them."""
    settings = dict(BASE_CONF)
    settings["spark.master"] = master or DEFAULT_MASTER
    driver = f"{settings[JAVA_OPTION_KEYS[0]]} {QUICK_JIT} {DRIVER_HEAP} {driver_options}".rstrip()
    if quiet:
        log_config = resources.files("replicator.spark") / "log4j2.properties"
        driver += f" -Dlog4j2.configurationFile=file:{log_config}"
    settings[JAVA_OPTION_KEYS[0]] = driver
    if "spark.jars" not in conf and "spark.jars.packages" not in conf:
        jar = jdbc_jar()
        if jar is not None:
            settings["spark.jars"] = str(jar)
        else:
            settings["spark.jars.packages"] = JDBC_PACKAGE
    for key, value in conf.items():
        settings[key] = f"{settings[key]} {value}" if key in JAVA_OPTION_KEYS else value
    if not _NAMES_A_GC.search(settings[JAVA_OPTION_KEYS[0]]):
        settings[JAVA_OPTION_KEYS[0]] += f" {DRIVER_GC}"
    if settings["spark.master"].startswith("local"):
        settings["spark.master"] = with_task_retries(settings["spark.master"])
        # This process's pyspark is the Spark that runs the workers: import it, not the zip.
        settings.setdefault(DAEMON_MODULE_KEY, LOCAL_DAEMON_MODULE)
    if executor_archive is not None:
        _ship(settings, executor_archive)
    return settings


def _ship(settings: dict[str, str], archive: Path) -> None:
    """Unpack the archive in each executor's working directory and put it on the executors'
    PYTHONPATH, after whatever the config already lists there."""
    from .executor_env import ALIAS

    archives = settings.get(ARCHIVES_KEY)
    settings[ARCHIVES_KEY] = ",".join(filter(None, [archives, f"{archive}#{ALIAS}"]))
    path = settings.get(EXECUTOR_PATH_KEY)
    settings[EXECUTOR_PATH_KEY] = ":".join(filter(None, [path, ALIAS]))


def shipped_archive(master: str | None, ship_environment: bool) -> Path | None:
    """The executors' Python environment (executor_env.py) when a cluster master's
    executors need it; built or reused here (its module imports `packaging`: only then)."""
    if not ship_environment or is_local(master):
        return None
    from .executor_env import executor_archive

    return executor_archive()


def is_local(master: str | None) -> bool:
    """Whether Spark runs inside this machine's driver JVM (no executors elsewhere)."""
    return (master or DEFAULT_MASTER).startswith("local")


LOCAL_TASK_ATTEMPTS = 4  # as spark.task.maxFailures on a cluster
_LOCAL = re.compile(r"local(?:\[(?P<threads>[^,\]]+)\])?")


def with_task_retries(master: str) -> str:
    """`local[N]` -> `local[N,4]`: local mode otherwise tries a task once, so a copy task
    that lost its connection would fail the table (the partition markers make a retried
    task load its rows exactly once). A master that already says, or `local-cluster`, stays."""
    match = _LOCAL.fullmatch(master)
    if match is None:
        return master
    return f"local[{match['threads'] or 1},{LOCAL_TASK_ATTEMPTS}]"


def start_spark_context(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    quiet: bool = True,
    driver_options: str = "",
    executor_archive: Path | None = None,
) -> SparkContext:
    """Start (or reuse) the process's SparkContext with the settings above (the copy jobs
    are RDD jobs on it, task_job.py)."""
    settings = spark_conf(
        master,
        conf or {},
        quiet=quiet,
        driver_options=driver_options,
        executor_archive=executor_archive,
    )
    _choose_executor_python(settings)
    from pyspark import SparkConf, SparkContext

    numpy_converters_wait_for_numpy()
    spark_config = SparkConf().setAll(list(settings.items()))
    with SparkContext._lock:
        if SparkContext._gateway is None:  # a new JVM: its stderr goes to the log (-v)
            SparkContext._ensure_initialized(gateway=_launch_gateway(spark_config))
        return SparkContext.getOrCreate(spark_config)


class _OnceNumpyIsLoaded:
    """One of pyspark's NumPy input converters, asked only once NumPy is loaded.

    Py4J asks every registered converter about every argument of every call to the JVM, and
    pyspark's NumPy converters answer by importing `pyspark.testing.utils`, which imports
    pandas and pyarrow: the driver's first call into a new JVM paid most of a second and
    85 MB for them (bench/RESULTS.md). A value can be a NumPy one only once NumPy is loaded,
    so until then the answer is no, as the converter's would be; after, it is the
    converter's own."""

    def __init__(self, converter: Any):
        self.converter = converter

    def can_convert(self, obj: Any) -> bool:
        return "numpy" in sys.modules and self.converter.can_convert(obj)

    def convert(self, obj: Any, gateway_client: Any) -> Any:
        return self.converter.convert(obj, gateway_client)


def numpy_converters_wait_for_numpy() -> None:
    """Wrap pyspark's NumPy converters in Py4J's list (once: the wrapped are no longer
    theirs)."""
    from py4j import protocol
    from pyspark.sql import types

    kinds = tuple(
        kind
        for kind in (
            getattr(types, "NumpyArrayConverter", None),
            getattr(types, "NumpyScalarConverter", None),
        )
        if kind is not None
    )
    protocol.INPUT_CONVERTER[:] = [
        _OnceNumpyIsLoaded(converter) if isinstance(converter, kinds) else converter
        for converter in protocol.INPUT_CONVERTER
    ]


def _launch_gateway(spark_config: SparkConf) -> Any:
    """Start the driver JVM with a pipe as its stderr (jvm_output.py); when it exits
    before answering, the error says what it printed first (no java, a bad option)."""
    from pyspark.java_gateway import launch_gateway

    output = JvmOutput()
    try:
        return launch_gateway(spark_config, popen_kwargs={"stderr": output.write_end})
    except Exception as exc:
        failure = exc
    finally:
        output.launched()
    said = output.first_words(timeout=5.0)
    if said is None:
        raise failure
    first = next(iter(str(failure).strip().splitlines()), type(failure).__name__)
    raise ReplicatorError(f"{first} ({said.splitlines()[0]})") from None


def _choose_executor_python(settings: Mapping[str, str]) -> None:
    """pyspark reads the executors' interpreter from PYSPARK_PYTHON (else `python3`).

    Locally that is this very interpreter; on a cluster, `spark.pyspark.python` when the
    config sets it, else PYSPARK_PYTHON from the environment, else the executors' `python3`
    (this machine's venv path means nothing there)."""
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if EXECUTOR_PYTHON_KEY in settings:
        os.environ["PYSPARK_PYTHON"] = settings[EXECUTOR_PYTHON_KEY]
    elif is_local(settings["spark.master"]):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def start_spark(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    quiet: bool = True,
) -> SparkSession:
    """A SparkSession on that context, for DataFrame work (the tests' JDBC check)."""
    from pyspark.sql import SparkSession

    return SparkSession(start_spark_context(master, conf, quiet=quiet))
