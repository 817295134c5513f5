"""Schema drift against real clusters: a changed table reloads alone, with its reason."""

from __future__ import annotations

import json

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark


def _tables(source_conn: psycopg.Connection, schema: str) -> None:
    """`orders` (the one that changes, with an enum column) and `other` (never changes)."""
    s = sql.Identifier(schema)
    source_conn.execute(
        sql.SQL("CREATE TYPE {}.{} AS ENUM ('new', 'paid')").format(s, sql.Identifier("state"))
    )
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.orders (id bigint PRIMARY KEY, amount numeric(12,2), "
            "note text, state {s}.state NOT NULL DEFAULT 'new', "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(s=s)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {}.orders (id, amount, note, updated_at) SELECT g, g / 4.0, 'n' || g, "
            "'2025-01-01'::timestamptz + g * interval '1 minute' FROM generate_series(1, 500) g"
        ).format(s)
    )
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.other (id int PRIMARY KEY, v text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(s=s)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {}.other (id, v) SELECT g, 'v' FROM generate_series(1, 50) g").format(
            s
        )
    )


def _config(project, schema: str, **orders_extra) -> None:
    project.write_config(
        {
            "tables": [
                {"name": f"{schema}.orders", "replication_key": "updated_at", **orders_extra},
                {"name": f"{schema}.other", "replication_key": "updated_at"},
            ]
        }
    )


def sync_events(project, *args: str) -> tuple[int, dict[str, dict]]:
    """Run `sync --log-format json`; the exit code and each table's table.finished event."""
    result = project.run("sync", "--log-format", "json", *args)
    events = {}
    for line in result.stderr.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "table.finished":
                events[event["name"]] = event
    return result.exit_code, events


@pytest.fixture
def synced(db_project, source_conn, schema):
    """Both tables created, configured and loaded once."""
    _tables(source_conn, schema)
    _config(db_project, schema)
    code, events = sync_events(db_project)
    assert code == 0, events
    return db_project


def _q(schema: str, text: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema))


CHANGES = [
    pytest.param(
        ["ALTER TABLE {s}.orders ADD COLUMN region text NOT NULL DEFAULT 'eu'"],
        "schema changed: column added: region text NOT NULL",
        id="column-added-with-default",
    ),
    pytest.param(
        ["ALTER TABLE {s}.orders DROP COLUMN note"],
        "schema changed: column dropped: note",
        id="column-dropped",
    ),
    pytest.param(
        ["ALTER TABLE {s}.orders ALTER COLUMN amount TYPE numeric(16,4)"],
        "schema changed: type changed: amount numeric(12,2) -> numeric(16,4)",
        id="type-widened",
    ),
    pytest.param(
        ["ALTER TABLE {s}.orders ALTER COLUMN note TYPE varchar(8)"],
        "schema changed: type changed: note text -> character varying(8)",
        id="type-narrowed",
    ),
    pytest.param(
        # the same type: the values change in place, and neither the log nor a cursor says
        # so (the copy kept `n1` where the source had `N1`, exit 0)
        ["ALTER TABLE {s}.orders ALTER COLUMN note TYPE text USING upper(note)"],
        "schema changed: column rewritten: note (the table was rewritten",
        id="column-rewritten-in-place",
    ),
    pytest.param(
        ["ALTER TABLE {s}.orders RENAME COLUMN note TO remark"],
        "schema changed: column renamed: note -> remark",
        id="column-renamed",
    ),
    pytest.param(
        [
            "ALTER TYPE {s}.state ADD VALUE 'refunded'",
            "UPDATE {s}.orders SET state = 'refunded', updated_at = clock_timestamp() "
            "WHERE id <= 3",
        ],
        "schema changed: enum label added: {schema}.state 'refunded'",
        id="enum-label-added",
    ),
    pytest.param(
        [
            "ALTER TABLE {s}.orders DROP CONSTRAINT orders_pkey",
            "ALTER TABLE {s}.orders ADD PRIMARY KEY (id, updated_at)",
        ],
        "schema changed: primary key changed: (id) -> (id, updated_at)",
        id="primary-key-changed",
    ),
    pytest.param(
        [
            "ALTER TABLE {s}.orders RENAME TO orders_old",
            "CREATE TABLE {s}.orders (LIKE {s}.orders_old INCLUDING ALL)",
            "INSERT INTO {s}.orders SELECT * FROM {s}.orders_old WHERE id % 2 = 0",
        ],
        "schema changed: table recreated: dropped and created again",
        id="table-recreated",
    ),
]


@pytest.mark.parametrize(("statements", "reason"), CHANGES)
def test_a_changed_table_reloads_alone(synced, source_conn, dest_conn, schema, statements, reason):
    for statement in statements:
        source_conn.execute(_q(schema, statement))
    source_conn.execute(
        _q(
            schema,
            "UPDATE {s}.other SET v = 'changed', updated_at = clock_timestamp() WHERE id = 7",
        )
    )
    code, events = sync_events(synced)
    assert code == 0, events
    orders, other = events[f"{schema}.orders"], events[f"{schema}.other"]
    assert orders["action"] == "full_reload"
    assert orders["reason"].startswith(reason.format(schema=schema)), orders["reason"]
    assert other["action"] == "incremental", other
    assert assert_same_table(source_conn, dest_conn, schema, "orders") > 0
    assert assert_same_table(source_conn, dest_conn, schema, "other") == 50
    # The reload stored the new signature: the next run is incremental again.
    code, events = sync_events(synced)
    assert code == 0
    assert events[f"{schema}.orders"]["action"] == "noop", events


