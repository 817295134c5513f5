"""What people build on a copy survives its reload (postgres/copy_objects.py, swap.py):
indexes and unique constraints under their names, triggers with their enabled state,
row-level security and its policies, materialized views with their owner, grants, indexes
and fresh rows; and the indexes `tables[].indexes` asks for are built and kept."""

from __future__ import annotations

from dbcompare import assert_same_table
from psycopg import sql

_OBJECTS = """
SELECT 'index', indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s
UNION ALL
SELECT 'constraint', conname, pg_get_constraintdef(oid) FROM pg_constraint
 WHERE connamespace = %(s)s::regnamespace AND contype <> 'p'
UNION ALL
SELECT 'trigger', tgname, pg_get_triggerdef(oid) || ' ' || tgenabled::text FROM pg_trigger
 WHERE tgrelid = %(t)s::regclass AND NOT tgisinternal
UNION ALL
SELECT 'policy', policyname, concat_ws(' ', permissive, cmd, roles::text, qual, with_check)
  FROM pg_policies WHERE schemaname = %(s)s
UNION ALL
SELECT 'security', relname, relrowsecurity::text || relforcerowsecurity::text FROM pg_class
 WHERE oid = %(t)s::regclass
UNION ALL
SELECT 'relation', c.relname, c.relkind::text || ' ' || pg_get_userbyid(c.relowner) || ' '
       || coalesce(c.relacl::text, '') || ' ' || c.relispopulated::text
  FROM pg_class c WHERE c.relnamespace = %(s)s::regnamespace AND c.relkind IN ('v', 'm')
ORDER BY 1, 2
"""


def _objects(conn, schema, table="t"):
    return conn.execute(_OBJECTS, {"s": schema, "t": f"{schema}.{table}"}).fetchall()


def _oid(conn, schema, table="t"):
    return conn.execute("SELECT %s::regclass::oid", (f"{schema}.{table}",)).fetchone()[0]


def _source_table(conn, schema):
    conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, code text NOT NULL, v int, note text);"
            "INSERT INTO {t} SELECT g, 'c' || g, g % 10, 'Note ' || g "
            "FROM generate_series(1, 2000) g"
        ).format(t=sql.Identifier(schema, "t"))
    )


def test_an_analysts_indexes_triggers_policies_and_materialized_views_survive_a_reload(
    db_project, source_conn, dest_conn, schema
):
    _source_table(source_conn, schema)
    db_project.configure(schema, "t", mode="full-refresh")
    db_project.sync()
    dest_conn.execute(
        sql.SQL(
            """
            CREATE INDEX t_v ON {t} (v);
            CREATE INDEX "T lower note" ON {t} (lower(note)) WHERE v > 2;
            ALTER TABLE {t} ADD CONSTRAINT t_code UNIQUE (code);
            CREATE FUNCTION {s}.stamp() RETURNS trigger LANGUAGE plpgsql
              AS 'BEGIN NEW.note := NEW.note || ''!''; RETURN NEW; END';
            CREATE TRIGGER t_stamp BEFORE UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION {s}.stamp();
            CREATE TRIGGER t_off BEFORE INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {s}.stamp();
            ALTER TABLE {t} DISABLE TRIGGER t_off;
            ALTER TABLE {t} ENABLE ROW LEVEL SECURITY;
            CREATE POLICY low ON {t} FOR SELECT TO PUBLIC USING (v < 5);
            CREATE MATERIALIZED VIEW {s}.by_v AS SELECT v, count(*) AS n FROM {t} GROUP BY v;
            CREATE UNIQUE INDEX by_v_v ON {s}.by_v (v);
            GRANT SELECT ON {s}.by_v TO PUBLIC;
            CREATE VIEW {s}.big_v AS SELECT v FROM {s}.by_v WHERE n > 100;
            """
        ).format(t=sql.Identifier(schema, "t"), s=sql.Identifier(schema))
    )
    before, oid = _objects(dest_conn, schema), _oid(dest_conn, schema)
    source_conn.execute(
        sql.SQL("UPDATE {} SET v = 3 WHERE id <= 500").format(sql.Identifier(schema, "t"))
    )

    synced = db_project.sync()

    assert synced.exit_code == 0, synced.output
    assert "left out" not in synced.output, synced.output
    assert _oid(dest_conn, schema) != oid, "reloaded: a new table"
    assert _objects(dest_conn, schema) == before
    assert_same_table(source_conn, dest_conn, schema, "t")  # the triggers fired on no row
    counts = sql.SQL("SELECT v, count(*) FROM {} GROUP BY v ORDER BY v")
    assert (
        dest_conn.execute(
            sql.SQL("SELECT v, n FROM {} ORDER BY v").format(sql.Identifier(schema, "by_v"))
        ).fetchall()
        == source_conn.execute(counts.format(sql.Identifier(schema, "t"))).fetchall()
    )
    assert dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "big_v"))
    ).fetchone() == (10,)
    retired = dest_conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relname "
        "LIKE 'old%%'",
        (schema,),
    ).fetchall()
    assert retired == [], "the old table and its indexes are gone"


