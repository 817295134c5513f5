"""`columns` and `where` on `cdc` tables: an excluded column that never reaches the
destination (and never leaves the source when the publication can list columns), hashes
made from the log equal to those a load makes on the source, and rows that enter and leave
the filter through updates, with a writer running."""

from __future__ import annotations

import json
import threading

import pytest
from psycopg import sql

pytestmark = pytest.mark.spark

SALT = "cdc salt"
COLUMNS = ("id", "name", "email", "active", "code", "ip", "status")
HASHED = ("email", "active", "code", "ip")


def _create(conn, schema, name, identity_full):
    table = sql.Identifier(schema, name)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, name text, ssn text, email text, "
            "active boolean, code char(6), ip inet, status text NOT NULL)"
        ).format(table)
    )
    if identity_full:
        conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table))
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'n' || g, 'ssn' || g, "
            "CASE WHEN g % 9 = 0 THEN NULL ELSE 'e\\t' || g || '@x' END, g % 2 = 0, "
            "'c' || g, ('10.0.' || g % 250 || '.1')::inet, "
            "CASE WHEN g % 4 = 0 THEN 'test' ELSE 'live' END FROM generate_series(1, 200) g"
        ).format(table)
    )


def _expected(conn, schema, name, where):
    hashed = [
        sql.SQL("encode(sha256(convert_to({} || {}::text, 'UTF8')), 'hex')").format(
            sql.Literal(SALT), sql.Identifier(c)
        )
        if c in HASHED
        else sql.Identifier(c)
        for c in COLUMNS
    ]
    return conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY id").format(
            sql.SQL(", ").join(hashed), sql.Identifier(schema, name), sql.SQL(where)
        )
    ).fetchall()


def _copy(conn, schema, name):
    return conn.execute(
        sql.SQL("SELECT {} FROM {} ORDER BY id").format(
            sql.SQL(", ").join(map(sql.Identifier, COLUMNS)), sql.Identifier(schema, name)
        )
    ).fetchall()


