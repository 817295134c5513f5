"""Loads on a real Spark standalone cluster: a master and two workers, separate processes,
whose executors' Python (the system `python3`) has neither replicator nor psycopg.

Every run is its own `python -m replicator` process, as cron runs it: the test process's
own local Spark context must not be reused, and PYSPARK_PYTHON (which the in-process runs
set to the virtualenv's interpreter) is dropped so the executors cannot borrow the venv.
The cluster starts once for the module (tests/spark_cluster.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dbcompare import assert_same_table, leftovers, pausing_scans
from engines import IN_PROCESS
from psycopg import sql
from source_tables import keyed_table
from spark_cluster import SYSTEM_PYTHON, SparkCluster
from waiting import wait_for

from replicator.base.identifiers import TableName

pytestmark = pytest.mark.spark

ROWS = 40_000
NO_VENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")
# Each partition's scan stops for a while in its middle: its first rows are already in the
# destination (uncommitted) when a test kills something.
PAUSING_MODEL = (
    "SELECT t.id, t.v, t.updated_at FROM {{ source }} AS t "
    "WHERE t.id % 20000 <> 10000 OR pg_sleep(4) IS NOT NULL"
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SparkCluster:
    if subprocess.run([SYSTEM_PYTHON, "-c", "import psycopg"], capture_output=True).returncode == 0:
        pytest.fail(f"{SYSTEM_PYTHON} has psycopg: the workers would not need the shipped one")
    started = SparkCluster(tmp_path_factory.mktemp("spark-cluster")).start()
    yield started
    started.stop()


@pytest.fixture
def table(source_conn, schema):
    return keyed_table(source_conn, schema, ROWS)


def _configure(db_project, cluster: SparkCluster, schema: str, **spark) -> None:
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.t",
                    "replication_key": "updated_at",
                    "lookback": 0,  # the batch is exactly the rows changed
                    "partitions": 2,
                }
            ],
            "spark": {
                "master": cluster.url,
                "conf": {
                    # Start the first job only when both executors are there.
                    "spark.cores.max": "2",
                    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                    "spark.executor.memory": "512m",
                },
                **spark,
            },
        }
    )


def _apps(cluster: SparkCluster) -> set[str]:
    return {p.name for w in cluster.nodes for p in w.folder.glob("work/app-*")}


def _sync(db_project, cluster: SparkCluster, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """One `sync` process; returns it and the Spark application it ran."""
    before = _apps(cluster)
    run = db_project.run_process("sync", *args, drop=NO_VENV)
    (app,) = _apps(cluster) - before
    return run, app


def test_without_the_shipped_environment_the_executors_cannot_run_a_task(
    db_project, cluster, table
):
    _configure(db_project, cluster, table, ship_environment=False)
    run, _ = _sync(db_project, cluster)
    assert run.returncode == 1
    assert "No module named 'replicator'" in run.stderr, run.stderr
    assert "install them there, or set spark.ship_environment to true" in run.stderr


def _start_sync(db_project, tmp_path: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in NO_VENV}
    command = [sys.executable, "-m", "replicator", "sync", "-f"]
    with (tmp_path / "killed.err").open("w") as err:
        return subprocess.Popen(
            [*command, "--project-dir", str(db_project.path)],
            env={**env, **db_project.env},
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def test_a_load_survives_a_lost_worker_and_a_batch_runs_on_both_workers(
    db_project, cluster, table, source_conn, dest_conn, tmp_path
):
    """Both executors copy a partition each, from the shipped environment; one worker (and
    its executor) is killed mid-copy: its partition runs again on the other, exactly once.
    Then, the worker back, an incremental batch runs on both."""
    _configure(db_project, cluster, table)
    db_project.write(f"models/{table}/t.sql", PAUSING_MODEL)
    before = _apps(cluster)
    run = _start_sync(db_project, tmp_path)
    try:
        wait_for(lambda: pausing_scans(source_conn, table) == 2, 120, "both partitions mid-scan")
        (app,) = _apps(cluster) - before
        assert [w.tasks_run(app) > 0 for w in cluster.nodes] == [True, True]
        for worker in cluster.nodes:  # unpacked where each executor runs
            assert list(worker.folder.glob(f"work/{app}/*/replicator-python/psycopg"))
        cluster.kill_worker(cluster.nodes[0])
        code = run.wait(timeout=180)
    finally:
        run.kill()
        cluster.start_worker(cluster.nodes[0])
    stderr = (tmp_path / "killed.err").read_text()
    assert code == 0, stderr
    assert f"t: full_reload, {ROWS:,} rows" in stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []

    source_conn.execute(
        sql.SQL(
            "UPDATE {t} SET v = 'changed', updated_at = clock_timestamp() "
            "WHERE id % 3 = 0 AND id % 20000 <> 10000; "  # no pause in the batch
            "INSERT INTO {t} (id, v) SELECT g, 'new' FROM generate_series(40001, 41000) g"
        ).format(t=sql.Identifier(table, "t"))
    )
    batch, app = _sync(db_project, cluster)
    assert batch.returncode == 0, batch.stderr
    assert "t: incremental, 14,3" in batch.stderr, batch.stderr  # and the row at the cursor
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS + 1000
    assert [w.tasks_run(app) > 0 for w in cluster.nodes] == [True, True]


def test_a_driver_killed_mid_load_and_the_next_run_converges(
    db_project, cluster, table, source_conn, dest_conn, tmp_path
):
    """The driver host lost mid-copy (the CLI and its JVM killed) while the executors write:
    the next run, here in-process, is not disturbed by what the cluster still holds."""
    _configure(db_project, cluster, table)
    db_project.write(f"models/{table}/t.sql", PAUSING_MODEL)
    run = _start_sync(db_project, tmp_path)
    try:
        wait_for(lambda: pausing_scans(source_conn, table) == 2, 120, "both partitions mid-scan")
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        run.kill()
    (db_project.path / "models" / table / "t.sql").unlink()
    source_conn.execute(
        sql.SQL("DELETE FROM {} WHERE id <= 100").format(sql.Identifier(table, "t"))
    )
    again = db_project.run_process("sync", env=IN_PROCESS)
    assert again.returncode == 0, again.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS - 100
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


def test_check_against_the_live_master(db_project, cluster, table):
    _configure(db_project, cluster, table)
    checked = db_project.run("check")
    assert f"master {cluster.url}: 127.0.0.1:{cluster.master_port} answers" in checked.stdout
    assert "executors get replicator's Python environment with each run" in checked.stdout
    # The test servers listen on 127.0.0.1, which works here only because all runs on one host.
    assert (
        "warn  spark: REPLICATOR_SOURCE_URL names 127.0.0.1: on a cluster each executor "
        "connects from its own host" in checked.stdout
    )
