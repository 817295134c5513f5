"""`replicator dbt-sources` checked by real dbt (dbt-core 1.10, dbt-postgres 1.9): the file
parses, the models that select from it run, and `dbt source freshness` passes, warns and
errors by the load history, for a table synced now, long ago and never."""

from __future__ import annotations

import json
import os
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml
from dbt_venv import dbt_program
from psycopg import sql


@pytest.fixture(scope="module")
def dbt():
    return dbt_program()


def _tables(source_conn, schema):
    for statement in (
        "CREATE TABLE {s}.orders (id int PRIMARY KEY, customer text, amount numeric(10,2), "
        "updated_at timestamptz NOT NULL DEFAULT now())",
        "COMMENT ON TABLE {s}.orders IS 'One row per order: the shop''s truth'",
        "COMMENT ON COLUMN {s}.orders.customer IS 'Who ordered'",
        "INSERT INTO {s}.orders SELECT g, 'c' || g, g, now() FROM generate_series(1, 5) g",
        "CREATE TABLE {s}.customers (id int PRIMARY KEY, email text, plan text)",
        "INSERT INTO {s}.customers VALUES (1, 'a@example.com', 'pro')",
        "CREATE TABLE {s}.refunds (id int PRIMARY KEY, order_id int)",
    ):
        source_conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))


def _config(db_project, schema, **top):
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.orders", "replication_key": "updated_at"},
                {
                    "name": f"{schema}.customers",
                    "mode": "full-refresh",
                    "columns": {"hash": ["email"]},
                    "freshness": {"warn_after": "30m", "error_after": "2h"},
                },
                {"name": f"{schema}.refunds", "mode": "full-refresh"},
            ],
            "freshness": {"warn_after": "1h", "error_after": "6h"},
            **top,
        }
    )


def _dbt_project(tmp_path, dest_url, sources_yml):
    """A dbt project on the destination whose models select from every source table."""
    folder = tmp_path / "analytics"
    (folder / "models").mkdir(parents=True)
    url = urlsplit(dest_url)
    (folder / "profiles.yml").write_text(
        yaml.safe_dump(
            {
                "analytics": {
                    "target": "dev",
                    "outputs": {
                        "dev": {
                            "type": "postgres",
                            "host": url.hostname,
                            "port": url.port,
                            "user": url.username,
                            "password": "",
                            "dbname": url.path.lstrip("/"),
                            "schema": "dbt_models",
                            "threads": 1,
                        }
                    },
                }
            }
        )
    )
    (folder / "dbt_project.yml").write_text(
        "name: analytics\nversion: '1.0'\nconfig-version: 2\nprofile: analytics\n"
    )
    (folder / "models" / "sources.yml").write_bytes(sources_yml)
    return folder


