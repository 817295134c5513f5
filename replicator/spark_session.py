"""The run's SparkSession: built lazily, once, only when a table needs data moved.

Where the PostgreSQL JDBC driver comes from: $REPLICATOR_JDBC_JAR, else Debian's
libpostgresql-jdbc-java (/usr/share/java/postgresql.jar), else `spark.jars.packages`
(Maven Central) unless the config already sets `spark.jars` or `spark.jars.packages`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JDBC_JAR_ENV = "REPLICATOR_JDBC_JAR"
DEBIAN_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"
DEFAULT_MASTER = "local[*]"
_UTC_JAVA = "-Duser.timezone=UTC"

# Exactness and quiet by default; anything from the config's spark.conf wins.
BASE_CONF: Mapping[str, str] = {
    "spark.app.name": "replicator",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": _UTC_JAVA,
    "spark.executor.extraJavaOptions": _UTC_JAVA,
    "spark.sql.shuffle.partitions": "8",
}


def jdbc_jar() -> Path | None:
    """The local JDBC driver jar, if this machine has one."""
    override = os.environ.get(JDBC_JAR_ENV)
    if override:
        return Path(override)
    return DEBIAN_JDBC_JAR if DEBIAN_JDBC_JAR.is_file() else None


def spark_conf(master: str | None, conf: Mapping[str, str]) -> dict[str, str]:
    """Every setting the session starts with: defaults, the driver jar, then the config's."""
    settings = dict(BASE_CONF)
    settings["spark.master"] = master or DEFAULT_MASTER
    if "spark.jars" not in conf and "spark.jars.packages" not in conf:
        jar = jdbc_jar()
        if jar is not None:
            settings["spark.jars"] = str(jar)
        else:
            settings["spark.jars.packages"] = JDBC_PACKAGE
    settings.update(conf)
    return settings


def start_spark(master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """Start (or reuse) the process's SparkSession with the settings above."""
    # Executors' Python workers must use this interpreter, not `python3` from PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_conf(master, conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
