"""Partitioned tables are one table, in every mode: read through their root, sized by their
leaves, split by leaf for Spark, captured from the log under the root's name, reloaded when
a partition brings or takes rows that no run reads, and verified on the root."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.postgres.partition_tree import Leaf
from replicator.transfer.leaf_parts import leaf_range_query, split_leaves

pytestmark = pytest.mark.spark


def _run(conn, schema: str, statement: str, *params) -> None:
    """A statement whose {names} are tables of the test's schema."""
    names = {
        word: sql.Identifier(schema, word)
        for word in (
            "events",
            "p_low",
            "p_mid",
            "p_mid_eu",
            "p_mid_other",
            "p_rest",
            "p_new",
            "loose",
        )
    }
    conn.execute(sql.SQL(statement).format(**names), params or None)


def _events(conn, schema: str) -> None:
    """Two levels and two default partitions: range on k, then list on region."""
    for statement in (
        "CREATE TABLE {events} (id int, k int, region text, note text, "
        "PRIMARY KEY (id, k, region)) PARTITION BY RANGE (k)",
        "CREATE TABLE {p_low} PARTITION OF {events} FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE {p_mid} PARTITION OF {events} FOR VALUES FROM (100) TO (200) "
        "PARTITION BY LIST (region)",
        "CREATE TABLE {p_mid_eu} PARTITION OF {p_mid} FOR VALUES IN ('eu')",
        "CREATE TABLE {p_mid_other} PARTITION OF {p_mid} DEFAULT",
        "CREATE TABLE {p_rest} PARTITION OF {events} DEFAULT",
        "INSERT INTO {events} SELECT g, g % 250, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, "
        "'n' || g FROM generate_series(1, 500) g",
    ):
        _run(conn, schema, statement)


def _loose_table(conn, schema: str, low: int) -> None:
    """A table made apart, with rows, to be attached for k in [low, low + 100)."""
    _run(
        conn,
        schema,
        "CREATE TABLE {loose} (id int NOT NULL, k int NOT NULL, region text NOT NULL, note text)",
    )
    _run(
        conn,
        schema,
        "INSERT INTO {loose} SELECT 5000 + g, %s + mod(g, 100), 'eu', 'loose' "
        "FROM generate_series(1, 50) g",
        low,
    )


def _same(source_conn, dest_conn, schema: str) -> int:
    return assert_same_table(source_conn, dest_conn, schema, "events")


