"""The local Spark session the engine uses: starts, finds the JDBC driver, reads in UTC."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import sql
from waiting import wait_for

from replicator.spark.session import DAEMON_MODULE_KEY, jdbc_jar, spark_conf, with_task_retries
from replicator.spark.worker_daemon import prefer_installed_pyspark

pytestmark = pytest.mark.spark


def test_conf_prefers_local_jar_and_config_wins():
    conf = spark_conf(None, {"spark.sql.shuffle.partitions": "3"})
    assert conf["spark.master"] == "local[*,4]", "local mode retries a failed task"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.shuffle.partitions"] == "3"
    if jdbc_jar() is not None:
        assert conf["spark.jars"] == str(jdbc_jar())
    custom = spark_conf("spark://h:7077", {"spark.jars.packages": "org.postgresql:postgresql:1"})
    assert custom["spark.master"] == "spark://h:7077" and "spark.jars" not in custom
    # Only a local run's workers can rely on this process's pyspark being installed.
    assert conf[DAEMON_MODULE_KEY] == "replicator.spark.worker_daemon"
    assert DAEMON_MODULE_KEY not in custom


@pytest.mark.parametrize(
    ("configured", "collector"),
    [(None, "UseSerialGC"), ("-Xmx2g -XX:+UseParallelGC", "UseParallelGC")],
)
def test_the_driver_jvm_starts_with_the_collector_the_config_names_else_the_serial_one(
    configured, collector
):
    """Ours is only a default: a JVM given two collectors refuses to start."""
    conf = {"spark.driver.extraJavaOptions": configured} if configured else {}
    options = spark_conf(None, conf)["spark.driver.extraJavaOptions"].split()
    java = subprocess.run(
        ["java", *options, "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert java.returncode == 0, java.stderr
    collectors = {"UseSerialGC", "UseParallelGC", "UseG1GC", "UseZGC", "UseShenandoahGC"}
    chosen = [
        fields[1]
        for fields in (line.split() for line in java.stdout.splitlines())
        if len(fields) > 3 and fields[1] in collectors and fields[3] == "true"
    ]
    assert chosen == [collector]


def test_the_shipped_environment_joins_what_the_config_already_ships(tmp_path):
    archive = tmp_path / "env.tar.gz"
    conf = spark_conf(
        "spark://h:7077",
        {"spark.archives": "/opt/extra.zip#extra", "spark.executorEnv.PYTHONPATH": "extra"},
        executor_archive=archive,
    )
    assert conf["spark.archives"] == f"/opt/extra.zip#extra,{archive}#replicator-python"
    assert conf["spark.executorEnv.PYTHONPATH"] == "extra:replicator-python"


def test_the_archive_holds_replicator_and_its_dependencies_but_not_spark(tmp_path, monkeypatch):
    import tarfile

    from replicator.spark.executor_env import executor_archive

    monkeypatch.setenv("REPLICATOR_CACHE_DIR", str(tmp_path))
    built = executor_archive()
    assert executor_archive() == built  # the second run reuses it
    with tarfile.open(built) as archive:
        tops = {name.split("/")[0] for name in archive.getnames()}
    assert {"replicator", "psycopg", "psycopg_binary", "pydantic_core", "sqlglot"} <= tops
    assert not {"pyspark", "py4j", "pytest", "pandas", "numpy", "pyarrow", "grpc"} & tops


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", "local[1,4]"),
        ("local[*]", "local[*,4]"),
        ("local[2]", "local[2,4]"),
        ("local[2,1]", "local[2,1]"),
        ("local-cluster[2,1,1024]", "local-cluster[2,1,1024]"),
        ("spark://h:7077", "spark://h:7077"),
    ],
)
def test_local_masters_retry_failed_tasks(master, expected):
    assert with_task_retries(master) == expected


DRIVER_SCRIPT = """
import sys
from replicator.spark.jvm_stop import stop_jvm
from replicator.spark.session import start_spark_context
context = start_spark_context("local[1]")
print(context.parallelize(range(3), 1).map(abs).sum())
print(sorted({name.split(".")[0] for name in sys.modules} & {"pandas", "pyarrow", "numpy"}))
import numpy
print(context._jvm.java.lang.String.valueOf(numpy.int64(5)))
print(context._jvm.java.util.Arrays.toString(numpy.array([1, 2], dtype="int32")))
stop_jvm(context, graceful=True)
"""


def test_the_driver_loads_neither_pandas_nor_pyarrow_yet_still_sends_numpy_values():
    """pyspark's NumPy converters import pandas and pyarrow when asked about any value: the
    driver asks them only once NumPy is loaded (a process of its own: this one has them)."""
    run = subprocess.run(
        [sys.executable, "-c", DRIVER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:4] == ["3", "[]", "5", "[1, 2]"], run.stdout


def test_local_workers_import_the_installed_pyspark_not_the_zip(spark):
    def where_pyspark_comes_from(_):
        import pyspark

        return pyspark.__file__

    origins = spark.sparkContext.parallelize(range(2), 2).map(where_pyspark_comes_from).collect()
    assert origins and all(".zip" not in origin for origin in origins), origins
    moved = prefer_installed_pyspark(["/x/pyspark/python/lib/pyspark.zip", "/site", "/y.zip"])
    assert moved == ["/site", "/y.zip", "/x/pyspark/python/lib/pyspark.zip"]


def test_spark_reads_source_through_jdbc_in_utc(spark, source_conn, schema, pg_servers):
    table = sql.Identifier(schema, "t")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, at timestamptz)").format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, "
            "timestamptz '2026-11-20 10:00:00.123456+00' + g * interval '1 s' "
            "FROM generate_series(1, 1000) g"
        ).format(table)
    )
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(pg_servers.source_url)
    frame = (
        spark.read.format("jdbc")
        .option("url", f"jdbc:postgresql://{info['host']}:{info['port']}/{info['dbname']}")
        .option("user", info["user"])
        .option("driver", "org.postgresql.Driver")
        .option("dbtable", f'"{schema}"."t"')
        .option("partitionColumn", "id")
        .option("lowerBound", 1)
        .option("upperBound", 1000)
        .option("numPartitions", 2)
        .option("fetchsize", 500)
        .load()
    )
    assert frame.rdd.getNumPartitions() == 2
    assert frame.count() == 1000
    first = (
        frame.where("id = 1").selectExpr("date_format(at, 'yyyy-MM-dd HH:mm:ss.SSSSSS')").first()
    )
    assert first[0] == "2026-11-20 10:00:01.123456"


def test_a_driver_archive_is_offered_only_to_the_spark_home_it_was_written_for(
    tmp_path, monkeypatch
):
    """The JVM maps a class-data archive only for the class path it was written with: one
    written by another install's Spark (another virtualenv, a fresh clone) would be ignored
    without a word, and every driver would start seconds slower, for good."""
    from pyspark.find_spark_home import _find_spark_home

    from replicator.spark.jvm_archive import discard_archive, plan_archive

    monkeypatch.setenv("REPLICATOR_CACHE_DIR", str(tmp_path / "cache"))
    home = _find_spark_home()
    monkeypatch.setenv("SPARK_HOME", home)
    first = plan_archive(JAR, "")
    assert first.pending is not None and first.final is not None  # none yet: list the classes
    discard_archive(first)
    first.final.write_bytes(b"an archive")  # what the builder renames into place
    assert f"-XX:SharedArchiveFile={first.final}" in plan_archive(JAR, "").options
    elsewhere = tmp_path / "other-install"
    elsewhere.symlink_to(home)  # the same Spark, its jars under another path
    monkeypatch.setenv("SPARK_HOME", str(elsewhere))
    other = plan_archive(JAR, "")
    assert other.final is not None and other.final != first.final
    assert "-XX:DumpLoadedClassList=" in other.options


def test_one_run_at_a_time_lists_its_classes_for_the_driver_archive(tmp_path, monkeypatch):
    """A run that starts while another one (or its builder) makes the archive goes
    without; once that process is gone without publishing one (killed), the next run lists
    its classes, and a run that hands nothing on leaves nothing behind."""
    from replicator.spark.jvm_archive import build_archive_later, discard_archive, plan_archive

    monkeypatch.setenv("REPLICATOR_CACHE_DIR", str(tmp_path))
    listing = plan_archive(JAR, "")
    assert listing.pending is not None and "-XX:DumpLoadedClassList=" in listing.options
    assert plan_archive(JAR, "").options == ""  # meanwhile
    # the listing run killed: its file names a dead process
    dead = listing.pending.with_name(listing.pending.name.rsplit("-", 1)[0] + f"-{_dead_pid()}")
    listing.pending.rename(dead)
    again = plan_archive(JAR, "")
    assert "-XX:DumpLoadedClassList=" in again.options and not dead.exists()
    # no JVM to take the options from (or an interrupted run): no builder, no file left
    assert build_archive_later(again, None) is False
    assert list(tmp_path.glob("*.jsa.*")) == []
    discard_archive(plan_archive(JAR, ""))
    assert list(tmp_path.glob("*.jsa.*")) == []
    assert "-XX:DumpLoadedClassList=" in plan_archive(JAR, "").options


def test_the_first_spark_run_leaves_the_archive_to_a_detached_build_later_runs_map(
    db_project, source_conn, schema
):
    """The run that finds no archive is not slowed by making one: its JVM lists the classes
    it loads, and a builder dumps them after the command has exited, in a session of its
    own. The next JVM maps the archive.

    The suite's own cache, which starts as a new machine's does: an archive from before
    this suite run is removed, so that every run of the suite builds one (about 20 s of
    one core), whichever worker's run hands it the list first; a run that starts meanwhile
    goes without, as a user's does (a JVM already started keeps the archive it mapped)."""
    cache = Path(os.environ["REPLICATOR_CACHE_DIR"])
    suite_started = float(os.environ["REPLICATOR_TESTS_STARTED"])  # conftest.py
    for archive in cache.glob("spark-driver-*.jsa"):
        if archive.stat().st_mtime < suite_started:
            archive.unlink()
    source_conn.execute(
        sql.SQL("CREATE TABLE {} AS SELECT g AS id FROM generate_series(1, 100) g").format(
            sql.Identifier(schema, "t")
        )
    )
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    done = db_project.run_process("sync")  # through Spark (REPLICATOR_SPARK_MIN_ROWS=0)
    assert done.returncode == 0, done.stderr
    assert "t: full_reload, 100 rows" in done.stderr
    archive = wait_for(lambda: next(cache.glob("spark-driver-*.jsa"), None), 600, "the archive")
    wait_for(lambda: not list(cache.glob(f"{archive.name}.*-*")), 60, "the builder's files")
    mapped = subprocess.run(
        [sys.executable, "-c", _MAPS_ARCHIVE],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert mapped.stdout.splitlines()[-1] == str(archive)


def test_the_archive_builder_gets_no_database_url_or_secret_from_the_run():
    """The builder outlives the command by about 20 s: nothing of the run's environment it
    has no use for, least of all the databases' URLs; the JVM options it does need."""
    from replicator.spark.jvm_archive import builder_environment

    run = {
        "REPLICATOR_SOURCE_URL": "postgresql://app:s3cret@db/shop",
        "REPLICATOR_DEST_URL": "postgresql://wh:s3cret@wh/wh",
        "REPLICATOR_WEBHOOK_SECRET": "s3cret",
        "PGPASSWORD": "s3cret",
        "PATH": "/usr/bin",
        "JAVA_TOOL_OPTIONS": "-Xmx2g",
    }
    given = builder_environment(run)
    assert given == {"PATH": "/usr/bin", "JAVA_TOOL_OPTIONS": "-Xmx2g"}
    assert "s3cret" not in repr(given)


# A new driver JVM, planned and started as a run does it: which archive it maps.
_MAPS_ARCHIVE = """
from pathlib import Path
from pyspark import SparkContext
from replicator.spark.jvm_archive import plan_archive
from replicator.spark.session import jdbc_jar, start_spark_context
from replicator.spark.jvm_stop import stop_jvm
context = start_spark_context(driver_options=plan_archive(str(jdbc_jar() or ""), "").options)
maps = Path(f"/proc/{SparkContext._gateway.proc.pid}/maps").read_text().split()
stop_jvm(context, graceful=True)
print(next((word for word in maps if word.endswith(".jsa")), "no archive mapped"))
"""

JAR = "/usr/share/java/postgresql.jar"


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(gone.stdout)