def _writes(stop, url, schema, table="people", rows=200, update=None):
    """Updates moving rows in and out of the filter while a sync runs: `update` (a
    statement of {} the table, %(n)s the update's number and %(id)s its row)."""
    import psycopg

    update = update or (
        "UPDATE {} SET status = CASE status WHEN 'test' THEN 'live' ELSE 'test' END, "
        "email = email || 'x' WHERE id = %(id)s"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        n = 0
        while not stop.is_set():
            n += 1
            conn.execute(
                sql.SQL(update).format(sql.Identifier(schema, table)),
                {"n": n, "id": n % rows + 1},
            )


def test_a_cdc_table_leaves_out_hashes_and_filters_from_the_log(
    cdc_project, schema, writer, source_conn, dest_conn, pg_servers
):
    _create(writer, schema, "people", identity_full=True)
    _create(writer, schema, "accounts", identity_full=False)
    _create(writer, schema, "orders", identity_full=False)
    shaped = {"mode": "cdc", "columns": {"exclude": ["ssn"], "hash": list(HASHED)}}
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.people", **shaped, "where": "status <> 'test'"},
                {"name": f"{schema}.accounts", **shaped},
                {"name": f"{schema}.orders", "mode": "cdc", "where": "status <> 'test'"},
            ]
        }
    )
    env = {"REPLICATOR_HASH_SALT": SALT}
    checked = cdc_project.run("check", env=env)
    assert f"ALTER TABLE {schema}.orders REPLICA IDENTITY FULL" in checked.stdout
    assert "REPLICA IDENTITY FULL: the log carries excluded column(s) ssn" in checked.stdout
    assert "excluded column(s) ssn stay in the source" in checked.stdout
    assert f"ok    {schema}.orders: next sync" not in checked.stdout, "it fails, said above"
    assert f"ok    {schema}.people: next sync" in checked.stdout
    first = cdc_project.run("sync", env=env)
    assert first.exit_code == 1, first.output  # orders fails alone, with the fix
    assert f"ALTER TABLE {schema}.orders REPLICA IDENTITY FULL" in first.stderr
    unverified = cdc_project.run("verify", "--json", "-s", f"{schema}.orders", env=env)
    (verdict,) = json.loads(unverified.stdout)
    assert verdict["status"] == "failed"
    assert f"ALTER TABLE {schema}.orders REPLICA IDENTITY FULL" in verdict["error"], verdict
    assert not verdict["error"].startswith(f"{schema}.orders"), "the verdict names the table"
    assert _copy(dest_conn, schema, "people") == _expected(
        source_conn, schema, "people", "status <> 'test'"
    )
    assert _copy(dest_conn, schema, "accounts") == _expected(
        source_conn, schema, "accounts", "true"
    )
    published = dict(
        source_conn.execute(
            "SELECT tablename, attnames FROM pg_publication_tables WHERE schemaname = %s",
            (schema,),
        ).fetchall()
    )
    assert "ssn" not in published["accounts"], "the column list keeps ssn in the source"
    assert "ssn" in published["people"]  # REPLICA IDENTITY FULL: the drain drops it

    for name in ("people", "accounts"):
        table = sql.Identifier(schema, name)
        writer.execute(sql.SQL("UPDATE {} SET status = 'test' WHERE id IN (1, 2)").format(table))
        writer.execute(sql.SQL("UPDATE {} SET status = 'live' WHERE id IN (4, 8)").format(table))
        writer.execute(
            sql.SQL(
                "UPDATE {} SET email = 'new\\\\mail', active = NOT active, code = 'zz', "
                "ip = '::1', ssn = 'secret' WHERE id = 3"
            ).format(table)
        )
        writer.execute(
            sql.SQL(
                "INSERT INTO {} VALUES (900, 'new', 's', NULL, NULL, NULL, NULL, 'live')"
            ).format(table)
        )
        writer.execute(sql.SQL("DELETE FROM {} WHERE id = 5").format(table))
    stop = threading.Event()
    live = threading.Thread(target=_writes, args=(stop, pg_servers.source_url, schema))
    live.start()
    try:
        during = cdc_project.run(
            "sync", "-s", f"{schema}.people", "-s", f"{schema}.accounts", env=env
        )
    finally:
        stop.set()
        live.join()
    assert during.exit_code == 0, during.output
    after = cdc_project.run("sync", "-s", f"{schema}.people", "-s", f"{schema}.accounts", env=env)
    assert after.exit_code == 0, after.output
    assert f"{schema}.people: incremental" in after.stderr
    assert "now listed with" not in after.stderr, "the publication was altered, unchanged"
    assert _copy(dest_conn, schema, "people") == _expected(
        source_conn, schema, "people", "status <> 'test'"
    )
    assert _copy(dest_conn, schema, "accounts") == _expected(
        source_conn, schema, "accounts", "true"
    )
    assert "ssn" not in [
        r[0]
        for r in dest_conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s",
            (schema,),
        )
    ]
    verified = cdc_project.run("verify", "--json", "-s", f"{schema}.people", env=env)
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)[0]["status"] == "equal"

    # A narrower filter: the copy reloads, and the publication filters by the new one.
    config = json.loads((cdc_project.path / "tables-config.json").read_text())
    config["tables"][0]["where"] = "status <> 'test' AND id > 10"
    cdc_project.write_config(config)
    narrowed = cdc_project.run("sync", "-s", f"{schema}.people", env=env)
    assert narrowed.exit_code == 0, narrowed.output
    assert "reason: columns or where changed:" in narrowed.stderr
    writer.execute(
        sql.SQL("UPDATE {} SET status = 'live', id = 7000 WHERE id = 8").format(
            sql.Identifier(schema, "people")
        )
    )
    writer.execute(
        sql.SQL("UPDATE {} SET name = 'out of the new filter' WHERE id IN (3, 6)").format(
            sql.Identifier(schema, "people")
        )
    )
    writer.execute(
        sql.SQL("UPDATE {} SET status = 'live' WHERE id = 12").format(
            sql.Identifier(schema, "people")
        )
    )
    again = cdc_project.run("sync", "-s", f"{schema}.people", env=env)
    assert again.exit_code == 0, again.output
    assert _copy(dest_conn, schema, "people") == _expected(
        source_conn, schema, "people", "status <> 'test' AND id > 10"
    )


