"""`mode: "cdc"`, the source side (cdc/source): the slot and the publication, the tool's or a
DBA's, what a table must be to be captured, and the stream over the replication protocol."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
import uuid

import pytest
from cdc_tables import (
    configure_cdc,
    create_orders,
    dba_slot,
    drop_dba_slots,
    on_table,
    published_tables,
    slot_of,
)
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark


def test_a_table_back_in_the_config_reloads_instead_of_missing_changes(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """Out of the config, a table leaves the publication: its changes meanwhile are in no
    log. Back in, its copy reloads (found by a newcomer trial: it went on from its old
    position, and the update below was never applied)."""
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    configure_cdc(cdc_project, schema, "items")
    assert "removed" in cdc_project.sync().stderr
    on_table(writer, schema, "UPDATE {t} SET note = 'while out of the config' WHERE id = 3")
    configure_cdc(cdc_project, schema, "orders", "items")
    back = cdc_project.sync()
    assert f"{schema}.orders: full_reload" in back.stderr, back.stderr
    assert "reason: back among the cdc tables: the slot moved on" in back.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_table_back_in_the_config_of_a_dba_slot_reloads(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """With a DBA's slot and publication (`create: false`) the table stays published while
    it is out of the config, and the slot moves past its changes: back in, its copy reloads
    (it went on from its old position and kept a deleted row and old versions for good)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}, {}").format(
            sql.Identifier(slot), sql.Identifier(schema, "orders"), sql.Identifier(schema, "items")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    dba = {"slot": slot, "publication": slot, "create": False}
    configure_cdc(cdc_project, schema, "orders", "items", cdc=dba)
    cdc_project.sync()
    configure_cdc(cdc_project, schema, "items", cdc=dba)
    on_table(writer, schema, "DELETE FROM {t} WHERE id = 1")
    for n in range(3):
        on_table(writer, schema, "UPDATE {t} SET note = %s WHERE id = 2", f"version {n}")
    on_table(writer, schema, "UPDATE {t} SET note = 'items too' WHERE id = 2", table="items")
    cdc_project.sync()  # drains items; the slot moves past the orders changes
    configure_cdc(cdc_project, schema, "orders", "items", cdc=dba)
    status = {r["name"]: r for r in json.loads(cdc_project.run("status", "--json").stdout)}
    assert status[f"{schema}.orders"]["next_action"].startswith("full_reload: back among")
    back = cdc_project.sync()
    assert f"{schema}.orders: full_reload" in back.stderr, back.stderr
    assert "reason: back among the cdc tables: the slot moved on" in back.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")
    on_table(writer, schema, "UPDATE {t} SET note = 'after' WHERE id = 5")
    again = cdc_project.sync()
    assert f"{schema}.orders: incremental" in again.stderr, again.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    source_conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(slot)))


def test_a_slot_the_dba_makes_again_reloads_the_copies(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A slot named in `cdc` (create: false) that disappears, then is made again by hand,
    starts after the copies' positions: the changes in between are in no slot, so the copies
    reload (found by a newcomer trial: the next sync went on and lost them)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    create_orders(writer, schema)
    dba_slot(source_conn, schema, slot, "orders")
    configure_cdc(
        cdc_project, schema, "orders", cdc={"slot": slot, "publication": slot, "create": False}
    )
    cdc_project.sync()
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))  # by mistake
    on_table(writer, schema, "UPDATE {t} SET note = 'in no slot' WHERE id = 3")
    missing = cdc_project.run("sync")
    assert missing.exit_code == 1
    assert f"create it (SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'))" in (
        missing.stderr
    )
    assert "the next sync then reloads every cdc table" in missing.stderr
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    again = cdc_project.sync()
    assert "reason: slot lost" in again.stderr, again.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_table_the_log_cannot_carry_says_why(cdc_project, schema, writer):
    """Alone in the config, its own reason, not the set-up's "no table can be captured"."""
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, n int, "
            "twice int GENERATED ALWAYS AS (n * 2) STORED)"
        ).format(sql.Identifier(schema, "gen"))
    )
    configure_cdc(cdc_project, schema, "gen")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1
    assert "generated column" in failed.stderr, failed.stderr
    # compile and status say the same before a sync (they predicted a full reload)
    compiled = cdc_project.run("compile")
    assert compiled.exit_code == 1 and "generated column" in compiled.stdout, compiled.output
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"].startswith("fail: ") and "generated" in status[0]["next_action"]