def test_a_column_the_copy_leaves_out_rewritten_in_place_reloads_it(
    synced, source_conn, dest_conn, schema
):
    """The copy does not hold `note`, but its `where` reads it: rewritten in place, the rows
    it lets in are others (a model that reads a column without returning it is the same)."""
    _config(synced, schema, columns={"exclude": ["note"]}, where="note <> 'N7'", deletes="delete")
    code, events = sync_events(synced)
    assert code == 0 and events[f"{schema}.orders"]["action"] == "full_reload", events
    source_conn.execute(
        _q(schema, "ALTER TABLE {s}.orders ALTER COLUMN note TYPE text USING upper(note)")
    )
    code, events = sync_events(synced)
    assert code == 0
    orders = events[f"{schema}.orders"]
    assert orders["action"] == "full_reload", orders
    assert orders["reason"].startswith("schema changed: column rewritten: note"), orders
    (copied,) = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
    ).fetchone()
    assert copied == 499


def test_a_rewrite_that_changes_no_column_reloads_nothing(synced, source_conn, schema):
    """VACUUM FULL and CLUSTER give the table new storage but leave every value and column
    as it was: the copy goes on (only a rewrite with a column altered reloads it). They
    also write again the catalog row of a column added with a default (its value kept
    aside until then, `atthasmissing`): that was taken for a column rewritten."""
    source_conn.execute(_q(schema, "ALTER TABLE {s}.orders ADD COLUMN flag int NOT NULL DEFAULT 0"))
    code, events = sync_events(synced)
    assert code == 0 and events[f"{schema}.orders"]["action"] == "full_reload", events
    source_conn.execute(_q(schema, "VACUUM FULL {s}.orders"))
    source_conn.execute(_q(schema, "CLUSTER {s}.orders USING orders_pkey"))
    code, events = sync_events(synced)
    assert code == 0
    assert events[f"{schema}.orders"]["action"] == "noop", events
    source_conn.execute(
        _q(schema, "ALTER TABLE {s}.orders ALTER COLUMN flag TYPE int USING flag + 1")
    )
    code, events = sync_events(synced)
    assert code == 0
    reason = events[f"{schema}.orders"]["reason"]
    assert reason.startswith("schema changed: column rewritten: flag"), reason


def test_on_schema_change_fail_fails_only_that_table(synced, source_conn, dest_conn, schema):
    _config(synced, schema, on_schema_change="fail")
    source_conn.execute(_q(schema, "ALTER TABLE {s}.orders ADD COLUMN region text"))
    source_conn.execute(_q(schema, "UPDATE {s}.other SET v = 'x', updated_at = now() WHERE id = 1"))
    code, events = sync_events(synced)
    assert code == 1
    orders, other = events[f"{schema}.orders"], events[f"{schema}.other"]
    assert orders["status"] == "failure"
    assert "schema changed: column added: region text" in orders["error"]
    assert 'on_schema_change is "fail"' in orders["error"]
    assert other["status"] == "success" and other["action"] == "incremental"
    # The destination kept its old shape; the user's explicit reload then applies the change.
    assert "region" not in {
        r[0]
        for r in dest_conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass",
            (f"{schema}.orders",),
        )
    }
    code, events = sync_events(synced, "-f", "-s", f"{schema}.orders")
    assert code == 0 and events[f"{schema}.orders"]["reason"] == "--full-refresh"
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_top_level_policy_applies_to_every_table(synced, source_conn, schema):
    synced.write_config(
        {
            "on_schema_change": "fail",
            "tables": [
                {"name": f"{schema}.orders", "replication_key": "updated_at"},
                {
                    "name": f"{schema}.other",
                    "replication_key": "updated_at",
                    "on_schema_change": "full_reload",
                },
            ],
        }
    )
    source_conn.execute(_q(schema, "ALTER TABLE {s}.orders ADD COLUMN a int"))
    source_conn.execute(_q(schema, "ALTER TABLE {s}.other ADD COLUMN b int"))
    code, events = sync_events(synced)
    assert code == 1
    assert events[f"{schema}.orders"]["status"] == "failure"
    assert events[f"{schema}.other"]["action"] == "full_reload"


def test_dropping_the_destination_table_reloads_it(synced, source_conn, dest_conn, schema):
    dest_conn.execute(_q(schema, "DROP TABLE {s}.orders"))
    code, events = sync_events(synced)
    assert code == 0
    assert events[f"{schema}.orders"]["action"] == "full_reload"
    assert events[f"{schema}.orders"]["reason"] == "destination table missing"
    assert events[f"{schema}.other"]["action"] == "noop"
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500


def test_an_altered_destination_table_is_reloaded(synced, source_conn, dest_conn, schema):
    dest_conn.execute(_q(schema, "ALTER TABLE {s}.orders ADD COLUMN mine int"))
    dest_conn.execute(_q(schema, "ALTER TABLE {s}.orders ALTER COLUMN note TYPE varchar(20)"))
    code, events = sync_events(synced)
    assert code == 0
    orders = events[f"{schema}.orders"]
    assert orders["action"] == "full_reload"
    assert orders["reason"] == (
        "destination table altered: type changed: note text -> character varying(20); "
        "column added: mine integer"
    )
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500


def test_refresh_reloads_exactly_the_marked_tables_once(synced, source_conn, dest_conn, schema):
    result = synced.run("refresh", f"{schema}.other")
    assert result.exit_code == 0
    status = {r["name"]: r for r in json.loads(synced.run("status", "--json").stdout)}
    assert status[f"{schema}.other"]["next_action"] == "full_reload: refresh requested"
    assert status[f"{schema}.orders"]["next_action"] == "incremental"
    code, events = sync_events(synced)
    assert code == 0
    assert events[f"{schema}.other"]["action"] == "full_reload"
    assert events[f"{schema}.other"]["reason"] == "refresh requested"
    assert events[f"{schema}.orders"]["action"] == "noop"
    code, events = sync_events(synced)
    assert events[f"{schema}.other"]["action"] == "noop", "the mark clears after the swap"


