"""`replicator check`: every problem a sync would hit, found up front, each with its fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

import click
import psycopg
from psycopg import sql

from ...base.errors import ReplicatorError
from ...base.identifiers import display_ident
from ...base.redact import redact
from ...plan.cursor import cursor_limits
from ...plan.drift import plan_now
from ...plan.evolution import Evolution, evolution
from ...plan.inspect_table import inspect_table, near_table
from ...plan.read_ahead import NOTHING_READ, ReadAhead, read_ahead
from ...plan.selection import expand_project, has_patterns, without_patterns
from ...postgres.catalog import TableInfo, describe_table, leading_index_columns
from ...postgres.database import connect, execute, fetch_all
from ...postgres.dependent_views import reload_problem
from ...postgres.dest_schema import missing_schemas
from ...postgres.naming import INTERNAL_SCHEMA
from ...postgres.partition_tree import PARTITIONED, leaves
from ...postgres.types.type_closure import domain_base
from ...project.config import TableConfig
from ...project.project import Project
from ...project.settings import SALT_SETTING
from ...project.templates import stray_models
from ...report.logs import json_output, quiet
from ...report.results import utc_now
from ...report.webhook import build_payload, post
from .capture_checks import capture_findings
from .findings import Finding, summed_up
from .install_checks import install_findings
from .spark_checks import spark_findings
from .type_checks import extension_findings


def print_checks(project: Project, ping: bool = False, verbose: int = 0) -> int:
    """Run the checks and print one line per finding (a JSON object each under --log-format
    json; errors and warnings only under -q), then the count; 1 when any is an error. The
    tables of one pattern entry are summed up (findings.summed_up) unless `verbose`."""
    findings = run_checks(project, ping)
    shown = findings if verbose or json_output() else summed_up(findings)
    for finding in shown:
        if quiet() and finding.level == "ok":
            continue
        if json_output():
            click.echo(redact(json.dumps({"event": "check.finding", **asdict(finding)})))
        else:
            click.echo(redact(finding.line()))
    errors = sum(f.level == "error" for f in findings)
    warnings = sum(f.level == "warn" for f in findings)
    if json_output():
        click.echo(json.dumps({"event": "check.finished", "errors": errors, "warnings": warnings}))
    else:
        lines = sum(f.level in ("error", "warn") for f in shown)
        summed = "" if lines == errors + warnings else f" (on {lines} line(s): -v lists each)"
        click.echo(f"{errors} error(s), {warnings} warning(s){summed}")
    return 1 if errors else 0


def run_checks(project: Project, ping: bool = False) -> list[Finding]:
    """Check connections, privileges, keys, indexes, Java and the driver; never writes
    anything (`ping` sends the webhook a test payload)."""
    findings: list[Finding] = [*install_findings(), *spark_findings(project)]
    if ping:
        findings.append(_ping_webhook(project))
    connections = project.connections()
    source = _connect(connections.source, "source", "REPLICATOR_SOURCE_URL", findings)
    dest = _connect(connections.destination, "destination", "REPLICATOR_DEST_URL", findings)
    try:
        project = _expanded(project, source, findings)
        findings.extend(_stray_models(project))
        if source is not None:
            if any(t.mode != "cdc" and t.replication_key for t in project.config.tables):
                findings.extend(_cursor_protection(source))
            findings.extend(capture_findings(source, project))
        if dest is not None:
            findings.extend(_destination_privileges(dest, project))
        ahead = read_ahead(source, dest, project.config.tables) if source is not None else None
        for table in project.config.tables:
            found = list(_check_state(project, table))
            if source is not None:
                found.extend(_check_table(source, table, project))
            if source is not None and dest is not None:
                failing = any(f.level == "error" for f in found) or any(
                    f.level == "error" and f.subject == table.written_name for f in findings
                )
                # the plan of a table found failing is not what its next sync does: it fails
                found.extend(
                    f
                    for f in _check_plan(source, dest, table, project, ahead or NOTHING_READ)
                    if not failing or f.level != "ok"
                )
                found.extend(extension_findings(source, dest, table, project))
            findings.extend(replace(f, pattern=table.pattern) for f in found)
    finally:
        for conn in (source, dest):
            if conn is not None:
                conn.close()
    return findings


def _expanded(
    project: Project, source: psycopg.Connection[Any] | None, findings: list[Finding]
) -> Project:
    """The project with its patterns matched against the source's catalog now; each
    pattern's matches (or none) and each table one chose before that is gone, said."""
    if not has_patterns(project):
        return project
    if source is None:
        findings.append(
            Finding(
                "error",
                "tables",
                "the table patterns cannot be matched: the source cannot be reached",
                "fix the source connection (above)",
            )
        )
        return without_patterns(project)
    expanded = expand_project(project, source)
    for entry in project.config.tables:
        matched = [
            str(t.name) for t in expanded.config.tables if t.pattern and t.entry == entry.entry
        ]
        if entry.is_pattern and matched:
            more = f" and {len(matched) - 5} more" if len(matched) > 5 else ""
            message = (
                f"tables[{entry.entry}] ({entry.written_name}) matches {len(matched)} "
                f"table(s): {', '.join(matched[:5])}{more}"
            )
            findings.append(Finding("ok", "tables", message))
    level = "error" if expanded.abandoned else "warn"  # it leaves copies behind: sync exits 1
    findings.extend(Finding(level, "tables", line) for line in expanded.unmatched)
    findings.extend(Finding("warn", "tables", v.line()) for v in expanded.vanished)
    return expanded