def test_renaming_the_slot_in_the_config_names_the_old_one_to_drop(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    old = slot_of(cdc_project)
    renamed = f"renamed_{uuid.uuid4().hex[:8]}"
    try:
        configure_cdc(cdc_project, schema, "orders", cdc={"slot": renamed})
        synced = cdc_project.sync()
        assert f"replication slot {old} (made by this project) is no longer used" in (synced.stderr)
        assert f"SELECT pg_drop_replication_slot('{old}')" in synced.stderr
        assert_same_table(source_conn, dest_conn, schema, "orders")
    finally:
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (old,),
        )


def test_check_names_what_the_publication_needs_from_the_role(
    cdc_project, schema, writer, source_conn, pg_servers
):
    """The first sync creates the publication (CREATE on the database) and adds the tables
    (only their owner may): `check` says so before a sync fails on it (newcomer trial)."""
    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    role = f"loader_{uuid.uuid4().hex[:8]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        source_conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {0} TO {1}; GRANT SELECT ON {2} TO {1}").format(
                sql.Identifier(schema), sql.Identifier(role), sql.Identifier(schema, "orders")
            )
        )
        url = pg_servers.source_url.replace("postgres@", f"{role}@", 1)
        checked = cdc_project.run("check", env={"REPLICATOR_SOURCE_URL": url})
        assert f"error cdc: role {role} lacks CREATE on database postgres" in checked.output
        assert f"fix: GRANT CREATE ON DATABASE postgres TO {role}" in checked.output
        assert f"error {schema}.orders: role {role} does not own the source table" in (
            checked.output
        )
        assert f"OWNER TO {role}" in checked.output
    finally:
        source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_dba_slot_and_publication_as_check_status_and_compile_see_them(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """`create: false` before the first sync: `status` sees the DBA's slot (it said "no
    slot yet"), `check` fails a table the publication lacks (it said 0 errors, then the
    sync failed), and `state set-cursor` on a cdc table is a usage error that says cdc."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(slot), sql.Identifier(schema, "orders")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        dba = {"slot": slot, "publication": slot, "create": False}
        configure_cdc(cdc_project, schema, "orders", "items", cdc=dba)
        status = cdc_project.run("status")
        assert f"cdc: slot {slot} retains" in status.stdout, status.stdout
        assert "no replication slot yet" not in status.stdout
        checked = cdc_project.run("check")
        assert checked.exit_code != 0
        assert f"error {schema}.items: not in publication {slot}" in checked.output
        assert f'fix: a DBA adds it: ALTER PUBLICATION "{slot}" ADD TABLE "{schema}"."items"' in (
            checked.output
        )
        assert f"error {schema}.orders" not in checked.output
        configure_cdc(cdc_project, schema, "orders", cdc=dba)
        cdc_project.sync()
        cursor = cdc_project.run("state", "set-cursor", f"{schema}.orders", "0/0")
        assert cursor.exit_code == 2
        assert "mode cdc has no cursor to set" in cursor.stderr
        assert f"replicator refresh {schema}.orders" in cursor.stderr
    finally:
        source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        source_conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(slot)))


def test_only_cdc_tables_join_the_publication(cdc_project, schema, writer, source_conn):
    """A cursor table synced in the same run is not published (the first sync added it to
    the publication, and the next one removed it again)."""
    create_orders(writer, schema, "orders")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz)").format(
            sql.Identifier(schema, "items")
        )
    )
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.items", "replication_key": "updated_at"},
                {"name": f"{schema}.orders", "mode": "cdc"},
            ]
        }
    )
    cdc_project.sync()
    assert published_tables(source_conn, cdc_project) == [("orders",)]
    assert "publication" not in cdc_project.sync().stderr


def test_a_dba_publication_that_withholds_changes_fails_the_table_with_the_fix(
    cdc_project, schema, writer, source_conn
):
    """A DBA's publication without deletes, with a row filter or with a column list would
    silently lose changes (found by a newcomer trial: check said 0 errors, the copy kept
    deleted rows). check and the sync both say what it withholds and give the statements."""
    name = f"dba_{uuid.uuid4().hex[:12]}"
    create_orders(writer, schema)
    dba_slot(source_conn, schema, name, "orders")
    pub, table = sql.Identifier(name), sql.Identifier(schema, "orders")
    try:
        configure_cdc(
            cdc_project, schema, "orders", cdc={"slot": name, "publication": name, "create": False}
        )
        for statement, says in (
            (
                "ALTER PUBLICATION {p} SET (publish = 'insert, update')",
                "it does not publish deletes or truncates",
            ),
            (
                "ALTER PUBLICATION {p} SET TABLE {t} WHERE (id > 10)",
                "a row filter (WHERE (id > 10)) leaves rows out",
            ),
            (
                "ALTER PUBLICATION {p} SET TABLE {t} (id, note)",
                "its column list leaves out amount, big",
            ),
        ):
            source_conn.execute(sql.SQL(statement).format(p=pub, t=table))
            checked = cdc_project.run("check")
            assert checked.exit_code == 1, checked.output
            assert f"publication {name} (named in tables-config.json `cdc`) withholds changes" in (
                checked.output
            )
            assert says in checked.output, checked.output
            synced = cdc_project.run("sync")
            assert synced.exit_code == 1 and says in synced.stderr, synced.stderr
            assert "fix" in checked.output and f'ALTER PUBLICATION "{name}"' in checked.output
            source_conn.execute(
                sql.SQL(
                    "ALTER PUBLICATION {p} SET (publish = 'insert, update, delete, truncate'); "
                    "ALTER PUBLICATION {p} SET TABLE {t}"
                ).format(p=pub, t=table)
            )
        assert cdc_project.run("check").exit_code == 0
        cdc_project.sync()
    finally:
        drop_dba_slots(source_conn, name)


def test_pointing_cdc_at_another_slot_reloads_every_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The copies' positions are in the old slot's stream: a new slot holds none of the
    changes in between (a newcomer trial's sync went on and lost them). A slot of another
    plugin is refused with the statements that make it again."""
    first, second, decoded = (f"dba_{uuid.uuid4().hex[:12]}" for _ in range(3))
    create_orders(writer, schema)
    dba_slot(source_conn, schema, first, "orders")
    try:
        configure_cdc(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": first, "publication": first, "create": False},
        )
        cdc_project.sync()
        on_table(writer, schema, "UPDATE {t} SET note = 'between the slots' WHERE id = 4")
        on_table(writer, schema, "DELETE FROM {t} WHERE id = 5")
        source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (second,))
        configure_cdc(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": second, "publication": first, "create": False},
        )
        moved = cdc_project.sync()
        assert f"reason: replication slot changed: {first} -> {second}" in moved.stderr, (
            moved.stderr
        )
        assert_same_table(source_conn, dest_conn, schema, "orders")
        source_conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (decoded,)
        )
        configure_cdc(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": decoded, "publication": first, "create": False},
        )
        for result, text in (
            (cdc_project.run("check"), "output"),
            (cdc_project.run("sync"), "stderr"),
        ):
            assert result.exit_code == 1
            said = getattr(result, text)
            assert f"replication slot {decoded} decodes with the test_decoding plugin" in said, said
            assert f"pg_create_logical_replication_slot('{decoded}', 'pgoutput')" in said
    finally:
        drop_dba_slots(source_conn, first, second, decoded)


