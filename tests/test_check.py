"""`replicator check`: one line per finding, with a fix; exit 0 only when nothing is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg import sql


@pytest.fixture
def tables(source_conn, schema):
    def create(name: str, ddl: str) -> None:
        source_conn.execute(sql.SQL("CREATE TABLE {} " + ddl).format(sql.Identifier(schema, name)))

    # A NOT NULL key: a nullable one is a warning of its own (test_cursor.py).
    create("good", "(id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
    source_conn.execute(
        sql.SQL("CREATE INDEX ON {} (updated_at)").format(sql.Identifier(schema, "good"))
    )
    create("no_pk", "(id int, updated_at timestamptz)")
    create("no_index", "(id int PRIMARY KEY, updated_at timestamptz NOT NULL)")
    return schema


def test_all_good_is_exit_0(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    result = db_project.run("check")
    assert result.exit_code == 0, result.output
    assert "ok    source: connected (PostgreSQL" in result.stdout
    assert "ok    destination: role postgres may create tables in schemas" in result.stdout
    assert "ok    source: role postgres sees every session's transaction start" in result.stdout
    assert f"ok    {tables}.good: replication key updated_at is indexed" in result.stdout
    assert result.stdout.strip().endswith("0 error(s), 0 warning(s)")


def test_table_without_primary_key_is_an_error_with_fix(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.no_pk", "replication_key": "updated_at"}]}
    )
    result = db_project.run("check")
    assert result.exit_code == 1
    assert (
        f"error {tables}.no_pk: the source table has no primary key, which mode "
        "incremental-deduped needs"
    ) in result.stdout
    assert 'set "primary_key" in tables-config.json' in result.stdout


def test_configured_primary_key_satisfies_the_check(db_project, tables):
    db_project.write_config(
        {
            "tables": [
                {"name": f"{tables}.no_pk", "replication_key": "updated_at", "primary_key": ["id"]}
            ]
        }
    )
    result = db_project.run("check")
    assert "primary key (id)" in result.stdout
    assert "error" not in result.stdout.replace("0 error(s)", "")


def test_unindexed_replication_key_is_a_warning_with_the_index_to_create(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.no_index", "replication_key": "updated_at"}]}
    )
    result = db_project.run("check")
    assert result.exit_code == 0, result.output
    assert (
        f"warn  {tables}.no_index: replication key updated_at has no index: every sync will "
        f'scan the whole table; fix: CREATE INDEX ON "{tables}"."no_index" ("updated_at")'
    ) in result.stdout
    assert "0 error(s), 1 warning(s)" in result.stdout


def test_missing_table_and_column_are_errors(db_project, tables):
    db_project.write_config(
        {
            "tables": [
                {"name": f"{tables}.absent", "replication_key": "updated_at"},
                {"name": f"{tables}.good", "replication_key": "changed_at"},
            ]
        }
    )
    result = db_project.run("check")
    assert result.exit_code == 1
    assert f"error {tables}.absent: source table does not exist" in result.stdout
    assert (
        f"error {tables}.good: replication key column changed_at does not exist in the source table"
    ) in result.stdout
    assert "2 error(s)" in result.stdout


def test_a_misspelt_table_name_gets_the_table_it_meant_in_check_and_sync(db_project, tables):
    """`sync -s ordrs` suggested the configured name; the config's own typo only said the
    source table does not exist (a newcomer trial)."""
    db_project.write_config({"tables": [{"name": f"{tables}.no_indx", "mode": "full-refresh"}]})
    checked = db_project.run("check")
    assert checked.exit_code == 1
    assert (
        f"error {tables}.no_indx: source table does not exist; did you mean {tables}.no_index?"
    ) in checked.stdout, checked.stdout
    synced = db_project.run("sync")
    assert synced.exit_code == 1
    assert (
        f"source table does not exist: did you mean {tables}.no_index? Fix its name "
        "(tables[0] in tables-config.json)"
    ) in synced.stderr, synced.stderr


def test_a_column_named_in_the_wrong_case_gets_the_spelling_to_write(
    db_project, tables, source_conn
):
    source_conn.execute(
        sql.SQL('CREATE TABLE {} (id int PRIMARY KEY, "UpdatedAt" timestamptz NOT NULL)').format(
            sql.Identifier(tables, "camel")
        )
    )
    db_project.write_config(
        {"tables": [{"name": f"{tables}.camel", "replication_key": "UpdatedAt"}]}
    )
    result = db_project.run("check")
    assert result.exit_code == 1
    assert (
        f"error {tables}.camel: replication key column updatedat does not exist in the source "
        'table (it has id, "UpdatedAt"); did you mean "UpdatedAt"? Unquoted names are folded '
        'to lower case: write it as "\\"UpdatedAt\\"" in tables-config.json'
    ) in result.stdout, result.stdout


def test_a_primary_key_over_a_nullable_column_is_a_warning(db_project, tables):
    db_project.write_config(
        {
            "tables": [
                {"name": f"{tables}.no_pk", "replication_key": "updated_at", "primary_key": ["id"]}
            ]
        }
    )
    result = db_project.run("check")
    assert (
        f"warn  {tables}.no_pk: primary_key column(s) id may be NULL in the source: a row "
        "with NULL there fails the load"
    ) in result.stdout, result.stdout


def test_corrupt_state_file_is_reported(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    db_project.write(f"sync-state/{tables}.good.json", "{ truncated")
    result = db_project.run("check")
    assert result.exit_code == 1
    assert f"sync-state/{tables}.good.json: corrupt or truncated sync-state file" in result.stdout


def test_role_without_pg_read_all_stats_gets_a_warning(db_project, tables, source_conn):
    source_conn.execute(
        "DO $$ BEGIN CREATE ROLE replicator_reader LOGIN; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    source_conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO replicator_reader").format(sql.Identifier(tables))
    )
    source_conn.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO replicator_reader").format(
            sql.Identifier(tables)
        )
    )
    url = db_project.env["REPLICATOR_SOURCE_URL"].replace("postgres@", "replicator_reader@")
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    result = db_project.run("check", env={"REPLICATOR_SOURCE_URL": url})
    assert result.exit_code == 0, result.output
    assert (
        "ok    source: role replicator_reader waits for every transaction open at the read"
        in result.stdout
    )
    assert "GRANT pg_read_all_stats TO replicator_reader lets a timestamp cursor" in result.stdout


def test_a_source_role_without_usage_on_the_schema_is_told_the_grant(
    db_project, tables, source_conn
):
    """SELECT on the table is not enough: without USAGE on its schema the sync fails, so
    `check` says it, with the GRANT."""
    source_conn.execute(
        "DO $$ BEGIN CREATE ROLE replicator_nousage LOGIN; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    source_conn.execute(
        sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO replicator_nousage").format(
            sql.Identifier(tables)
        )
    )
    url = db_project.env["REPLICATOR_SOURCE_URL"].replace("postgres@", "replicator_nousage@")
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    result = db_project.run("check", env={"REPLICATOR_SOURCE_URL": url})
    assert result.exit_code == 1, result.output
    assert (
        f"error {tables}.good: the source role lacks USAGE on schema {tables}, which reading "
        "any table in it needs" in result.stdout
    ), result.stdout
    assert f"GRANT USAGE ON SCHEMA {tables} TO replicator_nousage" in result.stdout
    synced = db_project.run("sync", env={"REPLICATOR_SOURCE_URL": url})
    assert synced.exit_code == 1
    assert "permission denied for schema" in synced.stderr, synced.stderr
    assert "(reading macro default_model" not in synced.stderr, "not a model's error"
    source_conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO replicator_nousage").format(sql.Identifier(tables))
    )
    assert (
        f"error {tables}.good"
        not in db_project.run("check", env={"REPLICATOR_SOURCE_URL": url}).stdout
    )


def test_java_and_jdbc_driver_are_reported(db_project, tables):
    db_project.write_config({"tables": [{"name": f"{tables}.good", "mode": "full-refresh"}]})
    result = db_project.run("check")
    assert "ok    spark: java: " in result.stdout
    assert "ok    spark: JDBC driver: /usr/share/java/postgresql.jar" in result.stdout
    missing = db_project.run("check", env={"REPLICATOR_JDBC_JAR": "/nonexistent/pg.jar"})
    assert missing.exit_code == 1
    assert "error spark: JDBC driver: /nonexistent/pg.jar does not exist" in missing.stdout


def test_ping_sends_the_webhook_a_test_payload(db_project, tables, httpserver):
    import json

    httpserver.expect_request("/hook").respond_with_data("ok")
    db_project.write_config(
        {
            "tables": [{"name": f"{tables}.good", "mode": "full-refresh"}],
            "webhook": {"url": httpserver.url_for("/hook")},
        }
    )
    result = db_project.run("check", "--ping")
    assert result.exit_code == 0, result.output
    assert "ok    webhook: test payload delivered" in result.stdout
    posted = json.loads(httpserver.log[0][0].data)
    assert posted["event"] == "check.ping"
    assert posted["text"] == "replicator check --ping: a test post, no sync ran", "not a sync's"
    assert db_project.run("check").exit_code == 0 and len(httpserver.log) == 1


def test_the_tables_of_a_pattern_are_summed_up_unless_verbose(db_project, source_conn, schema):
    """Tenant tables under one pattern, each without an index on its key: one line says it
    of all of them (it was one line per table, 350 lines for 94 tables), `-v` lists each."""
    for i in range(6):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)").format(
                sql.Identifier(schema, f"t_{i}")
            )
        )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.t_*", "replication_key": "updated_at"}]}
    )
    summed = db_project.run("check")
    assert summed.exit_code == 0, summed.output
    lines = [line for line in summed.stdout.splitlines() if f"{schema}.t_" in line]
    pattern = f"{schema}.t_* (6 tables: {schema}.t_0, {schema}.t_1, {schema}.t_2 and 3 more)"
    assert (
        f"warn  {pattern}: replication key updated_at has no index: every sync will scan the "
        'whole table; fix: CREATE INDEX ON <table> ("updated_at"), for each' in lines
    ), summed.stdout
    reason = f"next sync: full_reload (no state: new table matched {schema}.t_*)"
    assert f"ok    {pattern}: {reason}" in lines  # the same reason for each: said
    assert "6 warning(s) (on 1 line(s): -v lists each)" in summed.stdout, summed.stdout[:600]
    assert len(lines) <= 5, lines  # the pattern's match line, and one per kind of finding
    each = db_project.run("check", "-v")
    for i in range(6):
        assert f"warn  {schema}.t_{i}: replication key updated_at has no index" in each.stdout
    assert " sql: " not in each.stderr, "-v: the lines, -vv: the statements too"
    assert " sql: " in db_project.run("check", "-vv").stderr


_FINDINGS = (
    "import replicator.cli.main; "
    "from replicator.commands.check.install_checks import install_findings; "
    "print(*(f.line() for f in install_findings()), sep='\\n')"
)


def test_modules_without_bytecode_where_none_is_written_are_a_warning_whose_fix_works(tmp_path):
    """PYTHONDONTWRITEBYTECODE set (as in many Docker images) and an install of the package
    left without `.pyc`: check says so, and the command it gives compiles them."""
    import os
    import shlex
    import shutil
    import subprocess
    import sys

    import replicator

    package = tmp_path / "install" / "replicator"
    shutil.copytree(
        Path(replicator.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__")
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(package.parent)}

    def lines() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", _FINDINGS],
            capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
        )  # fmt: skip
        return [line for line in done.stdout.splitlines() if line.startswith("warn  install:")]

    (warning,) = lines()
    assert "PYTHONDONTWRITEBYTECODE" in warning and f"e.g. {package}" in warning, warning
    fix = shlex.split(warning.split("fix: compile them once: ", 1)[1])
    assert str(package) in fix
    subprocess.run(fix, check=True, env=env)
    assert lines() == []
