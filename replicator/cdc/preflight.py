"""What a source table must be for `mode: "cdc"`, checked before it joins the publication
(a table with no replica identity in a publication would make the source refuse its UPDATEs
and DELETEs: that must never be the tool's doing).

- the built-in model: the log carries the table's rows, and a model's SELECT cannot be
  applied to a change;
- a plain or partitioned table (PostgreSQL 13+, whose publications send a partition's
  changes under its root's name), without generated columns (the log does not carry them);
- a replica identity that names the rows by the table's key: the primary key (the default),
  REPLICA IDENTITY USING INDEX on the unique index that keys a table without one
  (plan/table_key.py), or REPLICA IDENTITY FULL (the whole old row: any key works); for a
  partitioned table, on every leaf too (the leaves' own setting decides what their updates
  and deletes log);
- a primary key that is not DEFERRABLE (see _deferred_key_problem; PostgreSQL takes no
  deferrable key as a replica identity, so under DEFAULT the source refuses the table's
  updates while it is published).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, NamedTuple

import psycopg

from ..base.errors import TableProblem
from ..base.identifiers import TableName, display_ident
from ..plan.table_sql import TableSql
from ..postgres.catalog import TableInfo
from ..postgres.database import fetch_all
from ..postgres.partition_tree import PARTITIONED, leaves
from .rows.shaped_log import log_shaping
from .source.log_filter import row_filter_problem, where_columns

_IDENTITIES = """
SELECT c.oid, c.relreplident::text,
       (SELECT array_agg(a.attname::text ORDER BY a.attname)
          FROM pg_catalog.pg_index i
          CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         WHERE i.indrelid = c.oid AND k.ord <= i.indnkeyatts
           AND (CASE c.relreplident WHEN 'i' THEN i.indisreplident
                ELSE i.indisprimary AND i.indimmediate END)),
       (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attgenerated <> ''),
       (WITH RECURSIVE up(oid, depth) AS (
          SELECT i.inhparent, 1 FROM pg_catalog.pg_inherits i
           WHERE i.inhrelid = c.oid AND c.relispartition
          UNION ALL
          SELECT i.inhparent, up.depth + 1 FROM up
            JOIN pg_catalog.pg_class u ON u.oid = up.oid AND u.relispartition
            JOIN pg_catalog.pg_inherits i ON i.inhrelid = up.oid)
        SELECT array_agg(ARRAY[n.nspname::text, p.relname::text] ORDER BY up.depth DESC)
          FROM up JOIN pg_catalog.pg_class p ON p.oid = up.oid
          JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace),
       (SELECT k.conname::text FROM pg_catalog.pg_constraint k
         WHERE k.conrelid = c.oid AND k.contype = 'p' AND k.condeferrable),
       -- a deferrable primary key's columns, unless an immediate unique index over some of
       -- them keeps two rows from ever holding one key
       (SELECT array_agg(a.attname::text ORDER BY k.ord)
          FROM pg_catalog.pg_index p
          CROSS JOIN LATERAL unnest(p.indkey) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_catalog.pg_attribute a ON a.attrelid = p.indrelid AND a.attnum = k.attnum
         WHERE p.indrelid = c.oid AND p.indisprimary AND NOT p.indimmediate
           AND k.ord <= p.indnkeyatts
           AND NOT EXISTS (
             SELECT FROM pg_catalog.pg_index u
              WHERE u.indrelid = c.oid AND u.indisunique AND u.indimmediate AND u.indisvalid
                AND u.indpred IS NULL AND u.indexprs IS NULL
                AND (u.indkey::int2[])[0:u.indnkeyatts - 1]
                    <@ (p.indkey::int2[])[0:p.indnkeyatts - 1]))
FROM pg_catalog.pg_class c WHERE c.oid = ANY(%s)
"""
_VIA_ROOT_SINCE = 130000  # publish_via_partition_root

IDENTITY_NAMES = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


class _Identity(NamedTuple):
    """A table's row of _IDENTITIES."""

    oid: int
    identity: str  # d, f, i, n
    keys: list[str] | None  # the columns the replica identity names rows by
    generated: list[str] | None
    ancestors: list[list[str]] | None  # [schema, name] of each partitioned ancestor
    deferrable: str | None  # a DEFERRABLE primary key's name
    unguarded: list[str] | None  # its columns, unless an immediate unique index guards them

    def refused(self) -> str | None:
        """Why the source refuses the UPDATEs and DELETEs of the table while it is published
        (it has no replica identity); None when it takes them. PostgreSQL takes no DEFERRABLE
        primary key as a replica identity."""
        if self.identity == "n":
            return "replica identity NOTHING"
        if self.identity == "d" and not self.keys and self.deferrable:
            return (
                f"its primary key {display_ident(self.deferrable)} is DEFERRABLE, which "
                "PostgreSQL does not take as the replica identity, and replica identity DEFAULT"
            )
        if self.identity == "d" and not self.keys:
            return "no primary key, and replica identity DEFAULT"
        if self.identity == "i" and not self.keys:
            return "replica identity USING INDEX, whose index is gone"
        return None