def _run_dbt(dbt, folder, *args):
    env = {**os.environ, "DBT_PROFILES_DIR": str(folder), "DBT_SEND_ANONYMOUS_USAGE_STATS": "0"}
    return subprocess.run(
        [str(dbt), *args, "--project-dir", str(folder), "--no-use-colors"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _freshness(dbt, folder):
    """dbt source freshness: its exit code and each source table's status."""
    done = _run_dbt(dbt, folder, "source", "freshness")
    results = json.loads((folder / "target" / "sources.json").read_text())["results"]
    return done, {r["unique_id"].rsplit(".", 1)[-1]: r["status"] for r in results}


def _shift_last_sync(dest_conn, schema, table, hours):
    """The table's successful syncs as if they ended `hours` earlier: time passing."""
    dest_conn.execute(
        "UPDATE _replicator.runs SET finished_at = finished_at - make_interval(hours => %s) "
        "WHERE table_name = %s",
        (hours, f"{schema}.{table}"),
    )


def test_dbt_parses_the_sources_and_checks_freshness_by_the_load_history(
    db_project, pg_servers, source_conn, dest_conn, schema, dbt, tmp_path, request
):
    _tables(source_conn, schema)
    _config(db_project, schema)
    out = tmp_path / "sources.yml"
    # written before the project's first sync, which then records its runs as the file's
    written = db_project.run("dbt-sources", "-o", str(out))
    assert written.exit_code == 0, written.output
    db_project.sync("-s", f"{schema}.orders", "-s", f"{schema}.customers")  # refunds: never
    assert f"wrote {out}: 3 table(s) in 1 source(s)" in written.output
    document = yaml.safe_load(out.read_text())
    (source,) = document["sources"]
    assert source["name"] == schema and source["schema"] == schema
    tables = {t["name"]: t for t in source["tables"]}
    orders = tables["orders"]
    assert orders["description"] == "One row per order: the shop's truth"
    assert orders["columns"] == [
        {"name": "id", "data_type": "integer"},
        {"name": "customer", "data_type": "text", "description": "Who ordered"},
        {"name": "amount", "data_type": "numeric(10,2)"},
        {"name": "updated_at", "data_type": "timestamp with time zone"},
    ]
    assert orders["config"]["meta"] == {
        "replicator": {"source_table": f"{schema}.orders", "mode": "incremental-deduped"}
    }
    assert orders["config"]["freshness"] == {
        "warn_after": {"count": 1, "period": "hour"},
        "error_after": {"count": 6, "period": "hour"},
    }
    email = next(c for c in tables["customers"]["columns"] if c["name"] == "email")
    assert email["data_type"] == "text" and "sha256" in email["description"]
    assert tables["customers"]["config"]["freshness"]["warn_after"] == {
        "count": 30,
        "period": "minute",
    }
    # the same config and catalogs: the same bytes, printed or written
    printed = db_project.run("dbt-sources")
    assert printed.exit_code == 0 and printed.output == out.read_text()

    folder = _dbt_project(tmp_path, pg_servers.dest_url, out.read_bytes())
    request.addfinalizer(lambda: dest_conn.execute("DROP SCHEMA IF EXISTS dbt_models CASCADE"))
    (folder / "models" / "order_count.sql").write_text(
        f"select count(*) as orders from {{{{ source('{schema}', 'orders') }}}}"
    )
    parsed = _run_dbt(dbt, folder, "parse")
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr
    assert "Deprecation]" not in parsed.stdout, parsed.stdout  # keys where dbt 1.10 wants them
    # dbt 1.10's one warning per table with limits is its bug (dbt-core#12451): no other
    logged = _run_dbt(dbt, folder, "--log-format", "json", "parse", "--no-partial-parse")
    events = [
        json.loads(line)["info"] for line in logged.stdout.splitlines() if line.startswith("{")
    ]
    warned = {e["name"] for e in events if e["level"] in ("warn", "error")}
    assert warned == {"FreshnessConfigProblem"}, logged.stdout
    strict = _run_dbt(dbt, folder, "--warn-error", "parse", "--no-partial-parse")
    assert strict.returncode == 0, strict.stdout
    built = _run_dbt(dbt, folder, "run")
    assert built.returncode == 0, built.stdout
    (count,) = dest_conn.execute("SELECT orders FROM dbt_models.order_count").fetchone()
    assert count == 5

    done, status = _freshness(dbt, folder)
    # synced just now; refunds never loaded (no successful sync in the history)
    assert status == {"orders": "pass", "customers": "pass", "refunds": "error"}, done.stdout
    assert done.returncode == 1

    _shift_last_sync(dest_conn, schema, "orders", 2)  # past its warn_after (1h), not 6h
    _shift_last_sync(dest_conn, schema, "customers", 3)  # past its own error_after (2h)
    db_project.sync("-s", f"{schema}.refunds")
    done, status = _freshness(dbt, folder)
    assert status == {"orders": "warn", "customers": "error", "refunds": "pass"}, done.stdout

    # a failed run is no load: the time of the last success decides
    _shift_last_sync(dest_conn, schema, "refunds", 7)
    source_conn.execute(sql.SQL("DROP TABLE {}.refunds").format(sql.Identifier(schema)))
    assert db_project.run("sync", "-s", f"{schema}.refunds").exit_code == 1  # a row: now
    done, status = _freshness(dbt, folder)
    assert status["refunds"] == "error", done.stdout


def test_a_source_per_destination_schema_patterns_expanded_and_named(
    db_project, source_conn, dest_conn, schema, tmp_path
):
    _tables(source_conn, schema)
    raw = f"{schema}_raw"
    dest_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(raw)))
    try:
        db_project.write_config(
            {
                "tables": [
                    {
                        "name": f"{schema}.*",
                        "exclude": [f"{schema}.refunds"],
                        "mode": "full-refresh",
                    },
                    {
                        "name": f"{schema}.refunds",
                        "destination": f"{raw}.refunds",
                        "mode": "full-refresh",
                    },
                ]
            }
        )
        named = db_project.run("dbt-sources", "--name", "shop")
        assert named.exit_code == 0, named.output
        sources = yaml.safe_load(named.output)["sources"]
        assert [(s["name"], s["schema"]) for s in sources] == [
            (f"shop_{schema}", schema),
            (f"shop_{raw}", raw),
        ]
        assert [t["name"] for t in sources[0]["tables"]] == ["customers", "orders"]
        # no freshness configured: dbt checks none
        assert "freshness" not in sources[0]["tables"][0]["config"]
        one = db_project.run("dbt-sources", "-s", f"{schema}.orders", "--name", "shop")
        assert [s["name"] for s in yaml.safe_load(one.output)["sources"]] == ["shop"]
        dashed = db_project.run("dbt-sources", "--name", "shop", "-o", "-")
        assert dashed.exit_code == 0 and dashed.output == named.output  # '-': printed

        # the top-level default, and a table that opts out of it with null
        db_project.write_config(
            {
                "freshness": {"warn_after": "1h"},
                "tables": [
                    {"name": f"{schema}.orders", "mode": "full-refresh"},
                    {"name": f"{schema}.customers", "mode": "full-refresh", "freshness": None},
                    {"name": f"{schema}_nothere.*", "mode": "full-refresh"},
                ],
            }
        )
        limits = db_project.run("dbt-sources")
        assert limits.exit_code == 0, limits.output
        tables = {
            t["name"]: t["config"] for t in yaml.safe_load(limits.stdout)["sources"][0]["tables"]
        }
        assert tables["orders"]["freshness"] == {"warn_after": {"count": 1, "period": "hour"}}
        assert "freshness" not in tables["customers"]
        assert f"warning: tables[2] ({schema}_nothere.*) matches no table" in limits.stderr
    finally:
        dest_conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(raw)))


