"""replicator replaces, drops and merges into only the destination tables it created or was
handed (`adopt`, `initial_load: skip`); anyone else's table fails its sync with the fix, and
`check`, `compile` and `status` say so before a sync does."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

from replicator.base.errors import DatabaseError
from replicator.base.identifiers import TableName
from replicator.postgres.ownership import classify, read_many_records, read_records
from replicator.postgres.swap import swap_in
from replicator.project.identity import PROJECT_SETTING, read_identity
from replicator.project.settings import with_setting

pytestmark = pytest.mark.spark

NOT_OWNED = "destination table exists and was not created by replicator"


@pytest.fixture
def shop(source_conn, dest_conn, schema):
    """100 orders in the source; a hand-made table of 50 rows under the same name in the
    destination (say, an analyst's earlier copy)."""
    for conn, rows in ((source_conn, 100), (dest_conn, 50)):
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, note text, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(schema, "orders"))
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, note) SELECT g, 'row ' || g FROM generate_series(1, %s) g"
            ).format(sql.Identifier(schema, "orders")),
            (rows,),
        )
    return schema


def _dest_table(dest_conn, schema: str) -> tuple[int, int]:
    """(oid, rows) of the destination table."""
    table = sql.Identifier(schema, "orders")
    return dest_conn.execute(
        sql.SQL("SELECT {name}::regclass::oid::int, (SELECT count(*) FROM {t})").format(
            name=sql.Literal(table.as_string(dest_conn)), t=table
        )
    ).fetchone()


@pytest.mark.parametrize(
    ("table", "args"),
    [
        pytest.param({"replication_key": "updated_at"}, (), id="first-sync"),
        pytest.param({"replication_key": "updated_at"}, ("-f",), id="full-refresh-flag"),
        pytest.param({"mode": "full-refresh"}, (), id="full-refresh-mode"),
        pytest.param(
            {"replication_key": "updated_at", "mode": "incremental-append"}, (), id="append"
        ),
    ],
)
def test_a_hand_made_destination_table_is_never_replaced(db_project, shop, dest_conn, table, args):
    db_project.write_config({"tables": [{"name": f"{shop}.orders", **table}]})
    before = _dest_table(dest_conn, shop)
    synced = db_project.run("sync", *args)
    assert synced.exit_code == 1, synced.output
    assert re.search(
        rf"{shop}\.orders: failed after [\d.]+ s: {NOT_OWNED}; replicator never replaces",
        synced.stderr,
    ), synced.stderr
    assert f"`replicator adopt {shop}.orders`" in synced.stderr
    assert _dest_table(dest_conn, shop) == before, "same table, same 50 rows"


def test_check_compile_and_status_say_so_before_a_sync(db_project, shop):
    db_project.configure(shop, "orders", replication_key="updated_at")
    checked = db_project.run("check")
    assert checked.exit_code == 1, checked.output
    assert f"error {shop}.orders: {NOT_OWNED}; fix: replicator never replaces" in checked.stdout
    compiled = db_project.run("compile")
    assert f"-- next sync: fail ({NOT_OWNED})" in compiled.stdout
    assert "-- fix: replicator never replaces a table it did not create" in compiled.stdout
    (row,) = json.loads(db_project.run("status", "--json").stdout)
    assert row["next_action"] == f"fail: {NOT_OWNED}"
    assert row["rows"] == 50


def test_adopt_hands_the_table_over_and_the_next_sync_reloads_it(
    db_project, shop, source_conn, dest_conn
):
    db_project.configure(shop, "orders", replication_key="updated_at")
    adopted = db_project.run("adopt", f"{shop}.orders")
    assert adopted.exit_code == 0, adopted.output
    assert (
        f"{shop}.orders: adopted {shop}.orders; replicator may now replace and update it. "
        "Next sync: full_reload (no state)" in adopted.stdout
    )
    assert "is already replicator's" in db_project.run("adopt", "orders").stdout
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert assert_same_table(source_conn, dest_conn, shop, "orders") == 100


def test_initial_load_skip_adopts_a_matching_table_and_keeps_its_rows(db_project, shop, dest_conn):
    db_project.configure(shop, "orders", replication_key="updated_at", initial_load="skip")
    assert "initial_load skip" in db_project.run("check").stdout
    before = _dest_table(dest_conn, shop)
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert "destination table adopted" in synced.stderr
    assert _dest_table(dest_conn, shop) == before
    reloaded = db_project.run("sync", "-f")
    assert reloaded.exit_code == 0, reloaded.output
    assert _dest_table(dest_conn, shop)[1] == 100, "adopted: now the tool's to reload"


