"""A source schema change taken by the copy in place (`on_schema_change: "evolve"`): the
ALTERs plan/evolution.py chose, and an added column's values brought to the source's.

Right after `ADD COLUMN`, every row of the copy holds the same value for the new column: the
constant its source default gives (added with that default, a change of the catalog alone),
else NULL. So the rows to write are exactly the source rows whose value is not that one: a
default the source filled in, a volatile default (each row its own), or a backfill UPDATE
that moved no replication key. One COPY reads them (the key and the new columns, in one
snapshot) into a temporary table, outside the copy's lock; then one transaction takes the
lock, drops the views an ALTER of their columns needs out of the way, ALTERs, writes the
staged values into their rows, sets NOT NULL where the source has it, and recreates the
views as a reload's swap does. A kill anywhere rolls it all back: the next run starts over
from the same change. Readers wait for that transaction (the UPDATE is the long part when
every value differs), and never see a column half filled.

The statements come from `evolve_script`, which `compile` prints and the sync runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg import sql

from ...base.errors import DatabaseError
from ...base.failpoints import failpoint
from ...base.identifiers import TableName
from ...plan.evolution import Evolution
from ...plan.table_sql import TableSql
from ...postgres import ddl
from ...postgres.catalog import FIRST_NORMAL_OID, TableInfo
from ...postgres.database import Endpoints, Step, execute, fetch_all, run_steps, transaction
from ...postgres.history_tables import IS_CURRENT, key_match
from ...postgres.naming import derived_name
from ...postgres.swap import LOCK_NOT_AVAILABLE, LOCK_TIMEOUT, read_facts, view_steps
from ...postgres.types.dest_types import type_work
from ...transfer.copy_stream import SOURCE_BEGIN, stream_between
from ..scripts import MAINTENANCE_WORK_MEM, TEMPORARY_SCHEMA

log = logging.getLogger(__name__)

# Past this share of the copy's rows written, its key is built again after the UPDATE rather
# than kept up to date by it (bench/RESULTS.md, "schema evolution").
REBUILD_SHARE = 0.1
# Past this share, writing the new values costs more than a reload (an UPDATE writes a new
# version of each row, and leaves the old one for vacuum): the table is reloaded instead.
RELOAD_SHARE = 0.5
# The hash join of the staged values, and the key's sort, in memory.
WORK_MEM = "256MB"

_DEFAULT = """
SELECT a.attname, pg_catalog.pg_get_expr(d.adbin, d.adrelid)
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attname = ANY(%s) AND a.attgenerated = ''
"""


@dataclass(frozen=True)
class EvolveScript:
    """The statements of one evolution, in the order they run."""

    types: list[Step]  # an added column's user-defined type, made in the destination
    create: Step  # the temporary table the new columns' values are staged in
    copy_in: Step
    copy_out: Step
    staged: Step  # the staged rows' statistics, so that the UPDATE joins them by hash
    head: list[Step]  # under the copy's lock: settings, the lock, views aside, ALTERs
    update: Step | None  # writes the staged values into their rows (None: no column added)
    tail: list[Step]  # NOT NULL, views recreated
    key: tuple[Step, Step] | None  # the key dropped and built again around a big UPDATE
    after: list[Step]  # statistics of the new columns
    rows: int  # the copy's rows, as its statistics count them
    limit: int | None  # the staged rows past which a reload writes sooner

    def change(self, rebuild_key: bool = False) -> list[Step]:
        """What runs under the lock; `rebuild_key`: when many rows get new values, the key
        is built again after the UPDATE rather than kept up to date by it (a sort instead
        of an index entry for each row written)."""
        if self.update is None:
            return [*self.head, *self.tail]
        if not rebuild_key or self.key is None:
            return [*self.head, self.update, *self.tail]
        drop, build = self.key
        return [*self.head, drop, self.update, build, *self.tail]

    @property
    def steps(self) -> list[Step]:
        """As `compile` prints them (the key kept; see `change`)."""
        return [
            Step("destination", "BEGIN"),
            *self.types,
            self.create,
            Step("source", SOURCE_BEGIN),
            self.copy_in,
            self.copy_out,
            Step("source", "ROLLBACK"),
            self.staged,
            *self.change(),
            Step("destination", "COMMIT"),
            *self.after,
        ]


def _history_steps(
    built: TableSql, evo: Evolution, types: dict[str, str], current: dict[str, str]
) -> list[Step]:
    """The change in the table's history table, whose current versions then take the added
    columns' values from the copy (where they differ: a NULL column writes none)."""
    history = built.history
    if history is None:
        return []
    steps = [
        Step("destination", sql.SQL(statement))
        for statement in evo.history_alters(history.name, types, current)
    ]
    added = [c.name for c in evo.added]
    if added:
        steps.append(
            Step(
                "destination",
                sql.SQL(
                    "UPDATE {h} AS h SET {set} FROM {copy} AS c WHERE {match} AND h.{current} "
                    "AND ({differs})"
                ).format(
                    h=history.name.identifier(),
                    set=sql.SQL(", ").join(
                        sql.SQL("{c} = c.{c}").format(c=sql.Identifier(c)) for c in added
                    ),
                    copy=history.copy.identifier(),
                    match=key_match("h", "c", history.key),
                    current=sql.Identifier(IS_CURRENT),
                    differs=sql.SQL(" OR ").join(
                        sql.SQL("h.{c} IS DISTINCT FROM c.{c}").format(c=sql.Identifier(c))
                        for c in added
                    ),
                ),
            )
        )
    return steps