def _identities(source: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, _Identity]:
    rows = fetch_all(source, _IDENTITIES, (list(oids),))
    return {row[0]: _Identity(*row) for row in rows}


def replica_identity(source: psycopg.Connection[Any], info: TableInfo) -> tuple[str, list[str]]:
    """The table's replica identity (d, f, i, n) and the key columns it names."""
    found = _identities(source, [info.oid])[info.oid]
    return found.identity, found.keys or []


def capture_problem(
    source: psycopg.Connection[Any],
    info: TableInfo,
    built: TableSql,
    captured: Collection[TableName],
) -> str | None:
    """Why the table cannot be captured from the log, with the fix; None when it can.
    `captured`: every `cdc` table of the config (Project.cdc_tables: a partition of one
    of them cannot be)."""
    return _log_problem(source, info, built, captured) or shaping_problem(source, info, built)


def _log_problem(
    source: psycopg.Connection[Any],
    info: TableInfo,
    built: TableSql,
    captured: Collection[TableName],
) -> str | None:
    name = built.table.written_name
    if not (built.model.base or built.model).reads_table_as_is:
        return (
            f"{name}: mode cdc copies the table as the log carries it, and a model "
            f"({built.model.origin}) cannot be applied to a change: remove the model file, "
            "or use a cursor mode"
        )
    partitioned = info.kind == PARTITIONED
    if info.kind != "table" and not partitioned:
        return (
            f"{name}: mode cdc reads a table's changes from the log, and this is a "
            f"{info.kind}, which it cannot read yet: use a cursor mode (replication_key), "
            "or full-refresh"
        )
    if partitioned and source.info.server_version < _VIA_ROOT_SINCE:
        return (
            f"{name}: mode cdc on a partitioned table needs PostgreSQL 13 or later (a "
            "publication that sends its partitions' changes under its name): use a cursor "
            "mode, or full-refresh"
        )
    identity = _identities(source, [info.oid])[info.oid]
    # the topmost captured ancestor: the name the publication gives this partition's changes
    ancestors = [TableName(*a) for a in identity.ancestors or []]
    above = next((a for a in ancestors if a in captured), None)
    if above is not None:
        # The publication sends a partition's changes under the name of its topmost
        # ancestor in it: this partition's own copy would never change again.
        return (
            f"{name}: a partition of {above}, which is captured too (mode cdc): the log "
            f"names this partition's changes by {above} only, so this copy would never "
            f"change, and {above}'s copy holds its rows already: remove {name} from the "
            "config, or give it a cursor mode (replication_key) or full-refresh"
        )
    if identity.generated:
        columns = ", ".join(map(display_ident, identity.generated))
        return (
            f"{name}: generated column(s) {columns} are not in the log (PostgreSQL 15): "
            "mode cdc cannot copy them; use a cursor mode"
        )
    problem = _identity_problem(name, name, built, built.table.name, identity)
    if problem is not None or not partitioned:
        return problem
    found = leaves(source, info.oid)
    identities = _identities(source, (leaf.oid for leaf in found))
    for leaf in found:
        subject = f"{name}: partition {leaf.name}"
        if leaf.foreign:
            return (
                f"{subject} is a foreign table, whose changes are not in the log: use a "
                "cursor mode, or full-refresh"
            )
        problem = _identity_problem(name, subject, built, leaf.name, identities[leaf.oid])
        if problem is not None:
            return problem
    return None


def refuses_changes(source: psycopg.Connection[Any], info: TableInfo) -> bool:
    """Whether the source would refuse UPDATEs and DELETEs of the table, or of one of its
    partitions, while the table is published: the publication must then let it go."""
    if _identities(source, [info.oid])[info.oid].refused():
        return True
    if info.kind != PARTITIONED:
        return False
    found = [leaf.oid for leaf in leaves(source, info.oid) if not leaf.foreign]
    return any(leaf.refused() for leaf in _identities(source, found).values())


