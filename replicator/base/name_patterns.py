"""Table name patterns: `"sales.*"`, `"many.t_*"`, `"*.events"` in tables-config.json.

A pattern is a `schema.table` name whose unquoted parts may hold `*` (any run of
characters) and `?` (one character), matched case-sensitively against the names PostgreSQL
stores. Unquoted letters fold to lower case as in SQL, and a quoted part is literal, `*`
included: `"Sales".*` matches every table of schema `Sales`, `sales."a*b"` only `a*b`. A
part may join quoted and unquoted pieces, for names with capitals: `sales."Orders"*`
matches `Orders2024` and `Orders_eu` (not `orders_x`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .identifiers import ASCII_LOWER, SPACE, TableName, read_quoted, skip_space

GLOB_CHARACTERS = "*?"


def is_pattern(text: str) -> bool:
    """Whether a configured name is a pattern: a glob character outside double quotes."""
    try:
        parts = _pattern_parts(text.strip())
    except ValueError:
        return False
    return any(globbed for _, globbed in parts)


# A part's first unquoted piece: an identifier's start (PostgreSQL's lexer) or a glob.
_UNQUOTED_GLOB = re.compile(r"(?:[A-Za-z_*?]|[^\x00-\x7f])(?:[A-Za-z0-9_$*?]|[^\x00-\x7f])*")
# A piece that follows another in one part (`"Orders"2024_*`): identifier characters or globs.
_PIECE = re.compile(r"(?:[A-Za-z0-9_$*?]|[^\x00-\x7f])+")


def _pattern_parts(text: str) -> list[tuple[str, bool]]:
    """Each dotted part as fnmatch reads it, and whether it holds a glob. A part is a run of
    pieces: quoted ones literal (`*` included, case kept, `""` a quote), unquoted ones
    folded to lower case with their globs; ValueError says where the text is wrong."""
    parts: list[tuple[str, bool]] = []
    i, n = skip_space(text, 0), len(text)
    while True:
        pieces: list[str] = []
        globbed = False
        while i < n and text[i] not in SPACE + ".":
            if text[i] == '"':
                literal, i = read_quoted(text, i)
                pieces.append(_escape(literal))
                continue
            m = (_PIECE if pieces else _UNQUOTED_GLOB).match(text, i)
            if not m:
                raise ValueError(f"expected an identifier at position {i + 1} of {_quoted(text)}")
            piece = m.group(0).translate(ASCII_LOWER)
            globbed = globbed or _has_glob(piece)
            pieces.append(piece)
            i = m.end()
        if not pieces:
            raise ValueError(f"expected an identifier at position {i + 1} of {_quoted(text)}")
        parts.append(("".join(pieces), globbed))
        i = skip_space(text, i)
        if i == n:
            return parts
        if text[i] != ".":
            raise ValueError(
                f"unexpected {json.dumps(text[i])} at position {i + 1} of {_quoted(text)}"
            )
        i = skip_space(text, i + 1)


@dataclass(frozen=True)
class NamePattern:
    """A parsed pattern: each part as fnmatch reads it (quoted parts escaped)."""

    schema: str
    name: str
    text: str  # as written, for messages

    @classmethod
    def parse(cls, text: str) -> NamePattern:
        """Parse `schema.table` with globs; ValueError names what is wrong."""
        parts = _pattern_parts(text.strip())
        if len(parts) != 2:
            raise ValueError(
                f'expected a pattern like "schema.*" or "schema.t_*", got {_quoted(text)}'
            )
        (schema, _), (name, _) = parts
        return cls(schema, name, text.strip())

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


def _quoted(text: str) -> str:
    """A name as written, in a message: as JSON writes it, the way the config holds it."""
    return json.dumps(text, ensure_ascii=False)
