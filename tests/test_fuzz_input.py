"""Fuzzed tables-config.json and sync-state files: never a traceback, never a write."""

from __future__ import annotations

import json

import pytest
from dbcompare import assert_same_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
keys = st.sampled_from(
    [
        "name",
        "replication_key",
        "mode",
        "primary_key",
        "destination",
        "partitions",
        "lookback",
        "on_schema_change",
        "initial_load",
        "//",
        "nme",
    ]
)
names = st.text(min_size=0, max_size=70) | st.sampled_from(
    ['public."Or""ders"', "a.b", 'x."😀 table"', "select.from", "a" * 64 + ".b", '"unterminated']
)
near_valid_tables = st.lists(
    st.dictionaries(keys, names | json_values, min_size=1, max_size=6), min_size=0, max_size=4
)
documents = (
    json_values.map(json.dumps)
    | near_valid_tables.map(lambda tables: json.dumps({"tables": tables}))
    | st.builds(
        lambda tables, extra: json.dumps({"tables": tables, **extra}),
        near_valid_tables,
        st.dictionaries(
            st.sampled_from(["webhook", "spark", "on_schema_change", "webhok"]), json_values
        ),
    )
    | st.text(max_size=200)
)


@FUZZ
@given(document=documents)
def test_any_config_is_exit_0_or_2_without_a_traceback(project, document):
    project.write_config(document)
    before = {p: p.read_bytes() for p in project.path.rglob("*") if p.is_file()}
    status = project.run("status")
    assert status.exit_code in (0, 2), status.output
    assert "Traceback" not in status.output
    if status.exit_code == 2:
        assert "tables-config.json" in status.stderr
    for args in (("sync",), ("compile",)):  # no connection settings: exit 2 either way
        result = project.run(*args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        if status.exit_code == 2:
            assert result.stderr == status.stderr
    after = {p: p.read_bytes() for p in project.path.rglob("*") if p.is_file()}
    assert after == before


state_documents = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.builds(
        lambda version, extra: json.dumps(
            {"format_version": version, "table": "public.orders", **extra}
        ).encode(),
        st.integers(-2, 5) | json_values,
        st.dictionaries(
            st.sampled_from(["cursor", "window", "pending", "last_run", "schema_signature"]),
            json_values,
        ),
    )
)


@FUZZ
@given(content=state_documents)
def test_any_state_file_fails_that_table_naming_the_file(project, content):
    project.write_config(
        {
            "tables": [
                {"name": "public.orders", "replication_key": "updated_at"},
                {"name": "public.other", "replication_key": "updated_at"},
            ]
        }
    )
    path = project.path / "sync-state" / "public.orders.json"
    path.write_bytes(content)
    before = {p: p.read_bytes() for p in project.path.rglob("*") if p.is_file()}
    for args in (("status", "--json"), ("state", "show")):
        result = project.run(*args)
        assert "Traceback" not in result.output
        assert result.exit_code in (0, 1), result.output
        if result.exit_code == 1:
            assert str(path) in result.output
            assert "public.other" in result.output, "the other table is still reported"
    after = {p: p.read_bytes() for p in project.path.rglob("*") if p.is_file()}
    assert after == before


@pytest.fixture
def two_synced_tables(db_project, source_conn, schema):
    """Two small tables, synced once in-process; the fuzz then corrupts the first's state."""
    for name in ("orders", "other"):
        source_conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL); "
                "INSERT INTO {} SELECT g, now() FROM generate_series(1, 20) g"
            ).format(sql.Identifier(schema, name), sql.Identifier(schema, name))
        )
    db_project.env["REPLICATOR_SPARK_MIN_ROWS"] = "1000000000"
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.orders", "replication_key": "updated_at"},
                {"name": f"{schema}.other", "replication_key": "updated_at"},
            ]
        }
    )
    assert db_project.run("sync").exit_code == 0
    return db_project


@settings(FUZZ, max_examples=25)
@given(content=state_documents)
def test_sync_with_any_state_file_fails_that_table_only(
    two_synced_tables, source_conn, dest_conn, schema, content
):
    """`sync` fails the table with the broken state file (exit 1, naming the file, the file
    left as it was, the destination table untouched) and syncs the other table."""
    project = two_synced_tables
    path = project.path / "sync-state" / f"{schema}.orders.json"
    good = path.read_bytes()
    path.write_bytes(content)
    source_conn.execute(
        sql.SQL("UPDATE {} SET updated_at = clock_timestamp() WHERE id = 1").format(
            sql.Identifier(schema, "other")
        )
    )
    before = dest_conn.execute(
        sql.SQL("SELECT xmin::text, count(*) FROM {} GROUP BY 1").format(
            sql.Identifier(schema, "orders")
        )
    ).fetchall()
    try:
        result = project.run("sync")
        assert "Traceback" not in result.output
        assert result.exit_code == 1, result.output
        assert str(path) in result.output
        assert path.read_bytes() == content
        assert assert_same_table(source_conn, dest_conn, schema, "other") == 20
        after = dest_conn.execute(
            sql.SQL("SELECT xmin::text, count(*) FROM {} GROUP BY 1").format(
                sql.Identifier(schema, "orders")
            )
        ).fetchall()
        assert after == before
    finally:
        path.write_bytes(good)
