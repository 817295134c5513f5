"""`tables[].name` as a pattern (`"sales.*"`): matched against the source's catalog at every
run, with `exclude`, a `schema.*` destination, explicit entries winning, partitions never
matched alone, `replicator ls`, and a table created (or dropped) between two runs."""

from __future__ import annotations

import json
import threading

import pytest
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark


def _table(conn, schema, name, rows=200, key=True):
    target = sql.Identifier(schema, name)
    updated = ", updated_at timestamptz NOT NULL DEFAULT now()" if key else ""
    conn.execute(
        sql.SQL(f"CREATE TABLE {{}} (id int PRIMARY KEY, note text{updated})").format(target)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note) SELECT g, 'n' || g FROM generate_series(1, %s) g"
        ).format(target),
        (rows,),
    )


def _writes_until(stop, url, schema, name):
    """Rows inserted into one matched table while a sync runs (a live source)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        next_id = 100_000
        while not stop.is_set():
            conn.execute(
                sql.SQL("INSERT INTO {} (id, note) VALUES (%s, 'live')").format(
                    sql.Identifier(schema, name)
                ),
                (next_id,),
            )
            next_id += 1


def test_a_pattern_syncs_its_matches_and_a_table_created_between_two_runs(
    db_project, schema, source_conn, dest_conn, pg_servers
):
    for name in ("alpha", "beta", "gamma_tmp"):
        _table(source_conn, schema, name)
    events = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int, at date NOT NULL, updated_at timestamptz NOT NULL "
            "DEFAULT now(), PRIMARY KEY (id, at)) PARTITION BY RANGE (at)"
        ).format(events)
    )
    for part, low, high in (
        ("events_2025", "2025-01-01", "2026-01-01"),
        ("events_2026", "2026-01-01", "2027-01-01"),
    ):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(schema, part), events, sql.Literal(low), sql.Literal(high)
            )
        )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, at) SELECT g, date '2025-06-01' + g FROM generate_series(1, 400) g"
        ).format(events)
    )
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.*",
                    "replication_key": "updated_at",
                    "exclude": [f"{schema}.*_tmp"],
                },
                {"name": f"{schema}.beta", "mode": "full-refresh"},
            ]
        }
    )

    listed = db_project.run("ls", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["entry"], r["pattern"], r["mode"]) for r in rows] == [
        (f"{schema}.alpha", 0, f"{schema}.*", "incremental-deduped"),
        (f"{schema}.events", 0, f"{schema}.*", "incremental-deduped"),
        (f"{schema}.beta", 1, None, "full-refresh"),
    ]
    assert rows[1]["primary_key"] == ["id", "at"] and rows[1]["replication_key"] == "updated_at"

    compiled = db_project.run("compile", "--json")
    assert compiled.exit_code == 0, compiled.output
    assert [t["name"] for t in json.loads(compiled.stdout)] == [r["name"] for r in rows]
    checked = db_project.run("check")
    assert (
        f"ok    tables: tables[0] ({schema}.*) matches 2 table(s): {schema}.alpha, {schema}.events"
        in checked.stdout
    ), checked.stdout
    first = db_project.run("sync")
    assert first.exit_code == 0, first.output
    assert f"{schema}.alpha: full_reload" in first.stderr
    assert f"reason: no state: new table matched {schema}.*" in first.stderr
    for name in ("alpha", "beta", "events"):
        assert_same_table(source_conn, dest_conn, schema, name, key="id")
    assert dest_conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename LIKE %s",
        (schema, "%_20%"),
    ).fetchone() == (0,), "a partition was copied on its own"

    # Between two runs: a new table appears, one matched table goes away, one has no
    # replication key; a writer keeps inserting into another while the run goes on.
    _table(source_conn, schema, "delta", rows=300)
    _table(source_conn, schema, "epsilon", rows=10, key=False)
    source_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "alpha")))
    stop = threading.Event()
    live = threading.Thread(
        target=_writes_until, args=(stop, pg_servers.source_url, schema, "beta")
    )
    live.start()
    try:
        second = db_project.run("sync")
    finally:
        stop.set()
        live.join()
    assert second.exit_code == 1, second.output  # epsilon fails, alone
    assert f"{schema}.delta: full_reload" in second.stderr
    assert f"reason: no state: new table matched {schema}.*" in second.stderr
    assert f"{schema}.alpha matched tables[0] ({schema}.*) at an earlier run and is gone" in (
        second.stderr
    )
    assert f'add "{schema}.epsilon" to its "exclude"' in second.stderr
    assert dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "alpha"))
    ).fetchone() == (200,), "the copy of a table gone from the source is kept"
    assert f"until `replicator state reset {schema}.alpha` removes it" in second.stderr
    forgotten = db_project.run("state", "reset", f"{schema}.alpha")
    assert forgotten.exit_code == 0, forgotten.output
    assert f"{schema}.alpha: gone from the source; its state removed" in forgotten.output
    assert "is gone" not in db_project.run("ls").output

    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.*",
                    "replication_key": "updated_at",
                    "exclude": [f"{schema}.*_tmp", f"{schema}.epsilon"],
                },
                {"name": f"{schema}.beta", "mode": "full-refresh"},
            ]
        }
    )
    third = db_project.run("sync")
    assert third.exit_code == 0, third.output
    for name in ("beta", "delta", "events"):
        assert_same_table(source_conn, dest_conn, schema, name, key="id")
    verified = db_project.run("verify", "--json")
    assert verified.exit_code == 0, verified.output
    assert [v["name"] for v in json.loads(verified.stdout)] == [
        f"{schema}.delta",
        f"{schema}.events",
        f"{schema}.beta",
    ]
    status = db_project.run("status", "--json")
    assert [r["name"] for r in json.loads(status.stdout)] == [
        f"{schema}.delta",
        f"{schema}.events",
        f"{schema}.beta",
    ]


def test_a_pattern_copies_into_another_schema_and_a_clash_fails_that_table_alone(
    db_project, schema, source_conn, dest_conn
):
    other = f"{schema}_b"
    raw = f"{schema}_raw"
    source_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(other)))
    try:
        _table(source_conn, schema, "orders")
        _table(source_conn, schema, "items")
        _table(source_conn, other, "orders", rows=5)
        db_project.write_config(
            {
                "tables": [
                    {"name": f"{schema}.*", "mode": "full-refresh", "destination": f"{raw}.*"},
                    {"name": f"{other}.*", "mode": "full-refresh", "destination": f"{raw}.*"},
                ]
            }
        )
        listed = json.loads(db_project.run("ls", "--json").stdout)
        assert [(r["name"], r["destination"]) for r in listed] == [
            (f"{schema}.items", f"{raw}.items"),
            (f"{schema}.orders", f"{raw}.orders"),
            (f"{other}.orders", f"{raw}.orders"),
        ]
        synced = db_project.run("sync")
        assert synced.exit_code == 1, synced.output
        assert (
            f"{other}.orders: failed after" in synced.stderr
            and f"its destination {raw}.orders is already the copy of {schema}.orders"
            in synced.stderr
        )
        copied = dest_conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(raw, "orders"))
        ).fetchone()
        assert copied == (200,), "the clashing match never wrote the first one's copy"
    finally:
        source_conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(other)))
        dest_conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(raw)))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "sales.*", "mode": "full-refresh", "destination": "raw.orders"},
            'its destination must be "schema.*"',
        ),
        (
            {"name": "sales.orders", "mode": "full-refresh", "destination": "raw.*"},
            'is a pattern, but name "sales.orders" is one table',
        ),
        (
            {"name": "sales.orders", "mode": "full-refresh", "exclude": ["sales.x"]},
            '"exclude" applies to a pattern name',
        ),
        (
            {"name": "sales.*", "mode": "full-refresh", "destination": "r*.*"},
            'a pattern\'s destination is "schema.*"',
        ),
        ({"name": "*", "mode": "full-refresh"}, 'expected a pattern like "schema.*"'),
        (
            {"name": "many.t_%", "mode": "full-refresh"},
            'a pattern is a glob, not SQL LIKE: write "many.t_*"',
        ),
        (
            {"name": "many", "mode": "full-refresh"},
            'for every table of schema many, write "many.*"',
        ),
    ],
)
def test_a_pattern_entry_that_cannot_work_is_refused_before_anything_runs(project, entry, message):
    project.write_config({"tables": [entry]})
    result = project.run("ls")
    assert result.exit_code == 2
    assert "tables[0]" in result.stderr and message in result.stderr, result.stderr


def test_the_screen_of_many_tables_sees_a_rewritten_row_and_a_tied_one(
    db_project, schema, source_conn, dest_conn
):
    """The tables of a run are probed together before any is synced (sync/probe_many.py).
    Every row of each table shares one `updated_at`, so each probe reads them all: a row
    rewritten in place keeps the count and the newest key (only the hash tells), a row
    added at the cursor adds one past what the last sync read there, and an untouched
    table is a noop."""
    for name in ("rewritten", "tied", "untouched"):
        _table(source_conn, schema, name, rows=10)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.*", "replication_key": "updated_at", "lookback": 0}]}
    )
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'rewritten' WHERE id = 3").format(
            sql.Identifier(schema, "rewritten")
        )
    )
    tied = sql.Identifier(schema, "tied")
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {0} (id, note, updated_at) SELECT 11, 'tied', max(updated_at) FROM {0}"
        ).format(tied)
    )
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    for name in ("rewritten", "tied"):
        assert f"{schema}.{name}: incremental, " in result.stderr, result.stderr
        assert_same_table(source_conn, dest_conn, schema, name)
    assert f"{schema}.untouched: noop" in result.stderr


def test_a_source_out_of_reach_fails_each_matched_table_and_records_it(
    db_project, schema, source_conn
):
    """A pattern cannot be matched without the source's catalog: the run matches it against
    the tables sync-state knows, and each fails with the connection's error, recorded as its
    last run (status), as in a project without patterns. `state show` needs no database."""
    from replicator.postgres.pgcluster import free_port

    for name in ("alpha", "beta"):
        _table(source_conn, schema, name, rows=5)
    db_project.write_config({"tables": [{"name": f"{schema}.*", "replication_key": "updated_at"}]})
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    env = {"REPLICATOR_SOURCE_URL": unreachable}
    first = db_project.run("sync", env=env)  # sync-state knows no table yet: nothing to say
    assert first.exit_code == 1 and "cannot connect to the source" in first.stderr, first.output
    assert db_project.run("sync").exit_code == 0
    named = db_project.run("sync", "-s", f"{schema}.gamma", env=env)  # not in sync-state
    assert named.exit_code == 1 and "cannot connect to the source" in named.stderr, named.output
    failed = db_project.run("sync", env=env)
    assert failed.exit_code == 1, failed.output
    error = "cannot connect to the source database"
    assert failed.stderr.count(error) == 1, failed.stderr
    assert "2 of 2 table(s) not synced" in failed.stderr, failed.stderr
    rows = json.loads(db_project.run("status", "--json", env=env).stdout)
    names = [f"{schema}.alpha", f"{schema}.beta"]
    assert [(r["name"], r["last_status"]) for r in rows] == [(n, "failure") for n in names]
    assert all(r["last_error"].startswith(error) for r in rows)
    shown = db_project.run("state", "show", env=env)
    assert shown.exit_code == 0, shown.output
    assert sorted(json.loads(shown.stdout)) == names
    assert error in shown.stderr


def test_a_table_named_by_hand_that_never_existed_is_not_reported_gone(
    db_project, schema, source_conn
):
    """A typo'd entry fails its run, whose state file records that run. Once the entry is
    gone, a pattern that would match the name does not call it a table gone from the
    source: no sync ever copied it."""
    _table(source_conn, schema, "alpha", rows=5)
    key = {"replication_key": "updated_at"}
    db_project.write_config(
        {"tables": [{"name": f"{schema}.alpha", **key}, {"name": f"{schema}.alhpa", **key}]}
    )
    assert db_project.run("sync").exit_code == 1
    db_project.write_config({"tables": [{"name": f"{schema}.*", **key}]})
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert "gone" not in synced.stderr, synced.stderr


def test_a_pattern_with_capitals_joins_a_quoted_piece_and_a_glob(
    db_project, schema, source_conn, dest_conn
):
    """`"Orders"*`: a quoted piece keeps its capitals, the glob after it matches on; an
    unquoted `Orders*` folds to lower case, as SQL reads it."""
    for name in ("Orders2024", "Orders_EU", "orders_lower", "Other"):
        _table(source_conn, schema, name, rows=20)
    db_project.write_config(
        {"tables": [{"name": f'{schema}."Orders"*', "replication_key": "updated_at"}]}
    )
    listed = db_project.run("ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert sorted(t["name"] for t in json.loads(listed.stdout)) == [
        f'{schema}."Orders2024"',
        f'{schema}."Orders_EU"',
    ]
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    for name in ("Orders2024", "Orders_EU"):
        assert assert_same_table(source_conn, dest_conn, schema, name) == 20
    db_project.write_config(
        {"tables": [{"name": f"{schema}.Orders*", "replication_key": "updated_at"}]}
    )
    folded = db_project.run("ls", "--json")
    assert [t["name"] for t in json.loads(folded.stdout)] == [f"{schema}.orders_lower"]
    db_project.write_config(
        {"tables": [{"name": f"{schema}.Other*", "replication_key": "updated_at"}]}
    )
    nothing = db_project.run("ls")
    assert "matches no table in the source (capitals outside double quotes fold" in (
        nothing.output
    ), nothing.output


def test_the_fix_for_a_quoted_name_a_pattern_chose_is_written_as_json_takes_it(
    db_project, schema, source_conn
):
    """A table the pattern chose fails (no replication key): the fix names it as the
    "exclude" list must hold it, a JSON string with its quotes escaped, not a name wrapped
    in a second pair of quotes."""
    _table(source_conn, schema, "Fine", rows=5)
    _table(source_conn, schema, "No Key", rows=5, key=False)
    db_project.write_config({"tables": [{"name": f"{schema}.*", "replication_key": "updated_at"}]})
    synced = db_project.run("sync")
    assert synced.exit_code == 1, synced.output
    written = json.dumps(f'{schema}."No Key"')
    assert f'add {written} to its "exclude" (as JSON writes it)' in synced.stderr, synced.stderr


def test_a_patterns_excluded_column_stays_in_the_source_wherever_a_table_has_it(
    db_project, schema, source_conn, dest_conn
):
    """One entry keeps `password_hash` out of every table it matches: a table without the
    column is copied whole, one with it without it; a table with a column close to the
    name (a typo in the config, or in the table) fails with the hint, never copied."""
    for name, extra in (
        ("users", ", password_hash text"),
        ("orders", ""),
        ("admins", ", password_hsh text"),
    ):
        source_conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, note text{}, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(schema, name), sql.SQL(extra))
        )
        source_conn.execute(
            sql.SQL("INSERT INTO {} (id, note) SELECT g, 'n' FROM generate_series(1, 5) g").format(
                sql.Identifier(schema, name)
            )
        )
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.*",
                    "replication_key": "updated_at",
                    "columns": {"exclude": ["password_hash"]},
                }
            ]
        }
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 1, synced.output  # admins alone
    assert (
        f"{schema}.admins: failed after" in synced.stderr
        and "columns: no column password_hash in the source table (it has id, note, "
        "password_hsh, updated_at)"
        in synced.stderr
    ), synced.stderr
    assert "did you mean password_hsh for password_hash?" in synced.stderr

    def columns(name):
        return [
            r[0]
            for r in dest_conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (sql.Identifier(schema, name).as_string(dest_conn),),
            )
        ]

    assert columns("users") == ["id", "note", "updated_at"]
    assert columns("orders") == ["id", "note", "updated_at"]
    assert dest_conn.execute(
        "SELECT to_regclass(%s)", (sql.Identifier(schema, "admins").as_string(dest_conn),)
    ).fetchone() == (None,)
    again = db_project.run("sync", "-s", f"{schema}.users", "-s", f"{schema}.orders")
    assert again.exit_code == 0, again.output
    assert f"{schema}.users: noop" in again.stderr and f"{schema}.orders: noop" in again.stderr
    # A model of a table without the column that returns one of that name (from a join,
    # say) is shaped as the entry says: here it reads an excluded column, and fails.
    db_project.write(
        f"models/{schema}/orders.sql",
        "SELECT id, note, 'secret' AS password_hash, updated_at FROM {{ source }}",
    )
    modelled = db_project.run("sync", "-s", f"{schema}.orders")
    assert modelled.exit_code == 1, modelled.output
    assert "reads excluded column(s) password_hash" in modelled.stderr, modelled.stderr
    assert "password_hash" not in columns("orders")


def test_ls_writes_key_columns_as_it_writes_names(project):
    """`ls --json` gave `name` as written in SQL (quotes where needed) and the key columns
    bare: a column with capitals read as another one."""
    project.write_config(
        {
            "tables": [
                {
                    "name": '"Sales".Orders',
                    "replication_key": '"UpdatedAt"',
                    "primary_key": ['"ID"', "line"],
                }
            ]
        }
    )
    listed = project.run("ls", "--json")
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert (row["name"], row["replication_key"], row["primary_key"]) == (
        '"Sales".Orders',
        '"UpdatedAt"',
        ['"ID"', "line"],
    )


def test_a_pattern_written_wrong_that_leaves_copies_behind_fails_the_run(
    db_project, schema, source_conn, httpserver
):
    """`orders` written `order` in a pattern: it matches nothing, and the tables it copied
    are kept current no more. The run said `0 table(s)`, exit 0; now it names them, offers
    the pattern meant, and exits 1 (check says it as an error, the webhook as a warning)."""
    for name in ("orders", "orders_eu"):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at int NOT NULL)").format(
                sql.Identifier(schema, name)
            )
        )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders*", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    typo = {"tables": [{"name": f"{schema}.ordr*", "replication_key": "updated_at"}]}
    db_project.write_config({**typo, "webhook": {"url": httpserver.url_for("/hook")}})
    failed = db_project.run("sync")
    assert failed.exit_code == 1, failed.output
    said = (
        f"tables[0] ({schema}.ordr*) matches no table in the source, and sync-state holds 2 "
        f"table(s) it copied that no entry selects now ({schema}.orders, {schema}.orders_eu): "
        f"their copies are no longer kept current; did you mean {schema}.orders?"
    )
    assert said in failed.stderr, failed.stderr
    assert said in httpserver.log[-1][0].get_json()["warnings"]
    checked = db_project.run("check")
    assert f"error tables: {said}" in checked.stdout, checked.stdout


def test_a_pattern_selects_tables_on_the_command_line(db_project, schema, source_conn):
    """`-s 'tenant_*.orders'` for a hundred tenants (each had to be typed), and `adopt` the
    same way; a pattern that selects nothing is exit 2."""
    for name in ("t_1", "t_2", "u_1"):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, name))
        )
    db_project.write_config({"tables": [{"name": f"{schema}.*", "mode": "full-refresh"}]})
    synced = db_project.run("sync", "-s", f"{schema}.t_*")
    assert synced.exit_code == 0, synced.output
    assert "sync started: 2 table(s)" in synced.stderr, synced.stderr
    listed = json.loads(db_project.run("ls", "--json", "-s", f"{schema}.t_*").stdout)
    assert [r["name"] for r in listed] == [f"{schema}.t_1", f"{schema}.t_2"]
    adopted = db_project.run("adopt", f"{schema}.t_*")
    assert adopted.exit_code == 0 and adopted.stdout.count("already replicator's") == 2
    nothing = db_project.run("sync", "-s", f"{schema}.x_*")
    assert nothing.exit_code == 2
    assert f"{schema}.x_* matches no table of tables-config.json" in nothing.stderr