def _writing(url: str, schema: str, stop: threading.Event, written: list[int]) -> None:
    """Inserts into every partition, and moves rows between them, until told to stop."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        n = 0
        while not stop.is_set():
            n += 1
            with conn.transaction():
                _run(
                    conn,
                    schema,
                    "INSERT INTO {events} VALUES (%s, %s, %s, 'written')",
                    10_000 + n,
                    n * 37 % 250,
                    "eu" if n % 3 else "us",
                )
                _run(
                    conn, schema, "UPDATE {events} SET k = mod(k + 90, 250) WHERE id = %s", n % 400
                )
            written.append(n)


def test_cdc_follows_every_partition_of_a_partitioned_root(
    cdc_project, schema, writer, source_conn, dest_conn, pg_servers
):
    cdc_project.env.update(IN_PROCESS)
    _events(writer, schema)
    cdc_project.write_config({"tables": [{"name": f"{schema}.events", "mode": "cdc"}]})
    first = cdc_project.sync()
    assert f"{schema}.events: full_reload" in first.stderr, first.stderr
    assert _same(source_conn, dest_conn, schema) == 500
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    (via_root,) = source_conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (names["publication"],)
    ).fetchone()
    assert via_root

    # Inserts into every leaf, rows moved across partitions (both levels), an update, a delete.
    for statement in (
        "INSERT INTO {events} VALUES (1001, 5, 'eu', 'low'), (1002, 150, 'eu', 'mid eu'), "
        "(1003, 150, 'us', 'mid other'), (1004, 240, 'us', 'rest')",
        "UPDATE {events} SET k = 150, region = 'eu' WHERE id = 1",  # low -> mid eu
        "UPDATE {events} SET region = 'us' WHERE id = 150",  # mid eu -> mid other
        "UPDATE {events} SET k = 220 WHERE id = 151",  # mid other -> rest
        "UPDATE {events} SET note = 'changed' WHERE id BETWEEN 200 AND 220",
        "DELETE FROM {events} WHERE id BETWEEN 240 AND 249",
    ):
        _run(writer, schema, statement)
    applied = cdc_project.sync()
    assert f"{schema}.events: incremental" in applied.stderr, applied.stderr
    assert _same(source_conn, dest_conn, schema) == 494

    # A partition created later: nothing to reload; its rows arrive through the log.
    _run(
        writer, schema, "CREATE TABLE {p_new} PARTITION OF {events} FOR VALUES FROM (300) TO (400)"
    )
    created = cdc_project.sync()
    assert f"{schema}.events: noop" in created.stderr, created.stderr
    assert _same(source_conn, dest_conn, schema) == 494
    _run(
        writer,
        schema,
        "INSERT INTO {events} SELECT g, 300 + g % 100, 'eu', 'new' "
        "FROM generate_series(2001, 2040) g",
    )
    arrived = cdc_project.sync()
    assert f"{schema}.events: incremental" in arrived.stderr, arrived.stderr
    assert _same(source_conn, dest_conn, schema) == 534

    # A table attached with rows: the log has no INSERT for them. Reloaded while a writer
    # inserts into every partition and moves rows between them.
    _loose_table(writer, schema, 400)
    _run(
        writer,
        schema,
        "ALTER TABLE {events} ATTACH PARTITION {loose} FOR VALUES FROM (400) TO (500)",
    )
    stop, written = threading.Event(), []
    thread = threading.Thread(target=_writing, args=(pg_servers.source_url, schema, stop, written))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(written) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        reloaded = cdc_project.sync()
    finally:
        stop.set()
        thread.join()
    assert f"reason: partitions changed: {schema}.loose attached with rows" in reloaded.stderr, (
        reloaded.stderr
    )
    cdc_project.sync()  # what the writer did after the load's snapshot, from the log
    assert _same(source_conn, dest_conn, schema) == 584 + len(written)

    # Partitions detached and dropped: the log has no DELETE for their rows.
    _run(writer, schema, "ALTER TABLE {events} DETACH PARTITION {p_low}")
    _run(writer, schema, "DROP TABLE {p_new}")
    gone = cdc_project.sync()
    assert f"{schema}.p_low detached or dropped" in gone.stderr, gone.stderr
    assert f"{schema}.p_new detached or dropped" in gone.stderr
    rows = _same(source_conn, dest_conn, schema)

    # A partition's TRUNCATE is not published through the root.
    _run(writer, schema, "TRUNCATE {p_mid_eu}")
    truncated = cdc_project.sync()
    assert f"partitions changed: {schema}.p_mid_eu truncated or rewritten" in truncated.stderr
    assert _same(source_conn, dest_conn, schema) < rows

    # verify compares the root with the copy, and repairs it.
    assert cdc_project.run("verify").exit_code == 0
    dest_conn.execute(
        sql.SQL("DELETE FROM {} WHERE id = 5001").format(sql.Identifier(schema, "events"))
    )
    found = cdc_project.run("verify", "--json")
    assert found.exit_code == 1, found.output
    assert json.loads(found.stdout)[0]["missing"] == 1
    assert cdc_project.run("verify", "--repair").exit_code == 0
    _same(source_conn, dest_conn, schema)


def test_a_cursor_table_reloads_when_a_partition_brings_or_takes_rows(
    db_project, schema, writer, source_conn, dest_conn
):
    """Rows attached behind the cursor would never be read; rows detached never deleted. A
    new partition whose rows the cursor reads anyway reloads nothing."""
    db_project.env.update(IN_PROCESS)
    _events(writer, schema)
    _run(writer, schema, "ALTER TABLE {events} ADD COLUMN rev int NOT NULL DEFAULT 1")
    db_project.write_config({"tables": [{"name": f"{schema}.events", "replication_key": "rev"}]})
    db_project.sync()
    _run(writer, schema, "UPDATE {events} SET rev = 2, note = 'two' WHERE id <= 10")
    _run(
        writer, schema, "CREATE TABLE {p_new} PARTITION OF {events} FOR VALUES FROM (300) TO (400)"
    )
    _run(
        writer,
        schema,
        "INSERT INTO {events} SELECT g, 300 + mod(g, 100), 'eu', 'new', 2 "
        "FROM generate_series(2001, 2040) g",
    )
    created = db_project.sync()
    assert f"{schema}.events: incremental" in created.stderr, created.stderr
    assert _same(source_conn, dest_conn, schema) == 540

    _loose_table(writer, schema, 400)
    _run(writer, schema, "ALTER TABLE {loose} ADD COLUMN rev int NOT NULL DEFAULT 1")
    _run(
        writer,
        schema,
        "ALTER TABLE {events} ATTACH PARTITION {loose} FOR VALUES FROM (400) TO (500)",
    )
    compiled = db_project.run("compile")
    assert (
        f"-- next sync: full_reload (partitions changed: {schema}.loose attached with rows "
        "behind the cursor)" in compiled.stdout
    ), compiled.output
    attached = db_project.sync()
    assert f"{schema}.loose attached with rows behind the cursor" in attached.stderr
    assert _same(source_conn, dest_conn, schema) == 590

    _run(writer, schema, "ALTER TABLE {p_mid} DETACH PARTITION {p_mid_eu}")
    detached = db_project.sync()
    assert f"{schema}.p_mid_eu detached or dropped" in detached.stderr, detached.stderr
    assert _same(source_conn, dest_conn, schema) == 490
    assert db_project.run("verify").exit_code == 0

    # A leaf rewritten alone changes no value; a column rewritten in place through the root
    # (same type) changes them all, with no cursor moved (the copy kept them, exit 0).
    _run(writer, schema, "VACUUM FULL {p_low}")
    assert f"{schema}.events: noop" in db_project.sync().stderr
    _run(writer, schema, "ALTER TABLE {events} ALTER COLUMN note TYPE text USING upper(note)")
    rewritten = db_project.sync()
    assert "schema changed: column rewritten: note" in rewritten.stderr, rewritten.stderr
    assert _same(source_conn, dest_conn, schema) == 490


def test_the_tools_publication_made_before_gets_publish_via_partition_root(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A publication an earlier version made (without the option) for plain tables is set to
    publish through the root before a partitioned table joins it; the plain table's slot
    position holds (no reload)."""
    cdc_project.env.update(IN_PROCESS)
    _events(writer, schema)
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text)").format(
            sql.Identifier(schema, "plain")
        )
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.plain", "mode": "cdc"}]})
    cdc_project.sync()
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    publication = sql.Identifier(names["publication"])
    source_conn.execute(
        sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = false)").format(publication)
    )
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.{t}", "mode": "cdc"} for t in ("plain", "events")]}
    )
    joined = cdc_project.sync()
    assert f"{schema}.events: full_reload" in joined.stderr, joined.stderr
    assert f"{schema}.plain: noop" in joined.stderr
    _run(writer, schema, "UPDATE {events} SET k = 150, region = 'eu' WHERE id = 3")
    writer.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'one')").format(sql.Identifier(schema, "plain"))
    )
    applied = cdc_project.sync()
    assert f"{schema}.events: incremental" in applied.stderr, applied.stderr
    assert f"{schema}.plain: incremental" in applied.stderr
    assert _same(source_conn, dest_conn, schema) == 500
    assert assert_same_table(source_conn, dest_conn, schema, "plain") == 1