def evolve_script(
    ends: Endpoints, built: TableSql, source: TableInfo, destination: TableInfo, evo: Evolution
) -> EvolveScript:
    """The evolution's statements (reads the added columns' defaults on the source, and the
    copy's dependent views when an ALTER needs them out of the way)."""
    target = built.table.target
    types = {c.name: c.type for c in built.destination_columns}
    current = {c.name: c.type for c in destination.columns}
    hashed = set(built.table.columns.hash) if built.table.columns else set()
    added = [c.name for c in evo.added]
    # An added column of a user-defined type: the type made in the destination first, as a
    # load makes its table's (postgres/types/dest_types.py).
    new_columns = [c for c in built.columns if c.name in added]
    work = type_work(ends.source, ends.dest, new_columns)
    user_types = {c.name for c in new_columns if c.type_oid >= FIRST_NORMAL_OID}
    defaults = _constant_defaults(ends, source, evo, types, hashed, user_types)
    alters = evo.alters(target, types, current, defaults)
    key = list(built.primary_key)
    staging = TableName(TEMPORARY_SCHEMA, derived_name("evo", target))
    by_name = {c.name: c for c in built.destination_columns}
    drop_views: list[Step] = []
    create_views: list[Step] = []
    if evo.reshapes:
        drop_views, create_views = view_steps(read_facts(ends.dest, target))
    update = Step(
        "destination",
        sql.SQL("UPDATE {t} AS t SET {set} FROM {s} AS s WHERE {match}").format(
            t=target.identifier(),
            set=sql.SQL(", ").join(
                sql.SQL("{c} = s.{c}").format(c=sql.Identifier(c)) for c in added
            ),
            s=sql.Identifier(staging.name),
            match=sql.SQL(" AND ").join(
                sql.SQL("t.{k} = s.{k}").format(k=sql.Identifier(k)) for k in key
            ),
        ),
    )
    settings = [
        sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(value))
        for name, value in (
            ("lock_timeout", LOCK_TIMEOUT),
            ("work_mem", WORK_MEM),
            ("maintenance_work_mem", MAINTENANCE_WORK_MEM),
        )
    ]
    head = [
        *(Step("destination", setting) for setting in settings),
        Step(
            "destination",
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(target.identifier()),
        ),
        *drop_views,
        *(Step("destination", statement) for statement in alters),
    ]
    tail = [
        *(Step("destination", statement) for statement in evo.not_null(target)),
        *create_views,
        *_history_steps(built, evo, types, current),
    ]
    columns = [*key, *added]
    differs = sql.SQL(" OR ").join(
        sql.SQL("m.{c} IS NOT NULL").format(c=sql.Identifier(c))
        if c not in defaults
        else sql.SQL("m.{c}::text IS DISTINCT FROM {v}").format(
            c=sql.Identifier(c), v=sql.Literal(defaults[c])
        )
        for c in added
    )
    listed = sql.SQL(", ").join(sql.SQL("m.{}").format(sql.Identifier(c)) for c in columns)
    rows = _copy_rows(ends, destination)
    # Past the share a reload writes sooner, the copy stops: the table is reloaded instead.
    limit = int(rows * RELOAD_SHARE) + 1 if rows > 0 else None
    copy_out = sql.SQL("COPY (SELECT {} FROM ({}) AS m WHERE {}{}) TO STDOUT").format(
        listed,
        sql.SQL(built.model.sql),
        differs if added else sql.SQL("false"),
        sql.SQL(" LIMIT {}").format(sql.Literal(limit)) if limit is not None else sql.SQL(""),
    )
    copy_in = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(staging.name), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    analyze = (
        [
            Step(
                "destination",
                sql.SQL("ANALYZE {} ({})").format(
                    target.identifier(), sql.SQL(", ").join(map(sql.Identifier, added))
                ),
            )
        ]
        if added
        else []
    )
    key_name = _key_name(ends, destination)
    key_steps = None
    if key_name is not None and key:
        constraint = sql.Identifier(key_name)
        key_steps = (
            Step(
                "destination",
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                    target.identifier(), constraint
                ),
            ),
            Step(
                "destination",
                sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                    target.identifier(),
                    constraint,
                    sql.SQL(", ").join(map(sql.Identifier, key)),
                ),
            ),
        )
    return EvolveScript(
        types=[
            *(Step("destination", ddl.create_schema(schema)) for schema in work.schemas),
            *work.steps,
        ],
        create=Step(
            "destination",
            ddl.create_temporary_table(staging.name, [by_name[c] for c in columns]),
        ),
        copy_in=Step("destination", copy_in),
        copy_out=Step("source", copy_out),
        staged=Step("destination", sql.SQL("ANALYZE {}").format(sql.Identifier(staging.name))),
        head=head,
        update=update if added else None,
        tail=tail,
        key=key_steps if added else None,
        after=analyze,
        rows=rows,
        limit=limit,
    )


