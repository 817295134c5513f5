"""`replicator demo`: two throwaway clusters, sample tables, two syncs, a verified summary.

Runs the project's tables (the repository root is the demo project) against a source filled
with sample data, changes some rows between the two syncs, and checks that both sides hold
the same rows. It works in a temporary copy of the project: a real project's sync-state,
webhook and Spark master are never used, so running it in the wrong folder harms nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from psycopg import sql

from ..plan.inspect_table import inspect_table
from ..plan.selection import expand_project
from ..postgres.database import connect, execute
from ..postgres.pgcluster import PgCluster
from ..project.config import CONFIG_FILE, load_config
from ..project.project import Project
from ..project.settings import (
    DEST_URL,
    SOURCE_URL,
    SPARK_MASTER,
    WEBHOOK_SECRET,
    WEBHOOK_URL,
    Environment,
)
from ..project.state import STATE_DIR
from ..project.templates import MACROS_DIR, MODELS_DIR
from ..report.logs import say

SAMPLE_SCHEMA = """
CREATE OR REPLACE FUNCTION touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN NEW.updated_at := clock_timestamp(); RETURN NEW; END $$;
CREATE TABLE countries (code char(2) PRIMARY KEY, name text NOT NULL);
INSERT INTO countries VALUES ('FR', 'France'), ('DE', 'Germany'), ('ES', 'Spain'),
  ('IT', 'Italy'), ('PT', 'Portugal'), ('NL', 'Netherlands'), ('BE', 'Belgium'),
  ('JP', 'Japan'), ('BR', 'Brazil'), ('CA', 'Canada');
