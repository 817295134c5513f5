"""A table other tables inherit from (`CREATE TABLE c () INHERITS (t)`, not partitioning):
`FROM t` reads the children's rows too, where t's own key does not hold. The copy is of
the table alone (`FROM ONLY t`, as pg_dump copies it), in every mode, and the tool's
publication lists it alone, so the source goes on taking the children's UPDATEs."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

pytestmark = pytest.mark.spark


def _family(conn, schema, parent="parent"):
    """The parent's ids 1..5, a child's 4..8 (4 and 5 on both), a grandchild's 9."""
    t, c, g = (sql.Identifier(schema, n) for n in (parent, f"{parent}_child", f"{parent}_g"))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, v text, ts timestamptz NOT NULL DEFAULT now())"
        ).format(t)
    )
    conn.execute(sql.SQL("CREATE TABLE {} () INHERITS ({})").format(c, t))
    conn.execute(sql.SQL("CREATE TABLE {} () INHERITS ({})").format(g, c))
    conn.execute(
        sql.SQL("INSERT INTO {} (id, v) SELECT g, 'p' FROM generate_series(1, 5) g").format(t)
    )
    conn.execute(
        sql.SQL("INSERT INTO {} (id, v) SELECT g, 'c' FROM generate_series(4, 8) g").format(c)
    )
    conn.execute(sql.SQL("INSERT INTO {} (id, v) VALUES (9, 'g')").format(g))


def _alone(conn, schema, table):
    query = sql.SQL("SELECT id, v FROM ONLY {} ORDER BY id").format(sql.Identifier(schema, table))
    return conn.execute(query).fetchall()


def _sync(project):
    result = project.run("sync")
    assert result.exit_code == 0, result.output
    assert "whose primary key another row also has" not in result.output
    return result


def test_a_parent_table_is_copied_alone_in_every_cursor_mode(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """incremental-deduped kept a child's row in place of the parent's with the same key
    and then failed ("ON CONFLICT DO UPDATE command cannot affect row a second time"),
    full-refresh and append copied the children's rows, and verify said equal."""
    modes = {
        "full": "full-refresh",
        "deduped": "incremental-deduped",
        "appended": "incremental-append",
    }
    for name in modes:
        _family(writer, schema, name)
    # a model file reads what it says (its `source` is the table's name, never `ONLY`)
    cdc_project.write(f"models/{schema}/appended.sql", "SELECT id, v, ts FROM ONLY {{ source }}")
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.{name}", "mode": mode}
                | ({} if mode == "full-refresh" else {"replication_key": "ts"})
                for name, mode in modes.items()
            ]
        }
    )
    _sync(cdc_project)
    for name in modes:
        writer.execute(
            sql.SQL("UPDATE ONLY {} SET v = 'p2', ts = now() WHERE id = 4").format(
                sql.Identifier(schema, name)
            )
        )
        writer.execute(
            sql.SQL("INSERT INTO {} (id, v) VALUES (10, 'p')").format(sql.Identifier(schema, name))
        )
        writer.execute(
            sql.SQL("UPDATE {} SET v = 'c2', ts = now() WHERE id = 6").format(
                sql.Identifier(schema, f"{name}_child")
            )
        )
    _sync(cdc_project)
    expected = [(1, "p"), (2, "p"), (3, "p"), (4, "p2"), (5, "p"), (10, "p")]
    assert _alone(source_conn, schema, "full") == expected
    for name, mode in modes.items():
        wanted = [
            (4, "p") if r == (4, "p2") and mode == "incremental-append" else r for r in expected
        ]
        assert _alone(dest_conn, schema, name) == wanted, mode
    compiled = cdc_project.run("compile", "-s", f"{schema}.full")
    assert f'FROM ONLY "{schema}"."full"' in compiled.output, compiled.output
    dest_conn.execute(
        sql.SQL("INSERT INTO {} VALUES (6, 'c', now())").format(sql.Identifier(schema, "full"))
    )
    verified = cdc_project.run("verify", "-s", f"{schema}.full")
    assert verified.exit_code == 1, verified.output
    assert "1 extra" in verified.output, verified.output


