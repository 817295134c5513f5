"""Which destination tables replicator owns: only those may be replaced, dropped or merged into.

A table the tool creates (a full load's swap, a start without backfill) or that a user hands
over (`replicator adopt`, `initial_load: skip` on a matching table) is recorded in
`_replicator.owned_tables` by OID, in the transaction that puts it in place, with the
project that keeps it (its identity, project/identity.py): another project finds it
`taken`, and its sync of that table fails with the fix instead of loading it over. A destination
table that exists without such a record was made by someone else: its sync fails with the fix
instead of replacing it. OIDs, not names: a table dropped and created again by hand under the
same name is not the tool's any more.

Tables loaded by a replicator version that kept no records are recognized once by their
sync-state (a load recorded there, and no record of any table under that name) and recorded
then. So are the tables of a destination whose `_replicator` schema (or registry) someone
dropped; a run says which of the two it was (`bookkeeping_gone`), read before the run's first
table creates the registry again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from ..base.identifiers import INTERNAL_SCHEMA, TableName
from ..project.config import TableConfig
from ..project.state import TableState
from .database import Step, execute, fetch_all, run_steps, transaction
from .dest_schema import ensure_bookkeeping
from .naming import OWNED_TABLE

log = logging.getLogger(__name__)

# missing: no destination table; owned: recorded as the tool's; legacy: loaded by an earlier
# version (see above); foreign: someone else's, never replaced; taken: the tool's, recorded
# as the copy another project keeps (another sync-state folder: one project per copy).
Ownership = Literal["missing", "owned", "legacy", "foreign", "taken"]

# This project's identity, which every destination session holds (project/identity.py);
# NULL in a session without one (a project before its first sync).
_OURS = "nullif(pg_catalog.current_setting('replicator.project', true), '')"

# The table now at the name and the registry, read in one statement, so in one snapshot: an
# OID read earlier (the plan's description of the table) may be the table another run's swap
# has just replaced, and that run's record names the new one (in a fresh clone's CI run, two
# project copies syncing together: the second failed as if someone else's table were there).
_RECORDS = (
    """
SELECT o.table_oid IS NOT NULL, o.table_oid IS NOT NULL OR named.table_name IS NOT NULL,
       o.project_id IS DISTINCT FROM """
    + _OURS
    + """ AND o.project_id IS NOT NULL
FROM unnest(%(schemas)s::text[], %(names)s::text[])
    WITH ORDINALITY AS w (schema_name, table_name, i)
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = w.schema_name
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = w.table_name
LEFT JOIN {registry} AS o ON o.table_oid = c.oid
LEFT JOIN (SELECT DISTINCT schema_name, table_name FROM {registry}) AS named
    ON named.schema_name = w.schema_name AND named.table_name = w.table_name
ORDER BY w.i
"""
)


@dataclass(frozen=True)
class Records:
    """What the registry says about one destination table."""

    this_oid: bool  # the table that exists now is recorded
    same_name: bool  # some table of this name was recorded (maybe one dropped since)
    other_project: bool = False  # ... as the copy another project keeps


def classify(exists: bool, records: Records, state: TableState | None) -> Ownership:
    """Pure: whose the destination table is."""
    if not exists:
        return "missing"
    if records.this_oid:
        return "taken" if records.other_project else "owned"
    loaded_before = state is not None and state.last_synced_at is not None
    if loaded_before and state.schema_signature is not None and not records.same_name:
        return "legacy"
    return "foreign"


def read_records(dest: psycopg.Connection[Any], target: TableName, oid: int | None) -> Records:
    """The registry's rows for the table now at `target` (none when the registry does not
    exist yet, or `oid` says there is no table)."""
    if oid is None:
        return Records(False, False)
    return _read(dest, [target])[0]


def read_many_records(
    dest: psycopg.Connection[Any], tables: Mapping[TableName, int | None]
) -> dict[TableName, Records]:
    """`read_records` of these (destination table, OID) pairs in one statement."""
    present = [target for target, oid in tables.items() if oid is not None]
    found = dict(zip(present, _read(dest, present), strict=True)) if present else {}
    return {target: found.get(target, Records(False, False)) for target in tables}


def _read(dest: psycopg.Connection[Any], targets: list[TableName]) -> list[Records]:
    """What the registry says of the tables now at these names, in their order."""
    (exists,) = execute(dest, "SELECT to_regclass(%s) IS NOT NULL", (OWNED_TABLE.sql(),)).fetchone()
    if not exists:
        return [Records(False, False) for _ in targets]
    query = sql.SQL(_RECORDS).format(registry=OWNED_TABLE.identifier())
    params = {"schemas": [t.schema for t in targets], "names": [t.name for t in targets]}
    rows = fetch_all(dest, query, params)
    return [Records(bool(this), bool(same), bool(other)) for this, same, other in rows]


# `_RECORDS` of one table, with the OID of the table now at its name and whether it holds a
# row: an error (undefined table) when the table or the registry is gone.
_RECORDS_NOW = _RECORDS.replace(
    "SELECT o.table_oid", "SELECT c.oid, EXISTS (SELECT FROM {target}), o.table_oid", 1
)


def records_now(dest: psycopg.Connection[Any], target: TableName) -> tuple[int, bool, Records]:
    """The OID of the table at `target`, whether it holds a row, and the registry's records
    of it, in one statement; a DatabaseError when the table or the registry is gone."""
    query = sql.SQL(_RECORDS_NOW).format(
        registry=OWNED_TABLE.identifier(), target=target.identifier()
    )
    params = {"schemas": [target.schema], "names": [target.name]}
    oid, has_rows, this, same, other = fetch_all(dest, query, params)[0]
    return int(oid), bool(has_rows), Records(bool(this), bool(same), bool(other))


def record_owned(dest: psycopg.Connection[Any], target: TableName) -> None:
    """Record the table now at `target` as the tool's (see `record_owned_steps`)."""
    run_steps(dest, record_owned_steps(target))


