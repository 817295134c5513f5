"""`check` for `cdc` tables: what log capture needs from the source (wal_level, the
REPLICATION attribute, a free slot, a bound on retained WAL), each table's replica identity,
and the project's slot and publication as they are. Reads only."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import psycopg

from ...base.errors import ReplicatorError
from ...base.identifiers import TableName, display_ident
from ...cdc.preflight import (
    IDENTITY_NAMES,
    applied_where,
    capture_problem,
    replica_identity,
    toastable_columns,
)
from ...cdc.source.dba_publication import publication_problem, via_root_problem
from ...cdc.source.log_filter import PublishedAs
from ...cdc.source.slot import (
    PLUGIN,
    WAL_LEVEL_FIX,
    add_table_statement,
    create_publication_statement,
    create_slot_statement,
    drop_slot_statement,
    publication_exists,
    published_tables,
    slot_info,
    wrong_plugin,
)
from ...cdc.source.unused_slot import unused_slot
from ...plan.inspect_table import inspect_source
from ...postgres.catalog import describe_tables
from ...postgres.database import fetch_all
from ...postgres.partition_tree import PARTITIONED
from ...project.project import Project
from ..capture_status import size_text
from .findings import Finding

_SETTINGS = """
SELECT current_setting('wal_level'), current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,
       current_setting('max_slot_wal_keep_size'),
       (SELECT rolreplication OR rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
       current_user
"""


def capture_findings(source: psycopg.Connection[Any], project: Project) -> Iterator[Finding]:
    tables = [t for t in project.config.tables if t.mode == "cdc"]
    if not tables:
        unused = unused_slot(source, project)
        if unused is not None:
            yield Finding("warn", "cdc", *unused)
        return
    level, slots, used, keep, replication, user = fetch_all(source, _SETTINGS)[0]
    if level == "logical":
        yield Finding("ok", "cdc", "wal_level is logical")
    else:
        yield Finding(
            "error",
            "cdc",
            f"wal_level is {level}: log capture needs logical",
            WAL_LEVEL_FIX,
        )
    if replication:
        yield Finding("ok", "cdc", f"role {user} may replicate")
    else:
        yield Finding(
            "error",
            "cdc",
            f"role {user} lacks the REPLICATION attribute (slots and load snapshots need it)",
            f"ALTER ROLE {display_ident(user)} REPLICATION",
        )
    names = _names(project)
    mine = names is not None and slot_info(source, names.slot) is not None
    needed = (0 if mine else 1) + 1  # the project's slot, and one while a table loads
    if slots - used >= needed:
        yield Finding("ok", "cdc", f"{slots - used} of {slots} replication slots free")
    else:
        yield Finding(
            "error",
            "cdc",
            f"{slots - used} of {slots} replication slots free; a sync needs {needed}",
            "drop unused slots (SELECT slot_name, active FROM pg_replication_slots), or raise "
            "max_replication_slots (restart)",
        )
    if keep == "-1":
        yield Finding(
            "warn",
            "cdc",
            "max_slot_wal_keep_size is unlimited: an abandoned slot keeps WAL until the disk fills",
            "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB' (sized for your disk); "
            "SELECT pg_reload_conf()",
        )
    else:
        yield Finding("ok", "cdc", f"max_slot_wal_keep_size is {keep}")
    yield from _slot(source, names)
    manages = names is None or names.created  # the tool makes and edits the publication
    published = None
    if manages:
        yield from _may_create_publication(source, names, user)
    else:
        published = yield from _dba_publication(source, names, tables)
    for table in tables:
        yield from _table(source, project, table, user if manages else None, published, names)


_CREATE_ON_DATABASE = (
    "SELECT has_database_privilege(current_user, current_database(), 'CREATE'), current_database()"
)


def _may_create_publication(
    source: psycopg.Connection[Any], names: Any, user: str
) -> Iterator[Finding]:
    if names is not None and publication_exists(source, names.publication):
        return
    may, database = fetch_all(source, _CREATE_ON_DATABASE)[0]
    if not may:
        yield Finding(
            "error",
            "cdc",
            f"role {user} lacks CREATE on database {database}: the first sync creates the "
            "publication",
            f"GRANT CREATE ON DATABASE {display_ident(database)} TO {display_ident(user)}, or "
            'let a DBA make the slot and publication and set "cdc": {"create": false, ...}',
        )


_OWNS = (
    "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_catalog.pg_class c "
    "WHERE c.oid = %s"
)


def _names(project: Project) -> Any:
    try:
        return project.capture_names()
    except ReplicatorError:
        return None


def _slot(source: psycopg.Connection[Any], names: Any) -> Iterator[Finding]:
    if names is None:
        yield Finding("ok", "cdc", "no slot yet: the first sync creates the slot and publication")
        return
    info = slot_info(source, names.slot)
    if info is None:
        fix = None if names.created else create_slot_statement(names.slot)
        yield Finding(
            "warn" if names.created else "error",
            "cdc",
            f"slot {names.slot} does not exist (the next sync "
            + ("makes it and reloads the cdc tables)" if names.created else "cannot run)"),
            fix,
        )
        return
    if info.plugin != PLUGIN:
        problem, _, fix = wrong_plugin(info).partition(": make it again with ")
        yield Finding("error", "cdc", problem, fix)
        return
    level = "error" if info.lost else "ok"
    yield Finding(
        level,
        "cdc",
        f"slot {names.slot}: wal_status {info.wal_status}, retains "
        f"{size_text(info.retained_bytes)} of WAL, {size_text(info.lag_bytes)} not yet read",
        _lost_fix(names) if info.lost else None,
    )
    published = published_tables(source, names.publication)
    yield Finding("ok", "cdc", f"publication {names.publication}: {len(published)} table(s)")


def _dba_publication(
    source: psycopg.Connection[Any], names: Any, tables: list[Any]
) -> Generator[Finding, None, set[TableName] | None]:
    """A DBA's publication (`create: false`): it must exist; returns what it lists."""
    if publication_exists(source, names.publication):
        return published_tables(source, names.publication)
    described = describe_tables(source, [t.name for t in tables])
    alone = {
        name: PublishedAs(alone=True)
        for name, info in described.items()
        if info is not None and info.has_children
    }
    create = create_publication_statement(names.publication, [t.name for t in tables], True, alone)
    yield Finding(
        "error",
        "cdc",
        f"publication {names.publication} (named in tables-config.json `cdc`) does not exist "
        "in the source: the sync cannot run",
        f"a DBA creates it: {create}",
    )
    return None


def _table(
    source: psycopg.Connection[Any],
    project: Project,
    table: Any,
    publisher: str | None,
    published: set[TableName] | None = None,
    names: Any = None,
) -> Iterator[Finding]:
    """`publisher`: the role that adds the table to the publication, which must own it;
    `published`: what a DBA's publication lists (None: the tool manages it)."""
    try:
        info, built = inspect_source(source, table, project.templates)
    except ReplicatorError:
        return  # the table's own checks said why
    problem = capture_problem(source, info, built, project.cdc_tables)
    if problem is not None:
        yield Finding("error", table.written_name, problem.removeprefix(f"{table.written_name}: "))
        return
    via_root = (
        via_root_problem(source, names.publication, table.name)
        if published is not None and info.kind == PARTITIONED
        else None
    )
    if via_root is not None:  # what the publication lists is then its partitions
        yield Finding("error", table.written_name, *via_root)
    elif published is not None and table.name not in published:
        yield Finding(
            "error",
            table.written_name,
            f"not in publication {names.publication} (named in tables-config.json `cdc`): its "
            "changes would never arrive, and its sync fails",
            "a DBA adds it: "
            + add_table_statement(names.publication, table.name, info.has_children),
        )
    elif published is not None:
        shaping = built.shaping
        excluded = shaping.exclude if shaping else ()
        columns = [c.name for c in info.columns if c.name not in excluded]
        applied = applied_where(source, info, built)  # the apply's: not the publication's
        where = shaping.where if shaping and not applied else None
        withheld = publication_problem(
            source, names.publication, table.name, columns, where, info.has_children
        )
        if withheld is not None:
            yield Finding("error", table.written_name, *withheld)
    if publisher is not None and not fetch_all(source, _OWNS, (info.oid,))[0][0]:
        yield Finding(
            "error",
            table.written_name,
            f"role {publisher} does not own the source table: only its owner can add it to "
            "the publication",
            f"ALTER TABLE {built.table.name} OWNER TO {display_ident(publisher)}, or let a DBA "
            'make the publication and set "cdc": {"create": false, ...}',
        )
    identity, _ = replica_identity(source, info)
    yield Finding(
        "ok",
        table.written_name,
        f"replica identity {IDENTITY_NAMES[identity]}: the log names its rows",
    )
    if info.kind == PARTITIONED and not info.primary_key:
        # A key on the root reaches every new partition; a replica identity does not.
        yield Finding(
            "warn",
            table.written_name,
            "a partition created later has no replica identity of its own (the table has no "
            "primary key to give it one): the source refuses its UPDATEs and DELETEs while "
            "the table is published, so the next sync takes the table out of the tool's "
            "publication until the partition has one, and reloads it then (a DBA's "
            "publication must drop it itself)",
            "run ALTER TABLE <partition> REPLICA IDENTITY FULL as each partition is created "
            "(in the same transaction)",
        )
    applied = applied_where(source, info, built) is not None
    toastable = toastable_columns(source, info, built) if applied else []
    yield from _shaping_findings(table.written_name, built, identity, applied, toastable)


def _shaping_findings(
    name: str, built: Any, identity: str, applied: bool, toastable: list[str]
) -> Iterator[Finding]:
    """What the log does with the table's `columns` and `where` (preflight refused what it
    cannot do): where an excluded column goes, and who filters the rows."""
    shaping = built.shaping
    if shaping is None:
        return
    excluded = ", ".join(map(display_ident, shaping.exclude))
    if shaping.include and not shaping.exclude and identity == "f":
        yield Finding(
            "warn",
            name,
            "REPLICA IDENTITY FULL: a column the source gains later is carried by the log to "
            "replicator (no column list is possible), which drops it before anything is "
            "staged; it never reaches the destination",
            "to keep such columns in the source, key the table's identity on its primary key "
            f"(ALTER TABLE {built.table.name} REPLICA IDENTITY DEFAULT)",
        )
    if shaping.exclude and identity == "f":
        yield Finding(
            "warn",
            name,
            f"REPLICA IDENTITY FULL: the log carries excluded column(s) {excluded} to "
            "replicator (a publication's column list must hold every identity column), which "
            "drops them before anything is staged; they never reach the destination",
            "to keep them in the source, key the table's identity on its primary key "
            f"(ALTER TABLE {built.table.name} REPLICA IDENTITY DEFAULT) and filter with key "
            "columns only",
        )
    elif shaping.exclude:
        yield Finding(
            "ok",
            name,
            f"excluded column(s) {excluded} stay in the source (the publication's column list)",
        )
    if shaping.where and applied:
        yield Finding(
            "ok",
            name,
            "where runs at the apply, over each change's new row (it reads columns outside "
            "the replica identity, each stored plain: every change carries them): the "
            "publication sends every row, and a row an update takes out of it is deleted by "
            "key",
        )
        if toastable:
            yield Finding(
                "warn",
                name,
                f"column(s) {', '.join(map(display_ident, toastable))} may hold TOASTed values "
                "(over about 2 kB): an update that brings a row into the filter and leaves "
                "such a value as it was fails the table until its reload (nothing in the log "
                "or the copy holds that value)",
                f"ALTER TABLE {built.table.name} REPLICA IDENTITY FULL: the publication then "
                "filters, and the log carries whole rows",
            )
    elif shaping.where:
        yield Finding(
            "ok",
            name,
            "where is the publication's row filter: an update that takes a row out of it "
            "arrives as a delete, one that brings a row in as an insert",
        )


def _lost_fix(names: Any) -> str:
    if names.created:
        return "the next sync makes it again and reloads every cdc table"
    return (
        f"{drop_slot_statement(names.slot)}; {create_slot_statement(names.slot)}; the next sync "
        "then reloads every cdc table"
    )