def _stray_models(project: Project) -> Iterator[Finding]:
    """A model file that no configured table reads is a mistake (a misspelt name)."""
    tables = [t.name for t in project.config.tables]
    for path, near in stray_models(project.templates, tables):
        yield Finding(
            "error",
            "models",
            f"{path} is the model of no table in tables-config.json: it is never read",
            f"rename it to {near}" if near else "remove it, or add its table to the config",
        )


def _ping_webhook(project: Project) -> Finding:

    target = project.settings.webhook
    if target is None:
        return Finding("warn", "webhook", "--ping: no webhook configured")
    now = utc_now()
    payload = build_payload("check-ping", now, now, [], status="success")
    # Not a sync's: a chat channel shows `text` as it is.
    payload.update(event="check.ping", text="replicator check --ping: a test post, no sync ran")
    problem = post(target, payload)
    if problem is None:
        return Finding("ok", "webhook", "test payload delivered")
    return Finding(
        "error",
        "webhook",
        f"test payload not delivered: {problem}",
        "check webhook.url / REPLICATOR_WEBHOOK_URL and the receiver",
    )


def _connect(url: str, role: str, variable: str, findings: list[Finding]) -> Any:
    try:
        conn = connect(url, role)
    except ReplicatorError as exc:
        findings.append(Finding("error", role, str(exc), f"check {variable}"))
        return None
    (version,) = execute(conn, "SHOW server_version").fetchone()
    findings.append(Finding("ok", role, f"connected (PostgreSQL {version})"))
    transport = _transport(conn, role, variable)
    if transport is not None:
        findings.append(transport)
    return conn


LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _transport(conn: psycopg.Connection[Any], role: str, variable: str) -> Finding | None:
    """A server on another host reached without `sslmode=verify-full`: its rows (and the
    role's password, unless SCRAM) cross the network readable, or to a server that only
    claims to be it. None for a local one (a Unix socket, loopback)."""
    host = conn.info.host
    if host.startswith("/") or host in LOCAL_HOSTS:
        return None
    options = {o.keyword.decode(): o.val for o in conn.pgconn.info}
    mode = (options.get("sslmode") or b"prefer").decode()
    if mode == "verify-full":
        return None
    state = (
        "encrypted, but nothing checks that the server is the one named"
        if conn.pgconn.ssl_in_use
        else "not encrypted"
    )
    return Finding(
        "warn",
        role,
        f"host {host} is reached with sslmode {mode} ({state}): the rows cross the "
        "network where a machine in between may read them or pose as the server",
        f"add sslmode=verify-full and sslrootcert=<the CA's certificate file> to {variable} "
        "(every Spark executor needs that file at the same path: docs/configuration.md, TLS)",
    )


def _cursor_protection(conn: psycopg.Connection[Any]) -> Iterator[Finding]:
    """What keeps a cursor from passing a row that a transaction open at the read commits
    later, with this role on this server (postgres/open_transactions.py)."""
    user, sees_all, standby = fetch_all(
        conn,
        "SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) "
        "OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'), pg_is_in_recovery()",
    )[0]
    role = display_ident(user)
    if standby:
        yield Finding(
            "warn",
            "source",
            "the source is a standby: a cursor waits for every transaction of the primary "
            "that had written when it read, but one that had not written yet (BEGIN, work, "
            "then UPDATE ... now()) cannot be seen from a standby, and only the table's "
            "`lookback` covers it",
            "read the primary, or set tables[].lookback above the longest transaction "
            "that writes these tables",
        )
    elif sees_all:
        yield Finding(
            "ok",
            "source",
            f"role {role} sees every session's transaction start: a timestamp cursor stops "
            "at the oldest open transaction's start and advances right after a batch; other "
            "keys wait for every transaction open at the read to end",
        )
    else:
        yield Finding(
            "ok",
            "source",
            f"role {role} waits for every transaction open at the read (their locks need no "
            "privilege): while one is open, a cursor advances one run later (rows are read "
            "again, nothing is missed); GRANT pg_read_all_stats TO "
            f"{role} lets a timestamp cursor stop at the oldest one's start instead",
        )