def test_a_table_that_cannot_be_described_writes_nothing(db_project, source_conn, schema, tmp_path):
    _tables(source_conn, schema)
    db_project.configure(schema, "orders", "gone", mode="full-refresh")
    out = tmp_path / "sources.yml"
    failed = db_project.run("dbt-sources", "-o", str(out))
    assert failed.exit_code == 1
    assert (
        "source table does not exist" in failed.output and "no sources.yml written" in failed.output
    )
    assert not out.exists()
    elsewhere = db_project.run("dbt-sources", "-o", str(tmp_path / "nowhere" / "sources.yml"))
    assert elsewhere.exit_code == 2 and "does not exist; create it first" in elsewhere.output


def test_freshness_written_wrong_is_a_config_error(db_project, schema):
    for freshness, said in (
        ({"warn_after": "90s"}, 'not whole minutes (write "2m" or "1m")'),
        ({"warn_after": "6h", "error_after": "1h"}, "warn_after must be shorter than error_after"),
        ({"warn_after": "1 hour"}, 'expected a duration like "1h"'),
        ({}, "expected warn_after, error_after or both"),
    ):
        db_project.configure(schema, "orders", mode="full-refresh", freshness=freshness)
        failed = db_project.run("dbt-sources")
        assert failed.exit_code == 2, failed.output
        assert "tables[0].freshness" in failed.output and said in failed.output
