"""Which columns key a table's copy (plan/table_key.py): pure, from what the catalog said."""

from __future__ import annotations

import pytest

from replicator.base.errors import TableProblem
from replicator.base.identifiers import TableName
from replicator.plan.table_key import TableKey, resolve_key
from replicator.postgres.catalog import Column, TableInfo, UniqueIndex
from replicator.project.config import TableConfig

COLUMNS = (Column("id", "integer", True), Column("code", "text", True), Column("note", "text"))


def _table(**entry):
    return TableConfig.model_validate({"name": "s.t", "written_name": "s.t", **entry})


def _source(primary_key=(), index=None):
    return TableInfo(TableName("s", "t"), 1, "table", COLUMNS, primary_key, index)


INDEX = UniqueIndex("t_code_key", ("code",))
ALL = {"id", "code", "note"}


@pytest.mark.parametrize(
    ("entry", "source", "key"),
    [
        pytest.param(
            {"replication_key": "id"}, _source(("id",)), TableKey(("id",), "primary key"), id="pk"
        ),
        pytest.param(
            {"replication_key": "id"},
            _source(index=INDEX),
            TableKey(("code",), "unique index", "t_code_key"),
            id="unique-index",
        ),
        pytest.param(
            {"replication_key": "id", "primary_key": ["id"]},
            _source(index=INDEX),
            TableKey(("id",), "config"),
            id="config-wins",
        ),
        pytest.param({"mode": "full-refresh"}, _source(), TableKey((), "none"), id="keyless"),
    ],
)
def test_the_key_and_where_it_comes_from(entry, source, key):
    assert resolve_key(_table(**entry), source, ALL) == key


def test_a_full_refresh_model_without_the_index_columns_is_copied_without_a_key():
    table = _table(mode="full-refresh")
    keyless = resolve_key(table, _source(index=INDEX), {"id", "note"})
    assert keyless == TableKey((), "none", "t_code_key")
    assert keyless.describe() == "no key (the model leaves out columns of unique index t_code_key)"
    # The other modes keep the key; build_table_sql then says the model must keep it.
    incremental = _table(replication_key="id")
    assert resolve_key(incremental, _source(index=INDEX), {"id", "note"}).origin == "unique index"


def test_describe_names_the_index():
    assert TableKey(("code",), "unique index", "t_code_key").describe() == (
        "key from unique index t_code_key (code)"
    )
    assert TableKey(("id",), "config").describe() == "primary key (id)"


@pytest.mark.parametrize("mode", ["incremental-deduped", "incremental-append", "cdc"])
def test_a_mode_that_needs_a_key_refuses_a_table_without_one(mode):
    entry = {"mode": mode} if mode == "cdc" else {"mode": mode, "replication_key": "id"}
    with pytest.raises(TableProblem, match=f"which mode {mode} needs .* no unique index"):
        resolve_key(_table(**entry), _source(), ALL)