def test_a_parent_cdc_table_is_published_alone_and_its_children_keep_taking_updates(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """Listed whole, the children joined the tool's publication, and the source refused
    their UPDATEs and DELETEs ("does not have a replica identity and publishes updates")
    until the next sync took them out."""
    _family(writer, schema)
    # the statement `check` gives a DBA whose publication is still to be made lists it alone
    dba = {"slot": f"dba_{schema}"[:60], "publication": f"dba_{schema}"[:60], "create": False}
    table = {"name": f"{schema}.parent", "mode": "cdc"}
    cdc_project.write_config({"tables": [table], "cdc": dba})
    checked = cdc_project.run("check")
    assert f'FOR TABLE ONLY "{schema}"."parent"' in checked.output, checked.output
    cdc_project.write_config({"tables": [table]})
    _sync(cdc_project)
    child = sql.Identifier(schema, "parent_child")
    writer.execute(sql.SQL("UPDATE {} SET v = 'c2' WHERE id = 8").format(child))
    writer.execute(sql.SQL("DELETE FROM {} WHERE id = 7").format(child))
    writer.execute(
        sql.SQL("UPDATE {} SET v = 'g2' WHERE id = 9").format(sql.Identifier(schema, "parent_g"))
    )
    parent = sql.Identifier(schema, "parent")
    writer.execute(sql.SQL("UPDATE ONLY {} SET v = 'p2' WHERE id = 4").format(parent))
    writer.execute(sql.SQL("DELETE FROM ONLY {} WHERE id = 5").format(parent))
    _sync(cdc_project)
    assert _alone(dest_conn, schema, "parent") == [(1, "p"), (2, "p"), (3, "p"), (4, "p2")]
    assert _alone(source_conn, schema, "parent") == _alone(dest_conn, schema, "parent")
    verified = cdc_project.run("verify")
    assert verified.exit_code == 0, verified.output
    # The children are not in the publication, so their replica identity is not the
    # parent's concern, in a run of another table too; and the parent leaves it with ONLY
    # (a DROP without it looked for the children there and failed every cdc table).
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, "other"))
    )
    both = [{"name": f"{schema}.{t}", "mode": "cdc"} for t in ("parent", "other")]
    cdc_project.write_config({"tables": both})
    other = cdc_project.run("sync", "-s", f"{schema}.other")
    assert other.exit_code == 0 and "refuse" not in other.output, other.output
    cdc_project.write_config({"tables": both[1:]})
    _sync(cdc_project)
    published = source_conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE schemaname = %s ORDER BY 1", (schema,)
    ).fetchall()
    assert published == [("other",)]


def test_a_copy_made_while_the_parent_was_read_with_its_children_reloads(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """Copies made before the table was read alone hold the children's rows, and their
    state says the built-in model read them as `default`: the next sync reloads them."""
    _family(writer, schema)
    cdc_project.write_config({"tables": [{"name": f"{schema}.parent", "replication_key": "ts"}]})
    _sync(cdc_project)
    state_file = next((cdc_project.path / "sync-state").glob(f"{schema}.parent*.json"))
    state = json.loads(state_file.read_text())
    assert state["schema_signature"]["model"] == "default only", state["schema_signature"]
    state["schema_signature"]["model"] = "default"  # as the copy's first load wrote it
    state_file.write_text(json.dumps(state))
    dest_conn.execute(
        sql.SQL("INSERT INTO {} VALUES (7, 'c', now())").format(sql.Identifier(schema, "parent"))
    )
    reloaded = _sync(cdc_project)
    assert "full_reload" in reloaded.output, reloaded.output
    assert "model changed: the table has child tables (INHERITS)" in reloaded.output
    assert _alone(dest_conn, schema, "parent") == _alone(source_conn, schema, "parent")
