"""Log capture with values in their types' binary form (cdc/rows/binary_values.py): every
built-in type the drain reads that way arrives as the source has it, in a batch big enough
to be staged many rows at once (cdc/rows/binary_block.py) and one change at a time
(cdc/rows/binary_rows.py); a drain that stages any other type reads text, as before."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from cdc_tables import configure_cdc
from dbcompare import assert_same_table
from psycopg import sql
from waiting import wait_for

from replicator.cdc.rows.binary_values import BINARY_TYPES

pytestmark = pytest.mark.spark

BINARY = "binary 'true'"

# a column of every type binary_values takes, and the values each row gets: g is the row's
# number, and every seventh row's values are NULL (the key and `big` aside)
COLUMNS = {
    "b": ("bool", "g % 2 = 0"),
    "ba": ("bytea", "decode(lpad(to_hex(g), 8, '0') || '000a5c09', 'hex')"),
    "c": ('"char"', 'chr((65 + g % 26)::int)::"char"'),
    "nm": ("name", "'name ' || g"),
    "i2": ("int2", "(g % 30000 - 15000)::int2"),
    "i4": ("int4", "g * -7"),
    "t": (
        "text",
        "CASE g % 5 WHEN 0 THEN '' WHEN 1 THEN E'tab\\there\\nline\\\\' "
        "WHEN 2 THEN 'é ü ß ' || g WHEN 3 THEN E'\\\\N' ELSE 't' || g END",
    ),
    "o": ("oid", "g::oid"),
    "j": ("json", "json_build_object('k', g, 's', E'a\\tb', 'n', NULL)"),
    "ci": ("cidr", "('10.' || g % 256 || '.0.0/16')::cidr"),
    "f4": (
        "float4",
        "CASE g % 4 WHEN 0 THEN 'NaN' WHEN 1 THEN '-0' WHEN 2 THEN '-Infinity' "
        "ELSE (g / 3.0)::float4 END",
    ),
    "f8": ("float8", "CASE g % 3 WHEN 0 THEN 'Infinity' ELSE 0.1 + g * 0.2 END"),
    "m8": ("macaddr8", "'08:00:2b:01:02:03:04:05'::macaddr8"),
    "m": ("macaddr", "'08:00:2b:01:02:03'::macaddr"),
    "ip": ("inet", "('2001:db8::' || to_hex(g) || '/64')::inet"),
    "bp": ("char(5)", "left(g::text, 5)"),
    "vc": ("varchar(20)", "'v' || g"),
    "d": (
        "date",
        "CASE g % 5 WHEN 0 THEN 'infinity' WHEN 1 THEN '4713-01-01 BC' "
        "ELSE DATE '2026-01-01' + g END",
    ),
    "tm": ("time", "TIME '00:00:00.000001' + g * INTERVAL '1 second'"),
    "ts": (
        "timestamp(3)",
        "CASE g % 4 WHEN 0 THEN '-infinity' "
        "ELSE TIMESTAMP '2026-11-27 01:02:03.4567' + g * INTERVAL '1 hour' END",
    ),
    "tz": ("timestamptz", "TIMESTAMPTZ '1999-12-31 23:59:59.999999+05:30' + g * INTERVAL '1 day'"),
    "iv": ("interval", "make_interval(months => g % 13, days => -g, secs => g / 7.0)"),
    "ttz": ("timetz", "TIMETZ '12:34:56.789-03:30'"),
    "bt": ("bit(4)", "(g % 16)::bit(4)"),
    "vb": ("varbit", "(g % 256)::bit(8)::varbit"),
    "num": ("numeric(12,3)", "g / 8.0"),
    "nu": (
        "numeric",
        "CASE g % 4 WHEN 0 THEN 'NaN' WHEN 1 THEN 1.000 WHEN 2 THEN -1e-20 "
        "ELSE 12345678901234567890.5 * g END",
    ),
    "u": ("uuid", "md5(g::text)::uuid"),
    "l": ("pg_lsn", "('0/' || to_hex(g))::pg_lsn"),
    "jb": ("jsonb", "jsonb_build_object('k', g, 'a', jsonb_build_array(1.50, 'x', NULL))"),
    "aj": ("json[]", "ARRAY[json_build_object('g', g), NULL]"),
    "aci": ("cidr[]", "ARRAY['10.0.0.0/8'::cidr]"),
    "ab": ("bool[]", "ARRAY[true, NULL, false]"),
    "aba": ("bytea[]", "ARRAY['\\x00'::bytea, '']"),
    "ai2": ("int2[]", "ARRAY[[1, 2], [3, g % 100]]::int2[]"),
    "ai4": ("int4[]", "'{}'::int4[]"),
    "at": ("text[]", "ARRAY['a,b', E'c\"d', NULL, '', 'NULL']"),
    "abp": ("char(2)[]", "ARRAY['a', 'bc']"),
    "avc": ("varchar(8)[]", "ARRAY['x' || g % 10]"),
    "ai8": ("int8[]", "ARRAY[g, -g, 9223372036854775807]"),
    "af4": ("float4[]", "ARRAY['NaN', 1.5]::float4[]"),
    "af8": ("float8[]", "ARRAY[g * 0.1]"),
    "aip": ("inet[]", "ARRAY['127.0.0.1'::inet]"),
    "ats": ("timestamp[]", "ARRAY[TIMESTAMP '2026-01-01', 'infinity']"),
    "ad": ("date[]", "ARRAY[DATE '2026-01-01' + g]"),
    "atm": ("time[]", "ARRAY[TIME '23:59:59.999999']"),
    "atz": ("timestamptz[]", "ARRAY[now()]"),
    "aiv": ("interval[]", "ARRAY[INTERVAL '1 year -2 days 03:04:05']"),
    "anum": ("numeric[]", "ARRAY[1.10, 'NaN', g]::numeric[]"),
    "attz": ("timetz[]", "ARRAY[TIMETZ '01:02:03+14']"),
    "au": ("uuid[]", "ARRAY[md5('u' || g)::uuid]"),
    "ajb": ("jsonb[]", "ARRAY['{\"a\": [1, 2]}'::jsonb]"),
}


def _braced(text: str) -> str:
    """`text` inside sql.SQL's format string, of a statement with parameters."""
    return text.replace("{", "{{").replace("}", "}}").replace("%", "%%")


