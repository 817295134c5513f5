"""The SQL one table's sync runs, built from its config, the source catalog and its model.

Pure: given what the catalog said, it builds statements and never talks to a database, so
`compile` shows exactly what `sync` would run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError, TableProblem
from ..base.identifiers import TableName, display_ident, quote_ident
from ..postgres import ddl
from ..postgres.catalog import Column, TableInfo
from ..postgres.copy_objects import CopyIndex, configured_index
from ..postgres.history_tables import HistoryTable
from ..postgres.naming import MARK_COLUMN, MARK_TYPE, staging_table
from ..project.config import TableConfig
from ..project.state import Cursor
from ..project.templates import Model, Templates
from .column_hint import columns_hint
from .shaping import MODEL_ALIAS, Shaping
from .table_key import TableKey, resolve_key


@dataclass(frozen=True)
class TableSql:
    """Everything a table's sync would run, as statements."""

    table: TableConfig
    model: Model
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    full_extract: sql.Composable
    key: TableKey  # `primary_key` and where it comes from (table_key.py)
    templates: Templates = field(compare=False, repr=False)
    shaping: Shaping | None = None  # the table's `columns` and `where` (plan/shaping.py)
    # a column's values are, or hold, a type COPY's binary form cannot carry to another
    # database (regclass, a domain over it, tsquery...: type_closure.TEXT_COPIED_TYPES):
    # its rows are copied in COPY's text form
    copies_as_text: bool = False

    # Rendered when first used: a run screening 1,000 untouched tables needs none of them.
    @functools.cached_property
    def create_destination(self) -> sql.Composed:
        return ddl.create_table(
            self.table.target, destination_columns(self.table, self.columns), self.primary_key
        )

    @functools.cached_property
    def incremental_extract(self) -> sql.Composable | None:
        return incremental_extract(self.model.sql, self.table, self.columns)

    @functools.cached_property
    def merge(self) -> str | None:
        """The merge of the staged batch into the copy (None for full-refresh and cdc)."""
        return self.merge_from(staging_table(self.table.target))

    def merge_from(self, staging: TableName) -> str | None:
        """The merge of the rows staged in `staging` into the copy."""
        return _merge(
            self.table, self.columns, self.primary_key, self.templates, staging, self.unique_keys
        )

    @property
    def unique_keys(self) -> bool:
        """The batch cannot hold a key twice: the built-in model reads the table as it is,
        in one snapshot, and the key is the source's own primary key or unique index."""
        return self.model.reads_table_as_is and self.key.origin in ("primary key", "unique index")

    @property
    def merge_is_builtin(self) -> bool:
        """The merge comes from the tool's own macro, not one the project overrides."""
        macro = _MERGE_MACROS.get(self.table.mode or "")
        return macro is not None and self.templates.origins[macro].startswith("built-in")

    @property
    def merge_origin(self) -> str | None:
        """Which macro (and file) the merge is rendered from."""
        macro = _MERGE_MACROS.get(self.table.mode or "")
        return f"macro {macro} ({self.templates.origins[macro]})" if macro else None

    @contextlib.contextmanager
    def reading_model(self) -> Iterator[None]:
        """Source errors in the block name the model they come from (a division by zero in
        `models/shop/orders.sql` is the model's, not the tool's)."""
        try:
            yield
        except DatabaseError as exc:
            text = str(exc)
            if not text.startswith("source: ") or "(reading " in text:
                raise
            builtin = (self.model.base or self.model).reads_table_as_is
            if exc.sqlstate == INSUFFICIENT_PRIVILEGE and builtin:
                raise  # the role's, not a model's: the built-in one reads the table as is
            raise DatabaseError(
                f"{text} (reading {self.model.origin})", exc.sqlstate, exc.detail
            ) from None

    @functools.cached_property
    def history(self) -> HistoryTable | None:
        """The table's history table, when it keeps one (`tables[].history`)."""
        name = self.table.history_table
        if name is None:
            return None
        history = HistoryTable(name, self.table.target, self.primary_key, self.columns)
        problem = history.problem()
        if problem is not None:
            raise TableProblem(f"{self.table.written_name}: {problem}")
        return history

    @property
    def destination_columns(self) -> tuple[Column, ...]:
        return destination_columns(self.table, self.columns)

    @functools.cached_property
    def indexes(self) -> tuple[CopyIndex, ...]:
        """The indexes `tables[].indexes` asks the copy to keep; a column the copy does not
        have fails the table."""
        names = [c.name for c in self.destination_columns]
        wanted = []
        for number, index in enumerate(self.table.indexes):
            unknown = [c for c in index.columns if c not in names]
            if unknown:
                raise TableProblem(
                    f"{self.table.written_name}: indexes[{number}]: "
                    f"{', '.join(map(display_ident, unknown))} is not a column of the copy "
                    f"(its columns: {', '.join(map(display_ident, names))}); fix the entry in "
                    "tables-config.json"
                )
            wanted.append(
                configured_index(self.table.target, index.columns, index.unique, index.type)
            )
        return tuple(wanted)

    def type_of(self, column: str) -> str:
        """The exact type of one of the model's columns ("" when it has no such column)."""
        return next((c.type for c in self.columns if c.name == column), "")

    @property
    def replication_key_type(self) -> str:
        return self.type_of(self.table.replication_key or "")

    @property
    def key_can_be_null(self) -> bool:
        """Whether the model's replication key may be NULL (no NOT NULL to rely on)."""
        key = self.table.replication_key
        return any(c.name == key and not c.not_null for c in self.columns)


