"""The values of tables-config.json checked one at a time: table names (or patterns),
column names, URLs, Spark settings, filters. Each raises ValueError with what was expected;
config.py turns it into the file's error list."""

from __future__ import annotations

import re
from typing import Any

from ..base.identifiers import TableName, parse_column
from ..base.name_patterns import NamePattern, is_pattern
from .sql_text import expression_only


def table_name(value: Any) -> TableName:
    if isinstance(value, TableName):
        return value
    if not isinstance(value, str):
        raise ValueError('expected a string like "schema.table"')
    return TableName.parse(value)


def table_or_pattern(value: Any) -> TableName | NamePattern:
    if isinstance(value, TableName | NamePattern):
        return value
    try:
        if isinstance(value, str) and is_pattern(value):
            return NamePattern.parse(value)
        return table_name(value)
    except ValueError as exc:
        hint = _glob_hint(value) if isinstance(value, str) else None
        raise ValueError(f"{exc}; {hint}" if hint else str(exc)) from None


def _glob_hint(text: str) -> str | None:
    """The pattern a name written another way most likely meant: SQL's LIKE (`many.t_%`),
    or a bare schema (`many`)."""
    unquoted = re.sub(r'"(?:[^"]|"")*"', "", text)
    if "%" in unquoted:
        return (
            f'a pattern is a glob, not SQL LIKE: write "{text.replace("%", "*")}" (* stands '
            "for any run of characters, ? for one)"
        )
    if "." not in unquoted and '"' not in text and text.strip():
        return f'for every table of schema {text.strip()}, write "{text.strip()}.*"'
    return None


def column(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a column name (string)")
    return parse_column(value)


def http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


def spark_keys(conf: dict[str, str]) -> dict[str, str]:
    bad = [key for key in conf if not key.startswith("spark.")]
    if bad:
        raise ValueError(f"Spark settings start with 'spark.': {', '.join(bad)}")
    return conf


def not_empty(value: tuple[Any, ...]) -> tuple[Any, ...]:
    if not value:
        raise ValueError("expected at least one entry")
    return value


def where_expression(value: str) -> str:
    """A boolean SQL expression: not empty, one expression (PostgreSQL checks the rest when
    the table is inspected, and names the problem)."""
    text = value.strip()
    if not text:
        raise ValueError("expected a boolean SQL expression, e.g. \"status <> 'test'\"")
    if not expression_only(text):
        raise ValueError("expected one SQL expression (no `;`, balanced parentheses)")
    return text


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(B|kB|MB|GB|TB)\s*", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}


def size_bytes(value: str) -> int:
    """A size as PostgreSQL's settings write it ("2GB", "512MB", "1.5 GB"), in bytes (units
    of 1024, as max_slot_wal_keep_size counts them)."""
    match = _SIZE.fullmatch(value)
    if match is None or float(match[1]) <= 0:
        raise ValueError('expected a size above 0 with a unit, like "2GB", "512MB" or "10TB"')
    return int(float(match[1]) * _SIZE_UNITS[match[2].lower()])


def checked_size(value: str) -> str:
    size_bytes(value)
    return value
