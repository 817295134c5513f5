"""The rules between keys of tables-config.json: within a table (what a mode needs or
forbids, where its destination may be) and across tables (none listed twice).

pydantic checks each key on its own, and runs a model's own validators only when every
key of it passed, so a typo in one table used to hide a table listed twice, and an invalid
key hid its table's other problems. These rules read the document as written, once pydantic
has checked the keys: a key that failed, or that a misspelt key was probably meant to be, is
left out of the rules that read it, so one run lists every problem in the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ..base.identifiers import INTERNAL_SCHEMA, TableName, parse_column
from ..base.name_patterns import NamePattern, is_pattern
from .cdc_config import check_cdc_table

# The history table's name when `"history": true`: the copy's, with this suffix, beside it.
HISTORY_SUFFIX = "_history"

# A table's keys that a rule cannot trust: by table index (pydantic refused them).
Unsure = Mapping[int, set[str]]


def rule_problems(document: Mapping[str, Any], unsure: Unsure) -> list[str]:
    """Each problem as `path: message` (`tables[1]: ...`, `tables: ...`)."""
    tables = document.get("tables")
    if not isinstance(tables, list):
        return []
    entries = {i: t for i, t in enumerate(tables) if isinstance(t, dict)}
    problems = [
        f"tables[{i}]: {problem}"
        for i, table in entries.items()
        for problem in table_problems(table, unsure.get(i, set()))
    ]
    return problems + [f"tables: {p}" for p in duplicates(entries, unsure)]


def table_problems(table: Mapping[str, Any], unsure: set[str]) -> list[str]:
    """Every rule of one table whose keys are all trustworthy."""
    values = {k: v for k, v in table.items() if k not in unsure}
    found = []
    for keys, rule in _RULES:
        if keys & unsure:
            continue
        problem = rule(values)
        if problem is not None:
            found.append(problem)
    return found


def duplicates(entries: Mapping[int, Mapping[str, Any]], unsure: Unsure) -> list[str]:
    """Tables listed twice, by source name and by destination: each entry that repeats an
    earlier one (a pair once, though its destinations, the same names, repeat too)."""
    problems, pairs = [], set()
    for what, name_of in (("source table", _source), ("destination table", _target)):
        seen: dict[TableName, int] = {}
        for index, table in entries.items():
            name = name_of(table, unsure.get(index, set()))
            if name is None:
                continue
            if name not in seen:
                seen[name] = index
            elif (seen[name], index) not in pairs:
                pairs.add((seen[name], index))
                problems.append(
                    f"{what} {name} is listed twice (tables[{seen[name]}] and tables[{index}])"
                )
    written: dict[TableName, int] = {}  # each destination and history table: one writer
    for index, table in entries.items():
        for name in (_target(table, unsure.get(index, set())),):
            if name is not None:
                written.setdefault(name, index)
    for index, table in entries.items():
        history = history_target(table, unsure.get(index, set()))
        if history is None:
            continue
        if history in written and written[history] != index:
            problems.append(
                f"history table {history} of tables[{index}] is also written by "
                f"tables[{written[history]}]: name another with "
                '"history": {"table": "schema.name"}'
            )
        elif history in written:
            continue
        else:
            written[history] = index
    return problems


def _source(table: Mapping[str, Any], unsure: set[str]) -> TableName | None:
    return _parsed(table, "name", unsure)


def _target_schema(table: Mapping[str, Any]) -> str | None:
    """The schema the table (or a pattern's tables: `raw.*`) is written into."""
    destination = table.get("destination")
    if isinstance(destination, str) and is_pattern(destination):
        try:
            return NamePattern.parse(destination).literal_schema
        except ValueError:
            return None
    target = _target(table, set())
    return None if target is None else target.schema


def _target(table: Mapping[str, Any], unsure: set[str]) -> TableName | None:
    """The destination table (the source's name by default); None when not known or a
    pattern's."""
    if "destination" in table or "destination" in unsure:
        return _parsed(table, "destination", unsure)
    return _parsed(table, "name", unsure)


def _parsed(table: Mapping[str, Any], key: str, unsure: set[str]) -> TableName | None:
    value = table.get(key)
    if key in unsure or not isinstance(value, str):
        return None
    try:
        return TableName.parse(value)
    except ValueError:
        return None


def _needs_key(values: Mapping[str, Any]) -> str | None:
    mode = values.get("mode")
    if values.get("replication_key") is not None or mode in ("full-refresh", "cdc"):
        return None
    if mode is None:
        return (
            'set "replication_key" for an incremental table, '
            'or "mode": "full-refresh" to reload it every run'
        )
    return f'mode "{mode}" needs a "replication_key"'


def _cdc(values: Mapping[str, Any]) -> str | None:
    return check_cdc_table(values) if values.get("mode") == "cdc" else None


def _skip_needs_cursor(values: Mapping[str, Any]) -> str | None:
    if values.get("initial_load") == "skip" and values.get("mode") == "full-refresh":
        return (
            '"initial_load": "skip" needs an incremental mode (full-refresh copies every row '
            "every run)"
        )
    return None


def _deletes_need_cursor(values: Mapping[str, Any]) -> str | None:
    deletes, mode = values.get("deletes", "ignore"), values.get("mode")
    if deletes != "ignore" and mode == "full-refresh":
        return (
            '"deletes" applies to incremental modes (a full-refresh table is exact after every run)'
        )
    if deletes == "mark" and mode not in (None, "incremental-deduped", "full-refresh", "cdc"):
        return (
            '"deletes": "mark" needs mode incremental-deduped (a row that comes back is '
            'updated, and its mark cleared); use "delete" for an append table'
        )
    return None


def _pattern_keys(values: Mapping[str, Any]) -> str | None:
    """A pattern's destination is `schema.*` (each match keeps its name there); a single
    table's destination is one table, and only a pattern has tables to exclude."""
    name, destination = values.get("name"), values.get("destination")
    named_pattern = isinstance(name, str) and is_pattern(name)
    if isinstance(destination, str) and is_pattern(destination):
        if not named_pattern:
            return (
                f"destination {json.dumps(destination)} is a pattern, but name "
                f"{json.dumps(name)} is one table; "
                'write the destination as "schema.table"'
            )
        try:
            parsed = NamePattern.parse(destination)
        except ValueError as exc:
            return f"destination: {exc}"
        if parsed.literal_schema is None or not parsed.any_table:
            return (
                f"destination {json.dumps(destination)}: a pattern's destination is "
                '"schema.*" (each matched table keeps its name in that schema), e.g. "raw.*"'
            )
    elif destination is not None and named_pattern:
        return (
            f"name {json.dumps(name)} is a pattern: its destination must be "
            '"schema.*" (each matched table keeps its name there), not the one table '
            f"{json.dumps(destination)}"
        )
    if values.get("exclude") and not named_pattern:
        return f'"exclude" applies to a pattern name ("schema.*"); {json.dumps(name)} is one table'
    return None


def _destination_schema(values: Mapping[str, Any]) -> str | None:
    """Schemas replicator must never write a table into: its own bookkeeping schema, and
    PostgreSQL's system schemas."""
    schema = _target_schema(values)
    if schema is None:
        return None
    if schema == INTERNAL_SCHEMA:
        why = "replicator's own bookkeeping schema (partition markers, ownership records)"
    elif schema.startswith("pg_") or schema == "information_schema":
        why = "a PostgreSQL system schema"
    else:
        return None
    written = values.get("destination", values.get("name"))
    return (
        f'destination {written} is in {why}; set "destination" to a table in another '
        'schema (e.g. "warehouse.<table>")'
    )


def _shaped_columns(values: Mapping[str, Any]) -> str | None:
    """The columns a copy finds rows by (its key) or orders them by (its cursor) reach the
    destination as they are: neither excluded nor hashed; a column is one or the other."""
    columns = values.get("columns")
    if not isinstance(columns, Mapping):
        return None
    excluded, hashed = _column_set(columns.get("exclude")), _column_set(columns.get("hash"))
    included = _column_set(columns.get("include"))
    if included and columns.get("exclude"):
        return (
            'columns: "include" (the columns that leave the source) and "exclude" (the ones '
            "that do not) cannot be given together: keep one"
        )
    both = sorted(excluded & hashed)
    if both:
        return f"columns: {', '.join(both)} both excluded and hashed: choose one"
    shaped = excluded | hashed
    cursor = _column_set([values.get("replication_key")])
    if included:  # a hashed column leaves the source too, hashed
        left_out = sorted((cursor | _column_set(values.get("primary_key"))) - included - hashed)
        if left_out:
            return (
                f"columns: {', '.join(left_out)} (the replication key or primary key) must be "
                '"include"d: the copy reads its rows by them'
            )
    if cursor & shaped:
        return (
            f"columns: the replication key {', '.join(sorted(cursor))} cannot be excluded or "
            "hashed (each sync reads its value to know where to go on from)"
        )
    key = sorted(_column_set(values.get("primary_key")) & shaped)
    if key:
        return (
            f"columns: primary key column(s) {', '.join(key)} cannot be excluded or hashed "
            "(the copy finds its rows by them)"
        )
    return None


def _where_needs_deletes(values: Mapping[str, Any]) -> str | None:
    """A cursor table's filter: a row updated out of it is no longer read, and only the
    delete check removes it from the copy."""
    if values.get("where") is None or values.get("mode") in ("full-refresh", "cdc"):
        return None
    if values.get("deletes", "ignore") != "ignore":
        return None
    return (
        '"where" on a cursor table needs "deletes": "delete" (or "mark"): a row updated '
        "out of the filter is no longer read, and the delete check is what removes it from "
        'the copy (use "mode": "full-refresh" or "cdc" to need none)'
    )


def _history(values: Mapping[str, Any]) -> str | None:
    """A pattern's tables each keep their history beside their copy (`true`); a table named
    for it is one table's, outside the bookkeeping and system schemas, and not the copy."""
    history = values.get("history")
    if not isinstance(history, Mapping) or not isinstance(history.get("table"), str):
        return None
    name = values.get("name")
    if isinstance(name, str) and is_pattern(name):
        return (
            f'history: a pattern\'s tables each keep their own history: write "history": true '
            f"(each beside its copy, named <table>{HISTORY_SUFFIX}), not one table"
        )
    try:
        table = TableName.parse(history["table"])
    except ValueError:
        return None
    if table.schema == INTERNAL_SCHEMA or table.schema.startswith("pg_"):
        return f"history.table {table} is in a schema replicator keeps for itself or PostgreSQL's"
    if table == _target(values, set()):
        return f"history.table {table} is the copy itself: name another table"
    return None


def history_target(table: Mapping[str, Any], unsure: set[str]) -> TableName | None:
    """The history table an entry keeps (None: none, or not known from the document)."""
    history = table.get("history")
    if "history" in unsure or history is None or history is False:
        return None
    if isinstance(history, Mapping) and "table" in history:
        return _parsed(history, "table", set())
    target = _target(table, unsure)
    return None if target is None else TableName(target.schema, target.name + HISTORY_SUFFIX)


def _column_set(value: Any) -> set[str]:
    if not isinstance(value, list):
        return set()
    out = set()
    for item in value:
        try:
            out.add(parse_column(item))
        except (ValueError, AttributeError):
            continue
    return out


# Each rule, with the keys it reads: skipped when one of them cannot be trusted.
_RULES: tuple[tuple[frozenset[str], Callable[[Mapping[str, Any]], str | None]], ...] = (
    (frozenset({"mode", "replication_key"}), _needs_key),
    (frozenset({"mode"}), _cdc),
    (frozenset({"mode", "initial_load"}), _skip_needs_cursor),
    (frozenset({"mode", "deletes"}), _deletes_need_cursor),
    (frozenset({"name", "destination"}), _destination_schema),
    (frozenset({"name", "destination", "exclude"}), _pattern_keys),
    (frozenset({"columns", "replication_key", "primary_key"}), _shaped_columns),
    (frozenset({"where", "mode", "deletes"}), _where_needs_deletes),
    (frozenset({"name", "destination", "history"}), _history),
)