def test_a_process_with_a_thousand_files_open_reads_the_log(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The stream's socket gets a descriptor numbered over 1023 here, which select() refuses
    ("filedescriptor out of range"): the drain waits on it with poll."""
    create_orders(writer, schema, rows=10)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'later' WHERE id <= 5")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this machine allows {hard} open files, fewer than the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    opened = []
    try:
        while not opened or opened[-1] < 1030:
            opened.append(os.open(os.devnull, os.O_RDONLY))
        cdc_project.sync()
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10


def test_a_slot_still_held_by_a_walsender_on_its_way_out_is_waited_for(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn
):
    """A killed run's walsender lets go of the slot moments after: the next run's stream
    waits for it instead of failing its tables."""
    import psycopg
    from psycopg import pq

    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'after' WHERE id <= 10")
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    holder = pq.PGconn.connect(f"{pg_servers.source_url}?replication=database".encode())
    holder.send_query(
        f"START_REPLICATION SLOT {names['slot']} LOGICAL 0/0 "
        f"(proto_version '1', publication_names '{names['publication']}')".encode()
    )
    assert holder.get_result().status == pq.ExecStatus.COPY_BOTH

    def release_once_the_sync_waits() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline
                and not conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' "
                    "AND application_name = 'replicator'"
                ).fetchone()[0]
            ):
                time.sleep(0.05)
        holder.finish()

    releaser = threading.Thread(target=release_once_the_sync_waits)
    releaser.start()
    try:
        cdc_project.sync()
    finally:
        releaser.join()
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_a_long_apply_keeps_the_stream_alive(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn, monkeypatch
):
    """While a batch waits for a lock in the destination, the reader keeps sending status
    updates: the source does not end the stream as a dead client's before the drain has
    read the rest (wal_sender_timeout of 1 s from the URL, the lock held 3 s, a batch per
    transaction)."""
    import psycopg

    from replicator.cdc import drain
    from replicator.cdc.rows import stage

    monkeypatch.setattr(stage, "PING_EVERY_S", 0.2)
    monkeypatch.setattr(drain, "BATCH_CHANGES", 1)  # the stream goes on after the wait
    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    for n in range(1, 11):
        on_table(writer, schema, "UPDATE {t} SET note = 'late' WHERE id = %s", n)
    table = sql.Identifier(schema, "orders")
    waited = threading.Event()

    def hold_the_copy() -> None:
        with psycopg.connect(pg_servers.dest_url) as locker:
            locker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(table))
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline
                and not locker.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                    (table.as_string(locker),),
                ).fetchone()[0]
            ):
                time.sleep(0.05)
            waited.set()
            time.sleep(3)  # three times the stream's timeout
            locker.rollback()

    holder = threading.Thread(target=hold_the_copy)
    holder.start()
    try:
        url = cdc_project.env["REPLICATOR_SOURCE_URL"] + "?options=-c%20wal_sender_timeout%3D1s"
        result = cdc_project.run("sync", env={"REPLICATOR_SOURCE_URL": url})
    finally:
        holder.join()
    assert waited.is_set()
    assert result.exit_code == 0, result.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_changes_logged_while_the_replica_identity_named_other_columns_reload_the_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A copy keyed by `code` (REPLICA IDENTITY FULL, the source's key is `id`): the
    identity switched to DEFAULT for a while, changes made then name their rows by `id`
    only, and the identity back to FULL. Those changes cannot be applied by `code` (the
    old rows would stay): the log's own description of the table says so, and the copy
    reloads instead (a newcomer trial found the stale rows)."""
    target = sql.Identifier(schema, "ck")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, code text NOT NULL, v int)").format(target)
    )
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'c' || g, g FROM generate_series(1, 100) g").format(
            target
        )
    )
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(target))
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.ck", "mode": "cdc", "primary_key": ["code"]}]}
    )
    cdc_project.sync()
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY DEFAULT").format(target))
    writer.execute(
        sql.SQL("UPDATE {} SET code = code || 'w' WHERE id BETWEEN 21 AND 23").format(target)
    )
    writer.execute(sql.SQL("DELETE FROM {} WHERE id = 24").format(target))
    refused = cdc_project.run("sync")
    assert refused.exit_code == 1, refused.output  # said at the set-up, as before
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(target))
    back = cdc_project.sync()
    assert (
        f"{schema}.ck: full_reload" in back.stderr
        and "replica identity DEFAULT names rows by (id), not by the copy's key (code)"
        in back.stderr
    ), back.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "ck", key="id") == 99
    writer.execute(sql.SQL("UPDATE {} SET v = -v WHERE id < 10").format(target))
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "ck", key="id") == 99