def fitting_cursor(built: TableSql, cursor: Cursor | None) -> Cursor | None:
    """The stored cursor when it is a value of the replication key's type now; None when
    the key, its type or the mode changed since it was stored (a `cdc` table's cursor is a
    log position): the table reloads, and no statement may compare the key with it."""
    if cursor is None or cursor.type != built.replication_key_type:
        return None
    return cursor


def destination_columns(table: TableConfig, columns: tuple[Column, ...]) -> tuple[Column, ...]:
    """The model's columns, and for `deletes: "mark"` the mark column last."""
    if table.deletes != "mark":
        return columns
    return (*columns, Column(MARK_COLUMN, MARK_TYPE))


def check_replication_key(table: TableConfig, source: TableInfo) -> Column | None:
    """The replication-key column of the source; TableProblem when it is missing."""
    if table.replication_key is None:
        return None
    column = source.column(table.replication_key)
    if column is None:
        raise TableProblem(
            f"{table.written_name}: replication key column "
            f"{display_ident(table.replication_key)} does not exist in the source table"
            f"{columns_hint([table.replication_key], source)}; set replication_key to one of "
            f"its columns{table.pattern_fix()}"
        )
    return column


def model_columns(model_output: tuple[Column, ...], source: TableInfo) -> tuple[Column, ...]:
    """The model's columns; NOT NULL kept where a column is the source's, unchanged."""
    out = []
    for column in model_output:
        original = source.column(column.name)
        keep = original is not None and original.type == column.type and original.not_null
        out.append(
            Column(column.name, column.type, keep, column.type_oid, column.attnum, column.collation)
        )
    return tuple(out)


def build_table_sql(
    table: TableConfig,
    source: TableInfo,
    model: Model,
    model_output: tuple[Column, ...],
    templates: Templates,
    shaping: Shaping | None = None,
    *,
    copies_as_text: bool = False,
) -> TableSql:
    """Build every statement of the table's sync."""
    columns = model_columns(model_output, source)
    names = {c.name for c in columns}
    key = resolve_key(table, source, names)
    primary_key = key.columns
    check_replication_key(table, source)
    required = [*primary_key, *([table.replication_key] if table.replication_key else [])]
    dropped = [c for c in dict.fromkeys(required) if c not in names]
    if dropped:
        which = "primary key" if key.origin != "unique index" else key.describe()
        raise TableProblem(
            f"{table.written_name}: the model ({model.origin}) must keep the {which} and "
            f"replication key columns; missing: {', '.join(map(display_ident, dropped))}"
        )
    return TableSql(
        shaping=shaping,
        table=table,
        model=model,
        columns=columns,
        primary_key=primary_key,
        full_extract=sql.SQL(model.sql),
        templates=templates,
        key=key,
        copies_as_text=copies_as_text,
    )