_PUBLISHED_MEMBERS = """
WITH RECURSIVE member(root, oid) AS (
    SELECT r.prrelid, r.prrelid
    FROM pg_catalog.pg_publication_rel r
    JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid
    WHERE p.pubname = %s
    UNION ALL
    SELECT m.root, i.inhrelid FROM member m JOIN pg_catalog.pg_inherits i ON i.inhparent = m.oid
    JOIN pg_catalog.pg_class pc ON pc.oid = m.oid AND pc.relkind = 'p'  -- partitions only:
    -- a table others inherit from is listed alone (ONLY), its children are not published
)
SELECT n.nspname::text, t.relname::text, m.oid, cn.nspname::text, c.relname::text,
       m.oid = m.root
FROM member m
JOIN pg_catalog.pg_class t ON t.oid = m.root
JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace
JOIN pg_catalog.pg_class c ON c.oid = m.oid
JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace
WHERE m.oid = m.root OR c.relkind = 'r'  -- the table and its leaves, as refuses_changes
"""


def refused_in_publication(
    source: psycopg.Connection[Any], publication: str
) -> dict[TableName, str]:
    """The tables listed in the publication whose UPDATEs and DELETEs the source refuses
    (theirs, or a partition's), each with why: two catalog reads for the whole publication,
    so a run of some tables (`sync -s`) lets the others go too, as `refuses_changes` does
    for the tables it selects."""
    rows = fetch_all(source, _PUBLISHED_MEMBERS, (publication,))
    identities = _identities(source, (r[2] for r in rows))
    refused: dict[TableName, str] = {}
    for schema, name, oid, *member, is_root in sorted(rows, key=lambda r: (r[0], r[1], not r[5])):
        table = TableName(schema, name)
        why = identities[oid].refused() if oid in identities else None
        if why is not None and table not in refused:
            refused[table] = why if is_root else f"partition {TableName(*member)}: {why}"
    return refused


def _identity_problem(
    name: str,
    subject: str,
    built: TableSql,
    table: TableName,
    found: _Identity,
) -> str | None:
    """Why the table's (or a leaf's) replica identity does not name rows by the copy's key,
    or why changes applied by that key would not be the source's."""
    fix_full = f"ALTER TABLE {table} REPLICA IDENTITY FULL"
    keys, unguarded = found.keys, found.unguarded
    if found.deferrable and unguarded and set(unguarded) <= set(built.primary_key):
        # a copy keyed by those columns (and maybe more) repeats a key whenever two rows do
        return _deferred_key_problem(subject, table, found.deferrable, tuple(unguarded))
    if found.identity == "f":
        return None
    if sorted(keys or []) != sorted(built.primary_key) and built.key.origin == "unique index":
        fix_index = (
            f"ALTER TABLE {table} REPLICA IDENTITY USING INDEX "
            f"{display_ident(built.key.index or '')}"
        )
        have = ", ".join(map(display_ident, keys or [])) or "none: the table has no primary key"
        return (
            f"{subject}: mode cdc names rows by the {built.key.describe()}, but the log names "
            f"them by ({have}), so their updates and deletes could not be applied: run "
            f"`{fix_index}` in the source (or `{fix_full}`, which logs every column of the old "
            "row)"
        )
    refused = found.refused()
    if refused is not None:
        later = " (and on every partition created later)" if subject != name else ""
        return (
            f"{subject}: {refused}: the log names no row of its updates and deletes, and the "
            f"source refuses them while {name} is published, so {name} is left out of the "
            "tool's publication (its copy reloads once it is back; a DBA's publication, "
            f'"create": false, must drop it itself); run `{fix_full}` in the source{later}'
        )
    if sorted(keys or []) != sorted(built.primary_key):
        wanted = ", ".join(map(display_ident, built.primary_key))
        have = ", ".join(map(display_ident, keys or [])) or "none"
        return (
            f"{subject}: the log names rows by ({have}), the copy by its primary key ({wanted}): "
            f"run `{fix_full}` in the source, or set primary_key to the source's key"
        )
    return None


def _deferred_key_problem(
    subject: str, table: TableName, constraint: str, key: tuple[str, ...]
) -> str:
    """A DEFERRABLE primary key lets two rows hold one key inside a transaction (`UPDATE t
    SET id = id + 1` moves each row onto its neighbour's key before the neighbour leaves):
    the log then says "a row left key 2" after "a row arrived at key 2", and the copy,
    whose changes are applied by key, would lose the row that arrived (measured: keys 2-5
    of 1-5 gone, exit 0). PostgreSQL takes no such key as a replica identity either."""
    name = display_ident(constraint)
    columns = ", ".join(map(display_ident, key))
    fix = f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD CONSTRAINT {name} "
    fix += f"PRIMARY KEY ({columns})"
    index = f"CREATE UNIQUE INDEX ON {table} ({columns})"
    return (
        f"{subject}: its primary key {name} is DEFERRABLE: inside a transaction two rows may "
        "hold one key (UPDATE ... SET id = id + 1), which changes applied by key cannot tell "
        f"apart, so the copy would lose rows: run `{fix}` in the source (PostgreSQL cannot "
        "make a primary key NOT DEFERRABLE in place; this rebuilds its index, and foreign "
        f"keys that reference it must go first), or `{index}` (a unique index checked at "
        "once; under replica identity DEFAULT, make it the identity with REPLICA IDENTITY "
        "USING INDEX), or use a cursor mode (replication_key) or full-refresh"
    )


