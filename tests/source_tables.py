"""Source tables the tests share, each made in the test's own schema."""

from __future__ import annotations

from psycopg import sql


def keyed_table(conn, schema: str, rows: int, name: str = "t") -> str:
    """`schema.name`: a bigint key, an md5 text and an `updated_at` cursor that every insert
    sets to its own clock, `rows` rows; the schema."""
    table = sql.Identifier(schema, name)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, v text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, v) SELECT g, md5(g::text) FROM generate_series(1, %s) g"
        ).format(table),
        (rows,),
    )
    return schema
