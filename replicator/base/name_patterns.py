"""Table name patterns: `"sales.*"`, `"many.t_*"`, `"*.events"` in tables-config.json.

A pattern is a `schema.table` name whose unquoted parts may hold `*` (any run of
characters) and `?` (one character), matched case-sensitively against the names PostgreSQL
stores. Unquoted letters fold to lower case as in SQL, and a quoted part is literal, `*`
included: `"Sales".*` matches every table of schema `Sales`, `sales."a*b"` only `a*b`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from .identifiers import TableName, split_parts

GLOB_CHARACTERS = "*?"


def is_pattern(text: str) -> bool:
    """Whether a configured name is a pattern: a glob character outside double quotes."""
    try:
        parts = split_parts(text.strip(), globs=True)
    except ValueError:
        return False
    return any(not quoted and _has_glob(part) for part, quoted in parts)


@dataclass(frozen=True)
class NamePattern:
    """A parsed pattern: each part as fnmatch reads it (quoted parts escaped)."""

    schema: str
    name: str
    text: str  # as written, for messages

    @classmethod
    def parse(cls, text: str) -> NamePattern:
        """Parse `schema.table` with globs; ValueError names what is wrong."""
        parts = split_parts(text.strip(), globs=True)
        if len(parts) != 2:
            raise ValueError(f'expected a pattern like "schema.*" or "schema.t_*", got {text!r}')
        (schema, schema_quoted), (name, name_quoted) = parts
        return cls(
            schema if not schema_quoted else _escape(schema),
            name if not name_quoted else _escape(name),
            text.strip(),
        )

    def matches(self, table: TableName) -> bool:
        return fnmatchcase(table.schema, self.schema) and fnmatchcase(table.name, self.name)

    @property
    def literal_schema(self) -> str | None:
        """The schema when that part has no glob (`raw.*`): a destination pattern's schema."""
        return None if _has_glob(_unescaped(self.schema)) else _unescape(self.schema)

    @property
    def any_table(self) -> bool:
        """Whether the table part is `*` alone (what a destination pattern allows)."""
        return self.name == "*"

    def __str__(self) -> str:
        return self.text


def _has_glob(part: str) -> bool:
    return any(ch in part for ch in GLOB_CHARACTERS)


def _escape(literal: str) -> str:
    """A quoted part for fnmatch: `*`, `?` and `[` match only themselves."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in literal)


def _unescaped(part: str) -> str:
    """The part with its escaped characters removed (to see whether a real glob is left)."""
    for ch in "*?[":
        part = part.replace(f"[{ch}]", "")
    return part


def _unescape(part: str) -> str:
    for ch in "*?[":
        part = part.replace(f"[{ch}]", ch)
    return part


def destination_for(pattern_destination: NamePattern, source: TableName) -> TableName:
    """Where a match of a pattern entry goes: `raw.*` keeps the table's name in `raw`."""
    schema = pattern_destination.literal_schema
    assert schema is not None and pattern_destination.any_table
    return TableName(schema, source.name)
