"""`replicator init DIR`: a project that validates as written, with every example file."""

from __future__ import annotations

import json

from click.testing import CliRunner
from psycopg import sql

from replicator.cli.main import cli


def test_init_writes_a_valid_commented_project(tmp_path):
    target = tmp_path / "my-pipeline"
    result = CliRunner().invoke(cli, ["init", str(target)])
    assert result.exit_code == 0, result.output
    for relative in (
        "tables-config.json",
        ".env.example",
        "models/public/orders.sql",
        "macros/README.md",
        "sync-state/.gitkeep",
        ".gitignore",
    ):
        assert (target / relative).is_file(), relative
    assert f"next: edit {target / 'tables-config.json'}" in result.stdout
    config = json.loads((target / "tables-config.json").read_text())
    assert "//" in config["tables"][0]
    assert ".env" in (target / ".gitignore").read_text().splitlines()
    # The scaffold validates as written: status lists its three example tables.
    status = CliRunner().invoke(cli, ["status", "--json", "--project-dir", str(target)])
    assert status.exit_code == 0, status.output
    rows = json.loads(status.stdout)
    assert [r["name"] for r in rows] == [
        "public.orders",
        "public.countries",
        "public.payments",
        '"Sales"."Order Lines"',
    ]
    assert rows[2]["mode"] == "cdc"
    assert rows[3]["destination"] == "warehouse.order_lines"


def test_check_of_the_scaffold_reports_on_its_tables_and_capture(tmp_path, pg_servers):
    """Against real servers without the example tables: check says what is missing, and
    what the cdc example needs of the source; the config itself is valid (not exit 2)."""
    target = tmp_path / "p"
    assert CliRunner().invoke(cli, ["init", str(target)]).exit_code == 0
    env = {
        "REPLICATOR_SOURCE_URL": pg_servers.source_url,
        "REPLICATOR_DEST_URL": pg_servers.dest_url,
    }
    checked = CliRunner().invoke(cli, ["check", "--project-dir", str(target)], env=env)
    assert checked.exit_code == 1, checked.output
    assert "ok    cdc: wal_level is logical" in checked.output
    assert "public.payments" in checked.output


def test_the_readme_path_from_init_to_a_passing_check(tmp_path, pg_servers, source_conn, schema):
    """Tables replaced as the README says, the example model left: `check` failed on it as a
    model of no table, and nothing had said to remove it (a newcomer trial)."""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)").format(
            sql.Identifier(schema, "orders")
        )
    )
    source_conn.execute(
        sql.SQL("CREATE INDEX ON {} (updated_at)").format(sql.Identifier(schema, "orders"))
    )
    target = tmp_path / "p"
    made = CliRunner().invoke(cli, ["init", str(target)])
    model = target / "models/public/orders.sql"
    assert f"rename or delete the example model {model}" in made.stdout, made.stdout
    config = {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    (target / "tables-config.json").write_text(json.dumps(config))
    env = {
        "REPLICATOR_SOURCE_URL": pg_servers.source_url,
        "REPLICATOR_DEST_URL": pg_servers.dest_url,
    }
    checked = CliRunner().invoke(cli, ["check", "--project-dir", str(target)], env=env)
    assert checked.exit_code == 1
    assert (
        "error models: models/public/orders.sql is the model of no table in tables-config.json:"
        " it is never read; fix: remove it, or add its table to the config"
    ) in checked.stdout, checked.stdout
    model.unlink()
    checked = CliRunner().invoke(cli, ["check", "--project-dir", str(target)], env=env)
    assert checked.exit_code == 0, checked.output


def test_init_with_project_dir_option(tmp_path):
    result = CliRunner().invoke(cli, ["init", "--project-dir", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p" / "tables-config.json").is_file()


def test_init_refuses_to_overwrite_a_project(tmp_path):
    (tmp_path / "tables-config.json").write_text('{"tables": []}')
    result = CliRunner().invoke(cli, ["init", str(tmp_path)])
    assert result.exit_code == 2
    assert "already exists: not overwriting a project" in result.stderr
    assert (tmp_path / "tables-config.json").read_text() == '{"tables": []}'
    assert not (tmp_path / "models").exists()
