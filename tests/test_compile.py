"""`replicator compile`: the SQL each table would run, with macro shadowing and model overrides.
Every statement printed is also executed on the destination to prove it is valid SQL."""

from __future__ import annotations

import re

import pytest
from psycopg import sql

from replicator.base.identifiers import TableName


@pytest.fixture
def orders(source_conn, schema):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, amount numeric(12,2) NOT NULL, "
            "note text, tags text[], flags bit varying(5), updated_at timestamptz NOT NULL)"
        ).format(sql.Identifier(schema, "orders"))
    )
    return TableName(schema, "orders")


def _config(name: TableName, **extra):
    return {"tables": [{"name": name.sql(), "replication_key": "updated_at", **extra}]}


def _statements(output: str) -> dict[str, str]:
    """Split compile output into its commented sections."""
    sections, current = {}, None
    for line in output.splitlines():
        if line.startswith("-- ") and not line.startswith("-- mode") and "->" not in line:
            current = line[3:].split(";")[0].split(":")[0]
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return {k: v.strip() for k, v in sections.items()}


def test_default_compile_prints_exact_ddl_extract_and_merge(db_project, orders, dest_conn, schema):
    db_project.write_config(_config(orders))
    result = db_project.run("compile")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert (
        f'CREATE TABLE "{schema}"."orders" ("id" bigint NOT NULL, "amount" numeric(12,2) NOT NULL'
        in out
    )
    assert (
        '"flags" bit varying(5), "updated_at" timestamp with time zone NOT NULL, '
        'PRIMARY KEY ("id"))' in out
    )
    assert (
        f'SELECT "id", "amount", "note", "tags", "flags", "updated_at"\nFROM "{schema}"."orders";'
        in out
    )
    assert '"_replicator_model"."updated_at" >= %(cursor)s::timestamp with time zone' in out
    assert "cursor: none (no state: the next sync is a full load)" in out
    assert 'ON CONFLICT ("id") DO UPDATE SET' in out and "IS DISTINCT FROM" in out
    # Nothing was executed on the destination.
    assert dest_conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)
    ).fetchone() == (0,)
    # Everything printed is valid SQL on the destination.
    sections = _statements(out)
    with dest_conn.transaction(force_rollback=True):
        dest_conn.execute(sections["destination table"])
        dest_conn.execute(sections["staging table"].replace(";\n", ";"))
        dest_conn.execute(sections["merge"].rstrip(";"))