def test_a_failed_refresh_keeps_its_mark(synced, source_conn, schema):
    assert synced.run("refresh", f"{schema}.other").exit_code == 0
    failed = synced.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "after-load-before-swap"}
    )
    assert failed.returncode != 0
    state = json.loads(synced.run("state", "show", f"{schema}.other").stdout)
    assert state[f"{schema}.other"]["pending_full_reload"] is True
    code, events = sync_events(synced)
    assert events[f"{schema}.other"]["reason"] == "refresh requested"
    assert code == 0


def _row_ids(conn, schema: str) -> list[int]:
    return [r[0] for r in conn.execute(_q(schema, "SELECT id FROM {s}.orders ORDER BY id"))]


def test_skip_backfill_copies_no_existing_row(db_project, source_conn, dest_conn, schema):
    _tables(source_conn, schema)
    # Existing rows a day apart: only the newest one ties with the starting cursor.
    source_conn.execute(
        _q(
            schema,
            "UPDATE {s}.orders SET updated_at = '2024-01-01'::timestamptz + id * interval '1 day'",
        )
    )
    _config(db_project, schema, initial_load="skip")
    code, events = sync_events(db_project)
    assert code == 0, events
    orders = events[f"{schema}.orders"]
    assert orders["action"] == "noop" and orders["rows"] == 0
    assert orders["reason"].startswith("no state: initial_load skip: destination table created")
    assert _row_ids(dest_conn, schema) == []
    assert events[f"{schema}.other"]["action"] == "full_reload"
    # Later changes are picked up; existing rows other than the tie at the start are not.
    source_conn.execute(
        _q(schema, "UPDATE {s}.orders SET note = 'later', updated_at = now() WHERE id IN (2, 3)")
    )
    source_conn.execute(_q(schema, "INSERT INTO {s}.orders (id, amount) VALUES (501, 1)"))
    code, events = sync_events(db_project)
    assert code == 0 and events[f"{schema}.orders"]["action"] == "incremental"
    assert _row_ids(dest_conn, schema) == [2, 3, 500, 501]
    source_rows = source_conn.execute(
        _q(schema, "SELECT md5(o::text) FROM {s}.orders o WHERE id IN (2, 3, 500, 501) ORDER BY id")
    ).fetchall()
    dest_rows = dest_conn.execute(
        _q(schema, "SELECT md5(o::text) FROM {s}.orders o ORDER BY id")
    ).fetchall()
    assert source_rows == dest_rows


def test_skip_backfill_adopts_a_matching_destination_table(
    db_project, source_conn, dest_conn, schema
):
    _tables(source_conn, schema)
    dest_conn.execute(_q(schema, "CREATE TYPE {s}.state AS ENUM ('new', 'paid')"))
    dest_conn.execute(
        _q(
            schema,
            "CREATE TABLE {s}.orders (id bigint PRIMARY KEY, amount numeric(12,2), note text, "
            "state {s}.state NOT NULL, updated_at timestamptz NOT NULL)",
        )
    )
    dest_conn.execute(_q(schema, "INSERT INTO {s}.orders VALUES (1, 0, 'mine', 'new', now())"))
    _config(db_project, schema, initial_load="skip")
    code, events = sync_events(db_project, "-s", f"{schema}.orders")
    assert code == 0, events
    assert "destination table adopted" in events[f"{schema}.orders"]["reason"]
    assert _row_ids(dest_conn, schema) == [1]


def test_skip_backfill_refuses_a_different_destination_table(
    db_project, source_conn, dest_conn, schema
):
    _tables(source_conn, schema)
    dest_conn.execute(_q(schema, "CREATE TABLE {s}.orders (id bigint PRIMARY KEY)"))
    _config(db_project, schema, initial_load="skip")
    code, events = sync_events(db_project, "-s", f"{schema}.orders")
    assert code == 1
    error = events[f"{schema}.orders"]["error"]
    assert "initial_load skip adopts the existing destination table" in error
    assert "column dropped: amount" in error
    state = json.loads(db_project.run("state", "show", f"{schema}.orders").stdout)
    assert state[f"{schema}.orders"]["last_synced_at"] is None


