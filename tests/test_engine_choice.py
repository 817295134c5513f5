"""Spark or this process: chosen from what this host measured unless spark.min_rows is set."""

from __future__ import annotations

import json
import re

import pytest
from dbcompare import assert_same_table
from psycopg import sql

from replicator.spark.engine_choice import IN_PROCESS, EngineChoice

LOCAL = "Spark (local[*])"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLICATOR_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_before_any_figure_a_local_master_takes_spark_only_where_tasks_can_run_in_parallel(cache):
    assert not EngineChoice.of("local[2]", None, None, None).spark_for(50_000_000)
    assert not EngineChoice.of("local[8]", None, None, None).spark_for(1_000_000)
    assert EngineChoice.of("local[8]", None, None, None).spark_for(3_000_000)
    # the warm server on a local master: as that master, without its JVM start
    assert not EngineChoice.of(None, None, 2, None).spark_for(50_000_000)
    assert EngineChoice.of("local[*]", None, 8, None).spark_for(3_000_000)
    # a cluster (also behind the warm server) and a Connect server: measured by their
    # first copies
    for configured in (
        EngineChoice.of("spark://master:7077", None, None, None),
        EngineChoice.of("spark://master:7077", None, 2, None),
        EngineChoice.of(None, "sc://spark.example:15002/;token=s3cret", None, None),
    ):
        assert configured.spark_for(500_000) and not configured.spark_for(499_999)
        assert "until measured" in configured.describe()
    assert "s3cret" not in EngineChoice.of(None, "sc://h/;token=s3cret", None, None).where
    # spark.min_rows, when set, is the threshold whatever was measured
    assert EngineChoice.of("local[2]", None, None, 0).spark_for(1)
    assert not EngineChoice.of("spark://m:7077", None, None, 10**9).spark_for(10**8)


def test_the_figures_measured_here_decide_and_say_from_how_many_rows(cache):
    choice = EngineChoice.of("local[*]", None, None, None)
    choice.record(IN_PROCESS, 4_000_000, 10.0)  # 400,000 rows/s
    choice.record(LOCAL, 4_000_000, 5.0, waited=3.0)  # 800,000 rows/s after 3 s
    choice = EngineChoice.of("local[*]", None, None, None)  # read back from the cache
    # in this process: rows / 400k; on Spark: 3 s + rows / 800k: even at 2.4M rows
    assert not choice.spark_for(1_000_000) and choice.spark_for(5_000_000)
    assert choice.describe().startswith("from 2,400,000 rows (measured here")
    assert not choice.spark_for(60_000)  # below the floor: never a JVM start

    choice.record(LOCAL, 4_000_000, 16.0, waited=3.0)  # slower now: 250,000 rows/s
    figures = json.loads((cache / "engine-figures.json").read_text())
    assert figures[LOCAL]["rows_per_second"] == pytest.approx(525_000)  # halfway
    assert EngineChoice.of("local[*]", None, None, None).spark_for(50_000_000)
    choice.record(LOCAL, 4_000_000, 16.0, waited=3.0)  # 387,500 rows/s: slower than here
    assert not EngineChoice.of("local[*]", None, None, None).spark_for(50_000_000)
    assert choice.describe().startswith("never (measured here")

    figures = json.loads((cache / "engine-figures.json").read_text())
    choice.record(IN_PROCESS, 100_000, 0.1)  # a small copy is mostly fixed cost: not a figure
    assert json.loads((cache / "engine-figures.json").read_text()) == figures
    (cache / "engine-figures.json").write_text("{not json")  # measured again, no error
    assert not EngineChoice.of("local[*]", None, None, None).spark_for(5_000_000)


def test_a_load_in_this_process_records_its_rate(
    db_project, source_conn, dest_conn, schema, tmp_path
):
    """With spark.min_rows unset, a 500,000-row table is copied here (no figure yet says
    Spark is faster) and the copy's rate is kept for the next choice."""
    _wide_table(db_project, source_conn, schema)
    env = {"JAVA_HOME": "/nonexistent", "REPLICATOR_CACHE_DIR": str(tmp_path)}
    run = db_project.run_process("sync", "-v", env=env, drop=("REPLICATOR_SPARK_MIN_ROWS",))
    assert run.returncode == 0, run.stderr
    assert "copied 1 partition(s) in this process" in run.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "wide") == 500_000
    figures = json.loads((tmp_path / "engine-figures.json").read_text())
    assert figures[IN_PROCESS]["rows_per_second"] > 0


def test_a_load_through_spark_is_charged_the_whole_start_of_spark(
    db_project, source_conn, schema, tmp_path
):
    """The copy waits only for what is left of Spark's start when it begins; the figure
    keeps all of it, which the run's other work waited for as well (on a small host the
    JVM's start slows it), so that a later choice does not take Spark for cheaper than it
    was."""
    _wide_table(db_project, source_conn, schema)
    run = db_project.run_process("sync", "-vv", env={"REPLICATOR_CACHE_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    # the part of the start the load waited for while it planned its partitions
    planned = re.search(r"snapshot exported, Spark ready in ([0-9.]+) s", run.stderr)
    assert planned is not None, run.stderr[-3000:]
    figures = json.loads((tmp_path / "engine-figures.json").read_text())
    assert figures[LOCAL]["start_seconds"] >= float(planned.group(1))


def _wide_table(db_project, source_conn, schema) -> None:
    """A 500,000-row table, enough for a copy's figures to be kept (MEASURED_ROWS)."""
    table = sql.Identifier(schema, "wide")
    source_conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v text)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, md5(g::text) FROM generate_series(1, 500000) g").format(
            table
        )
    )
    db_project.write_config({"tables": [{"name": f"{schema}.wide", "mode": "full-refresh"}]})