def _copy_rows(ends: Endpoints, destination: TableInfo) -> int:
    """The copy's row count as the planner estimates it: its statistics' rows per page (its
    load analyzed it) times the pages it has now, since the batches after that analyze grew
    it (a copy that doubled since reads as double, not as its old count)."""
    (rows,) = execute(
        ends.dest,
        "SELECT CASE WHEN relpages > 0 AND reltuples >= 0"
        " THEN reltuples / relpages * (pg_catalog.pg_relation_size(oid)"
        " / pg_catalog.current_setting('block_size')::int)"
        " ELSE reltuples END FROM pg_catalog.pg_class WHERE oid = %s",
        (destination.oid,),
    ).fetchone()
    return max(int(rows), 0)


def _key_name(ends: Endpoints, destination: TableInfo) -> str | None:
    rows = fetch_all(
        ends.dest,
        "SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s AND contype = 'p'",
        (destination.oid,),
    )
    return rows[0][0] if rows else None


class CheaperReloaded(Exception):
    """So many rows would be written that a reload costs less: the copy is left as it was."""


def take_in_place(
    ends: Endpoints,
    built: TableSql,
    source: TableInfo,
    destination: TableInfo,
    evo: Evolution,
    reason: str,
) -> str | None:
    """`evolve`, said in the log with its `reason` (`schema evolved: ...`); or why the copy
    refused the change (a view that cannot be recreated, NOT NULL over rows the source no
    longer has, most rows to write), which its caller reloads for. A lock not had in time
    is raised: the table fails this run, and its change waits."""
    name = built.table.written_name
    try:
        written = evolve(ends, built, source, destination, evo)
    except (DatabaseError, CheaperReloaded) as exc:
        if isinstance(exc, DatabaseError) and exc.sqlstate == LOCK_NOT_AVAILABLE:
            raise
        why = str(exc).removeprefix("destination: ")
        log.info("%s: the change is not taken in place (%s): reloading", name, why)
        return why
    log.info(
        "%s: %s; %s row(s) given the new columns' values",
        name,
        reason,
        f"{written:,}",
        extra={"fields": {"event": "table.evolved", "name": name, "rows": written}},
    )
    return None


