"""Fuzzed tables-config.json and sync-state files: never a traceback, never a write."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    result = project.run("status")
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert "tables-config.json" in result.stderr
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
