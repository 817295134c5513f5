"""A `cdc` table's `columns` applied to the changes the log carries (plan/shaping.py does it
for loads): excluded columns dropped, hashed columns hashed, before anything is staged.

The publication normally leaves excluded columns out (a PostgreSQL 15 column list), so they
never leave the source; under REPLICA IDENTITY FULL the log must carry every column of an
update's old row, and the drain drops them here. The hash must equal the one the source
computes for a load, `sha256(salt || value::text)`: the log carries each value in its
type's output form, which is `value::text` for every type but the few whose cast to text is
a function of its own (boolean, character, inet); those are converted first, and a column
of a type whose text form cannot be told from the log is refused (`text_form`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ...base.errors import TableProblem
from ...base.identifiers import display_ident
from ...plan.table_sql import TableSql
from ...postgres.catalog import TableInfo
from ...postgres.database import fetch_all
from ..source.pgoutput import Unchanged
from .copy_rows import NULL, Field

TextForm = Callable[[bytes], bytes]
_UNESCAPE = re.compile(rb"\\(.)", re.S)
_ESCAPED = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"\\": b"\\"}

# The base types (domains resolved) whose cast to text is not their output function.
_BASE_TYPES = """
WITH RECURSIVE base(oid, typbasetype, typname, depth) AS (
  SELECT t.oid, t.typbasetype, t.typname, 0 FROM pg_catalog.pg_type t WHERE t.oid = ANY(%s)
  UNION ALL
  SELECT b.oid, t.typbasetype, t.typname, b.depth + 1
  FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.typbasetype WHERE b.typbasetype <> 0
)
SELECT DISTINCT ON (oid) oid, typname FROM base ORDER BY oid, depth DESC
"""


def _bool(value: bytes) -> bytes:
    return b"true" if value == b"t" else b"false"


def _bpchar(value: bytes) -> bytes:
    return value.rstrip(b" ")


def _inet(value: bytes) -> bytes:
    if b"/" in value:
        return value
    return value + (b"/128" if b":" in value else b"/32")


# typname -> how its output text becomes its `::text`; None: cannot be told apart.
_SPECIAL: dict[str, TextForm | None] = {
    "bool": _bool,
    "bpchar": _bpchar,
    "inet": _inet,
    "char": None,  # "char" prints bytes over 127 as \ooo; its cast to text does not
}


def text_form(type_name: str) -> TextForm | None:
    """How the log's text of a value of this base type becomes its `::text` (None: it
    cannot be told)."""
    return _SPECIAL.get(type_name, _same)


def _same(value: bytes) -> bytes:
    return value


def unescape(value: bytes) -> bytes:
    """A COPY text field's value as the log carried it."""
    if b"\\" not in value:
        return value
    return _UNESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), value)


@dataclass(frozen=True)
class LogShape:
    """How one relation's logged tuples become the rows its copy stages."""

    keep: tuple[int, ...]  # logged positions, in the copy's column order
    hashers: tuple[tuple[int, TextForm], ...]  # copy position, its value's `::text`
    salt: bytes

    def apply(self, values: list[Field] | None) -> list[Field] | None:
        if values is None:
            return None
        out = [values[i] for i in self.keep]
        for position, form in self.hashers:
            value = out[position]
            if value is NULL or isinstance(value, Unchanged):
                continue
            text = form(unescape(value))
            out[position] = hashlib.sha256(self.salt + text).hexdigest().encode()
        return out


@dataclass(frozen=True)
class LogShaping:
    """A `cdc` table's `columns` as the drain applies them, whatever the log's relation."""

    columns: tuple[str, ...]  # the copy's columns, in order
    types: dict[str, int]  # the type each is logged with (the source's)
    excluded: frozenset[str]
    forms: dict[str, TextForm]  # hashed column -> its `::text` from the log's text
    salt: bytes
    # `columns.include`: a column the log carries beyond the copy's is excluded (one the
    # source gained under REPLICA IDENTITY FULL, which allows no column list), no drift
    listed_only: bool = False

    def for_relation(self, logged: Sequence[tuple[str, int]]) -> LogShape | str:
        """The shape for a relation the log describes; a drift (text) when the log carries a
        column neither copied nor excluded, lacks one, or types one otherwise."""
        names = [name for name, _ in logged]
        extra = (
            []
            if self.listed_only
            else [n for n in names if n not in self.columns and n not in self.excluded]
        )
        missing = [c for c in self.columns if c not in names]
        retyped = [n for n, oid in logged if n in self.types and self.types[n] != oid]
        if extra or missing or retyped:
            parts = [
                *(f"{n} added" for n in extra),
                *(f"{n} dropped" for n in missing),
                *(f"{n} type changed" for n in retyped),
            ]
            return "in the log: " + ", ".join(parts)
        keep = tuple(names.index(c) for c in self.columns)
        hashers = tuple(
            (position, self.forms[name])
            for position, name in enumerate(self.columns)
            if name in self.forms
        )
        return LogShape(keep, hashers, self.salt)


def log_shaping(
    source: psycopg.Connection[Any], built: TableSql, info: TableInfo, salt: str | None
) -> LogShaping | None:
    """The drain's shaping of a table (None: it has no `columns`); TableProblem when a
    hashed column's text form cannot be told from the log."""
    shaping = built.shaping
    if shaping is None or not (shaping.exclude or shaping.hash or shaping.include):
        return None
    types = {c.name: c.type_oid for c in info.columns}
    hashed = {c: types[c] for c in shaping.hash}
    bases = dict(fetch_all(source, _BASE_TYPES, (list(hashed.values()),))) if hashed else {}
    forms: dict[str, TextForm] = {}
    bad = []
    for column, oid in hashed.items():
        form = text_form(bases.get(oid, ""))
        if form is None:
            bad.append(f"{display_ident(column)} ({bases.get(oid)})")
        else:
            forms[column] = form
    if bad:
        raise TableProblem(
            f"{built.table.written_name}: columns.hash of {', '.join(bad)}: the log's text of "
            "this type is not its `::text`, so the hash could not match a load's; use a "
            "cursor mode for this table, or hash another column"
        )
    columns = tuple(c.name for c in built.columns)
    return LogShaping(
        columns,
        {c: types[c] for c in columns if c in types},
        frozenset(shaping.exclude),
        forms,
        (salt or "").encode(),
        listed_only=bool(shaping.include),
    )