def evolve(
    ends: Endpoints, built: TableSql, source: TableInfo, destination: TableInfo, evo: Evolution
) -> int:
    """Take the change in place; return how many rows got the new columns' values. Raises
    CheaperReloaded, with the copy unchanged, when most rows would be written."""
    script = evolve_script(ends, built, source, destination, evo)
    written = 0
    with transaction(ends.dest):
        run_steps(ends.dest, [*script.types, script.create])
        with transaction(ends.source, SOURCE_BEGIN, rollback=True):
            staged, _ = stream_between(
                ends.source, ends.dest, script.copy_out.text, script.copy_in.text
            )
        if script.limit is not None and staged >= script.limit:
            raise CheaperReloaded(
                f"more than {script.limit - 1:,} of about {script.rows:,} rows would get new "
                "values, which a reload writes sooner"
            )
        run_steps(ends.dest, [script.staged])
        many = staged > REBUILD_SHARE * script.rows
        for step in script.change(rebuild_key=many):
            cursor = execute(ends.dest, step.statement, step.params)
            if step is script.update:
                written = cursor.rowcount
        failpoint("mid-evolve")
    if not many:  # so many rows written: autovacuum analyzes the copy soon
        run_steps(ends.dest, script.after)
    return written


def _constant_defaults(
    ends: Endpoints,
    source: TableInfo,
    evo: Evolution,
    types: dict[str, str],
    hashed: set[str],
    user_types: set[str],
) -> dict[str, str]:
    """The added columns whose source default is a constant, with its text, when the copy's
    type gives that text back (a setting such as TimeZone could change it): the value every
    row already in the copy takes at the ADD COLUMN. Not a hashed column's: its copy holds
    the hash, never the value. A user-defined type is made in the destination as the
    source has it (an enum's labels, a domain's base): its text is the source's."""
    names = [c.name for c in evo.added if c.name not in hashed]
    if not names:
        return {}
    found = {}
    for name, expression in fetch_all(ends.source, _DEFAULT, (source.oid, names)):
        if not _is_constant(expression):
            continue
        (text,) = execute(
            ends.source, sql.SQL("SELECT ({})::text").format(sql.SQL(expression))
        ).fetchone()
        if text is None:
            continue
        if name in user_types:
            found[name] = text
            continue
        try:
            (back,) = execute(
                ends.dest,
                sql.SQL("SELECT ({}::{})::text").format(sql.Literal(text), sql.SQL(types[name])),
            ).fetchone()
        except DatabaseError:
            continue
        if back == text:
            found[name] = text
    return found


def _is_constant(expression: str) -> bool:
    """A default that is a literal (cast or not): the same value for every row."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(expression, read="postgres")
    except sqlglot.errors.ParseError:
        return False

    def constant(node: exp.Expression) -> bool:
        if isinstance(node, exp.Cast):
            return constant(node.this)
        if isinstance(node, exp.Paren | exp.Neg):
            return constant(node.this)
        return isinstance(node, exp.Literal | exp.Null | exp.Boolean)

    return constant(tree)