INSUFFICIENT_PRIVILEGE = psycopg.errors.InsufficientPrivilege.sqlstate
_MERGE_MACROS = {"incremental-deduped": "merge_deduped", "incremental-append": "merge_append"}


def _merge(
    table: TableConfig,
    columns: tuple[Column, ...],
    primary_key: tuple[str, ...],
    templates: Templates,
    staging: TableName,
    unique_keys: bool = False,
) -> str | None:
    """The merge of the batch staged in `staging`. `unique_keys` (TableSql.unique_keys): the
    built-in macro skips its reduction to one row per key."""
    target = table.target
    quoted = [quote_ident(c.name) for c in columns]
    quoted_key = [quote_ident(c) for c in primary_key]
    if table.mode == "incremental-deduped":
        return templates.call(
            "merge_deduped",
            target=target.sql(),
            staging=staging.sql(),
            columns=quoted,
            key_columns=quoted_key,
            # The key columns too: a key whose type's equality is coarser than its text
            # (citext's 'a@x' = 'A@x', numeric's 1.0 = 1.00) conflicts with the copy's old
            # spelling, which would stay (and a delete check would then find the source's
            # spelling missing and the copy's gone). A marked row that comes back is updated:
            # its mark is cleared (EXCLUDED's is the column default, NULL, as the staging
            # table has no such column).
            update_columns=quoted + ([quote_ident(MARK_COLUMN)] if table.deletes == "mark" else []),
            replication_key=quote_ident(table.replication_key or primary_key[0]),
            unique_keys=unique_keys,
        )
    if table.mode == "incremental-append":
        return templates.call(
            "merge_append",
            target=target.sql(),
            staging=staging.sql(),
            columns=quoted,
            key_columns=quoted_key,
        )
    return None


def batch_query(
    model_sql: str,
    key: str,
    key_type: str,
    cursor: str | sql.Composable | None,
    until: str | None = None,
    *,
    with_nulls: bool = False,
) -> sql.Composable:
    """The model's rows at or past the cursor (all of them without a cursor) and, with
    `until`, at or before it; values inlined as typed literals: for COPY, which takes no
    parameters. A cursor given as a placeholder (`sql.Placeholder("cursor")`) leaves it to
    be bound; the model's `%` must then be doubled.

    `with_nulls`: rows whose key is NULL too. No cursor can order them, so every sync of a
    table whose key can be NULL reads them all again (the merge keeps it idempotent), and a
    row inserted with, or updated to, a NULL key is not lost."""
    model = sql.SQL(model_sql)
    bounds = [
        sql.SQL("{alias}.{key} {op} {value}::{type}").format(
            alias=sql.Identifier(MODEL_ALIAS),
            key=sql.Identifier(key),
            op=sql.SQL(op),
            value=value if isinstance(value, sql.Composable) else sql.Literal(value),
            type=sql.SQL(key_type),
        )
        for op, value in ((">=", cursor), ("<=", until))
        if value is not None
    ]
    if not bounds:
        return model
    where = sql.SQL(" AND ").join(bounds)
    if with_nulls:
        where = sql.SQL("({} OR {}.{} IS NULL)").format(
            where, sql.Identifier(MODEL_ALIAS), sql.Identifier(key)
        )
    return sql.SQL("SELECT * FROM ({model}) AS {alias} WHERE {where}").format(
        model=model, alias=sql.Identifier(MODEL_ALIAS), where=where
    )


def incremental_extract(
    model_sql: str, table: TableConfig, columns: tuple[Column, ...]
) -> sql.Composable | None:
    """The batch query an incremental sync reads (`batch_query`), with the cursor as a bound
    parameter `%(cursor)s` (typed as the key) instead of the value a sync inlines."""
    if table.mode == "full-refresh" or table.replication_key is None:
        return None
    column = next(c for c in columns if c.name == table.replication_key)
    # The model text is the user's SQL: `%` must be doubled once a parameter is bound.
    escaped = model_sql.replace("%", "%%")
    return batch_query(
        escaped,
        table.replication_key,
        column.type,
        sql.Placeholder("cursor"),
        with_nulls=not column.not_null,
    )
