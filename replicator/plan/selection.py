"""The tables a command works on: the config's entries, each pattern (`"sales.*"`) expanded
against the source's catalog.

Every run expands again, so a table created since the last run is loaded by the next one.
A pattern matches ordinary tables and partitioned roots, never a partition on its own; its
matches are sorted by name and stand where the entry stands. A table with an entry of its
own is that entry's, and a table two patterns match is the first one's. A table whose
sync-state says a pattern chose it but which the source no longer has is reported
(`vanished`); its copy is left alone.
"""

from __future__ import annotations

import dataclasses
import difflib
from fnmatch import fnmatchcase
from typing import Any

import psycopg

from ..base.errors import ReplicatorError, one_line
from ..base.identifiers import INTERNAL_SCHEMA, TableName, display_ident
from ..base.name_patterns import NamePattern, destination_for
from ..postgres.database import connect, fetch_all
from ..project.config import TableConfig
from ..project.project import Project, Vanished
from ..project.state import StateStore, state_file_stem

# Ordinary tables and partitioned roots outside the system schemas (and replicator's own).
_CATALOG_TABLES = """
SELECT n.nspname, c.relname
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> ALL (%s) AND n.nspname NOT LIKE 'pg\\_%%'
"""
_SKIPPED_SCHEMAS = ["information_schema", INTERNAL_SCHEMA]


def has_patterns(project: Project) -> bool:
    return any(t.is_pattern for t in project.config.tables)


def expand_project(
    project: Project,
    source: psycopg.Connection[Any] | None = None,
    catalog: list[TableName] | None = None,
) -> Project:
    """The project with every pattern entry replaced by its matches (itself when it has no
    pattern). Reads the source's catalog once, on `source` or a connection of its own
    (`catalog`: these tables instead); DatabaseError when the source cannot be reached."""
    if project.expanded or not has_patterns(project):
        return project
    if catalog is None and source is None:
        with connect(project.connections().source, "source") as conn:
            catalog = source_tables(conn)
    elif catalog is None:
        catalog = source_tables(source)
    entries = project.config.tables
    tables = expand_tables(entries, catalog)
    vanished = vanished_tables(entries, tables, catalog, project.store)
    chosen = {t.entry for t in tables}
    empty = [e for e in entries if e.is_pattern and e.entry not in chosen]
    abandoned = _abandoned(project.store, tables, vanished) if empty else ()
    unmatched = tuple(
        f"tables[{e.entry}] ({e.written_name}) matches no table in the source"
        + _capitals_hint(e.written_name)
        + _abandoned_hint(e, abandoned)
        for e in empty
    )
    config = project.config.model_copy(update={"tables": tables})
    return dataclasses.replace(
        project,
        config=config,
        expanded=True,
        vanished=vanished,
        unmatched=unmatched,
        abandoned=abandoned,
    )


def _abandoned(
    store: StateStore, tables: tuple[TableConfig, ...], vanished: tuple[Vanished, ...]
) -> tuple[TableName, ...]:
    """The tables sync-state has copied that no entry selects now and that the source still
    has (a vanished one is said apart)."""
    selected = {t.source for t in tables} | {v.name for v in vanished}
    return tuple(
        name
        for path in sorted(store.directory.glob("*.json"))
        if (name := store.name_in(path)) is not None
        and name not in selected
        and store.ever_synced(path)
    )


def _abandoned_hint(entry: TableConfig, abandoned: tuple[TableName, ...]) -> str:
    """What an entry that matches nothing leaves behind, and the pattern it most likely
    meant: one whose other part already matches a table left behind, and whose mistyped
    part is close to that table's."""
    if not abandoned:
        return ""
    assert isinstance(entry.name, NamePattern)
    pattern, names = entry.name, sorted(abandoned)
    meant = None
    for name in names:
        if fnmatchcase(name.schema, pattern.schema) and _close(pattern.name, name.name):
            meant = f"{entry.written_name.rsplit('.', 1)[0]}.{display_ident(name.name)}"
            break
        if fnmatchcase(name.name, pattern.name) and _close(pattern.schema, name.schema):
            meant = f"{display_ident(name.schema)}.{entry.written_name.rsplit('.', 1)[1]}"
            break
    shown = ", ".join(map(str, names[:3])) + (
        f" and {len(names) - 3} more" if len(names) > 3 else ""
    )
    hint = f"; did you mean {meant}?" if meant else ""
    return (
        f", and sync-state holds {len(names)} table(s) it copied that no entry selects now "
        f"({shown}): their copies are no longer kept current{hint}"
    )


def _close(written: str, actual: str) -> bool:
    return difflib.SequenceMatcher(None, written.replace("*", ""), actual).ratio() >= 0.75