def test_a_partition_of_a_captured_root_cannot_be_captured_too(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The publication names a partition's changes by its root: a partition captured beside
    its root (a second level's, here) would never change again. It fails, saying so, in
    every run and in check; the root goes on, and no run fails on the publication."""
    cdc_project.env.update(IN_PROCESS)
    _events(writer, schema)
    leaf = {"name": f"{schema}.p_mid_eu", "mode": "cdc"}
    cdc_project.write_config({"tables": [leaf]})
    cdc_project.sync()  # alone, the partition is captured under its own name
    cdc_project.write_config({"tables": [{"name": f"{schema}.events", "mode": "cdc"}, leaf]})
    expected = f"a partition of {schema}.events, which is captured too (mode cdc)"
    for round_ in range(2):
        _run(writer, schema, "UPDATE {events} SET note = %s WHERE region = 'eu'", f"r{round_}")
        result = cdc_project.run("sync")
        assert result.exit_code == 1, result.output
        assert f"{schema}.p_mid_eu: failed" in result.stderr and expected in result.stderr
        assert f"{schema}.events: {('full_reload', 'incremental')[round_]}" in result.stderr
        assert "already member" not in result.stderr, result.stderr
        assert _same(source_conn, dest_conn, schema) == 500
    checked = cdc_project.run("check")
    assert checked.exit_code == 1, checked.output
    assert expected in checked.output, checked.output


def _keyless_events(conn, schema: str) -> None:
    """A partitioned table without a key, captured under REPLICA IDENTITY FULL (its one
    partition too), 50 rows."""
    for statement in (
        "CREATE TABLE {events} (id int NOT NULL, k int, note text) PARTITION BY RANGE (k)",
        "CREATE TABLE {p_low} PARTITION OF {events} FOR VALUES FROM (0) TO (100)",
        "ALTER TABLE {events} REPLICA IDENTITY FULL",
        "ALTER TABLE {p_low} REPLICA IDENTITY FULL",
        "INSERT INTO {events} SELECT g, g % 100, 'n' FROM generate_series(1, 50) g",
    ):
        _run(conn, schema, statement)


def test_a_new_partition_without_a_replica_identity_takes_its_table_out_of_the_publication(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A keyless partitioned table captured under REPLICA IDENTITY FULL: a partition created
    later has no identity, and the source refuses its UPDATEs while the table is published.
    check warns of it; the next sync fails the table and takes it out of the publication
    (the application's UPDATEs go through again), and reloads it once the partition has one."""
    cdc_project.env.update(IN_PROCESS)
    _keyless_events(writer, schema)
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.events", "mode": "cdc", "primary_key": ["id"]}]}
    )
    cdc_project.sync()
    checked = cdc_project.run("check")
    warned = f"warn  {schema}.events: a partition created later has no replica identity"
    assert warned in checked.output, checked.output  # a warning, counted as one

    _run(
        writer, schema, "CREATE TABLE {p_new} PARTITION OF {events} FOR VALUES FROM (100) TO (200)"
    )
    _run(writer, schema, "INSERT INTO {events} VALUES (500, 150, 'new')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):  # refused, as published
        _run(writer, schema, "UPDATE {events} SET note = 'moved' WHERE id = 500")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1, failed.output
    assert f"partition {schema}.p_new: no primary key, and replica identity DEFAULT" in (
        failed.stderr
    ), failed.stderr
    assert f"{schema}.events is left out of the tool's publication" in failed.stderr
    _run(writer, schema, "UPDATE {events} SET note = 'moved' WHERE id = 500")  # taken again

    _run(writer, schema, "ALTER TABLE {p_new} REPLICA IDENTITY FULL")
    back = cdc_project.sync()
    assert f"{schema}.events: full_reload" in back.stderr, back.stderr
    _run(writer, schema, "UPDATE {events} SET note = 'again' WHERE id BETWEEN 1 AND 10")
    cdc_project.sync()
    assert _same(source_conn, dest_conn, schema) == 51


def test_a_run_of_other_tables_lets_a_refused_table_out_of_the_publication_too(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The same refusal found on a run that does not select the table (`sync -s loose`):
    the table leaves the publication then, with a warning, not at its own next run, so
    the application's UPDATEs go through at once; it reloads when it is back."""
    cdc_project.env.update(IN_PROCESS)
    _keyless_events(writer, schema)
    _run(writer, schema, "CREATE TABLE {loose} (id int PRIMARY KEY, note text)")
    _run(writer, schema, "INSERT INTO {loose} VALUES (1, 'a')")
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.events", "mode": "cdc", "primary_key": ["id"]},
                {"name": f"{schema}.loose", "mode": "cdc"},
            ]
        }
    )
    cdc_project.sync()
    _run(
        writer, schema, "CREATE TABLE {p_new} PARTITION OF {events} FOR VALUES FROM (100) TO (200)"
    )
    _run(writer, schema, "INSERT INTO {events} VALUES (500, 150, 'new')")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):  # refused, as published
        _run(writer, schema, "UPDATE {events} SET note = 'moved' WHERE id = 500")

    other = cdc_project.sync("-s", f"{schema}.loose")
    assert (
        f"{schema}.events: partition {schema}.p_new: no primary key, and replica identity "
        "DEFAULT: the source refuses its UPDATEs and DELETEs while it is published, so it "
        "leaves the tool's publication"
    ) in other.stderr, other.stderr
    _run(writer, schema, "UPDATE {events} SET note = 'moved' WHERE id = 500")  # taken at once
    assert f"{schema}.events" not in cdc_project.sync("-s", f"{schema}.loose").stderr

    _run(writer, schema, "ALTER TABLE {p_new} REPLICA IDENTITY FULL")
    back = cdc_project.sync()
    assert f"{schema}.events: full_reload" in back.stderr, back.stderr
    assert _same(source_conn, dest_conn, schema) == 51


