"""`replicator demo`: two throwaway clusters, sample tables, two syncs, a verified summary.

Runs the project's own tables-config.json (the repository root is the demo project) against
a source filled with sample data, changes some rows between the two syncs, and checks that
both sides hold the same rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import click
import psycopg
from psycopg import sql

from .database import connect
from .inspect_table import inspect_table
from .pgcluster import PgCluster
from .project import Project
from .settings import DEST_URL, SOURCE_URL

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
ANALYZE;
"""

CHANGES = """
UPDATE orders SET status = 'shipped' WHERE id % 100 = 0;
INSERT INTO orders (customer_id, amount, tags) SELECT g, 9.99, '{new}'
FROM generate_series(1, 500) g;
UPDATE customers SET email = 'moved.' || id || '@example.org' WHERE id <= 50;
INSERT INTO events (kind, payload) SELECT 'signup', '{}' FROM generate_series(1, 1000);
UPDATE countries SET name = 'España' WHERE code = 'ES';
"""


def run_demo(project_dir: Path, keep: bool, verbose: int) -> int:
    from .sync import run_sync

    project = Project.load(project_dir)
    base = Path(tempfile.mkdtemp(prefix="replicator-demo-"))
    clusters = [PgCluster(base / "source", logical=True), PgCluster(base / "destination")]
    started = time.monotonic()
    try:
        click.echo("demo: starting throwaway source and destination PostgreSQL clusters")
        for cluster in clusters:
            cluster.start()
        source_url, dest_url = clusters[0].url(), clusters[1].url()
        with psycopg.connect(source_url, autocommit=True) as conn:
            conn.execute(SAMPLE_SCHEMA)
        os.environ[SOURCE_URL], os.environ[DEST_URL] = source_url, dest_url
        project = Project.load(project_dir)  # again, to read the URLs just set
        for table in project.config.tables:  # new clusters: earlier demo state is void
            project.store.delete(table.name)
        click.echo("demo: sync 1 of 2 (first load of every table)")
        codes = [run_sync(project, (), False, verbose, always_summarize=True)]
        with psycopg.connect(source_url, autocommit=True) as conn:
            conn.execute(CHANGES)
        click.echo("demo: changed rows in the source (updates, inserts); sync 2 of 2")
        codes.append(run_sync(project, (), False, verbose, always_summarize=True))
        _verify(project, source_url, dest_url)
        click.echo(f"demo: finished in {time.monotonic() - started:.0f} s. Explore:")
        click.echo(f"  replicator status --project-dir {project_dir}")
        click.echo(f"  replicator state show --project-dir {project_dir}")
        if keep:
            click.echo("clusters kept running; to explore them:")
            click.echo(f"  export {SOURCE_URL}={source_url}")
            click.echo(f"  export {DEST_URL}={dest_url}")
            click.echo(f"  replicator compile --project-dir {project_dir}")
            click.echo(f"stop them with: rm -rf {base} after pg_ctl stop -D <dir>/data")
        return max(codes)
    finally:
        if not keep:
            for cluster in clusters:
                cluster.destroy()
            shutil.rmtree(base, ignore_errors=True)


def _verify(project: Project, source_url: str, dest_url: str) -> None:
    """Compare md5 of every row: the model's output on the source, the table on the dest."""
    query = sql.SQL(
        "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY md5(t::text))) FROM {} AS t"
    )
    with connect(source_url, "source") as source, connect(dest_url, "destination") as dest:
        for table in project.config.tables:
            model = inspect_table(source, table, project.templates).model.sql
            left = source.execute(query.format(sql.SQL("({})").format(sql.SQL(model)))).fetchone()
            target = sql.Identifier(table.target.schema, table.target.name)
            right = dest.execute(query.format(target)).fetchone()
            verdict = "identical" if left == right else "DIFFERENT"
            click.echo(
                f"demo: {table.written_name}: {left[0]:,} rows read by its model in the "
                f"source, {right[0]:,} in the destination, {verdict}"
            )
