"""Columns and rows shaped on their way out of the source, in every mode:
`tables[].columns.exclude` (never read), or `columns.include` (every other column excluded,
resolved against the source's columns at each plan), `tables[].columns.hash` (the hex
SHA-256 of the salted text form) and `tables[].where` (the rows the copy holds).

The table's model (the built-in one or the project's) is wrapped, so every path that reads
the model (full loads, batches, delete checks, verify, lag) reads the shaped rows: the
built-in model becomes `SELECT <columns> FROM <table> WHERE (<where>)`, where the filter may
use any column of the table, excluded ones included; a project's model becomes
`SELECT <columns> FROM (<model>) AS _replicator_model WHERE (<where>)`, the filter over
the model's columns. The salt (`REPLICATOR_HASH_SALT`) never appears in a statement: each
source session holds it in the `replicator.hash_salt` setting (project/settings.py).
`cdc` tables get the same result from the log: cdc/rows/shaped_log.py.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from ..base.errors import DatabaseError, TableProblem
from ..base.identifiers import display_ident, quote_ident
from ..postgres.catalog import Column, TableInfo, describe_query
from ..project.config import TableConfig
from ..project.settings import SALT_SETTING
from ..project.templates import Model
from .column_hint import columns_hint, near_column
from .model_reads import check_model_reads
from .salt import salt_id
from .table_key import preferred_key

MODEL_ALIAS = "_replicator_model"
TEXT_OID = 25


@dataclass(frozen=True)
class Shaping:
    """A table's shaping keys, as the config holds them."""

    exclude: tuple[str, ...]
    hash: tuple[str, ...]
    where: str | None
    salt_id: str | None  # which salt the hashes were made with (a fingerprint, not the salt)
    # `columns.include`: every other column of the source is excluded (`resolved`), those
    # it gains later too; the copy's signature names the included ones, so a new source
    # column changes nothing.
    include: tuple[str, ...] = ()

    def resolved(self, source: TableInfo) -> Shaping:
        """With `include`, `exclude` is every other column the source has now."""
        if not self.include:
            return self
        leaving = {*self.include, *self.hash}
        excluded = tuple(c.name for c in source.columns if c.name not in leaving)
        return replace(self, exclude=excluded)

    def where_present(self, names: Collection[str]) -> Shaping | None:
        """A pattern's `exclude` and `hash` on one table it matched, whose source table and
        model have the columns `names`: a column neither has is left out (one entry keeps
        `password_hash` in the source wherever it is), unless one close to it is there (a
        typo: kept, so the table fails with the hint). None when nothing is left to shape."""
        present = sorted(names)

        def kept(column: str) -> bool:
            return column in names or near_column(column, present) is not None

        pruned = replace(
            self,
            exclude=tuple(c for c in self.exclude if kept(c)),
            hash=tuple(c for c in self.hash if kept(c)),
        )
        if not (pruned.exclude or pruned.hash or pruned.include or pruned.where is not None):
            return None
        return pruned

    def describe(self) -> str:
        """For signatures and messages: what is shaped, and how."""
        parts = []
        if self.include:
            parts.append(f"include {', '.join(map(display_ident, self.include))}")
        elif self.exclude:
            parts.append(f"exclude {', '.join(map(display_ident, self.exclude))}")
        if self.hash:
            salt = f" (salt {self.salt_id})" if self.salt_id else " (no salt)"
            parts.append(f"hash {', '.join(map(display_ident, self.hash))}{salt}")
        if self.where:
            parts.append(f"where {self.where}")
        return "; ".join(parts)


def shaping_of(conn: psycopg.Connection[Any], table: TableConfig) -> Shaping | None:
    """The table's shaping; None when it has none (its model is read as it is). The
    source session `conn` says which salt its hashes use."""
    columns = table.columns
    exclude = columns.exclude if columns else ()
    hashed = columns.hash if columns else ()
    include = (columns.include or ()) if columns else ()
    if not exclude and not hashed and not include and table.where is None:
        return None
    salt = salt_id(conn) if hashed else None
    return Shaping(tuple(exclude), tuple(hashed), table.where, salt, tuple(include))