def test_a_table_recreated_by_hand_after_a_load_is_not_the_tools(
    db_project, shop, source_conn, dest_conn
):
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(shop, "orders")))
    db_project.configure(shop, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    assert db_project.run("sync", "-f").exit_code == 0, "its own table: replaced freely"
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(shop, "orders")))
    dest_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, updated_at timestamptz)").format(
            sql.Identifier(shop, "orders")
        )
    )
    before = _dest_table(dest_conn, shop)
    synced = db_project.run("sync")
    assert synced.exit_code == 1
    assert NOT_OWNED in synced.stderr
    assert _dest_table(dest_conn, shop) == before
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(shop, "orders")))
    again = db_project.run("sync")
    assert again.exit_code == 0, "dropping the destination still forces a reload"
    assert "destination table missing" in again.stderr
    assert assert_same_table(source_conn, dest_conn, shop, "orders") == 100


def test_a_table_loaded_before_ownership_records_stays_the_tools(
    db_project, shop, source_conn, dest_conn
):
    """Upgrading: a table an earlier version loaded (its sync-state says so) has no record;
    the next sync recognizes it by the state, records it and carries on."""
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(shop, "orders")))
    db_project.configure(shop, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    dest_conn.execute("DELETE FROM _replicator.owned_tables")  # as an older version left it
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'changed', updated_at = now() + interval '1 min' WHERE id <= 10"
        ).format(sql.Identifier(shop, "orders"))
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert "loaded by an earlier replicator version; recorded as replicator's" in synced.stderr
    assert assert_same_table(source_conn, dest_conn, shop, "orders") == 100
    (recorded,) = dest_conn.execute(
        "SELECT count(*) FROM _replicator.owned_tables WHERE schema_name = %s", (shop,)
    ).fetchone()
    assert recorded == 1


def test_a_dropped_bookkeeping_schema_is_named_as_such_and_the_next_sync_carries_on(
    cdc_project, shop, writer, source_conn, dest_conn
):
    """`DROP SCHEMA _replicator CASCADE` in the destination: the next sync says that is what
    happened (not "an earlier replicator version"), once, records the tables again from the
    sync-state, and reloads the cdc table whose log position went with it; every copy exact."""
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(shop, "orders")))
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(
            sql.Identifier(shop, "events")
        )
    )
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'e' || g FROM generate_series(1, 40) g").format(
            sql.Identifier(shop, "events")
        )
    )
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{shop}.orders", "replication_key": "updated_at"},
                {"name": f"{shop}.events", "mode": "cdc"},
            ]
        }
    )
    assert cdc_project.run("sync").exit_code == 0
    dest_conn.execute("DROP SCHEMA _replicator CASCADE")
    writer.execute(
        sql.SQL(
            "UPDATE {} SET note = 'changed', updated_at = now() + interval '1 min' WHERE id <= 10"
        ).format(sql.Identifier(shop, "orders"))
    )
    writer.execute(sql.SQL("DELETE FROM {} WHERE id > 30").format(sql.Identifier(shop, "events")))
    synced = cdc_project.run("sync")
    assert synced.exit_code == 0, synced.output
    log = synced.stderr
    assert "earlier replicator version" not in log, log
    assert (
        log.count(
            "replicator's bookkeeping in the destination was dropped (schema "
            "_replicator is gone): the tables this project's sync-state says it loaded "
            "are recorded as replicator's again; the rest of it is gone too: cdc tables "
            "reload in full"
        )
        == 1
    ), log
    for name in ("orders", "events"):
        assert (
            f"{shop}.{name}: destination table {shop}.{name} recorded as replicator's again, "
            "from this project's sync-state" in log
        ), log
    assert f"{shop}.orders: incremental" in log, log
    assert f"{shop}.events: full_reload" in log and "no log position in the destination" in log
    assert assert_same_table(source_conn, dest_conn, shop, "orders") == 100
    assert assert_same_table(source_conn, dest_conn, shop, "events") == 30
    (recorded,) = dest_conn.execute(
        "SELECT count(*) FROM _replicator.owned_tables WHERE schema_name = %s", (shop,)
    ).fetchone()
    assert recorded == 2
    again = cdc_project.run("sync")
    assert again.exit_code == 0 and "recorded as replicator's" not in again.stderr, again.stderr