def test_project_macro_shadows_builtin_everywhere(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(
        "macros/my_merge.sql",
        (
            "{% macro merge_deduped(target, staging, columns, key_columns, update_columns) %}"
            "-- project merge for {{ target }}\n"
            "INSERT INTO {{ target }} SELECT * FROM {{ staging }}"
            "{% endmacro %}\n"
            "{% macro default_model(source, columns) %}SELECT {{ columns | join(', ') }} "
            "FROM {{ source }} WHERE {{ shout('x') }} IS NOT NULL{% endmacro %}"
        ),
    )
    # A macro in another file, called by the shadowing default_model.
    db_project.write("macros/helpers.sql", "{% macro shout(v) %}upper('{{ v }}'){% endmacro %}")
    result = db_project.run("compile")
    assert result.exit_code == 0, result.output
    assert f'-- project merge for "{orders.schema}"."orders"' in result.stdout
    assert "WHERE upper('x') IS NOT NULL" in result.stdout
    assert "WHERE (t.*)::text IS DISTINCT FROM" not in result.stdout  # the built-in merge
    assert "macros/my_merge.sql" in result.stdout  # the model's origin is shown


def test_model_override_defines_columns_and_types(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(
        f"models/{orders.schema}/orders.sql",
        (
            "-- a model may rename, cast, filter and drop columns\n"
            'SELECT id, amount::numeric(14,4) AS "Amount EUR", upper(note) AS note, updated_at\n'
            "FROM {{ source }}\nWHERE note NOT LIKE 'test%'\n"
        ),
    )
    result = db_project.run("compile", "-s", f"{orders.schema}.orders")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"-- model: models/{orders.schema}/orders.sql" in out
    assert (
        '("id" bigint NOT NULL, "Amount EUR" numeric(14,4), "note" text, '
        '"updated_at" timestamp with time zone NOT NULL, PRIMARY KEY ("id"))'
    ) in out
    assert "WHERE note NOT LIKE 'test%%'" in out, "% is escaped once a cursor is bound"
    assert '"tags"' not in out


def test_model_syntax_error_names_file_and_line(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(
        f"models/{orders.schema}/orders.sql", "SELECT id, updated_at\nFROM {{ source }}\nWHERE\n"
    )
    result = db_project.run("compile")
    assert result.exit_code == 1
    assert re.search(rf"models/{orders.schema}/orders.sql:3:\d+: SQL syntax error", result.stdout)


def test_model_that_ends_early_says_so_in_plain_words(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(
        f"models/{orders.schema}/orders.sql",
        "SELECT id, updated_at\nFROM {{ source }} WHERE note <> 'cancelled' AND (\n",
    )
    result = db_project.run("compile")
    assert result.exit_code == 1
    assert "SQL syntax error at '('" in result.stdout
    assert "the statement ends early" in result.stdout
    assert "this" not in result.stdout.split("SQL syntax error")[1], "no sqlglot internals"


def test_model_jinja_error_names_file_and_line(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(f"models/{orders.schema}/orders.sql", "SELECT 1\n{% if %}\n")
    result = db_project.run("compile")
    assert result.exit_code == 1
    assert f"models/{orders.schema}/orders.sql:2:" in result.stdout


def test_model_must_keep_key_columns(db_project, orders):
    db_project.write_config(_config(orders))
    db_project.write(f"models/{orders.schema}/orders.sql", "SELECT id, amount FROM {{ source }}")
    result = db_project.run("compile")
    assert result.exit_code == 1
    assert "must keep the primary key and replication key columns; missing: updated_at" in (
        result.stdout
    )


def test_hostile_identifiers_compile_to_valid_sql(db_project, source_conn, dest_conn, schema):
    name = TableName(schema, 'Order "Lines".😀 select')
    source_conn.execute(
        sql.SQL(
            'CREATE TABLE {} ({} int, {} timestamptz NOT NULL, "Ünï code" text, PRIMARY KEY ({}))'
        ).format(
            sql.Identifier(schema, name.name),
            sql.Identifier('Line "No"'),
            sql.Identifier("Updated At"),
            sql.Identifier('Line "No"'),
        )
    )
    db_project.write_config({"tables": [{"name": name.sql(), "replication_key": '"Updated At"'}]})
    result = db_project.run("compile")
    assert result.exit_code == 0, result.output
    sections = _statements(result.stdout)
    with dest_conn.transaction(force_rollback=True):
        dest_conn.execute(sections["destination table"])
        dest_conn.execute(sections["staging table"].replace(";\n", ";"))
        dest_conn.execute(sections["merge"].rstrip(";"))
        columns = dest_conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "ORDER BY attnum",
            (name.sql(),),
        ).fetchall()
    assert [c[0] for c in columns] == ['Line "No"', "Updated At", "Ünï code"]


def test_missing_source_table_fails_that_table_only(db_project, orders, schema):
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.nope", "replication_key": "updated_at"},
                {"name": orders.sql(), "replication_key": "updated_at"},
            ]
        }
    )
    result = db_project.run("compile")
    assert result.exit_code == 1
    assert f"-- {schema}.nope: error: {schema}.nope: source table does not exist" in result.stdout
    assert f'CREATE TABLE "{schema}"."orders"' in result.stdout


def test_unknown_select_is_exit_2(db_project, orders):
    db_project.write_config(_config(orders))
    result = db_project.run("compile", "-s", "public.nope")
    assert result.exit_code == 2
    assert "table public.nope is not in tables-config.json" in result.stderr


def test_the_merge_reduces_a_batch_to_one_row_per_key_only_where_it_can_hold_one_twice(
    db_project, orders
):
    """Under the source's own primary key, read by the built-in model in one snapshot, a
    batch cannot hold a key twice: no DISTINCT ON sort. A configured primary_key, or a
    model of the project's (a join may repeat a key), keeps it."""
    db_project.write_config(_config(orders))
    as_is = _statements(db_project.run("compile").stdout)["merge"]
    assert "DISTINCT ON" not in as_is and 'ON CONFLICT ("id") DO UPDATE' in as_is
    db_project.write_config(_config(orders, primary_key=["id", "note"]))
    configured = _statements(db_project.run("compile").stdout)["merge"]
    assert 'SELECT DISTINCT ON ("id", "note")' in configured
    db_project.write(
        f"models/{orders.schema}/orders.sql", "SELECT * FROM {{ source }} WHERE id > 0\n"
    )
    db_project.write_config(_config(orders))
    modelled = _statements(db_project.run("compile").stdout)["merge"]
    assert 'SELECT DISTINCT ON ("id")' in modelled