def _create(conn, schema: str, rows: int, extra: str = "") -> sql.Identifier:
    table = sql.Identifier(schema, "typed")
    columns = ", ".join(f"{name} {kind}" for name, (kind, _) in COLUMNS.items())
    conn.execute(
        sql.SQL(
            f"CREATE TABLE {{}} (id bigint PRIMARY KEY, {columns}, big text{_braced(extra)})"
        ).format(table)
    )
    _insert(conn, table, 1, rows)
    return table


def _insert(conn, table: sql.Identifier, first: int, last: int) -> None:
    values = ", ".join(f"CASE WHEN g % 7 = 3 THEN NULL ELSE {v} END" for _, v in COLUMNS.values())

    names = ", ".join(COLUMNS)
    conn.execute(
        sql.SQL(
            f"INSERT INTO {{}} (id, {names}, big) SELECT g, {_braced(values)}, NULL "
            "FROM generate_series(%s::int, %s) AS g"
        ).format(table),
        (first, last),
    )


def _changes(conn, table: sql.Identifier, rows: int) -> None:
    """Inserts, updates of every column, deletes, a NULL made a value and back, unchanged
    TOASTed values kept by updates and by a key that moved."""
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    conn.execute(sql.SQL("UPDATE {} SET big = %s || id WHERE id %% 10 = 1").format(table), (big,))
    with conn.transaction():
        sets = ", ".join(f"{name} = s.{name}" for name in COLUMNS)
        values = ", ".join(
            f"CASE WHEN g % 7 = 4 THEN NULL ELSE {v} END AS {name}"
            for name, (_, v) in COLUMNS.items()
        )
        conn.execute(
            sql.SQL(
                f"UPDATE {{t}} AS t SET {sets} FROM (SELECT g + 1 AS id, {_braced(values)} "
                "FROM generate_series(1, %s::int) AS g) AS s "
                "WHERE t.id = s.id AND t.id %% 3 <> 0"
            ).format(t=table),
            (rows,),
        )
        conn.execute(sql.SQL("DELETE FROM {} WHERE id % 9 = 5").format(table))
        _insert(conn, table, rows + 1, rows + rows // 2)
        conn.execute(sql.SQL("UPDATE {} SET id = id + 100000 WHERE id % 10 = 1").format(table))
        conn.execute(sql.SQL("UPDATE {} SET i4 = -1 WHERE id % 10 = 1").format(table))


def test_the_binary_types_are_the_servers(source_conn):
    """Built-in types keep their OIDs from one server to the next: the list names them."""
    rows = source_conn.execute(
        "SELECT oid::int, typname FROM pg_catalog.pg_type WHERE oid = ANY(%s)",
        (list(BINARY_TYPES),),
    ).fetchall()
    assert dict(rows) == BINARY_TYPES


@pytest.mark.parametrize("rows", [30, 1200])
def test_every_binary_type_arrives_as_the_source_has_it(
    cdc_project, schema, writer, source_conn, dest_conn, rows
):
    table = _create(writer, schema, rows)
    configure_cdc(cdc_project, schema, "typed")
    cdc_project.sync("-v")
    _changes(writer, table, rows)
    second = cdc_project.sync("-v")
    assert BINARY in second.stderr, second.stderr
    assert "typed: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "typed") > rows


def test_a_drain_that_stages_an_enum_reads_text(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """An enum's OID differs from server to server: text, which each type's input reads,
    serves the whole drain, the other table of it too."""
    level = sql.Identifier(schema, "level")
    writer.execute(sql.SQL("CREATE TYPE {} AS ENUM ('low', 'high')").format(level))
    table = _create(writer, schema, 1200, f", level {level.as_string(writer)} DEFAULT 'high'")
    plain = _plain(writer, schema)
    configure_cdc(cdc_project, schema, "typed", "plain")
    cdc_project.sync("-v")
    _changes(writer, table, 1200)
    writer.execute(sql.SQL("UPDATE {} SET level = 'low' WHERE id % 4 = 0").format(table))
    writer.execute(sql.SQL("UPDATE {} SET qty = qty * 1000 + 7").format(plain))
    second = cdc_project.sync("-v")
    assert BINARY not in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "typed") > 1200
    assert assert_same_table(source_conn, dest_conn, schema, "plain") == 1500


def test_a_copy_altered_by_hand_just_before_the_drain_reads_text(
    cdc_project, schema, writer, dest_conn, tmp_path
):
    """A copy whose column was altered to another type (here while the run was between its
    plan, which reloads such a copy, and its drain) would read the source's binary value
    as its own type's, wrongly: the drain reads text, which that type's input reads."""
    plain = _plain(writer, schema)
    configure_cdc(cdc_project, schema, "plain")
    cdc_project.sync("-v")
    writer.execute(sql.SQL("UPDATE {} SET qty = qty * 1000 + 7").format(plain))
    pause = tmp_path / "pause"
    syncing = subprocess.Popen(
        [sys.executable, "-m", "replicator", "sync", "-v", "--project-dir", str(cdc_project.path)],
        env={**os.environ, **cdc_project.env, "REPLICATOR_PAUSE_AT": f"cdc-before-drain={pause}"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (tmp_path / "pause.reached").exists(), 120, "the sync at its drain")
    dest_conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN qty TYPE numeric").format(plain))
    pause.touch()
    _, err = syncing.communicate(timeout=120)
    assert syncing.returncode == 0, err
    assert "plain: incremental" in err and BINARY not in err, err
    values = sql.SQL("SELECT count(*) FILTER (WHERE qty = id * 1000 + 7) FROM {}").format(plain)
    assert dest_conn.execute(values).fetchone() == (1500,)


def _plain(conn, schema: str) -> sql.Identifier:
    plain = sql.Identifier(schema, "plain")
    conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, qty int)").format(plain))
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, g FROM generate_series(1, 1500) g").format(plain)
    )
    return plain


@pytest.mark.parametrize("identity", ["default", "full"])
def test_a_key_ending_in_a_zero_byte_is_one_key_in_both_row_paths(
    cdc_project, schema, writer, source_conn, dest_conn, identity
):
    """Key 256 is 00 00 01 00 in binary: staged once among a thousand inserts at once and
    once by itself (a moved key's delete, or a delete of the whole old row), it is still one
    key, so the batch is reduced to its last change (the copy kept the deleted row)."""
    table = sql.Identifier(schema, "keyed")
    writer.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table))
    if identity == "full":
        writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(table))
    configure_cdc(cdc_project, schema, "keyed")
    cdc_project.sync("-v")
    with writer.transaction():
        writer.execute(
            sql.SQL("INSERT INTO {} SELECT g, 'x' FROM generate_series(1, 2000) g").format(table)
        )
        if identity == "full":
            writer.execute(sql.SQL("DELETE FROM {} WHERE id IN (256, 512)").format(table))
        else:
            writer.execute(
                sql.SQL("UPDATE {} SET id = id * 1000 WHERE id IN (256, 512)").format(table)
            )
    second = cdc_project.sync("-v")
    assert BINARY in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "keyed") == 2000 - (
        2 if identity == "full" else 0
    )