def test_a_killed_load_resumes_only_while_the_leaves_are_the_same(
    db_project, schema, writer, source_conn, dest_conn
):
    """A leaf attached between the two snapshots would hold rows behind the catch-up's
    cursor: the load would start over; detached again, the same leaves resume."""
    _events(writer, schema)
    _run(writer, schema, "ALTER TABLE {events} ADD COLUMN rev int NOT NULL DEFAULT 1")
    db_project.write_config(
        {"tables": [{"name": f"{schema}.events", "replication_key": "rev", "partitions": 4}]}
    )
    killed = db_project.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "task-before-commit@3"}
    )
    assert killed.returncode == -9, killed.stderr
    status = db_project.run("status", "--json", env=IN_PROCESS)
    resumable = json.loads(status.stdout)[0]["resumable"]
    assert resumable["loaded"] == 2 and resumable["partitions"] >= 3, resumable

    _loose_table(writer, schema, 400)
    _run(writer, schema, "ALTER TABLE {loose} ADD COLUMN rev int NOT NULL DEFAULT 1")
    _run(
        writer,
        schema,
        "ALTER TABLE {events} ATTACH PARTITION {loose} FOR VALUES FROM (400) TO (500)",
    )
    compiled = db_project.run("compile", env=IN_PROCESS)
    assert "starts an unfinished load over: the source table was rewritten since" in (
        compiled.stdout
    ), compiled.output
    assert "a partition attached, detached or rewritten" in compiled.stdout

    _run(writer, schema, "ALTER TABLE {events} DETACH PARTITION {loose}")
    resumed = db_project.sync()
    assert f"resuming the load: 2 of {resumable['partitions']} partitions loaded" in (
        resumed.stderr
    ), resumed.stderr
    assert _same(source_conn, dest_conn, schema) == 500


