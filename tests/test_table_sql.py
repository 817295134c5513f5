"""Pure SQL building: DDL from sqlglot expressions, identifiers always quoted, types verbatim."""

from __future__ import annotations

from replicator.base.identifiers import TableName
from replicator.postgres import ddl
from replicator.postgres.catalog import Column
from replicator.postgres.database import render
from replicator.postgres.naming import derived_name, staging_table
from replicator.transfer.partitions import KeyRange, range_predicate, split_integer_range

ODD = TableName('Sales "EU"', "Order.Lines 😀")


def test_create_table_quotes_names_and_keeps_types_verbatim():
    columns = [
        Column("id", "bigint", True),
        Column('Weird "Col"', "bit varying(5)"),
        Column("m", 'public."My Enum"[]'),
    ]
    statement = render(ddl.create_table(ODD, columns, ["id"], unlogged=True, if_not_exists=True))
    assert statement == (
        'CREATE UNLOGGED TABLE IF NOT EXISTS "Sales ""EU"""."Order.Lines 😀" ('
        '"id" bigint NOT NULL, "Weird ""Col""" bit varying(5), "m" public."My Enum"[], '
        'PRIMARY KEY ("id"))'
    )


def test_drop_and_schema_ddl():
    assert render(ddl.drop_table(ODD)) == 'DROP TABLE IF EXISTS "Sales ""EU"""."Order.Lines 😀"'
    assert render(ddl.create_schema('a"b')) == 'CREATE SCHEMA IF NOT EXISTS "a""b"'


def test_derived_names_fit_63_bytes_and_never_collide():
    long_a = TableName("s" * 63, "é" * 31 + "a")
    long_b = TableName("s" * 63, "é" * 31 + "b")
    names = {derived_name("stg", t) for t in (long_a, long_b, ODD)}
    assert len(names) == 3
    assert all(len(n.encode()) <= 63 for n in names)
    assert staging_table(ODD).schema == "_replicator"


def test_integer_ranges_cover_everything_once():
    ranges = split_integer_range(1, 100, 4)
    assert ranges == [
        KeyRange(None, "26", True),
        KeyRange("26", "51"),
        KeyRange("51", "76"),
        KeyRange("76", None),
    ]
    assert split_integer_range(5, 6, 8) == [KeyRange(None, "6", True), KeyRange("6", None)]


def test_range_predicates_render_with_casts():
    assert range_predicate("id", "bigint", KeyRange(None, "26", True)).as_string(None) == (
        '("id" < \'26\'::bigint OR "id" IS NULL)'
    )
    assert range_predicate("Key", "text", KeyRange("a'b", "c")).as_string(None) == (
        "\"Key\" >= 'a''b'::text AND \"Key\" < 'c'::text"
    )
    assert range_predicate("id", "int", KeyRange(None, None, True)) is None
