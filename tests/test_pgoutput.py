"""The pgoutput decoder against what a real PostgreSQL slot returns: every message kind, NULLs,
unchanged TOASTed values, old keys, REPLICA IDENTITY FULL, truncate options, hostile names."""

from __future__ import annotations

import uuid

import pytest
from psycopg import sql

from replicator.cdc.rows.copy_rows import DELETE, INSERT, UPDATE, change, plain_line
from replicator.cdc.source.pgoutput import (
    UNCHANGED,
    Begin,
    Commit,
    DecodeError,
    Delete,
    Insert,
    Relation,
    Truncate,
    Update,
    decode,
)

TABLE = 'Order "Lines" 😀'


@pytest.fixture
def slot(source_conn, schema):
    """A table, a publication for it and a pgoutput slot created after the table.

    Logical decoding reads only WAL already flushed: the test clusters run with
    synchronous_commit off, so this session turns it on, or a commit could be decoded a
    moment later than the test looks."""
    source_conn.execute("SET synchronous_commit = on")
    name = f"t_{uuid.uuid4().hex[:12]}"
    table = sql.Identifier(schema, TABLE)
    source_conn.execute(
        sql.SQL(
            'CREATE TABLE {} (id int PRIMARY KEY, "Note %s" text, big text, amount numeric)'
        ).format(table)
    )
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(sql.Identifier(name), table)
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    try:
        yield name, table
    finally:
        source_conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        source_conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))


def _changes(conn, name):
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (name, name),
    ).fetchall()
    return [decode(data) for (data,) in rows]


def test_inserts_updates_deletes_and_their_transactions(source_conn, slot):
    name, table = slot
    big = "".join(uuid.uuid4().hex for _ in range(400))  # incompressible: stored out of line
    with source_conn.transaction():
        source_conn.execute(
            sql.SQL("INSERT INTO {} VALUES (1, 'one', %s, 1.50), (2, NULL, NULL, NULL)").format(
                table
            ),
            (big,),
        )
    source_conn.execute(sql.SQL("UPDATE {} SET \"Note %s\" = 'uno' WHERE id = 1").format(table))
    source_conn.execute(sql.SQL("UPDATE {} SET id = 3 WHERE id = 2").format(table))
    source_conn.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(table))
    messages = _changes(source_conn, name)

    kinds = [type(m).__name__ for m in messages]
    assert kinds == [
        "Begin", "Relation", "Insert", "Insert", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Update", "Commit",
        "Begin", "Delete", "Commit",
    ]  # fmt: skip
    begin, relation, first, second, commit = messages[:5]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.final_lsn == commit.lsn and commit.end_lsn > commit.lsn
    assert isinstance(relation, Relation)
    assert (relation.name, relation.replica_identity) == (TABLE, "d")
    assert [(c.name, c.in_key) for c in relation.columns] == [
        ("id", True),
        ("Note %s", False),
        ("big", False),
        ("amount", False),
    ]
    assert first == Insert(relation.oid, ("1", "one", big, "1.50"))
    assert second == Insert(relation.oid, ("2", None, None, None))

    untouched = messages[6]
    assert isinstance(untouched, Update)
    assert untouched.new == ("1", "uno", UNCHANGED, "1.50"), "the TOASTed value is not sent"
    assert untouched.old is None

    moved = messages[9]
    assert isinstance(moved, Update)
    assert moved.old_is_key and moved.old == ("2", None, None, None)
    assert moved.new == ("3", None, None, None)

    gone = messages[12]
    assert gone == Delete(relation.oid, ("3", None, None, None), old_is_key=True)
    assert messages[11].final_lsn > begin.final_lsn, "commit order is LSN order"


def test_replica_identity_full_sends_the_old_row(source_conn, slot):
    name, table = slot
    source_conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table))
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a', 'b', 2)").format(table))
    source_conn.execute(sql.SQL("UPDATE {} SET amount = 3").format(table))
    source_conn.execute(sql.SQL("DELETE FROM {}").format(table))
    messages = _changes(source_conn, name)
    relation, update, delete = [m for m in messages if isinstance(m, Update | Delete | Relation)]
    assert relation.replica_identity == "f"
    assert update.old == ("1", "a", "b", "2") and not update.old_is_key
    assert update.new == ("1", "a", "b", "3")
    assert delete == Delete(relation.oid, ("1", "a", "b", "3"), old_is_key=False)


def test_truncate_names_its_tables_and_options(source_conn, slot):
    name, table = slot
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a', 'b', 2)").format(table))
    source_conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(table))
    messages = _changes(source_conn, name)
    relation = next(m for m in messages if isinstance(m, Relation))
    (truncate,) = [m for m in messages if isinstance(m, Truncate)]
    assert truncate == Truncate((relation.oid,), cascade=False, restart_identity=True)


def test_bytes_that_are_not_pgoutput_are_refused_with_a_reason():
    with pytest.raises(DecodeError, match="not one of version 1's"):
        decode(b"Z")
    with pytest.raises(DecodeError, match="ends early"):
        decode(b"B\x00\x00")


def test_the_plain_fast_path_writes_what_the_general_path_writes(source_conn, slot):
    """copy_rows.plain_line takes the common changes (inserts, updates that kept their key,
    deletes by key) in one pass; on every message the log sends it must give the staging row
    the general path gives, and leave it the rest: values with bytes COPY reserves, NULLs,
    an unchanged TOASTed value, a key that moved, REPLICA IDENTITY FULL."""
    name, table = slot
    big = "".join(uuid.uuid4().hex for _ in range(400))
    statements = [
        ("INSERT INTO {} VALUES (1, 'one', %s, 1.50), (2, NULL, NULL, NULL)", (big,)),
        ("INSERT INTO {} VALUES (4, E'tab\\there\\nnew\\\\line', 'é😀', -0.5)", None),
        ("UPDATE {} SET \"Note %s\" = 'uno' WHERE id = 1", None),  # big: unchanged
        ("UPDATE {} SET amount = 2 WHERE id = 4", None),
        ("UPDATE {} SET id = 3 WHERE id = 2", None),
        ("DELETE FROM {} WHERE id = 3", None),
        ("ALTER TABLE {} REPLICA IDENTITY FULL", None),
        ("UPDATE {} SET amount = 3 WHERE id = 4", None),
        ("DELETE FROM {} WHERE id = 4", None),
    ]
    for statement, params in statements:
        source_conn.execute(sql.SQL(statement).format(table), params)
    rows = source_conn.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (name, name),
    ).fetchall()
    fast, general = 0, 0
    for seq, (data,) in enumerate(rows):
        if data[0] not in (INSERT, UPDATE, DELETE):
            continue
        plain = plain_line(data, seq)
        kind, old, _, new = change(data)
        values = new if kind != DELETE else old
        if plain is None:
            general += 1
            continue
        fast += 1
        op = {INSERT: b"I", UPDATE: b"U", DELETE: b"D"}[kind]
        assert old is None or kind == DELETE
        assert b"\t".join(plain) == b"\t".join([b"%d" % seq, op, b"{}", *values])
    assert (fast, general) == (5, 4), (fast, general)