def test_since_re_merges_a_range_without_moving_the_cursor(synced, source_conn, dest_conn, schema):
    name = f"{schema}.orders"
    before = json.loads(synced.run("state", "show", name).stdout)[name]
    # Rows changed behind the tool's back, in the destination: a re-sync of their range
    # restores them from the source, and only them.
    dest_conn.execute(_q(schema, "UPDATE {s}.orders SET note = 'damaged' WHERE id <= 20"))
    low, high = source_conn.execute(
        _q(
            schema,
            "SELECT min(updated_at)::text, max(updated_at)::text FROM {s}.orders WHERE id <= 10",
        )
    ).fetchone()
    code, events = sync_events(synced, "-s", name, "--since", low, "--until", high)
    assert code == 0, events
    event = events[name]
    assert event["action"] == "incremental" and event["rows"] == 10
    assert event["reason"].startswith(f"cursor {before['cursor']['value']} kept; re-sync ")
    damaged = dest_conn.execute(
        _q(schema, "SELECT array_agg(id ORDER BY id) FROM {s}.orders WHERE note = 'damaged'")
    ).fetchone()[0]
    assert damaged == list(range(11, 21))
    after = json.loads(synced.run("state", "show", name).stdout)[name]
    assert after["cursor"] == before["cursor"]
    assert after["window"] == before["window"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--until", "2026-01-01"], "--until needs --since"),
        (["--since", "2026-01-01"], "--since re-syncs one table: name it with -s TABLE"),
        (["-s", "{schema}.orders", "--since", "not a time"], "is not a valid timestamp"),
        (
            ["-s", "{schema}.orders", "--since", "2026-02-01", "--until", "2026-01-01"],
            "is after --until",
        ),
        (["-s", "{schema}.orders", "-f", "--since", "2026-01-01"], "cannot be combined with -f"),
    ],
)
def test_since_rejects_bad_usage_with_exit_2(synced, schema, args, message):
    before = {p.name: p.read_bytes() for p in (synced.path / "sync-state").glob("*.json")}
    result = synced.run("sync", *[a.format(schema=schema) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    after = {p.name: p.read_bytes() for p in (synced.path / "sync-state").glob("*.json")}
    assert after == before


def test_compile_shows_the_plan_the_diff_and_the_reload_ddl(synced, source_conn, dest_conn, schema):
    name = f"{schema}.orders"
    source_conn.execute(_q(schema, "ALTER TABLE {s}.orders ALTER COLUMN amount TYPE numeric(16,4)"))
    source_conn.execute(_q(schema, "ALTER TABLE {s}.orders ADD COLUMN region text"))
    state_before = {p.name: p.read_bytes() for p in (synced.path / "sync-state").iterdir()}
    dest_before = dest_conn.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname IN (%s, '_replicator')",
        (schema,),
    ).fetchone()
    result = synced.run("compile", "-s", name)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert (
        "-- next sync: full_reload (schema changed: type changed: amount numeric(12,2) -> "
        "numeric(16,4); column added: region text)" in out
    )
    assert (
        f'--     ALTER TABLE "{schema}"."orders" ALTER COLUMN "amount" '
        "SET DATA TYPE numeric(16,4);" in out
    )
    assert f'--     ALTER TABLE "{schema}"."orders" ADD COLUMN "region" text;' in out
    assert f'LOCK TABLE "{schema}"."orders" IN ACCESS EXCLUSIVE MODE;' in out

    document = json.loads(synced.run("compile", "--json", "-s", name).stdout)[0]
    assert document["next_action"] == "full_reload"
    assert [c["kind"] for c in document["changes"]["schema"]] == ["type changed", "column added"]
    assert document["changes"]["destination"] == []
    # The reload's statements run, in order, on the destination (rolled back here).
    with dest_conn.transaction(force_rollback=True):
        for statement in document["sql"]["full_reload"]:
            if statement.startswith("--") or statement in ("BEGIN", "COMMIT"):
                continue
            dest_conn.execute(statement)
        columns = dest_conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
            (f"{schema}.orders",),
        ).fetchall()
        assert ("region",) in columns
    # Nothing was written: not in sync-state, not in the destination.
    assert {p.name: p.read_bytes() for p in (synced.path / "sync-state").iterdir()} == state_before
    assert (
        dest_conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname IN (%s, '_replicator')",
            (schema,),
        ).fetchone()
        == dest_before
    )
    # Without a destination to look at, compile still works and says so.
    no_dest = synced.run("compile", "-s", name, env={"REPLICATOR_DEST_URL": None})
    assert no_dest.exit_code == 0
    assert "-- destination not inspected: REPLICATOR_DEST_URL is not set" in no_dest.stdout


def _domain_definition(conn: psycopg.Connection, schema: str, name: str) -> tuple:
    """A domain's default, NOT NULL and check rules (NOT VALID or not)."""
    return conn.execute(
        "SELECT t.typdefault, t.typnotnull, ARRAY(SELECT replace(pg_get_constraintdef(c.oid), "
        "' NOT VALID', '') FROM pg_constraint c WHERE c.contypid = t.oid ORDER BY 1) "
        "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE n.nspname = %s AND t.typname = %s",
        (schema, name),
    ).fetchone()


def test_a_changed_domain_is_redefined_in_the_destination(
    db_project, source_conn, dest_conn, schema
):
    """A relaxed check must reach the destination before the reload copies rows that only
    the relaxed rule allows; the default, NOT NULL and the checks follow the source."""
    for statement in [
        "CREATE DOMAIN {s}.qty AS int CHECK (VALUE > 0) CHECK (VALUE < 1000)",
        "CREATE TABLE {s}.stock (id int PRIMARY KEY, qty {s}.qty, "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "INSERT INTO {s}.stock (id, qty) SELECT g, g FROM generate_series(1, 100) g",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.stock", "replication_key": "updated_at"}]}
    )
    assert sync_events(db_project)[0] == 0
    (checks,) = source_conn.execute(
        "SELECT array_agg(conname) FROM pg_constraint WHERE contypid = %s::regtype",
        (f'"{schema}".qty',),
    ).fetchone()
    for statement in [
        *(f"ALTER DOMAIN {{s}}.qty DROP CONSTRAINT {name}" for name in checks),
        "ALTER DOMAIN {s}.qty ADD CHECK (VALUE > -100)",
        "ALTER DOMAIN {s}.qty SET DEFAULT 7",
        "ALTER DOMAIN {s}.qty SET NOT NULL",
        "INSERT INTO {s}.stock (id, qty) VALUES (101, -5), (102, 5000)",
    ]:
        source_conn.execute(_q(schema, statement))
    code, events = sync_events(db_project)
    stock = events[f"{schema}.stock"]
    assert code == 0, stock
    assert (stock["action"], stock["reason"]) == (
        "full_reload",
        f"schema changed: type definition changed: {schema}.qty (domain definition)",
    ), stock
    assert assert_same_table(source_conn, dest_conn, schema, "stock") == 102
    assert _domain_definition(dest_conn, schema, "qty") == _domain_definition(
        source_conn, schema, "qty"
    )
    assert sync_events(db_project)[1][f"{schema}.stock"]["action"] == "noop"