def test_a_dba_publication_must_publish_through_the_root(
    cdc_project, schema, writer, source_conn, dest_conn
):
    cdc_project.env.update(IN_PROCESS)
    _events(writer, schema)
    name = f"dba_{uuid.uuid4().hex[:12]}"
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.Identifier(schema, "events")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    cdc_project.write_config(
        {
            "tables": [{"name": f"{schema}.events", "mode": "cdc"}],
            "cdc": {"slot": name, "publication": name, "create": False},
        }
    )
    fix = f'ALTER PUBLICATION "{name}" SET (publish_via_partition_root = true)'
    checked = cdc_project.run("check")
    assert checked.exit_code == 1
    assert f"error {schema}.events: publication {name} (named in tables-config.json `cdc`) " in (
        checked.output
    )
    assert "publish_via_partition_root off" in checked.output
    assert f"fix: a DBA runs {fix}" in checked.output
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1
    assert "publish_via_partition_root off" in failed.stderr and fix in failed.stderr

    source_conn.execute(fix)
    cdc_project.sync()
    _run(writer, schema, "UPDATE {events} SET k = 150, region = 'eu' WHERE id = 3")
    moved = cdc_project.sync()
    assert f"{schema}.events: incremental" in moved.stderr, moved.stderr
    assert _same(source_conn, dest_conn, schema) == 500