def _destination_privileges(conn: psycopg.Connection[Any], project: Project) -> Iterator[Finding]:
    """The schemas a sync writes to: CREATE on each one that exists, CREATE on the database
    only when one is missing (the sync creates only missing schemas)."""
    needed = [*dict.fromkeys(t.target.schema for t in project.config.tables), INTERNAL_SCHEMA]
    user, database, may_create_schemas = fetch_all(
        conn,
        "SELECT current_user, current_database(), "
        "has_database_privilege(current_database(), 'CREATE')",
    )[0]
    role, db = display_ident(user), display_ident(database)
    missing = missing_schemas(conn, needed)
    usable = []
    for schema in needed:
        if schema in missing:
            continue
        lacks = [
            privilege
            for privilege in ("USAGE", "CREATE")
            if not fetch_all(conn, "SELECT has_schema_privilege(%s, %s)", (schema, privilege))[0][0]
        ]
        if lacks:
            yield Finding(
                "error",
                "destination",
                f"role {role} lacks {' and '.join(lacks)} on schema {display_ident(schema)}",
                f"GRANT USAGE, CREATE ON SCHEMA {display_ident(schema)} TO {role}",
            )
        else:
            usable.append(display_ident(schema))
    if usable:
        yield Finding(
            "ok", "destination", f"role {role} may create tables in schemas {some(usable)}"
        )
    if missing and may_create_schemas:  # one line for a hundred tenants' schemas
        names = [display_ident(schema) for schema in missing]
        yield Finding(
            "ok",
            "destination",
            f"schema {names[0]} is missing; role {role} may create it"
            if len(names) == 1
            else f"schemas {some(names)} are missing; role {role} may create them",
        )
    for schema in missing if not may_create_schemas else ():
        name = display_ident(schema)
        yield Finding(
            "error",
            "destination",
            f"schema {name} does not exist and role {role} may not create schemas in database {db}",
            f"CREATE SCHEMA {name} AUTHORIZATION {role}, or GRANT CREATE ON DATABASE {db} "
            f"TO {role}",
        )