def test_an_index_whose_column_is_gone_upstream_is_left_out_with_its_statement(
    db_project, source_conn, dest_conn, schema
):
    _source_table(source_conn, schema)
    db_project.configure(schema, "t", mode="full-refresh")
    db_project.sync()
    dest_conn.execute(
        sql.SQL("CREATE INDEX t_v ON {t} (v); CREATE INDEX t_note ON {t} (note)").format(
            t=sql.Identifier(schema, "t")
        )
    )
    source_conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN v").format(sql.Identifier(schema, "t")))

    synced = db_project.sync()

    assert synced.exit_code == 0, synced.output
    assert f"{schema}.t: the reload left out index t_v of the copy: it cannot be built" in (
        synced.stderr
    ), synced.stderr
    assert f"to create it again: CREATE INDEX t_v ON {schema}.t USING btree (v)" in synced.stderr
    names = dest_conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s ORDER BY 1", (schema,)
    ).fetchall()
    assert names == [("t_note",), ("t_pkey",)]
    assert_same_table(source_conn, dest_conn, schema, "t")


def _index_names(conn, schema):
    return [
        row[0]
        for row in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s ORDER BY 1", (schema,)
        )
    ]


def test_the_indexes_the_config_asks_for_are_built_and_kept(
    db_project, source_conn, dest_conn, schema
):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, customer_id int, code text, "
            "updated_at timestamptz NOT NULL DEFAULT now());"
            "INSERT INTO {t} SELECT g, g % 7, 'c' || g, now() - interval '1 hour' "
            "FROM generate_series(1, 500) g"
        ).format(t=sql.Identifier(schema, "t"))
    )
    asked = [{"columns": ["customer_id"]}]
    db_project.configure(schema, "t", replication_key="updated_at", indexes=asked)
    db_project.sync()
    assert _index_names(dest_conn, schema) == ["t_customer_id_idx", "t_pkey"]
    oid = _oid(dest_conn, schema)

    # asked for later, on a copy kept incrementally: built in place, not by a reload
    asked.append({"columns": ["code", "customer_id"], "unique": True, "type": "btree"})
    db_project.configure(schema, "t", replication_key="updated_at", indexes=asked)
    synced = db_project.sync()
    assert "building index t_code_customer_id_key (tables[].indexes)" in synced.stderr
    assert _index_names(dest_conn, schema) == [
        "t_code_customer_id_key",
        "t_customer_id_idx",
        "t_pkey",
    ]
    assert _oid(dest_conn, schema) == oid
    (unique,) = dest_conn.execute(
        "SELECT indisunique FROM pg_index WHERE indexrelid = %s::regclass",
        (f"{schema}.t_code_customer_id_key",),
    ).fetchone()
    assert unique

    # dropped by someone: back at the next run, even one with nothing to copy
    dest_conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "t_customer_id_idx")))
    db_project.sync()
    assert "t_customer_id_idx" in _index_names(dest_conn, schema)

    # and a reload keeps them
    db_project.sync("-f")
    assert _oid(dest_conn, schema) != oid
    assert _index_names(dest_conn, schema) == [
        "t_code_customer_id_key",
        "t_customer_id_idx",
        "t_pkey",
    ]
    assert_same_table(source_conn, dest_conn, schema, "t")


def test_an_index_asked_for_on_a_column_the_copy_lacks_fails_the_table_with_the_fix(
    db_project, source_conn, schema
):
    _source_table(source_conn, schema)
    db_project.configure(schema, "t", mode="full-refresh", indexes=[{"columns": ["nope"]}])
    problem = (
        "indexes[0]: nope is not a column of the copy (its columns: id, code, v, note); fix "
        "the entry in tables-config.json"
    )
    checked = db_project.run("check")
    assert checked.exit_code == 1
    assert f"error {schema}.t: {problem}" in checked.stdout, checked.stdout
    synced = db_project.run("sync")
    assert synced.exit_code == 1
    assert f"{schema}.t: failed after" in synced.stderr and problem in synced.stderr


def test_a_unique_index_the_new_rows_break_fails_the_table_and_keeps_the_old_copy(
    db_project, source_conn, dest_conn, schema
):
    _source_table(source_conn, schema)
    db_project.configure(
        schema, "t", mode="full-refresh", indexes=[{"columns": ["v"], "unique": True}]
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 1
    assert (
        "the index t_v_key that tables-config.json asks for cannot be built on the reloaded "
        'table: could not create unique index "t_v_key" (Key (v)=('
    ) in synced.stderr, synced.stderr
    assert dest_conn.execute("SELECT to_regclass(%s)", (f"{schema}.t",)).fetchone() == (None,)


def test_an_index_entry_added_later_on_a_missing_column_fails_that_table_alone(
    db_project, source_conn, dest_conn, schema
):
    """A quiet table the run screens for no-ops, whose config now asks for an index on a
    column it lacks: that table fails with the fix, the others sync."""
    for name in ("t", "u"):
        source_conn.execute(
            sql.SQL(
                "CREATE TABLE {t} (id int PRIMARY KEY, updated_at timestamptz NOT NULL);"
                "INSERT INTO {t} SELECT g, now() - interval '1 hour' FROM generate_series(1, 50) g"
            ).format(t=sql.Identifier(schema, name))
        )
    db_project.configure(schema, "t", "u", replication_key="updated_at")
    db_project.sync()
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.t", "replication_key": "updated_at"},
                {
                    "name": f"{schema}.u",
                    "replication_key": "updated_at",
                    "indexes": [{"columns": ["nope"]}],
                },
            ]
        }
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 1, synced.output
    assert f"{schema}.u: failed after" in synced.stderr
    assert "indexes[0]: nope is not a column of the copy" in synced.stderr, synced.stderr
    assert f"{schema}.t: noop" in synced.stderr, synced.stderr