@pytest.mark.parametrize("identity_full", [False, True], ids=["column-list", "identity-full"])
def test_a_cdc_table_with_include_keeps_a_column_the_source_gains_in_the_source(
    cdc_project, schema, writer, source_conn, dest_conn, identity_full
):
    """`columns.include` on a `cdc` table: the publication lists the included columns, so
    a column added later is not in the log, and the copy goes on without a reload (under
    REPLICA IDENTITY FULL, which allows no column list, the drain drops it)."""
    _create(writer, schema, "accounts", identity_full=identity_full)
    included = [c for c in COLUMNS if c not in HASHED]
    cdc_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.accounts",
                    "mode": "cdc",
                    "columns": {"include": included, "hash": list(HASHED)},
                }
            ]
        }
    )
    env = {"REPLICATOR_HASH_SALT": SALT}
    assert cdc_project.run("sync", env=env).exit_code == 0
    table = sql.Identifier(schema, "accounts")
    writer.execute(sql.SQL("ALTER TABLE {} ADD COLUMN card text").format(table))
    writer.execute(sql.SQL("UPDATE {} SET card = 'CARD-9', name = 'x' WHERE id <= 5").format(table))
    writer.execute(sql.SQL("DELETE FROM {} WHERE id = 6").format(table))
    applied = cdc_project.run("sync", env=env)
    assert applied.exit_code == 0, applied.output
    assert f"{schema}.accounts: incremental" in applied.stderr, applied.stderr
    (listed,) = source_conn.execute(
        "SELECT attnames FROM pg_publication_tables WHERE schemaname = %s", (schema,)
    ).fetchone()
    if not identity_full:
        assert "card" not in listed and "ssn" not in listed, listed
    assert _copy(dest_conn, schema, "accounts") == _expected(
        source_conn, schema, "accounts", "true"
    )
    columns = dest_conn.execute(
        "SELECT array_agg(column_name::text) FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = 'accounts'",
        (schema,),
    ).fetchone()[0]
    assert "card" not in columns and "ssn" not in columns, columns


def test_with_include_a_column_the_log_gains_mid_drain_is_dropped_not_a_drift():
    """A column added between a run's plan and the drain's read of it (REPLICA IDENTITY
    FULL: no column list keeps it out of the log) is dropped under `include`; under
    `exclude` it is a drift, and the table reloads."""
    from replicator.cdc.rows.shaped_log import LogShape, LogShaping

    logged = [("id", 23), ("name", 25), ("card", 25)]
    copied = {"columns": ("id", "name"), "types": {"id": 23, "name": 25}}
    kept = LogShaping(**copied, excluded=frozenset(), forms={}, salt=b"", listed_only=True)
    shape = kept.for_relation(logged)
    assert isinstance(shape, LogShape) and shape.keep == (0, 1)
    drifted = LogShaping(**copied, excluded=frozenset(), forms={}, salt=b"")
    assert drifted.for_relation(logged) == "in the log: card added"


def test_an_include_of_every_column_still_lists_them_so_a_new_one_stays_out(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """`include` naming every column the table has today: the publication still gets a
    column list, so the column added later is not in the log either."""
    table = sql.Identifier(schema, "plain")
    writer.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, name text)").format(table))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'n' FROM generate_series(1, 20) g").format(table)
    )
    entry = {"name": f"{schema}.plain", "mode": "cdc", "columns": {"include": ["id", "name"]}}
    cdc_project.write_config({"tables": [entry]})
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(sql.SQL("ALTER TABLE {} ADD COLUMN card text").format(table))
    writer.execute(sql.SQL("UPDATE {} SET card = 'CARD-9', name = 'x' WHERE id <= 5").format(table))
    (listed,) = source_conn.execute(
        "SELECT attnames FROM pg_publication_tables WHERE schemaname = %s", (schema,)
    ).fetchone()
    assert listed == ["id", "name"], listed
    applied = cdc_project.run("sync")
    assert applied.exit_code == 0, applied.output
    assert f"{schema}.plain: incremental" in applied.stderr, applied.stderr
    copied = dest_conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(table)).fetchall()
    assert copied[:6] == [(1, "x"), (2, "x"), (3, "x"), (4, "x"), (5, "x"), (6, "n")], copied


# Rows moved in and out of `active AND tier >= 2` while a sync runs.
EVENTS_UPDATE = (
    "UPDATE {} SET tier = (tier + 1) %% 4, active = NOT active, note = 'w' || %(n)s::text "
    "WHERE id = %(id)s"
)


