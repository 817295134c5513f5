"""`tables[].deletes: "delete"`: rows deleted in the source are deleted in the destination by
the sync, found by comparing keys; guarded against deleting more than half of a table."""

from __future__ import annotations

import json

import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark


def _orders(conn, schema, rows=2000):
    target = sql.Identifier(schema, "orders")
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL)"
        ).format(target)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'n' || g, now() - interval '1 day' + g * interval '1 s' "
            "FROM generate_series(1, %s) g"
        ).format(target),
        (rows,),
    )


def _source(conn, schema, statement):
    conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, "orders")))


def _checked_at(project, name):
    return json.loads(project.run("state", "show", name).stdout)[name]["deletes_checked_at"]


def _count(conn, schema):
    return conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
    ).fetchone()[0]


def test_rows_deleted_in_the_source_are_deleted_here(
    db_project, schema, source_conn, dest_conn, httpserver
):
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "DELETE FROM {t} WHERE id IN (5, 700, 1999)")
    _source(source_conn, schema, "DELETE FROM {t} WHERE id = 42")
    _source(source_conn, schema, "INSERT INTO {t} VALUES (42, 'back again', now())")
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    synced = db_project.run("sync", env={"REPLICATOR_WEBHOOK_URL": httpserver.url_for("/hook")})
    assert synced.exit_code == 0, synced.output
    assert "3 row(s) no longer in the source (deleted, or out of the model) deleted here" in (
        synced.stderr
    )
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1997
    ((request, _),) = httpserver.log
    (entry,) = request.get_json()["tables"]
    assert entry["deleted"] == 3 and entry["status"] == "success"


def test_deleting_more_than_half_needs_force(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "DELETE FROM {t} WHERE id > 800")
    refused = db_project.run("sync")
    assert refused.exit_code == 1
    assert "would delete 1,200 of 2,000 rows, more than half" in refused.stderr
    assert "replicator sync --deletes --force" in refused.stderr
    assert _count(dest_conn, schema) == 2000
    forced = db_project.run("sync", "--deletes", "--force")
    assert forced.exit_code == 0, forced.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 800


def test_a_truncated_source_empties_the_copy_only_when_forced(
    db_project, schema, source_conn, dest_conn
):
    _orders(source_conn, schema, rows=50)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "TRUNCATE {t}")
    assert db_project.run("sync").exit_code == 1
    assert _count(dest_conn, schema) == 50
    assert db_project.run("sync", "--deletes", "--force").exit_code == 0
    assert _count(dest_conn, schema) == 0


def test_deletes_interval_checks_when_due_or_asked(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema)
    db_project.configure(
        schema, "orders", replication_key="updated_at", deletes="delete", deletes_interval=3600
    )
    assert db_project.run("sync").exit_code == 0  # a full load: nothing to check
    assert db_project.run("sync").exit_code == 0  # first check: due (never checked)
    state = json.loads(next((db_project.path / "sync-state").glob("*.json")).read_text())
    assert state["deletes_checked_at"]
    _source(source_conn, schema, "DELETE FROM {t} WHERE id = 10")
    assert db_project.run("sync").exit_code == 0
    assert _count(dest_conn, schema) == 2000, "not due for an hour"
    assert db_project.run("sync", "--deletes").exit_code == 0
    assert _count(dest_conn, schema) == 1999


def test_rows_leaving_a_filtering_model_are_deleted(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema)
    db_project.write(
        f"models/{schema}/orders.sql",
        f"SELECT * FROM {schema}.orders WHERE note <> 'hidden'",
    )
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "UPDATE {t} SET note = 'hidden', updated_at = now() WHERE id = 3")
    assert db_project.run("sync").exit_code == 0
    ids = {
        r[0]
        for r in dest_conn.execute(
            sql.SQL("SELECT id FROM {}").format(sql.Identifier(schema, "orders"))
        )
    }
    assert 3 not in ids and len(ids) == 1999


def test_delete_settings_are_checked_before_anything_runs(db_project, schema, source_conn):
    _orders(source_conn, schema, rows=5)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "mode": "full-refresh", "deletes": "delete"}]}
    )
    result = db_project.run("sync")
    assert result.exit_code == 2 and '"deletes" applies to incremental modes' in result.stderr
    db_project.configure(
        schema, "orders", replication_key="updated_at", deletes="mark", mode="incremental-append"
    )
    result = db_project.run("sync")
    assert result.exit_code == 2 and '"mark" needs mode incremental-deduped' in result.stderr
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="sometimes")
    result = db_project.run("sync")
    assert result.exit_code == 2 and "expected one of ignore, delete, mark" in result.stderr
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    result = db_project.run("sync", "--force")
    assert result.exit_code == 2 and "--force goes with --deletes" in result.stderr
    assert list((db_project.path / "sync-state").glob("*.json")) == []


def test_a_delete_check_killed_before_it_commits_converges(
    db_project, schema, source_conn, dest_conn
):
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "DELETE FROM {t} WHERE id % 100 = 0")
    killed = db_project.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "deletes-before-commit"}
    )
    assert killed.returncode == -9
    assert _count(dest_conn, schema) == 2000
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1980