def test_a_partitioned_table_above_min_rows_is_copied_by_spark_leaf_by_leaf(
    db_project, schema, writer, source_conn, dest_conn
):
    """The root has no statistics: the estimate is its leaves', and Spark's tasks each read
    leaves (the large one in page ranges), never the root's own (empty) pages."""
    db_project.env["REPLICATOR_SPARK_MIN_ROWS"] = "10000"
    _run(
        writer,
        schema,
        "CREATE TABLE {events} (id int PRIMARY KEY, pad text) PARTITION BY RANGE (id)",
    )
    _run(
        writer, schema, "CREATE TABLE {p_low} PARTITION OF {events} FOR VALUES FROM (0) TO (30001)"
    )
    _run(
        writer,
        schema,
        "CREATE TABLE {p_mid} PARTITION OF {events} FOR VALUES FROM (30001) TO (35001)",
    )
    _run(writer, schema, "CREATE TABLE {p_rest} PARTITION OF {events} DEFAULT")
    # about 1 kB a row, stored as is (under the TOAST threshold): 40 MB in all
    _run(
        writer,
        schema,
        "INSERT INTO {events} SELECT g, repeat(md5(g::text), 28) FROM generate_series(1, 40000) g",
    )
    db_project.write_config({"tables": [{"name": f"{schema}.events", "mode": "full-refresh"}]})
    compiled = json.loads(db_project.run("compile", "--json").stdout)[0]
    copies = [
        s["sql"]
        for s in compiled["script"]["full_reload"]
        if s["side"] == "source" and s["sql"].startswith("COPY")
    ]
    assert len(copies) >= 2, copies
    for leaf in ("p_low", "p_mid", "p_rest"):
        assert any(f'"{schema}"."{leaf}"' in copy for copy in copies), copies
    assert not any(f'"{schema}"."events"' in copy for copy in copies)
    assert any("ctid" in copy and "p_low" in copy for copy in copies)  # inside the large leaf

    synced = db_project.sync("-v")
    tasks = int(synced.stderr.split("replicator copy: ")[1].split(" task(s)")[0])
    assert tasks >= 2, synced.stderr  # (as many as compile shows when Spark has its cores)
    assert assert_same_table(source_conn, dest_conn, schema, "events") == 40000