def shaping_problem(
    source: psycopg.Connection[Any], info: TableInfo, built: TableSql
) -> str | None:
    """Why the log cannot give the table's `columns` and `where`; None when it can."""
    shaping = built.shaping
    if shaping is None:
        return None
    name = built.table.written_name
    try:
        log_shaping(source, built, info, None)  # a hashed type the log cannot give
    except TableProblem as exc:
        return str(exc)
    if shaping.where is None:
        return None
    identity, keys = replica_identity(source, info)
    used = where_columns(source, info, shaping.where)
    beyond = [c for c in used if c not in keys]
    unfit = applied_filter_problem(source, info, built, used) if beyond else None
    if identity != "f" and beyond and unfit is None:
        return None  # the apply runs it: a publication's limits on a row filter do not apply
    if identity != "f" and unfit is not None:
        return (
            f"{name}: where reads {', '.join(map(display_ident, beyond))}, which the log's "
            f"old rows do not carry (replica identity {IDENTITY_NAMES.get(identity)}): the "
            "publication's row filter needs them to tell when an update takes a row out of "
            "the filter, and PostgreSQL would refuse the source's UPDATEs and DELETEs; nor "
            f"can the apply run it over each change's new row: {unfit}; run "
            f"`ALTER TABLE {built.table.name} REPLICA IDENTITY FULL` in the source"
        )
    refused = row_filter_problem(source, info, shaping.where)
    if refused:
        return (
            f"{name}: where cannot filter the log (a publication's row filter): {refused}; "
            "write it with immutable built-in functions and operators only, or use a cursor "
            "mode for this table"
        )
    return None


# The table's columns (and its partitions', at any depth: the log's rows come from them)
# among these that a value may be TOASTed in: stored otherwise than plain.
_NOT_PLAIN = """
SELECT DISTINCT a.attname::text FROM pg_catalog.pg_attribute a
WHERE (a.attrelid = %(table)s::oid OR a.attrelid IN
       (SELECT relid FROM pg_catalog.pg_partition_tree(%(table)s::oid::regclass)))
  AND a.attname = ANY(%(columns)s) AND a.attstorage <> 'p' AND NOT a.attisdropped
ORDER BY 1
"""


def applied_filter_problem(
    source: psycopg.Connection[Any], info: TableInfo, built: TableSql, used: list[str]
) -> str | None:
    """Why the table's apply cannot run its `where` over each change's new row, which is
    where it runs when the publication cannot (it reads columns outside the replica
    identity); None when it can: every column it reads is staged as the source holds it
    (neither excluded nor hashed) and stored plain, so that every change carries its value
    (an update leaves out a TOASTed value it did not change)."""
    shaping = built.shaping
    staged = {c.name for c in built.columns} - set(shaping.hash if shaping else ())
    unstaged = [c for c in used if c not in staged]
    if unstaged:
        return (
            f"the copy does not hold {', '.join(map(display_ident, unstaged))} as the source "
            "does (excluded or hashed)"
        )
    toasted = _not_plain(source, info, used)
    if toasted:
        return (
            f"{', '.join(map(display_ident, toasted))} may hold TOASTed values, which an "
            "update that leaves them as they were does not carry"
        )
    return None


def _not_plain(source: psycopg.Connection[Any], info: TableInfo, columns: list[str]) -> list[str]:
    return [
        row[0] for row in fetch_all(source, _NOT_PLAIN, {"table": info.oid, "columns": columns})
    ]


def toastable_columns(
    source: psycopg.Connection[Any], info: TableInfo, built: TableSql
) -> list[str]:
    """The copied columns whose values may be TOASTed (stored otherwise than plain)."""
    return _not_plain(source, info, [c.name for c in built.columns])


def applied_where(source: psycopg.Connection[Any], info: TableInfo, built: TableSql) -> str | None:
    """The table's `where` when its apply runs it, over each change's new row: a row a
    change takes out of it is deleted by key, as the publication's row filter would. That
    is where it runs when it reads a column outside the replica identity (the log's old
    rows do not carry it) and `applied_filter_problem` finds nothing against it; None when
    the publication runs it (or there is none)."""
    shaping = built.shaping
    if shaping is None or shaping.where is None:
        return None
    identity, keys = replica_identity(source, info)
    if identity == "f":
        return None
    used = where_columns(source, info, shaping.where)
    if all(c in keys for c in used):
        return None
    return shaping.where