def record_owned_steps(target: TableName) -> list[Step]:
    """Record the table at `target` as the tool's, forgetting earlier tables of that name and
    records of tables that no longer exist. They belong in the transaction that put the table
    there (or adopted it), after `dest_schema.bookkeeping_steps`."""
    registry = OWNED_TABLE.identifier()
    return [
        Step(
            "destination",
            sql.SQL(
                "DELETE FROM {r} AS o WHERE (o.schema_name = %(schema)s AND "
                "o.table_name = %(name)s) OR o.table_oid = %(table)s::regclass OR NOT EXISTS "
                "(SELECT FROM pg_catalog.pg_class c WHERE c.oid = o.table_oid)"
            ).format(r=registry),
            {"table": target.sql(), "schema": target.schema, "name": target.name},
        ),
        Step(
            "destination",
            sql.SQL(
                "INSERT INTO {r} (table_oid, schema_name, table_name, project_id) VALUES "
                "(%(table)s::regclass, %(schema)s, %(name)s, {ours})"
            ).format(r=registry, ours=sql.SQL(_OURS)),
            {"table": target.sql(), "schema": target.schema, "name": target.name},
        ),
    ]


def not_owned_fix(target: TableName, written_name: str) -> str:
    """What to do about a destination table the tool did not create."""
    return (
        f"replicator never replaces a table it did not create: drop or rename {target}, run "
        f"`replicator adopt {written_name}` to hand it over (the next sync reloads it from "
        'the source), or set "initial_load": "skip" for the table to keep its rows and '
        "continue from the source's newest key (its columns must match the source's)"
    )


def taken_fix(target: TableName, written_name: str) -> str:
    """What to do about a copy another project keeps (another sync-state folder)."""
    return (
        f"one project per copy: give this project's table another destination "
        f"(`destination`), leave {written_name} to the project that keeps {target}, or hand "
        f"the copy over to this one with `replicator adopt {written_name}` (the other project "
        "then refuses it)"
    )


def take_ownership(dest: psycopg.Connection[Any], table: TableConfig) -> None:
    """Record the destination table as the tool's (bookkeeping tables created if missing)."""
    ensure_bookkeeping(dest)
    with transaction(dest):
        record_owned(dest, table.target)


def bookkeeping_gone(dest: psycopg.Connection[Any]) -> str | None:
    """What of replicator's bookkeeping the destination lost, when its ownership registry is
    missing (`schema _replicator is gone`); None when the registry is there."""
    (schema, registry) = fetch_all(
        dest,
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = %s), "
        "to_regclass(%s) IS NOT NULL",
        (INTERNAL_SCHEMA, OWNED_TABLE.sql()),
    )[0]
    if registry:
        return None
    return f"table {OWNED_TABLE} is gone" if schema else f"schema {INTERNAL_SCHEMA} is gone"


def adopt_legacy(
    dest: psycopg.Connection[Any], table: TableConfig, dropped: str | None = None
) -> None:
    """A table this project's sync-state says the tool loaded, without a record: from before
    ownership records, or (`dropped`: what `bookkeeping_gone` said at the run's start) from
    before someone dropped replicator's bookkeeping in the destination."""
    take_ownership(dest, table)
    if dropped is None:
        why = "was loaded by an earlier replicator version; recorded as replicator's"
    else:
        why = (
            "recorded as replicator's again, from this project's sync-state (replicator's "
            f"bookkeeping in the destination was dropped: {dropped})"
        )
    log.info("%s: destination table %s %s", table.written_name, table.target, why)