def hash_sql(column: str) -> str:
    """The pinned hash of a column's value (DESIGN: `tables[].columns`): NULL stays NULL."""
    return (
        "encode(sha256(convert_to(coalesce(current_setting("
        f"'{SALT_SETTING}', true), '') || {quote_ident(column)}::text, 'UTF8')), 'hex')"
    )


def readable_columns(source: TableInfo, shaping: Shaping | None, name: str) -> list[str]:
    """The source's columns a model may read: all but the excluded ones. TableProblem
    when a shaped column is not in the source."""
    if shaping is None:
        return [c.name for c in source.columns]
    names = {c.name for c in source.columns}
    unknown = [c for c in (*shaping.include, *shaping.exclude, *shaping.hash) if c not in names]
    if unknown:
        raise TableProblem(
            f"{name}: columns: no column {', '.join(map(display_ident, unknown))} in the source "
            f"table{columns_hint(unknown, source)}"
        )
    return [c.name for c in source.columns if c.name not in shaping.exclude]


def shape_model(
    conn: psycopg.Connection[Any],
    table: TableConfig,
    source: TableInfo,
    model: Model,
    output: tuple[Column, ...],
    shaping: Shaping,
) -> tuple[Model, tuple[Column, ...]]:
    """The model wrapped by the table's shaping, and its output columns."""
    name = table.written_name
    shown = [c.name for c in output]
    leaked = [c for c in shaping.exclude if c in shown]
    if leaked:
        raise TableProblem(
            f"{name}: the model ({model.origin}) reads excluded column(s) "
            f"{', '.join(map(display_ident, leaked))}: remove them from it"
        )
    if not model.reads_table_as_is:  # the built-in model selects the columns one by one
        check_model_reads(
            conn, model.sql, model.origin, source, shaping.exclude, shaping.hash, name
        )
    absent = [c for c in shaping.hash if c not in shown]
    if absent:
        raise TableProblem(
            f"{name}: columns.hash: the model ({model.origin}) has no column "
            f"{', '.join(map(display_ident, absent))}"
        )
    key = preferred_key(table, source)
    left_out = [c for c in shaping.exclude if c in key]
    if left_out and shaping.include:
        raise TableProblem(
            f"{name}: primary key column(s) {', '.join(map(display_ident, left_out))} must be "
            'in "columns": {"include": [...]} (the copy finds its rows by them): add them there'
        )
    keyed = [c for c in shaping.hash if c in key] + left_out
    if keyed:
        raise TableProblem(
            f"{name}: primary key column(s) {', '.join(map(display_ident, keyed))} cannot be "
            'excluded or hashed (the copy finds its rows by them): remove them from "columns"'
        )
    projection = ", ".join(
        f"{hash_sql(c.name)} AS {quote_ident(c.name)}"
        if c.name in shaping.hash
        else quote_ident(c.name)
        for c in output
    )
    if model.reads_table_as_is:  # the filter sees every column of the table
        text = f"SELECT {projection}\nFROM {source.read_as}"
    else:
        text = f"SELECT {projection}\nFROM (\n{model.sql}\n) AS {quote_ident(MODEL_ALIAS)}"
    if shaping.where is not None:
        text += f"\nWHERE ({shaping.where}\n)"
    shaped = Model(
        text,
        model.origin,
        model.is_default,
        reads_table_as_is=model.reads_table_as_is and shaping.where is None,
        base=model,
        shaping=shaping.describe(),
    )
    columns = tuple(
        Column(c.name, "text", False, TEXT_OID) if c.name in shaping.hash else c for c in output
    )
    if shaping.where is not None:  # PostgreSQL checks the filter, and names its problem
        try:
            describe_query(conn, shaped.sql)
        except DatabaseError as exc:
            message = str(exc).removeprefix("source: ")
            balanced = shaping.where.count("(") >= shaping.where.count(")")
            if 'at or near ")"' in message and balanced:  # the `)` the filter is put in
                message += " (the expression ends too soon)"
            raise TableProblem(
                f"{name}: tables[{table.entry}].where in tables-config.json "
                f"({shaping.where}): {message}"
            ) from None
    return shaped, columns