def _leaf(name: str, megabytes: int) -> Leaf:
    size = megabytes * 1024**2
    return Leaf(TableName("s", name), 1, "1", 1, False, size, size // 8192, size // 1000, True)


def test_leaves_are_packed_into_parts_and_a_large_one_is_cut_into_page_ranges():
    leaves = [_leaf("big", 300), _leaf("a", 40), _leaf("b", 40), _leaf("c", 20)]
    parts = split_leaves(leaves, parallelism=4, requested=None)
    assert parts is not None
    big = [p.pieces[0] for p in parts if p.pieces[0].leaf.name == "big"]
    assert [(p.first, p.end) for p in big] == [(0, 12800), (12800, 25600), (25600, None)]
    small = [
        [piece.leaf.name for piece in p.pieces] for p in parts if p.pieces[0].leaf.name != "big"
    ]
    assert small == [["a", "b", "c"]]
    assert split_leaves([_leaf("small", 10)], parallelism=4, requested=None) is None
    query = leaf_range_query(
        'SELECT "id", "pad" FROM "s"."root"', TableName("s", "root"), parts[-1]
    )
    text = query.as_string(None)
    assert text.count("UNION ALL") == 2 and '"s"."root"' not in text and '"s"."c"' in text


@pytest.fixture
def granted_once(pg_servers, source_conn, schema):
    """A role given SELECT on the schema's tables once (GRANT ... ON ALL TABLES IN SCHEMA),
    as a DBA does: partitions created later are not covered. Its source URL."""
    role = f"reader_{schema[-8:]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield role, pg_servers.source_url.replace("//postgres@", f"//{role}@", 1)
    source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_new_partition_the_role_cannot_read_is_looked_at_through_the_root(
    db_project, schema, writer, source_conn, dest_conn, granted_once
):
    """The monthly partition made ahead of time, which the loading role may not read: empty,
    it reloads nothing (it used to count as holding rows: a full reload every month); with
    rows behind the cursor it still reloads. `check` names it, with the GRANT and the
    ALTER DEFAULT PRIVILEGES that keep the next month's readable."""
    role, url = granted_once
    db_project.env.update(IN_PROCESS, REPLICATOR_SOURCE_URL=url)
    _events(writer, schema)
    _run(writer, schema, "ALTER TABLE {events} ADD COLUMN rev int NOT NULL DEFAULT 1")
    writer.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {0} TO {1}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    writer.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {0} TO {1}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    db_project.write_config({"tables": [{"name": f"{schema}.events", "replication_key": "rev"}]})
    db_project.sync()
    _run(
        writer, schema, "CREATE TABLE {p_new} PARTITION OF {events} FOR VALUES FROM (300) TO (400)"
    )
    _run(writer, schema, "UPDATE {events} SET rev = 2, note = 'two' WHERE id <= 10")
    checked = db_project.run("check")
    assert (
        f"warn  {schema}.events: role {role} may read the table but not its partition(s) "
        f"{schema}.p_new" in checked.stdout
    ), checked.stdout
    assert f"GRANT SELECT ON {schema}.p_new TO {role}" in checked.stdout
    assert (
        f"ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA {schema} GRANT SELECT ON "
        f"TABLES TO {role}" in checked.stdout
    )
    assert "next sync: incremental" in checked.stdout, checked.stdout
    assert f"{schema}.events: incremental" in db_project.sync().stderr
    assert _same(source_conn, dest_conn, schema) == 500
    _run(  # rows behind the cursor (rev 1 < 2) in the partition it cannot read
        writer,
        schema,
        "INSERT INTO {events} SELECT g, 300 + mod(g, 100), 'eu', 'late', 1 "
        "FROM generate_series(3001, 3020) g",
    )
    _run(writer, schema, "DETACH PARTITION {p_new}".join(["ALTER TABLE {events} ", ""]))
    _run(
        writer,
        schema,
        "ALTER TABLE {events} ATTACH PARTITION {p_new} FOR VALUES FROM (300) TO (400)",
    )
    reloaded = db_project.sync()
    assert f"{schema}.p_new attached with rows behind the cursor" in reloaded.stderr, (
        reloaded.stderr
    )
    assert _same(source_conn, dest_conn, schema) == 520