def _marks(conn, schema):
    return dict(
        conn.execute(
            sql.SQL("SELECT id, _replicator_deleted_at IS NOT NULL FROM {}").format(
                sql.Identifier(schema, "orders")
            )
        ).fetchall()
    )


def test_mark_keeps_deleted_rows_with_the_time_they_went(
    db_project, schema, source_conn, dest_conn, httpserver
):
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="mark")
    assert db_project.run("sync").exit_code == 0
    (last,) = dest_conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
        "%s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum DESC LIMIT 1",
        (sql.Identifier(schema, "orders").as_string(dest_conn),),
    ).fetchall()
    assert last == ("_replicator_deleted_at", "timestamp with time zone")
    assert not any(_marks(dest_conn, schema).values())
    _source(source_conn, schema, "DELETE FROM {t} WHERE id IN (10, 20)")
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    synced = db_project.run("sync", env={"REPLICATOR_WEBHOOK_URL": httpserver.url_for("/hook")})
    assert synced.exit_code == 0, synced.output
    assert "2 row(s) no longer in the source (deleted, or out of the model) marked deleted" in (
        synced.stderr
    )
    ((request, _),) = httpserver.log
    assert request.get_json()["tables"][0]["deleted"] == 2
    marks = _marks(dest_conn, schema)
    assert len(marks) == 2000 and {k for k, v in marks.items() if v} == {10, 20}
    assert db_project.run("sync").exit_code == 0, "a second check marks nothing again"
    _source(source_conn, schema, "INSERT INTO {t} VALUES (10, 'back', now())")
    assert db_project.run("sync").exit_code == 0
    marks = _marks(dest_conn, schema)
    assert {k for k, v in marks.items() if v} == {20}, "a row that comes back is unmarked"
    result = db_project.run("verify", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["status"] == "equal"
    compiled = db_project.run("compile")
    assert '"_replicator_deleted_at" = EXCLUDED."_replicator_deleted_at"' in compiled.stdout
    assert "-- delete check (deletes: mark, every sync" in compiled.stdout
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="ignore")
    compiled = db_project.run("compile")
    assert "deletes changed: _replicator_deleted_at to drop (deletes is no longer mark)" in (
        compiled.stdout
    )
    assert 'DROP COLUMN "_replicator_deleted_at"' in compiled.stdout
    reloaded = db_project.run("sync")
    assert reloaded.exit_code == 0 and "deletes changed" in reloaded.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1999


def test_no_delete_check_follows_a_failed_read(db_project, schema, source_conn, dest_conn):
    """A model that fails returns no keys: that must not look like every row deleted."""
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", deletes="delete")
    assert db_project.run("sync").exit_code == 0
    _source(source_conn, schema, "DELETE FROM {t} WHERE id <= 10")
    _source(source_conn, schema, "UPDATE {t} SET updated_at = now() WHERE id = 500")
    db_project.write(
        f"models/{schema}/orders.sql", f"SELECT * FROM {schema}.orders WHERE 1 / (id - 500) > -1"
    )
    failed = db_project.run("sync")
    assert failed.exit_code == 1 and "division by zero" in failed.stderr
    assert "delete check" not in failed.stderr, "the read failed: no check follows"
    assert _count(dest_conn, schema) == 2000


@pytest.mark.parametrize("deletes", ["delete", "mark"])
def test_a_quiet_table_of_a_pattern_still_gets_its_deletes(
    db_project, schema, source_conn, dest_conn, deletes
):
    """Tenant tables under one pattern, nothing changed at or past their cursors: those
    whose copy holds the source's row count are screened as no-ops (their delete check's
    answer), one whose source lost a row is checked, and the row goes."""
    for name in ("t1", "t2", "t3"):
        table = sql.Identifier(schema, name)
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)").format(
                table
            )
        )
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, now() - interval '1 day' + g * interval '1 s' "
                "FROM generate_series(1, 100) g"
            ).format(table)
        )
    entry = {"name": f"{schema}.t*", "replication_key": "updated_at", "deletes": deletes}
    db_project.write_config({"tables": [entry]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    checked = []
    for _ in range(2):
        quiet = db_project.run("sync", env=IN_PROCESS)
        assert quiet.exit_code == 0
        assert quiet.stderr.count(": noop") == 3, quiet.stderr
        checked.append(_checked_at(db_project, f"{schema}.t1"))
    assert None not in checked and checked[1] > checked[0], "each run's delete check, done"
    source_conn.execute(sql.SQL("DELETE FROM {} WHERE id = 7").format(sql.Identifier(schema, "t2")))
    synced = db_project.run("sync", env=IN_PROCESS)
    assert synced.exit_code == 0, synced.output
    said = "1 row(s) no longer in the source (deleted, or out of the model)"
    assert f"{schema}.t2: {said}" in synced.stderr, synced.stderr
    assert synced.stderr.count(said) == 1
    gone = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE id = 7{}").format(
            sql.Identifier(schema, "t2"),
            sql.SQL(" AND _replicator_deleted_at IS NULL") if deletes == "mark" else sql.SQL(""),
        )
    ).fetchone()[0]
    assert gone == 0
    if deletes == "delete":
        for name in ("t1", "t2", "t3"):
            assert_same_table(source_conn, dest_conn, schema, name)