@pytest.mark.parametrize(
    ("identity", "entry"),
    [("DEFAULT", {}), ("FULL", {}), ("FULL", {"primary_key": ["id", "v"]})],
    ids=["default", "full", "full-configured-wider-key"],
)
def test_a_deferrable_primary_key_is_refused_and_the_source_keeps_taking_updates(
    cdc_project, schema, writer, source_conn, dest_conn, identity, entry
):
    """A DEFERRABLE primary key lets two rows hold one key inside a transaction: `UPDATE
    SET id = id + 1` logged "a row left key 2" after "a row arrived at key 2", and the copy
    lost keys 2-5 of 1-5, exit 0 (REPLICA IDENTITY FULL). Under DEFAULT, PostgreSQL takes no
    deferrable key as the replica identity: the table joined the publication and the source
    refused the application's UPDATEs. The table is refused with the fix, left out of the
    publication, and the source takes its updates."""
    target = sql.Identifier(schema, "shifted")
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} "
            "(id int CONSTRAINT shifted_key PRIMARY KEY DEFERRABLE, v text NOT NULL)"
        ).format(target)
    )
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY " + identity).format(target))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 5) g").format(target)
    )
    table = {"name": f"{schema}.shifted", "mode": "cdc", **entry}
    cdc_project.write_config({"tables": [table]})
    refused = cdc_project.run("sync")
    assert refused.exit_code == 1, refused.output
    fix = (
        f"ALTER TABLE {schema}.shifted DROP CONSTRAINT shifted_key, ADD CONSTRAINT shifted_key "
        "PRIMARY KEY (id)"
    )
    assert (
        "its primary key shifted_key is DEFERRABLE: inside a transaction two rows may hold one "
        "key (UPDATE ... SET id = id + 1), which changes applied by key cannot tell apart, so "
        f"the copy would lose rows: run `{fix}` in the source" in refused.stderr
    ), refused.stderr
    writer.execute(sql.SQL("UPDATE {} SET id = id + 1").format(target))  # not refused
    writer.execute(fix)
    cdc_project.sync()
    writer.execute(sql.SQL("UPDATE {} SET v = 'w' WHERE id = 6").format(target))
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "shifted") == 5


def test_a_deferrable_primary_key_beside_a_unique_index_checked_at_once_is_captured(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """An immediate unique index over the key keeps two rows from ever holding one key,
    whatever the primary key defers: made the replica identity, the table is captured."""
    target = sql.Identifier(schema, "guarded")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY DEFERRABLE, v text)").format(target)
    )
    writer.execute(sql.SQL("CREATE UNIQUE INDEX guarded_id ON {} (id)").format(target))
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX guarded_id").format(target))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 5) g").format(target)
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.guarded", "mode": "cdc"}]})
    cdc_project.sync()
    writer.execute(sql.SQL("UPDATE {} SET v = 'w' WHERE id = 3").format(target))
    writer.execute(sql.SQL("UPDATE {} SET id = 10 WHERE id = 5").format(target))
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "guarded") == 5