def test_a_domain_made_not_null_over_a_copy_holding_nulls_reloads_and_says_the_rest(
    db_project, source_conn, dest_conn, schema
):
    """The copy holds a NULL of a domain the source then makes NOT NULL (after filling it):
    SET NOT NULL in the destination would check the old copy's rows and fail every run (a
    newcomer trial: stuck until the table was dropped by hand). The reload goes on with the
    domain left NULL-able there, says how to finish, and the run after is a noop."""
    for statement in [
        "CREATE DOMAIN {s}.d2 AS int",
        "CREATE TABLE {s}.dt (id int PRIMARY KEY, x {s}.d2, "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "INSERT INTO {s}.dt (id, x) VALUES (1, NULL), (2, 5)",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config({"tables": [{"name": f"{schema}.dt", "replication_key": "updated_at"}]})
    assert sync_events(db_project)[0] == 0
    for statement in [
        "UPDATE {s}.dt SET x = 0, updated_at = clock_timestamp() WHERE x IS NULL",
        "ALTER DOMAIN {s}.d2 SET NOT NULL",
    ]:
        source_conn.execute(_q(schema, statement))
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    domain = f'"{schema}"."d2"'
    assert (
        f"domain {domain} is NOT NULL in the source, and stays NULL-able in the destination "
        f"for now: {schema}.dt.x hold(s) NULL there" in result.stderr
    ), result.stderr
    assert f"run ALTER DOMAIN {domain} SET NOT NULL in the destination" in result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "dt") == 2
    dest_conn.execute(_q(schema, "ALTER DOMAIN {s}.d2 SET NOT NULL"))  # as told: it holds
    assert sync_events(db_project)[1][f"{schema}.dt"]["action"] == "noop"


def test_a_domain_check_added_not_valid_over_old_rows_waits_for_its_validation(
    db_project, source_conn, dest_conn, schema
):
    """A check the source adds NOT VALID holds for new rows only: its old rows may break it,
    and the copy takes them (the check is not carried); once validated there, it is."""
    for statement in [
        "CREATE DOMAIN {s}.qty AS int CHECK (VALUE >= 0)",
        "CREATE TABLE {s}.stock (id int PRIMARY KEY, qty {s}.qty, "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "INSERT INTO {s}.stock (id, qty) VALUES (1, 5000), (2, 5)",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.stock", "replication_key": "updated_at"}]}
    )
    assert sync_events(db_project)[0] == 0
    source_conn.execute(
        _q(schema, "ALTER DOMAIN {s}.qty ADD CONSTRAINT small CHECK (VALUE < 1000) NOT VALID")
    )
    source_conn.execute(_q(schema, "INSERT INTO {s}.stock (id, qty) VALUES (3, 7)"))
    code, events = sync_events(db_project)
    assert code == 0, events[f"{schema}.stock"]
    assert assert_same_table(source_conn, dest_conn, schema, "stock") == 3
    source_conn.execute(_q(schema, "UPDATE {s}.stock SET qty = 999 WHERE id = 1"))
    source_conn.execute(_q(schema, "ALTER DOMAIN {s}.qty VALIDATE CONSTRAINT small"))
    code, events = sync_events(db_project)
    assert code == 0, events[f"{schema}.stock"]
    assert assert_same_table(source_conn, dest_conn, schema, "stock") == 3
    assert _domain_definition(dest_conn, schema, "qty") == _domain_definition(
        source_conn, schema, "qty"
    )


def _labels(conn, schema, name="mood"):
    return conn.execute(
        "SELECT array_agg(enumlabel ORDER BY enumsortorder) FROM pg_enum "
        "WHERE enumtypid = %s::regtype",
        (f'"{schema}".{name}',),
    ).fetchone()[0]


def test_an_enum_label_renamed_and_added_back_keeps_the_sources_order(
    db_project, source_conn, dest_conn, schema
):
    """Labels compare by their place: a label renamed in the source is renamed in the
    destination (not added beside the old one), so one added back later under the old name
    lands where the source has it. An order no statement can reach fails with the fix."""
    for statement in [
        "CREATE TYPE {s}.mood AS ENUM ('sad', 'meh', 'ok', 'happy')",
        "CREATE TABLE {s}.notes (id int PRIMARY KEY, m {s}.mood, "
        "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        "INSERT INTO {s}.notes (id, m) VALUES (1, 'sad'), (2, 'ok'), (3, 'happy')",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.notes", "replication_key": "updated_at"}]}
    )
    assert sync_events(db_project)[0] == 0
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood RENAME VALUE 'sad' TO 'blue'"))
    assert sync_events(db_project)[0] == 0
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood ADD VALUE 'sad'"))
    source_conn.execute(_q(schema, "INSERT INTO {s}.notes (id, m) VALUES (4, 'sad')"))
    assert sync_events(db_project)[0] == 0
    assert _labels(dest_conn, schema) == _labels(source_conn, schema)
    assert assert_same_table(source_conn, dest_conn, schema, "notes") == 4
    ordered = _q(schema, "SELECT array_agg(id ORDER BY m, id) FROM {s}.notes")
    assert dest_conn.execute(ordered).fetchone() == source_conn.execute(ordered).fetchone()

    dest_conn.execute(_q(schema, "ALTER TYPE {s}.mood ADD VALUE 'zen' BEFORE 'blue'"))
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood ADD VALUE 'zen'"))  # last there
    code, events = sync_events(db_project)
    assert code == 1
    error = events[f"{schema}.notes"]["error"]
    assert "orders its labels otherwise in the destination" in error, error
    assert "DROP TYPE" in error and "replicator sync -f" in error