def some(names: list[str], most: int = 5) -> str:
    """`a, b, c, d, e and 95 more`."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _check_state(project: Project, table: TableConfig) -> Iterator[Finding]:
    try:
        project.store.read(table.name)
    except ReplicatorError as exc:
        yield Finding("error", table.written_name, str(exc))


def _check_table(
    conn: psycopg.Connection[Any], table: TableConfig, project: Project
) -> Iterator[Finding]:
    subject = table.written_name
    info = describe_table(conn, table.name)
    if info is None:
        near = near_table(conn, table.name)
        yield Finding(
            "error",
            subject,
            "source table does not exist" + (f"; did you mean {near}?" if near else ""),
            "create it, or fix the name in tables-config.json",
        )
        return
    (can_select, can_use_schema) = execute(  # column grants count: `columns.exclude` needs no more
        conn,
        "SELECT has_any_column_privilege(c.oid, 'SELECT'), "
        "has_schema_privilege(c.relnamespace, 'USAGE') FROM pg_catalog.pg_class c WHERE c.oid = %s",
        (info.oid,),
    ).fetchone()
    if not can_use_schema:
        schema = display_ident(info.name.schema)
        yield Finding(
            "error",
            subject,
            f"the source role lacks USAGE on schema {schema}, which reading any table in it needs",
            f"GRANT USAGE ON SCHEMA {schema} TO {display_ident(_current_user(conn))}",
        )
        return
    if not can_select:
        yield Finding(
            "error",
            subject,
            "the source role may not SELECT from it",
            f"GRANT SELECT ON {info.name} TO {display_ident(_current_user(conn))}",
        )
        return
    try:
        built = inspect_table(conn, table, project.templates)
        # rendered now: a macro override may fail, an index name a column the copy lacks
        _ = (built.merge, built.create_destination, built.indexes)
    except ReplicatorError as exc:
        yield Finding("error", subject, str(exc).removeprefix(f"{subject}: "))
        return
    shape = f"{info.kind}, {len(info.columns)} columns, {built.key.describe()}"
    yield Finding("ok", subject, shape)
    if info.kind == PARTITIONED:
        yield from _unreadable_partitions(conn, subject, info)
    if table.columns is not None and table.columns.hash and not _salted(conn):
        yield Finding(
            "warn",
            subject,
            "columns.hash without REPLICATOR_HASH_SALT: each hash is the bare SHA-256 of the "
            "value, which a list of the possible values reverses (an SSN, a phone number)",
            "set REPLICATOR_HASH_SALT to a long random secret (the copy reloads once with it)",
        )
    nullable = [c for c in table.primary_key or () if not _not_null(info, c)]
    if nullable:  # the copy's key cannot hold a NULL: such a row fails the load
        yield Finding(
            "warn",
            subject,
            f"primary_key column(s) {', '.join(map(display_ident, nullable))} may be NULL in "
            "the source: a row with NULL there fails the load (a primary key holds no NULLs)",
            "choose columns declared NOT NULL, or make sure no row has NULL in them",
        )
    if table.replication_key is None:
        return
    (zone,) = execute(
        conn, "SELECT reset_val FROM pg_catalog.pg_settings WHERE name = 'TimeZone'"
    ).fetchone()
    base, not_null = domain_base(conn, built.replication_key_type)
    for limit in cursor_limits(built, zone, base, not_null):
        yield Finding("warn", subject, limit.message, limit.fix)
    if table.replication_key in leading_index_columns(conn, info.oid):
        yield Finding(
            "ok", subject, f"replication key {display_ident(table.replication_key)} is indexed"
        )
    else:
        yield Finding(
            "warn",
            subject,
            f"replication key {display_ident(table.replication_key)} has no index: "
            "every sync will scan the whole table",
            sql.SQL("CREATE INDEX ON {} ({})")
            .format(
                sql.Identifier(info.name.schema, info.name.name),
                sql.Identifier(table.replication_key),
            )
            .as_string(None),
        )


def _unreadable_partitions(
    conn: psycopg.Connection[Any], subject: str, info: TableInfo
) -> Iterator[Finding]:
    """Partitions the role may not read itself: a grant on the schema's tables (GRANT ...
    ON ALL TABLES IN SCHEMA) does not reach one created later. Nothing is missed (the root
    gives their rows), but a load reads the table through its root in key ranges instead
    of leaf by leaf, and each new one is looked at through the root."""
    hidden = [leaf.name for leaf in leaves(conn, info.oid) if not leaf.readable]
    if not hidden:
        return
    user = display_ident(_current_user(conn))
    owners = fetch_all(
        conn,
        "SELECT DISTINCT pg_get_userbyid(c.relowner), n.nspname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::regclass[]) "
        "ORDER BY 1, 2",
        ([name.sql() for name in hidden],),
    )
    more = f" and {len(hidden) - 5} more" if len(hidden) > 5 else ""
    defaults = "; ".join(
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {display_ident(owner)} IN SCHEMA "
        f"{display_ident(schema)} GRANT SELECT ON TABLES TO {user}"
        for owner, schema in owners
    )
    yield Finding(
        "warn",
        subject,
        f"role {user} may read the table but not its partition(s) "
        f"{', '.join(map(str, hidden[:5]))}{more} (a GRANT on a schema's tables does not "
        "reach partitions created later): nothing is missed, but a load reads the table "
        "through its root in key ranges instead of partition by partition",
        f"GRANT SELECT ON {', '.join(map(str, hidden))} TO {user}; and for the partitions "
        f"made later: {defaults}",
    )


def _check_plan(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    table: TableConfig,
    project: Project,
    ahead: ReadAhead,
) -> Iterator[Finding]:
    """The table's next sync as `sync` will decide it; a planned failure (a destination
    table replicator does not own, a schema change under on_schema_change fail) is an
    error with its fix. Problems on the source side were reported above."""
    try:
        state = project.store.read(table.name)
        planned = plan_now(source, dest, table, project.templates, state, ahead=ahead)
    except ReplicatorError:
        return
    plan = planned.plan
    if plan.action == "fail":
        yield Finding("error", table.written_name, plan.reason, plan.fix)
    else:
        yield Finding("ok", table.written_name, f"next sync: {plan.action} ({plan.reason})")
    changes = planned.observed.schema_changes
    shaped_cdc = table.mode == "cdc" and planned.built.shaping is not None
    evolvable = table.on_schema_change != "evolve" and not shaped_cdc
    if changes and evolvable and isinstance(evolution(changes), Evolution):
        yield Finding(
            "ok",
            table.written_name,
            'with "on_schema_change": "evolve" the copy would take this change in place, '
            "without a reload",
        )
    blocked = (
        reload_problem(dest, table.target) if planned.observed.ownership != "foreign" else None
    )
    if blocked is not None:
        problem, fix = blocked
        reloads = plan.action == "full_reload"
        when = "" if reloads else " (the next full reload fails on it)"
        yield Finding("error" if reloads else "warn", table.written_name, problem + when, fix)


def _current_user(conn: psycopg.Connection[Any]) -> str:
    return str(fetch_all(conn, "SELECT current_user")[0][0])


def _not_null(info: TableInfo, name: str) -> bool:
    column = info.column(name)
    return column is None or column.not_null  # a missing one is an error of its own


def _salted(conn: psycopg.Connection[Any]) -> bool:
    """The source session holds a hash salt (project/settings.py: never in a statement)."""
    (salt,) = execute(conn, "SELECT current_setting(%s, true)", (SALT_SETTING,)).fetchone()
    return bool(salt)
