"""`compile` prints the statements `sync` runs: for each action, the statements that change
something (DDL, DML, COPY, LOCK, ANALYZE, GRANT...), on each side, in order, are the same in
`compile --json`'s script and in what the sync executed (captured by the executor), apart
from values bound when it runs (load ids, row counts). Reads, and the transactions and
session settings around them, are not compared."""

from __future__ import annotations

import json
import re

import pytest
from engines import IN_PROCESS
from psycopg import sql

from replicator.postgres.database import captured
from replicator.sync import run

pytestmark = pytest.mark.spark

# The copies run in this process (IN_PROCESS): their statements are captured too.
WRITES = re.compile(
    r"^(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE|COPY|TRUNCATE|GRANT|REVOKE|COMMENT|ANALYZE|LOCK"
    r"|MERGE|REFRESH|WITH\b.*\b(INSERT|UPDATE|DELETE|MERGE)\b)",
    re.S,
)


def _writes(statements: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(side, text) of the statements that change something, leading comments dropped."""
    out = []
    for side, text in statements:
        body = re.sub(r"^(\s*--[^\n]*\n)+", "", text).strip()
        if WRITES.match(body):
            out.append((side, body))
    return out


@pytest.fixture
def sync_capturing(monkeypatch):
    """Run `sync` in this process, recording what each table's action executed."""
    executed: list[tuple[str, str]] = []
    carry_out = run.carry_out

    def capturing(job):
        with captured() as statements:
            try:
                return carry_out(job)
            finally:
                executed.extend((s.side or "", s.text) for s in statements)

    monkeypatch.setattr(run, "carry_out", capturing)

    def sync(project, *args):
        executed.clear()
        done = project.run("sync", *args, env=IN_PROCESS)
        assert done.exit_code == 0, done.output
        return _writes(executed)

    return sync


def _compiled(project, script: str, *args) -> list[tuple[str, str]]:
    done = project.run("compile", "--json", *args, env=IN_PROCESS)
    assert done.exit_code == 0, done.output
    (table,) = json.loads(done.stdout)
    return _writes([(s["side"], s["sql"]) for s in table["script"][script]])


@pytest.fixture
def shop(source_conn, dest_conn, schema):
    """Orders with an enum, a view another table's reload must carry, and rows to change."""
    s = sql.Identifier(schema)
    source_conn.execute(
        sql.SQL(
            "CREATE TYPE {s}.status AS ENUM ('new', 'paid'); "
            "CREATE TABLE {s}.orders (id int PRIMARY KEY, status {s}.status NOT NULL, "
            "amount numeric(10,2), updated_at timestamptz NOT NULL DEFAULT now()); "
            "INSERT INTO {s}.orders SELECT g, 'new', g, now() - interval '1 day' "
            "+ g * interval '1 s' FROM generate_series(1, 300) g"
        ).format(s=s)
    )
    return schema


def _change(source_conn, schema):
    source_conn.execute(
        sql.SQL("UPDATE {}.orders SET status = 'paid', updated_at = now() WHERE id % 7 = 0").format(
            sql.Identifier(schema)
        )
    )


def test_full_reload(db_project, shop, dest_conn, sync_capturing):
    db_project.configure(shop, "orders", replication_key="updated_at")
    first_compiled = _compiled(db_project, "full_reload")
    assert sync_capturing(db_project) == first_compiled  # a first load: no table to replace
    dest_conn.execute(
        sql.SQL("CREATE VIEW {}.paid AS SELECT * FROM {}.orders WHERE status = 'paid'").format(
            sql.Identifier(shop), sql.Identifier(shop)
        )
    )
    dest_conn.execute(
        sql.SQL(
            "COMMENT ON TABLE {t} IS 'copied by replicator'; CREATE INDEX by_amount ON {t} "
            "(amount); ALTER TABLE {t} ENABLE ROW LEVEL SECURITY; CREATE POLICY mine ON {t} "
            "USING (amount > 0); CREATE MATERIALIZED VIEW {s}.totals AS SELECT status, "
            "sum(amount) FROM {t} GROUP BY status; CREATE INDEX totals_status ON {s}.totals "
            "(status)"
        ).format(t=sql.Identifier(shop, "orders"), s=sql.Identifier(shop))
    )
    compiled = _compiled(db_project, "full_reload")
    for carried in ("CREATE VIEW", "CREATE INDEX", "CREATE POLICY", "REFRESH MATERIALIZED"):
        assert any(text.startswith(carried) for _, text in compiled), carried
    assert sync_capturing(db_project, "-f") == compiled


@pytest.mark.parametrize("mode", ["incremental-deduped", "incremental-append"])
def test_incremental(db_project, shop, source_conn, sync_capturing, mode):
    db_project.configure(shop, "orders", replication_key="updated_at", mode=mode)
    sync_capturing(db_project)
    _change(source_conn, shop)
    source_conn.execute(
        sql.SQL("INSERT INTO {}.orders VALUES (1000, 'new', 1, now())").format(sql.Identifier(shop))
    )
    compiled = _compiled(db_project, "incremental")
    assert any(text.startswith("COPY") for _, text in compiled)
    assert sync_capturing(db_project) == compiled


def test_an_evolution_of_the_schema(db_project, shop, source_conn, dest_conn, sync_capturing):
    db_project.configure(shop, "orders", replication_key="updated_at", on_schema_change="evolve")
    sync_capturing(db_project)
    dest_conn.execute(
        sql.SQL("CREATE VIEW {}.amounts AS SELECT id, amount FROM {}.orders").format(
            sql.Identifier(shop), sql.Identifier(shop)
        )
    )
    source_conn.execute(
        sql.SQL(
            "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'; "
            "ALTER TABLE {t} ALTER COLUMN amount TYPE numeric(14,2); "
            "UPDATE {t} SET region = 'us' WHERE id % 10 = 0"
        ).format(t=sql.Identifier(shop, "orders"))
    )
    _change(source_conn, shop)
    compiled = _compiled(db_project, "incremental")
    for part in ("ALTER TABLE", "UPDATE", "CREATE VIEW", "COPY"):
        assert any(text.startswith(part) for _, text in compiled), part
    assert sync_capturing(db_project) == compiled


def test_start_without_backfill(db_project, shop, sync_capturing):
    db_project.configure(shop, "orders", replication_key="updated_at", initial_load="skip")
    compiled = _compiled(db_project, "start_without_backfill")
    assert any(text.startswith("CREATE TABLE") for _, text in compiled)
    assert sync_capturing(db_project) == compiled


def test_resync_of_a_key_range(db_project, shop, sync_capturing):
    db_project.configure(shop, "orders", replication_key="updated_at")
    sync_capturing(db_project)
    args = ("-s", f"{shop}.orders", "--since", "2000-01-01", "--until", "2100-01-01")
    compiled = _compiled(db_project, "resync", *args)
    assert sync_capturing(db_project, *args) == compiled


def test_the_comparison_sees_a_statement_compile_does_not_print(
    db_project, shop, sync_capturing, monkeypatch
):
    """The test is not vacuous: an action that runs one statement more than its builders
    say is caught."""
    from replicator.sync.full_load import load as full_load

    db_project.configure(shop, "orders", replication_key="updated_at")
    compiled = _compiled(db_project, "full_reload")
    prepare = full_load.prepare_destination

    def with_an_extra_statement(ends, built, **options):
        side = prepare(ends, built, **options)
        full_load.execute(ends.dest, "ANALYZE")
        return side

    monkeypatch.setattr(full_load, "prepare_destination", with_an_extra_statement)
    assert sync_capturing(db_project) != compiled
