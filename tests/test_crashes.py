"""kill -9 at every failpoint, in every mode: the next run converges to the source exactly.

Each case: a first sync, changes in the source, a sync killed (SIGKILL) at the point (in a
process of its own), then a sync to completion. After it the destination equals the source
row for row (md5 of each row by key), no key appears twice, `_replicator` holds no side or
staging table, and the state file parses. Copies run in the replicator process here (fast,
and the kill hits the process that runs the point), but for the incremental batch's general
way, which the killed run takes on Spark; the Spark path's executor-side kill has its own
case.
"""

from __future__ import annotations

import json

import pytest
from dbcompare import assert_same_table, leftovers
from engines import IN_PROCESS
from failpoint_paths import FULL_RELOAD_POINTS, GENERAL_BATCH_POINTS, INCREMENTAL_POINTS
from psycopg import sql

from replicator.base.identifiers import TableName

pytestmark = pytest.mark.spark


SPARK = "on-spark"
CASES = [
    *[("full-refresh", p, "") for p in FULL_RELOAD_POINTS],
    *[("incremental-deduped", p, "") for p in INCREMENTAL_POINTS],
    *[("incremental-append", p, "") for p in INCREMENTAL_POINTS],
    *[("incremental-deduped", p, SPARK) for p in GENERAL_BATCH_POINTS],
]
# Where the killed run leaves a table of its own behind (the next run drops it).
LEAVES_A_TABLE = {
    ("after-staging-copy", SPARK),
    ("after-load-before-swap", ""),
    ("task-before-commit", ""),
    ("after-swap-commit", ""),
}


def _create(source_conn, schema: str) -> None:
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, v text, n numeric, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, v, n) SELECT g, md5(g::text), g / 7.0 "
            "FROM generate_series(1, 3000) g"
        ).format(sql.Identifier(schema, "t"))
    )


def _change(source_conn, schema: str, mode: str) -> None:
    """Inserts for every mode; updates too where the mode carries them."""
    table = sql.Identifier(schema, "t")
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, v, n) SELECT g, 'new', 0 FROM generate_series(3001, 3400) g"
        ).format(table)
    )
    if mode != "incremental-append":
        source_conn.execute(
            sql.SQL(
                "UPDATE {} SET v = 'changed', n = n + 1, updated_at = clock_timestamp() "
                "WHERE id % 13 = 0"
            ).format(table)
        )


def _leftovers(dest_conn, schema: str) -> list[str]:
    return leftovers(dest_conn, [TableName(schema, "t")])


@pytest.mark.parametrize(
    ("mode", "point", "engine"), CASES, ids=["-".join(filter(None, case)) for case in CASES]
)
def test_a_kill_at_the_point_converges(
    db_project, source_conn, dest_conn, schema, mode, point, engine
):
    _create(source_conn, schema)
    table = {"name": f"{schema}.t", "mode": mode}
    if mode != "full-refresh":
        table["replication_key"] = "updated_at"
    db_project.write_config({"tables": [table]})
    first = db_project.run("sync", env=IN_PROCESS)  # only the killed run needs its process
    assert first.exit_code == 0, first.output
    _change(source_conn, schema, mode)
    on = {} if engine == SPARK else IN_PROCESS
    killed = db_project.run_process("sync", env={**on, "REPLICATOR_FAILPOINT": point})
    assert killed.returncode == -9, f"the run did not reach {point}: {killed.stderr}"
    if (point, engine) in LEAVES_A_TABLE:
        assert _leftovers(dest_conn, schema), "the killed run left its table behind"
    again = db_project.run("sync", env=IN_PROCESS)
    assert again.exit_code == 0, again.output
    assert assert_same_table(source_conn, dest_conn, schema, "t") == 3400
    (duplicates,) = dest_conn.execute(
        sql.SQL("SELECT count(*) - count(DISTINCT id) FROM {}").format(sql.Identifier(schema, "t"))
    ).fetchone()
    assert duplicates == 0
    assert _leftovers(dest_conn, schema) == []
    shown = db_project.run("state", "show", f"{schema}.t")
    assert shown.exit_code == 0
    assert json.loads(shown.stdout)[f"{schema}.t"]["last_run"]["status"] == "success"


def test_a_reload_after_a_killed_batch_leaves_no_staging_table(
    db_project, source_conn, dest_conn, schema
):
    """An incremental run killed with its staging table in place (the general way, on
    Spark), then a full reload and no-ops (the soak found this order): nothing is left
    behind."""
    _create(source_conn, schema)
    db_project.write_config({"tables": [{"name": f"{schema}.t", "replication_key": "updated_at"}]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    _change(source_conn, schema, "incremental-deduped")
    killed = db_project.run_process("sync", env={"REPLICATOR_FAILPOINT": "after-staging-copy"})
    assert killed.returncode == -9 and _leftovers(dest_conn, schema)
    assert db_project.run("sync", "-f", env=IN_PROCESS).exit_code == 0
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    assert _leftovers(dest_conn, schema) == []
    assert assert_same_table(source_conn, dest_conn, schema, "t") == 3400


def test_a_killed_spark_task_is_retried(db_project, source_conn, dest_conn, schema, tmp_path):
    """A Python worker killed mid-copy (its connection lost with it) is retried by local
    Spark too, and the retried task loads its partition exactly once."""
    _create(source_conn, schema)
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    once = tmp_path / "killed-once"
    synced = db_project.run_process(
        "sync",
        env={"REPLICATOR_FAILPOINT": "mid-extract", "REPLICATOR_FAILPOINT_ONCE": str(once)},
    )
    assert once.exists(), "the first attempt was killed"
    assert synced.returncode == 0, synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "t") == 3000
    assert _leftovers(dest_conn, schema) == []


def test_a_task_killed_at_every_attempt_fails_the_table(db_project, source_conn, dest_conn, schema):
    """On Spark the executor-side points kill a Python worker, not the driver: killed at
    every attempt, the run fails that table, saying why, and the next run converges."""
    _create(source_conn, schema)
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    killed = db_project.run_process("sync", env={"REPLICATOR_FAILPOINT": "mid-extract"})
    assert killed.returncode == 1, killed.stderr
    assert "Spark task failed: Python worker exited unexpectedly (crashed)" in killed.stderr
    again = db_project.run_process("sync", env=IN_PROCESS)  # the engine adds nothing here
    assert again.returncode == 0, again.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "t") == 3000
    assert _leftovers(dest_conn, schema) == []


def test_a_task_that_would_fail_again_is_not_retried(db_project, source_conn, dest_conn, schema):
    """A division by zero in the model fails every attempt the same way: Spark tried the
    task four times (about 8 s) before the table failed (a newcomer trial). Under -v,
    Spark logs each failed attempt (`Lost task 0.N`): there is none, the task reported it."""
    _create(source_conn, schema)
    db_project.write(
        f"models/{schema}/t.sql", "SELECT t.* FROM {{ source }} AS t WHERE 1 / (t.id - 7) <> 0"
    )
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    failed = db_project.run_process("sync", "-v")
    assert failed.returncode == 1
    assert "Spark task failed: source: division by zero" in failed.stderr, failed.stderr[-2000:]
    assert "Lost task" not in failed.stderr, failed.stderr[-4000:]
    assert _leftovers(dest_conn, schema) == []