def without_patterns(project: Project) -> Project:
    """The project's single-table entries alone (its patterns cannot be matched now)."""
    tables = tuple(t for t in project.config.tables if not t.is_pattern)
    config = project.config.model_copy(update={"tables": tables})
    return dataclasses.replace(project, config=config, expanded=True)


def expanded_or_known(project: Project) -> tuple[Project, str | None]:
    """The project with its patterns matched now; with the source out of reach, matched
    against the tables its sync-state knows, with a note saying so (the commands that show
    sync-state work without the source)."""
    try:
        return expand_project(project), None
    except ReplicatorError as exc:
        return matched_in_sync_state(project), (
            f"{one_line(exc)}: the table patterns are matched against the tables of "
            "sync-state/, not the source's catalog"
        )


def matched_in_sync_state(project: Project) -> Project:
    """The project with its patterns matched against the tables sync-state knows."""
    return expand_project(project, catalog=known_tables(project.store))


def known_tables(store: StateStore) -> list[TableName]:
    """The tables sync-state/ holds a state of, sorted (the catalog when the source is out
    of reach)."""
    names = (store.name_in(path) for path in store.directory.glob("*.json"))
    return sorted(name for name in names if name is not None)


def source_tables(conn: psycopg.Connection[Any]) -> list[TableName]:
    """Every table a pattern may match, sorted by name."""
    rows = fetch_all(conn, _CATALOG_TABLES, [_SKIPPED_SCHEMAS])
    return sorted(TableName(schema, name) for schema, name in rows)


def expand_tables(
    entries: tuple[TableConfig, ...], catalog: list[TableName]
) -> tuple[TableConfig, ...]:
    """Each pattern entry replaced by its matches, in config order (pure)."""
    explicit = {e.name for e in entries if not e.is_pattern}
    taken: set[TableName] = set()
    out: list[TableConfig] = []
    for entry in entries:
        if not entry.is_pattern:
            out.append(entry)
            continue
        for name in catalog:
            if name in explicit or name in taken or not _chosen(entry, name):
                continue
            taken.add(name)
            out.append(_match(entry, name))
    return _with_destination_problems(out)


def _chosen(entry: TableConfig, name: TableName) -> bool:
    assert isinstance(entry.name, NamePattern)
    if not entry.name.matches(name):
        return False
    return not any(
        item.matches(name) if isinstance(item, NamePattern) else item == name
        for item in entry.exclude
    )


def _match(entry: TableConfig, name: TableName) -> TableConfig:
    destination = entry.destination
    if isinstance(destination, NamePattern) and destination != entry.name:
        target = destination_for(destination, name)
    else:
        target = name
    return entry.model_copy(
        update={
            "name": name,
            "destination": target,
            "exclude": (),
            "written_name": str(name),
            "pattern": entry.written_name,
        }
    )


def _with_destination_problems(tables: list[TableConfig]) -> tuple[TableConfig, ...]:
    """A match whose destination another table already has fails alone (its entry's
    other matches go on): two tables never write one copy."""
    owner = {t.target: t for t in tables if t.pattern is None}
    out = []
    for table in tables:
        other = owner.setdefault(table.target, table)
        if other is not table:
            problem = (
                f"{table.written_name}: its destination {table.target} is already the copy of "
                f"{other.written_name} (tables[{other.entry}]); add it to tables[{table.entry}]"
                '\'s "exclude", or give it an entry with a destination of its own'
            )
            table = table.model_copy(update={"problem": problem})
        out.append(table)
    return tuple(out)


def vanished_tables(
    entries: tuple[TableConfig, ...],
    tables: tuple[TableConfig, ...],
    catalog: list[TableName],
    store: StateStore,
) -> tuple[Vanished, ...]:
    """State files of tables a pattern would choose that the source no longer has (and that
    a sync copied once)."""
    present = set(catalog)
    selected = {state_file_stem(t.source) for t in tables}
    found = []
    for path in sorted(store.directory.glob("*.json")):
        if path.stem in selected:
            continue
        name = store.name_in(path)
        if name is None or name in present or not store.ever_synced(path):
            continue  # never copied (a table named by hand that never existed): not gone
        entry = next((e for e in entries if e.is_pattern and _chosen(e, name)), None)
        explicit = any(e.name == name for e in entries if not e.is_pattern)
        if entry is not None and not explicit:
            found.append(Vanished(name, entry.entry, entry.written_name, path))
    return tuple(found)


def _capitals_hint(written: str) -> str:
    """A pattern with capitals outside quotes: they fold to lower case, as in SQL."""
    outside = "".join(written.split('"')[::2])  # the text outside double quotes
    if not any("A" <= ch <= "Z" for ch in outside):
        return ""
    return (
        " (capitals outside double quotes fold to lower case, as in SQL: quote the part "
        'that has them, the glob outside, as in sales."Orders"*)'
    )