CREATE TABLE customers (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL, email text,
  country_code char(2) REFERENCES countries, updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON customers (updated_at);
CREATE TRIGGER customers_touch BEFORE UPDATE ON customers
  FOR EACH ROW EXECUTE FUNCTION touch_updated_at();
INSERT INTO customers (name, email, country_code, updated_at)
SELECT 'Customer ' || g, 'Customer.' || g || '@Example.COM',
       (ARRAY['FR','DE','ES','IT','PT','NL','BE','JP','BR','CA'])[1 + g % 10],
       now() - interval '30 days' + g * interval '1 minute'
FROM generate_series(1, 20000) g;
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE orders (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer_id bigint NOT NULL,
  amount numeric(12,2) NOT NULL, status order_status NOT NULL DEFAULT 'new',
  tags text[], details jsonb, updated_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON orders (updated_at);
CREATE TRIGGER orders_touch BEFORE UPDATE ON orders
  FOR EACH ROW EXECUTE FUNCTION touch_updated_at();
INSERT INTO orders (customer_id, amount, status, tags, details, updated_at)
SELECT 1 + g % 20000, round((random() * 1000)::numeric, 2),
       (ARRAY['new','paid','shipped','cancelled']::order_status[])[1 + g % 4],
       ARRAY['demo', 'batch ' || g % 7], jsonb_build_object('channel', 'web', 'n', g),
       now() - interval '30 days' + g * interval '10 seconds'
FROM generate_series(1, 200000) g;
CREATE TABLE events (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, kind text NOT NULL, payload jsonb,
  created_at timestamptz NOT NULL DEFAULT now());
INSERT INTO events (kind, payload)
SELECT (ARRAY['click','view','buy'])[1 + g % 3], jsonb_build_object('n', g)
FROM generate_series(1, 100000) g;
-- the other tables `replicator init` writes into a new project's config: the demo runs in
-- a project just made as well
CREATE TABLE payments (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, order_id bigint NOT NULL,
  amount numeric(12,2) NOT NULL, paid_at timestamptz NOT NULL DEFAULT now());
INSERT INTO payments (order_id, amount) SELECT g, 10 + g % 90 FROM generate_series(1, 50000) g;
CREATE SCHEMA "Sales";
CREATE TABLE "Sales"."Order Lines" (
  "OrderId" bigint, "Line" int, "Sku" text NOT NULL, "Qty" int NOT NULL,
  "UpdatedAt" timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ("OrderId", "Line"));
INSERT INTO "Sales"."Order Lines" SELECT g / 3, g % 3, 'SKU-' || g % 500, 1 + g % 5,
  now() - interval '1 day' + g * interval '1 second'
FROM generate_series(1, 30000) g;
ANALYZE;
"""

CHANGES = """
UPDATE orders SET status = 'shipped' WHERE id % 100 = 0;
INSERT INTO orders (customer_id, amount, tags) SELECT g, 9.99, '{new}'
FROM generate_series(1, 500) g;
UPDATE customers SET email = 'moved.' || id || '@example.org' WHERE id <= 50;
INSERT INTO events (kind, payload) SELECT 'signup', '{}' FROM generate_series(1, 1000);
UPDATE countries SET name = 'España' WHERE code = 'ES';
UPDATE payments SET amount = amount + 1 WHERE id % 50 = 0;
DELETE FROM payments WHERE id % 97 = 0;
UPDATE "Sales"."Order Lines" SET "Qty" = "Qty" + 1, "UpdatedAt" = clock_timestamp()
WHERE "OrderId" % 20 = 0;
"""


def run_demo(project_dir: Path, keep: bool, verbose: int) -> int:
    """The demo on a temporary copy of the project: the project's own sync-state, webhook
    and Spark master are never used or touched."""
    from ..sync.run import run_sync

    load_config(project_dir)  # a broken config is exit 2 before anything starts
    base = Path(tempfile.mkdtemp(prefix="replicator-demo-"))
    clusters = [PgCluster(base / "source", logical=True), PgCluster(base / "destination")]
    started = time.monotonic()
    try:
        copy = copy_project(project_dir, base / "project")
        say(f"demo: working in a copy of the project, {copy}", "demo")
        say("demo: starting throwaway source and destination PostgreSQL clusters", "demo")
        for cluster in clusters:
            cluster.start()
        source_url, dest_url = clusters[0].url(), clusters[1].url()
        with connect(source_url, "source") as conn:
            execute(conn, SAMPLE_SCHEMA)
        project = _demo_project(copy, source_url, dest_url)
        say("demo: sync 1 of 2 (first load of every table)", "demo")
        codes = [run_sync(project, (), False, verbose, always_summarize=True)]
        with connect(source_url, "source") as conn:
            execute(conn, CHANGES)
        say("demo: changed rows in the source (updates, inserts); sync 2 of 2", "demo")
        codes.append(run_sync(project, (), False, verbose, always_summarize=True))
        _verify(project, source_url, dest_url)
        say(f"demo: finished in {time.monotonic() - started:.0f} s.", "demo")
        if keep:
            _print_explore(base, copy, clusters)
        else:
            say("demo: clusters removed; `replicator demo --keep` keeps them to explore", "demo")
        return max(codes)
    finally:
        if not keep:
            for cluster in clusters:
                cluster.destroy()
            shutil.rmtree(base, ignore_errors=True)


def copy_project(project_dir: Path, copy: Path) -> Path:
    """The project's config (without its webhook and Spark master), models and macros;
    not its sync-state or .env."""
    copy.mkdir(parents=True)
    document = json.loads((project_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    document.pop("webhook", None)
    if isinstance(document.get("spark"), dict):
        document["spark"].pop("master", None)
    (copy / CONFIG_FILE).write_text(json.dumps(document, indent=2), encoding="utf-8")
    for folder in (MODELS_DIR, MACROS_DIR):
        if (project_dir / folder).is_dir():
            shutil.copytree(project_dir / folder, copy / folder)
    (copy / STATE_DIR).mkdir()
    return copy


def _demo_project(copy: Path, source_url: str, dest_url: str) -> Project:
    """The copy, with the throwaway clusters as its databases and nothing else from the
    environment that would reach outside the demo (webhook, Spark master)."""
    outside = {WEBHOOK_URL, WEBHOOK_SECRET, SPARK_MASTER, SOURCE_URL, DEST_URL}
    values = {k: v for k, v in os.environ.items() if k not in outside}
    values.update({SOURCE_URL: source_url, DEST_URL: dest_url})
    return Project(copy, load_config(copy), Environment(values, copy / ".env"))


def _print_explore(base: Path, copy: Path, clusters: list[PgCluster]) -> None:
    lines = [
        "clusters kept running; to explore them:",
        f"  export {SOURCE_URL}={clusters[0].url()}",
        f"  export {DEST_URL}={clusters[1].url()}",
        f"  {_command()} status --project-dir {copy}",
        f"  {_command()} compile --project-dir {copy}",
        "stop and remove them with:",
        *[f"  {shlex.join(cluster.stop_command())}" for cluster in clusters],
        f"  rm -rf {shlex.quote(str(base))}",
    ]
    for line in lines:
        say(line, "demo.explore")


def _command() -> str:
    """How to run this replicator from a shell: `replicator` when that is this one on the
    PATH, else its full path (after `make demo` it lives in .venv/bin)."""
    beside = Path(sys.executable).parent / "replicator"
    on_path = shutil.which("replicator")
    if on_path and beside.exists() and Path(on_path).resolve() == beside.resolve():
        return "replicator"
    if beside.exists():
        return shlex.quote(str(beside))
    return f"{shlex.quote(sys.executable)} -m replicator"


def _verify(project: Project, source_url: str, dest_url: str) -> None:
    """Compare md5 of every row: the model's output on the source, the table on the dest."""
    query = sql.SQL(
        "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))) FROM {} AS t"
    )
    with connect(source_url, "source") as source, connect(dest_url, "destination") as dest:
        for table in expand_project(project, source).config.tables:
            model = inspect_table(source, table, project.templates).model.sql
            left = execute(source, query.format(sql.SQL("({})").format(sql.SQL(model)))).fetchone()
            target = sql.Identifier(table.target.schema, table.target.name)
            right = execute(dest, query.format(target)).fetchone()
            verdict = "identical" if left == right else "DIFFERENT"
            say(
                f"demo: {table.written_name}: {left[0]:,} rows read by its model in the "
                f"source, {right[0]:,} in the destination, {verdict}",
                "demo.verified",
                name=table.written_name,
                identical=left == right,
            )