def test_the_swap_itself_refuses_a_table_it_does_not_own(pg_servers, dest_conn, schema):
    """The last line of defence, under the swap's lock: a table that became someone
    else's while the load ran is left alone."""
    target, side = TableName(schema, "t"), TableName(schema, "side")
    dest_conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(schema, "t")))
    dest_conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(schema, "side")))
    dest_conn.execute(sql.SQL("INSERT INTO {} VALUES (1), (2)").format(sql.Identifier(schema, "t")))
    with (
        psycopg.connect(pg_servers.dest_url, autocommit=True) as conn,
        pytest.raises(DatabaseError, match="is not a table replicator created"),
    ):
        swap_in(conn, side, target)
    (rows,) = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "t"))
    ).fetchone()
    assert rows == 2


@pytest.mark.parametrize("many", [False, True], ids=["one-table", "read-ahead"])
def test_a_plan_that_read_the_table_before_another_runs_swap_still_finds_it_the_tools(
    db_project, source_conn, dest_conn, schema, many
):
    """Two project copies syncing together (tests/test_table_lock.py): one's plan reads the
    destination table's OID, the other's swap replaces that table and records the new one,
    then the plan reads the ownership records. A fresh clone's CI run caught the second copy
    failing the table as someone else's; the registry and the table at that name are read in
    one snapshot now, whatever OID the plan's description holds."""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} AS SELECT g AS id FROM generate_series(1, 10) g").format(
            sql.Identifier(schema, "t")
        )
    )
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    target = TableName(schema, "t")
    (described,) = dest_conn.execute("SELECT %s::regclass::oid", (target.sql(),)).fetchone()
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0  # the other run's swap
    (now,) = dest_conn.execute("SELECT %s::regclass::oid", (target.sql(),)).fetchone()
    assert now != described
    identity = read_identity(db_project.path / "sync-state")
    url = with_setting(db_project.env["REPLICATOR_DEST_URL"], PROJECT_SETTING, identity)
    with psycopg.connect(url, autocommit=True) as as_the_project:  # as its runs connect
        if many:
            read_many_records(as_the_project, {target: described})
        records = read_records(as_the_project, target, described)
    assert classify(True, records, None) == "owned"


def test_a_second_project_on_the_same_destination_is_refused_its_copies(
    db_project, source_conn, dest_conn, schema, tmp_path
):
    """Two projects (two sync-state folders) pointed at one destination: the second used to
    take the first's copies over as `no state`, and the first then reloaded them all. Now
    the second's sync of such a table fails with the fix; the first goes on (a no-op);
    `adopt` in the second hands the copy over, and then the first is refused."""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at int NOT NULL)").format(
            sql.Identifier(schema, "t")
        )
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, g FROM generate_series(1, 10) g").format(
            sql.Identifier(schema, "t")
        )
    )
    config = {"tables": [{"name": f"{schema}.t", "replication_key": "updated_at"}]}
    db_project.env.update(IN_PROCESS)
    db_project.write_config(config)
    assert db_project.run("sync").exit_code == 0
    second = type(db_project)(tmp_path / "second", dict(db_project.env))
    (second.path / "sync-state").mkdir(parents=True)
    second.write_config(config)
    refused = second.run("sync")
    assert refused.exit_code == 1, refused.output
    said = "destination table is the copy another replicator project keeps"
    assert f"{schema}.t: failed after" in refused.stderr and said in refused.stderr
    assert "one project per copy" in refused.stderr, refused.stderr
    assert f"`replicator adopt {schema}.t`" in refused.stderr
    assert f"error {schema}.t: {said}; fix: one project per copy" in second.run("check").stdout
    first = db_project.run("sync")
    assert first.exit_code == 0 and f"{schema}.t: noop" in first.stderr, first.stderr
    handed = second.run("adopt", f"{schema}.t")
    assert handed.exit_code == 0, handed.output
    assert "was the copy another replicator project kept" in handed.stderr
    assert second.run("sync").exit_code == 0
    again = db_project.run("sync")
    assert again.exit_code == 1 and said in again.stderr, again.stderr
    assert_same_table(source_conn, dest_conn, schema, "t")