def test_a_where_beyond_the_replica_identity_runs_at_the_apply(
    cdc_project, schema, writer, source_conn, dest_conn, pg_servers
):
    """A `cdc` filter over columns outside the replica identity (it was refused, with
    REPLICA IDENTITY FULL as the fix, which DBAs resist on hot tables): its columns are
    stored plain (never TOASTed), so every change carries them, and the apply runs it over
    each change's new row; a row an update takes out of it is deleted by key. The
    publication sends every row; `check` and `compile` say where the filter runs."""
    table = sql.Identifier(schema, "events")
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, tier int NOT NULL, active boolean NOT NULL, "
            "note text)"
        ).format(table)
    )
    writer.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, g % 4, g % 3 <> 0, 'n' || g FROM generate_series(1, 300) g"
        ).format(table)
    )
    where = "active AND tier >= 2"
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.events", "mode": "cdc", "where": where}]}
    )
    checked = cdc_project.run("check")
    assert checked.exit_code == 0, checked.output
    assert (
        f"ok    {schema}.events: where runs at the apply, over each change's new row"
        in checked.stdout
    ), checked.stdout
    assert f"warn  {schema}.events: column(s) note may hold TOASTed values" in checked.stdout
    compiled = cdc_project.run("compile", "-s", f"{schema}.events")
    assert "SET \"_replicator_op\" = 'D' WHERE" in compiled.stdout, compiled.stdout
    assert "-- where runs at the apply, over each change's new row" in compiled.stdout

    def copy():
        return dest_conn.execute(sql.SQL("SELECT * FROM {} ORDER BY id").format(table)).fetchall()

    def expected():
        return source_conn.execute(
            sql.SQL("SELECT * FROM {} WHERE {} ORDER BY id").format(table, sql.SQL(where))
        ).fetchall()

    assert cdc_project.run("sync").exit_code == 0
    assert copy() == expected()
    (row_filter,) = source_conn.execute(
        "SELECT rowfilter FROM pg_publication_tables WHERE schemaname = %s AND tablename = %s",
        (schema, "events"),
    ).fetchone()
    assert row_filter is None, "the publication sends every row"
    writer.execute(sql.SQL("UPDATE {} SET active = false WHERE id IN (2, 10)").format(table))
    writer.execute(
        sql.SQL("UPDATE {} SET tier = 3, active = true WHERE id IN (4, 8)").format(table)
    )
    writer.execute(sql.SQL("UPDATE {} SET id = 9000 WHERE id = 11").format(table))  # a key moved
    writer.execute(
        sql.SQL("INSERT INTO {} VALUES (901, 3, true, 'in'), (902, 0, true, 'out')").format(table)
    )
    writer.execute(sql.SQL("DELETE FROM {} WHERE id IN (14, 15)").format(table))
    stop = threading.Event()
    live = threading.Thread(
        target=_writes, args=(stop, pg_servers.source_url, schema, "events", 300, EVENTS_UPDATE)
    )
    live.start()
    try:
        during = cdc_project.run("sync")
    finally:
        stop.set()
        live.join()
    assert during.exit_code == 0, during.output
    after = cdc_project.run("sync")
    assert after.exit_code == 0, after.output
    assert copy() == expected()
    verified = cdc_project.run("verify", "--json")
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.stdout)[0]["status"] == "equal"

    # A row out of the filter with a TOASTed note, brought in by an update that leaves the
    # note as it was: neither the log nor the copy holds it. The table fails, says why and
    # the fix, and its next sync reloads it with that reason (status says so meanwhile).
    big = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) AS g)"
    writer.execute(
        sql.SQL("UPDATE {} SET active = false, note = " + big + " WHERE id = 30").format(table)
    )
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(sql.SQL("UPDATE {} SET active = true, tier = 3 WHERE id = 30").format(table))
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1, failed.output
    assert "left a TOASTed value as it was" in failed.stderr, failed.stderr
    assert "(the first: id 30)" in failed.stderr and "REPLICA IDENTITY FULL" in failed.stderr
    (row,) = json.loads(cdc_project.run("status", "--json").stdout)
    assert row["next_action"].startswith("full_reload: the log could not be applied"), row
    reloaded = cdc_project.run("sync")
    assert reloaded.exit_code == 0, reloaded.output
    assert "reason: the log could not be applied" in reloaded.stderr
    assert copy() == expected()


def test_a_where_the_apply_runs_is_not_held_to_a_row_filters_limits(cdc_project, schema, writer):
    """A cast (`tier::text = '2'`) is no expression a publication's row filter takes; a filter
    the apply runs is not one (it was refused as 'invalid publication WHERE expression')."""
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, tier int NOT NULL)").format(
            sql.Identifier(schema, "tiers")
        )
    )
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.tiers", "mode": "cdc", "where": "tier::text = '2'"}]}
    )
    checked = cdc_project.run("check")
    assert checked.exit_code == 0, checked.stdout
    assert f"ok    {schema}.tiers: where runs at the apply" in checked.stdout