def test_an_enum_label_renamed_beside_a_label_added_is_renamed_in_the_destination(
    db_project, source_conn, dest_conn, schema
):
    """A rename and an addition between two syncs (the lists no longer as long): the label
    is renamed where it is, the new one added; one added back under the old name later lands
    where the source has it (it was kept beside the new name, and the table then failed)."""
    for statement in [
        "CREATE TYPE {s}.mood AS ENUM ('red', 'green', 'blue')",
        "CREATE TABLE {s}.notes (id int PRIMARY KEY, m {s}.mood)",
        "INSERT INTO {s}.notes VALUES (1, 'red'), (2, 'blue')",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config({"tables": [{"name": f"{schema}.notes", "mode": "cdc"}]})
    assert sync_events(db_project)[0] == 0
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood RENAME VALUE 'red' TO 'crimson'"))
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood ADD VALUE 'pink'"))
    source_conn.execute(_q(schema, "INSERT INTO {s}.notes VALUES (3, 'pink')"))
    assert sync_events(db_project)[0] == 0
    assert _labels(dest_conn, schema) == ["crimson", "green", "blue", "pink"]
    source_conn.execute(_q(schema, "ALTER TYPE {s}.mood ADD VALUE 'red' BEFORE 'green'"))
    source_conn.execute(_q(schema, "INSERT INTO {s}.notes VALUES (4, 'red')"))
    code, events = sync_events(db_project)
    assert code == 0, events
    assert _labels(dest_conn, schema) == _labels(source_conn, schema)
    assert assert_same_table(source_conn, dest_conn, schema, "notes") == 4


def test_a_range_type_is_created_in_the_destination(db_project, source_conn, dest_conn, schema):
    """A user's range type (its multirange and array too): created with the source's
    definition, then the log carries its values; one of another subtype fails with the fix."""
    for statement in [
        "CREATE TYPE {s}.span AS RANGE (SUBTYPE = float8, SUBTYPE_DIFF = float8mi, "
        "MULTIRANGE_TYPE_NAME = {s}.spans)",
        "CREATE TABLE {s}.readings (id int PRIMARY KEY, r {s}.span, rs {s}.span[], m {s}.spans)",
        "INSERT INTO {s}.readings VALUES (1, '[1.5,2)', ARRAY['(,0]', 'empty']::{s}.span[], "
        "'{{[1,2), [3,4]}}')",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config({"tables": [{"name": f"{schema}.readings", "mode": "cdc"}]})
    code, events = sync_events(db_project)
    assert code == 0, events
    source_conn.execute(_q(schema, "INSERT INTO {s}.readings VALUES (2, '(-1,1]', NULL, '{{}}')"))
    assert sync_events(db_project)[0] == 0
    assert assert_same_table(source_conn, dest_conn, schema, "readings") == 2
    defined = _q(  # its difference function and multirange came along
        schema,
        "SELECT rngsubdiff::regproc::text, rngmultitypid::regtype::text FROM pg_range "
        "WHERE rngtypid = '{s}.span'::regtype",
    )
    assert dest_conn.execute(defined).fetchone() == source_conn.execute(defined).fetchone()

    # A difference function of the user's own must be in the destination first.
    for statement in [
        "CREATE FUNCTION {s}.gap(a float8, b float8) RETURNS float8 LANGUAGE sql IMMUTABLE "
        "AS 'SELECT a - b'",
        "CREATE TYPE {s}.span2 AS RANGE (SUBTYPE = float8, SUBTYPE_DIFF = {s}.gap)",
        "CREATE TABLE {s}.gaps (id int PRIMARY KEY, r {s}.span2)",
    ]:
        source_conn.execute(_q(schema, statement))
    db_project.write_config({"tables": [{"name": f"{schema}.gaps", "mode": "full-refresh"}]})
    code, events = sync_events(db_project)
    assert code == 1
    assert f"uses function(s) {schema}.gap, which the destination lacks" in str(events), events

    other = f"{schema}_elsewhere"
    source_conn.execute(_q(other, "CREATE SCHEMA {s}"))
    try:
        source_conn.execute(_q(other, "CREATE TYPE {s}.span AS RANGE (SUBTYPE = int4)"))
        source_conn.execute(_q(other, "CREATE TABLE {s}.t (id int PRIMARY KEY, r {s}.span)"))
        dest_conn.execute(_q(other, "CREATE SCHEMA {s}"))
        dest_conn.execute(_q(other, "CREATE TYPE {s}.span AS RANGE (SUBTYPE = int8)"))
        db_project.write_config({"tables": [{"name": f"{other}.t", "mode": "full-refresh"}]})
        code, events = sync_events(db_project)
        assert code == 1
        error = events[f"{other}.t"]["error"]
        assert "is a range of bigint in the destination and of integer in the source" in error
        assert "DROP TYPE" in error and "replicator sync -f" in error, error
    finally:
        source_conn.execute(_q(other, "DROP SCHEMA {s} CASCADE"))
        dest_conn.execute(_q(other, "DROP SCHEMA {s} CASCADE"))


def test_a_domain_calling_a_function_the_destination_lacks_says_what_to_create(
    db_project, source_conn, dest_conn, schema
):
    """A domain whose check calls a function of the user's own and whose default draws from
    a sequence: the table fails naming both and the domain; once they exist there, it loads
    (`check` says it first)."""
    for statement in [
        "CREATE FUNCTION {s}.is_even(int) RETURNS boolean LANGUAGE sql IMMUTABLE "
        "AS 'SELECT $1 % 2 = 0'",
        "CREATE SEQUENCE {s}.numbers",
        "CREATE DOMAIN {s}.even AS int DEFAULT nextval('{s}.numbers') * 2 "
        "CHECK ({s}.is_even(VALUE))",
        "CREATE TABLE {s}.pairs (id int PRIMARY KEY, n {s}.even)",
        "INSERT INTO {s}.pairs VALUES (1, 2), (2, DEFAULT)",
    ]:
        source_conn.execute(sql.SQL(statement.replace("{s}", f'"{schema}"')))
    db_project.write_config({"tables": [{"name": f"{schema}.pairs", "mode": "full-refresh"}]})
    wanted = (
        f"domain {schema}.even's default or checks use function {schema}.is_even(integer), "
        f"sequence {schema}.numbers, which the destination lacks: create them there"
    )
    checked = db_project.run("check")
    assert checked.exit_code == 1 and wanted in checked.stdout, checked.output
    code, events = sync_events(db_project)
    assert code == 1 and wanted in events[f"{schema}.pairs"]["error"], events
    dest_conn.execute(_q(schema, "CREATE SCHEMA IF NOT EXISTS {s}"))
    dest_conn.execute(
        _q(
            schema,
            "CREATE FUNCTION {s}.is_even(int) RETURNS boolean LANGUAGE sql IMMUTABLE "
            "AS 'SELECT $1 % 2 = 0'",
        )
    )
    dest_conn.execute(_q(schema, "CREATE SEQUENCE {s}.numbers"))
    assert sync_events(db_project)[0] == 0
    assert assert_same_table(source_conn, dest_conn, schema, "pairs") == 2


def test_a_domain_with_another_base_type_fails_the_table_with_a_fix(
    db_project, source_conn, dest_conn, schema
):
    source_conn.execute(_q(schema, "CREATE DOMAIN {s}.code AS text"))
    source_conn.execute(_q(schema, "CREATE TABLE {s}.items (id int PRIMARY KEY, c {s}.code)"))
    source_conn.execute(_q(schema, "INSERT INTO {s}.items VALUES (1, 'abc')"))
    dest_conn.execute(_q(schema, "CREATE DOMAIN {s}.code AS varchar(5)"))
    db_project.write_config({"tables": [{"name": f"{schema}.items", "mode": "full-refresh"}]})
    code, events = sync_events(db_project)
    assert code == 1
    error = events[f"{schema}.items"]["error"]
    assert f'domain "{schema}"."code" is text in the source but character varying(5)' in error
    assert "DROP DOMAIN" in error and "replicator sync -f" in error


def test_a_composite_gains_added_attributes_and_fails_on_other_changes(
    db_project, source_conn, dest_conn, schema
):
    source_conn.execute(_q(schema, "CREATE TYPE {s}.pair AS (a int, b text)"))
    source_conn.execute(_q(schema, "CREATE TABLE {s}.pairs (id int PRIMARY KEY, p {s}.pair)"))
    source_conn.execute(_q(schema, "INSERT INTO {s}.pairs VALUES (1, (1, 'x'))"))
    db_project.write_config({"tables": [{"name": f"{schema}.pairs", "mode": "full-refresh"}]})
    assert sync_events(db_project)[0] == 0
    # An attribute added at the end: the destination type gains it, the rows follow.
    source_conn.execute(_q(schema, "ALTER TYPE {s}.pair ADD ATTRIBUTE c int"))
    source_conn.execute(_q(schema, "UPDATE {s}.pairs SET p = (1, 'x', 3)"))
    assert sync_events(db_project)[0] == 0
    assert assert_same_table(source_conn, dest_conn, schema, "pairs") == 1
    # An attribute dropped: readers of the live table would lose its values mid-load.
    source_conn.execute(_q(schema, "ALTER TYPE {s}.pair DROP ATTRIBUTE b"))
    code, events = sync_events(db_project)
    assert code == 1
    error = events[f"{schema}.pairs"]["error"]
    assert (
        f'composite type "{schema}"."pair" is (a integer, c integer) in the source but '
        "(a integer, b text, c integer) in the destination" in error
    ), error
    assert "DROP TYPE" in error and "replicator sync -f" in error
    dest_conn.execute(_q(schema, "DROP TYPE {s}.pair CASCADE"))
    assert sync_events(db_project)[0] == 0  # the fix the message gives works
    assert assert_same_table(source_conn, dest_conn, schema, "pairs") == 1


def _status_then_reload(project, schema: str, reason: str) -> None:
    """`status` says the next sync reloads `orders` and why; the sync does, `other` alone
    is a noop."""
    status = {r["name"]: r for r in json.loads(project.run("status", "--json").stdout)}
    assert status[f"{schema}.orders"]["next_action"].startswith(f"full_reload: {reason}")
    code, events = sync_events(project)
    assert code == 0
    assert events[f"{schema}.orders"]["action"] == "full_reload"
    assert events[f"{schema}.orders"]["reason"].startswith(reason)
    assert events[f"{schema}.other"]["action"] == "noop"


def _model(project, schema: str, text: str) -> None:
    project.write(f"models/{schema}/orders.sql", text)


def test_a_model_whose_sql_changes_in_meaning_reloads_the_table(
    db_project, source_conn, dest_conn, schema
):
    """Soft deletes: the model's filter is widened (removed). The rows the old filter left
    out must arrive: the table reloads, with the reason, and compile and status say so
    first. A change of whitespace, comments or keyword case alone reloads nothing."""
    _tables(source_conn, schema)
    _config(db_project, schema)
    _model(db_project, schema, f"SELECT * FROM {schema}.orders WHERE id % 10 <> 0")
    code, events = sync_events(db_project)
    assert code == 0 and events[f"{schema}.orders"]["rows"] == 450
    _model(
        db_project,
        schema,
        f"-- the live orders\nselect *\n  from {schema}.ORDERS\n where ID % 10 <> 0;",
    )
    code, events = sync_events(db_project)
    assert (code, events[f"{schema}.orders"]["action"]) == (0, "noop")

    _model(db_project, schema, f"SELECT * FROM {schema}.orders")
    reason = f"model changed: models/{schema}/orders.sql: its SQL reads other rows or values"
    compiled = db_project.run("compile", "-s", f"{schema}.orders")
    assert f"-- next sync: full_reload ({reason}" in compiled.stdout
    _status_then_reload(db_project, schema, reason)
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500

    (db_project.path / "models" / schema / "orders.sql").unlink()  # back to the default model
    code, events = sync_events(db_project)
    assert events[f"{schema}.orders"]["reason"] == (
        f"model changed: models/{schema}/orders.sql -> macro default_model (built-in macro "
        "default_model.sql)"
    )
    code, events = sync_events(db_project)
    assert (code, events[f"{schema}.orders"]["action"]) == (0, "noop")


def test_a_model_ending_in_a_line_comment_syncs(db_project, source_conn, dest_conn, schema):
    """`-- ...` on the model's last line, no newline after it: the engine wraps the model
    in `(...)`, and the comment must not swallow the `)`."""
    _tables(source_conn, schema)
    _config(db_project, schema)
    _model(db_project, schema, f"SELECT * FROM {schema}.orders -- every order")
    assert db_project.run("check").exit_code == 0
    code, events = sync_events(db_project)
    assert code == 0, events
    source_conn.execute(
        _q(
            schema,
            "UPDATE {s}.orders SET note = 'x', updated_at = now() + "
            "interval '1 hour' WHERE id <= 5",
        )
    )
    code, events = sync_events(db_project)  # the wrapped batch query
    assert code == 0, events
    assert events[f"{schema}.orders"]["action"] == "incremental"
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500


@pytest.mark.parametrize("deletes", ["ignore", "delete"])
def test_an_emptied_destination_table_is_reloaded(
    db_project, source_conn, dest_conn, schema, deletes
):
    """A TRUNCATE of the copy (a user's "refresh", or an accident): the cursor would never
    bring the rows back, so the next sync reloads it and says why; status says so first. A
    table whose source was empty at its load stays incremental."""
    _tables(source_conn, schema)
    source_conn.execute(_q(schema, "DELETE FROM {s}.other"))
    _config(db_project, schema, deletes=deletes)
    assert sync_events(db_project)[0] == 0
    dest_conn.execute(_q(schema, "TRUNCATE {s}.orders"))
    reason = "destination table emptied: it held rows at the last sync and holds none now"
    _status_then_reload(db_project, schema, reason)
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500
    code, events = sync_events(db_project)
    assert code == 0
    assert events[f"{schema}.orders"]["action"] == "noop"


def test_status_gives_no_cursor_advice_for_a_table_it_reloads(synced, schema):
    """A model that leaves the newest rows out puts the cursor past the model's newest key:
    status advised `state set-cursor` (and showed a negative lag) for a table whose next
    sync reloads it anyway (a newcomer trial)."""
    _model(synced, schema, f"SELECT * FROM {schema}.orders WHERE id < 400")
    shown = synced.run("status")
    assert shown.exit_code == 0, shown.output
    assert "set-cursor" not in shown.stdout and "is past the source's newest key" not in (
        shown.stdout
    ), shown.stdout
    row = next(
        r for r in json.loads(synced.run("status", "--json").stdout) if "orders" in r["name"]
    )
    assert row["next_action"].startswith("full_reload: model changed")
    assert row["lag"] is None and row["cursor_ahead"] is None


def test_a_misnamed_model_file_is_an_error_in_check_and_a_warning_in_sync(synced, schema):
    """`models/<schema>/ordrs.sql` for table orders was silently never read: a filter in
    it (one that keeps PII out, say) did not apply (a newcomer trial)."""
    synced.write(f"models/{schema}/ordrs.sql", f"SELECT * FROM {schema}.orders WHERE id < 9")
    checked = synced.run("check")
    assert checked.exit_code == 1
    assert (
        f"error models: models/{schema}/ordrs.sql is the model of no table in "
        f"tables-config.json: it is never read; fix: rename it to models/{schema}/orders.sql"
    ) in checked.stdout, checked.stdout
    code, _ = sync_events(synced)
    assert code == 0
    warned = synced.run("sync")
    assert f"models/{schema}/ordrs.sql is the model of no table" in warned.stderr
    assert f"(did you mean models/{schema}/orders.sql?)" in warned.stderr
    # a file for another table altogether: no rename to an unrelated name is offered
    (synced.path / "models" / schema / "ordrs.sql").unlink()
    synced.write(f"models/{schema}/slow.sql", "SELECT 1")
    other = synced.run("check")
    assert (
        f"error models: models/{schema}/slow.sql is the model of no table in tables-config.json:"
        " it is never read; fix: remove it, or add its table to the config"
    ) in other.stdout, other.stdout


def test_a_refresh_keeps_the_index_made_on_the_copy(db_project, source_conn, dest_conn, schema):
    _tables(source_conn, schema)
    _config(db_project, schema)
    assert sync_events(db_project)[0] == 0
    dest_conn.execute(_q(schema, "CREATE INDEX by_note ON {s}.orders (note)"))
    (oid,) = dest_conn.execute("SELECT %s::regclass::oid", (f"{schema}.orders",)).fetchone()
    assert db_project.run("refresh", f"{schema}.orders").exit_code == 0
    reloaded = db_project.run("sync", "-s", f"{schema}.orders")
    assert reloaded.exit_code == 0, reloaded.output
    assert "left out" not in reloaded.stderr, reloaded.stderr
    assert dest_conn.execute(
        "SELECT indrelid <> %s FROM pg_index WHERE indexrelid = %s::regclass",
        (oid, f"{schema}.by_note"),
    ).fetchone() == (True,), "on the new table"
