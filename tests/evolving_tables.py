"""What the schema evolution tests share: the orders table they change, statements on it, the
copy's facts they check, and a writer that keeps writing through every change."""

from __future__ import annotations

import random
import threading

import psycopg
from psycopg import sql
from waiting import wait_for


def create_orders(conn, schema, rows=2000):
    """`schema.orders`: a key, an int, a varchar(10), a numeric(8,2) and a timestamp that
    each write moves; `rows` rows written an hour ago."""
    table = sql.Identifier(schema, "orders")
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, n int, label varchar(10), amount numeric(8,2),"
            " updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, g, 'l' || g % 100, g / 10.0, now() - interval '1 hour' "
            "FROM generate_series(1, {}) g"
        ).format(table, sql.Literal(rows))
    )


def on_orders(conn, schema, statement):
    """Run `statement`, `{t}` standing for `schema.orders` and `{s}` for the schema."""
    conn.execute(
        sql.SQL(statement).format(t=sql.Identifier(schema, "orders"), s=sql.Identifier(schema))
    )


def oid_of(conn, schema):
    return conn.execute("SELECT %s::regclass::oid", (f"{schema}.orders",)).fetchone()[0]


def has_index(conn, schema, name):
    (count,) = conn.execute(
        "SELECT count(*) FROM pg_indexes WHERE indexname = %s AND schemaname = %s",
        (name, schema),
    ).fetchone()
    return count == 1


def written(conn, schema):
    """Rows inserted or updated in the copy so far (the statistics collector's count)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    (count,) = conn.execute(
        "SELECT n_tup_ins + n_tup_upd FROM pg_stat_all_tables WHERE relid = %s::regclass",
        (f"{schema}.orders",),
    ).fetchone()
    return count


class Writer:
    """Inserts, updates and (with `deletes`) deletes orders, one transaction each, on a
    thread of its own, until stopped; `pause` waits until no transaction of it is open."""

    def __init__(self, url, schema, *, deletes=False):
        self._conn = psycopg.connect(url, autocommit=True)
        self._conn.execute("SET synchronous_commit = on")  # see conftest's writer
        self._table = sql.Identifier(schema, "orders")
        self._deletes = deletes
        self._go = threading.Event()
        self._idle = threading.Event()
        self._stop = False
        self.writes = 0
        self._next = 1_000_000
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._go.set()
        self._thread.start()

    def _run(self):
        pick = random.Random(7)
        while not self._stop:
            if not self._go.is_set():
                self._idle.set()
                self._go.wait()
                continue
            self._idle.clear()
            kind = self.writes % (4 if self._deletes else 3)
            if kind == 0:
                self._next += 1
                statement = sql.SQL(
                    "INSERT INTO {} (id, n, label, updated_at) VALUES ({}, 1, 'w', now())"
                ).format(self._table, sql.Literal(self._next))
            elif kind == 3:
                statement = sql.SQL("DELETE FROM {} WHERE id = {}").format(
                    self._table, sql.Literal(pick.randint(1, 2000))
                )
            else:
                statement = sql.SQL(
                    "UPDATE {} SET n = n + 1, updated_at = now() WHERE id = {}"
                ).format(self._table, sql.Literal(pick.randint(1, 2000)))
            self._conn.execute(statement)
            self.writes += 1

    def wrote(self, writes=20):
        """Wait until it wrote `writes` more times."""
        start = self.writes
        wait_for(lambda: self.writes >= start + writes, 60, f"{writes} writes")

    def pause(self):
        self._go.clear()
        wait_for(self._idle.is_set, 60, "the writer to pause")

    def resume(self):
        self._idle.clear()
        self._go.set()

    def close(self):
        self._stop = True
        self._go.set()
        self._thread.join(60)
        self._conn.close()
