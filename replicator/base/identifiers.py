"""PostgreSQL identifiers: parsing names as PostgreSQL reads them, quoting them through
psycopg.sql (sqlglot nodes for the statements built with sqlglot, loaded only then).

Unquoted parts fold to lower case (ASCII only, as PostgreSQL does in UTF-8 databases); double
quotes keep case and allow any character, with `""` standing for one quote.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg import sql as psql

from .sql_keywords import KEYWORDS

if TYPE_CHECKING:
    from sqlglot import exp

MAX_IDENTIFIER_BYTES = 63
# replicator's own schema in the destination (markers, ownership records, side and staging
# tables): never a destination for a replicated table.
INTERNAL_SCHEMA = "_replicator"
# PostgreSQL's lexer: ident_start [A-Za-z\200-\377_], ident_cont adds digits and $ (bytes
# from \200 up: any character beyond ASCII, `[^\x00-\x7f]`, which compiles at once where the
# range up to U+10FFFF cost every start a noticeable part of it).
_UNQUOTED = re.compile(r"(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_$]|[^\x00-\x7f])*")
_SIMPLE = re.compile(r"[a-z_][a-z0-9_$]*")


@functools.lru_cache(maxsize=65_536)
def quote_ident(name: str) -> str:
    """The identifier quoted for PostgreSQL, whatever it contains (remembered: a run
    quotes each of its tables' names many times)."""
    return psql.Identifier(name).as_string(None)


def display_ident(name: str) -> str:
    """The identifier as a person would write it: bare when that reads back the same (a
    keyword does not: `order` is quoted)."""
    return name if _SIMPLE.fullmatch(name) and name not in KEYWORDS else quote_ident(name)


def split_name(text: str) -> list[str]:
    """Split a dotted name into identifier parts, applying PostgreSQL's quoting rules."""
    return [part for part, _quoted in split_parts(text)]


def split_parts(text: str) -> list[tuple[str, bool]]:
    """Each part of a dotted name with whether it was quoted (a pattern's parts:
    name_patterns.py)."""
    parts: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while True:
        i = skip_space(text, i)
        quoted = i < n and text[i] == '"'
        if quoted:
            part, i = read_quoted(text, i)
        else:
            m = _UNQUOTED.match(text, i)
            if not m:
                raise ValueError(f"expected an identifier at position {i + 1} of {_quoted(text)}")
            part = m.group(0).translate(ASCII_LOWER)
            i = m.end()
        parts.append((part, quoted))
        i = skip_space(text, i)
        if i == n:
            return parts
        if text[i] != ".":
            hint = (  # a space inside an unquoted name: `Big Customers`
                " (a name with spaces, capitals or symbols is written in double quotes, as in "
                "SQL: 'shop.\"Big Customers\"')"
                if not quoted and text[i - 1] in SPACE
                else ""
            )
            raise ValueError(
                f"unexpected {json.dumps(text[i])} at position {i + 1} of {_quoted(text)}{hint}"
            )
        i += 1


def read_quoted(text: str, i: int) -> tuple[str, int]:
    """The quoted identifier starting at `i` (a `"`; `""` stands for one quote), and where
    the text goes on after it."""
    buf, j = [], i + 1
    while True:
        k = text.find('"', j)
        if k < 0:
            raise ValueError(f"unterminated quoted identifier in {_quoted(text)}")
        buf.append(text[j:k])
        if text[k + 1 : k + 2] == '"':
            buf.append('"')
            j = k + 2
            continue
        part = "".join(buf)
        if not part:
            raise ValueError(f"empty quoted identifier in {_quoted(text)}")
        return part, k + 1


SPACE = " \t\n\r\f"  # PostgreSQL's scanner_isspace


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in SPACE:
        i += 1
    return i


ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _check_length(part: str, text: str) -> None:
    if len(part.encode()) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"identifier {part!r} in {_quoted(text)} is longer than PostgreSQL's "
            f"{MAX_IDENTIFIER_BYTES}-byte limit"
        )


def parse_column(text: str) -> str:
    """Parse one column name (`updated_at`, `"UpdatedAt"`)."""
    parts = split_name(text.strip())
    if len(parts) != 1:
        raise ValueError(f"expected a column name, got {_quoted(text)}")
    _check_length(parts[0], text)
    return parts[0]


@dataclass(frozen=True, order=True)
class TableName:
    """A schema-qualified table name, as PostgreSQL stores it (already unquoted and folded)."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Parse `schema.table` with PostgreSQL quoting rules; both parts are required."""
        parts = split_name(text.strip())
        if len(parts) != 2:
            raise ValueError(f'expected "schema.table", got {_quoted(text)}')
        for part in parts:
            _check_length(part, text)
        return cls(parts[0], parts[1])

    def table(self) -> exp.Table:
        """The sqlglot node for this table, both parts quoted."""
        from sqlglot import exp

        return exp.table_(self.name, db=self.schema, quoted=True)

    def sql(self) -> str:
        """The quoted SQL form: `"schema"."table"`."""
        return _table_sql(self.schema, self.name)

    def identifier(self) -> psql.Identifier:
        """The name for a psycopg.sql statement, both parts quoted."""
        return psql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return f"{display_ident(self.schema)}.{display_ident(self.name)}"


@functools.lru_cache(maxsize=65_536)
def _table_sql(schema: str, name: str) -> str:
    return psql.Identifier(schema, name).as_string(None)


def _quoted(text: str) -> str:
    """A name as written, in a message: as JSON writes it, the way the config holds it."""
    return json.dumps(text, ensure_ascii=False)
