"""`tables[].columns` (exclude, hash) and `tables[].where`: columns that never leave the
source, hashed with a salt no statement shows, and a filter whose rows enter and leave the
copy, in cursor and full-refresh modes (cdc: test_cdc_shaping.py)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark

SALT = "pep per\\salt"  # a space and a backslash: libpq's options escaping


def _people(conn, schema, name="people", rows=120):
    table = sql.Identifier(schema, name)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, name text NOT NULL, ssn text, email text, "
            "status text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, name, ssn, email, status) SELECT g, 'name ' || g, "
            "'ssn-' || g, CASE WHEN g %% 7 = 0 THEN NULL ELSE 'user' || g || '@x.test' END, "
            "CASE WHEN g %% 5 = 0 THEN 'test' ELSE 'live' END FROM generate_series(1, %s) g"
        ).format(table),
        (rows,),
    )


def _expected(conn, schema, name, salt, hashed=("email",), where="status <> 'test'"):
    """What the copy must hold, computed by the source itself with the salt written out."""
    columns = []
    for column in ("id", "name", "email", "status"):
        ident = sql.Identifier(column)
        if column in hashed:
            columns.append(
                sql.SQL("encode(sha256(convert_to({} || {}::text, 'UTF8')), 'hex')").format(
                    sql.Literal(salt), ident
                )
            )
        else:
            columns.append(ident)
    query = sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY 1").format(
        sql.SQL(", ").join(columns), sql.Identifier(schema, name), sql.SQL(where)
    )
    return conn.execute(query).fetchall()


def _copy(conn, schema, name):
    return conn.execute(
        sql.SQL("SELECT id, name, email, status FROM {} ORDER BY 1").format(
            sql.Identifier(schema, name)
        )
    ).fetchall()


def _columns(conn, schema, name):
    return [
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s ORDER BY ordinal_position",
            (schema, name),
        )
    ]


@pytest.fixture
def column_reader(source_conn, schema):
    """A source role that may read every column of the test's tables but `ssn`: a sync
    that read an excluded column would fail with permission denied."""
    role = f"reader_{schema[-8:]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    source_conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    yield role
    source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _grant_all_but_ssn(conn, schema, name, role):
    conn.execute(
        sql.SQL("GRANT SELECT (id, name, email, status, updated_at) ON {} TO {}").format(
            sql.Identifier(schema, name), sql.Identifier(role)
        )
    )


def test_excluded_hashed_and_filtered_columns_in_a_cursor_and_a_full_refresh_table(
    db_project, schema, source_conn, dest_conn, column_reader
):
    for name in ("people", "accounts"):
        _people(source_conn, schema, name)
        _grant_all_but_ssn(source_conn, schema, name, column_reader)
    shaped = {"columns": {"exclude": ["ssn"], "hash": ["email"]}, "where": "status <> 'test'"}
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.people",
                    "replication_key": "updated_at",
                    "deletes": "delete",
                    **shaped,
                },
                {"name": f"{schema}.accounts", "mode": "full-refresh", **shaped},
            ]
        }
    )
    url = db_project.env["REPLICATOR_SOURCE_URL"].replace("postgres@", f"{column_reader}@")
    env = {"REPLICATOR_SOURCE_URL": url, "REPLICATOR_HASH_SALT": SALT}

    checked = db_project.run("check", env=env)  # column grants are enough
    assert checked.exit_code == 0, checked.output
    assert "may not SELECT" not in checked.stdout and "HASH_SALT" not in checked.stdout
    unsalted = db_project.run("check", env={**env, "REPLICATOR_HASH_SALT": ""})
    assert "columns.hash without REPLICATOR_HASH_SALT" in unsalted.stdout, unsalted.output
    compiled = db_project.run("compile", env=env)
    assert compiled.exit_code == 0, compiled.output
    assert "current_setting('replicator.hash_salt', true)" in compiled.stdout
    first = db_project.run("-v", "sync", env=env)
    assert first.exit_code == 0, first.output
    assert "pep per" not in first.output + compiled.output, "the salt was printed"
    for name in ("people", "accounts"):
        assert _columns(dest_conn, schema, name) == ["id", "name", "email", "status", "updated_at"]
        assert _copy(dest_conn, schema, name) == _expected(source_conn, schema, name, SALT)

    # Rows enter and leave the filter; a hashed value changes; a NULL stays NULL.
    for name in ("people", "accounts"):
        table = sql.Identifier(schema, name)
        source_conn.execute(
            sql.SQL("UPDATE {} SET status = 'test', updated_at = now() WHERE id IN (1, 2)").format(
                table
            )
        )
        source_conn.execute(
            sql.SQL("UPDATE {} SET status = 'live', updated_at = now() WHERE id = 5").format(table)
        )
        source_conn.execute(
            sql.SQL(
                "UPDATE {} SET email = 'changed@x.test', updated_at = now() WHERE id = 3"
            ).format(table)
        )
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, name, ssn, email, status) "
                "VALUES (500, 'new', 's', NULL, 'live')"
            ).format(table)
        )
    second = db_project.run("sync", env=env)
    assert second.exit_code == 0, second.output
    for name in ("people", "accounts"):
        assert _copy(dest_conn, schema, name) == _expected(source_conn, schema, name, SALT)
    verified = db_project.run("verify", "--json", env=env)
    assert verified.exit_code == 0, verified.output
    assert [v["status"] for v in json.loads(verified.stdout)] == ["equal", "equal"]
    # status and compile plan with the salt too: the hashed column did not change.
    status = db_project.run("status", "--json", env=env)
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)[0]["next_action"] == "incremental"
    planned = db_project.run("compile", "--json", "-s", f"{schema}.people", env=env)
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)[0]["next_action"] == "incremental"

    # Another salt, and one more hashed column: the cursor table reloads, and says why.
    config = json.loads((db_project.path / "tables-config.json").read_text())
    config["tables"][0]["columns"]["hash"] = ["email", "name"]
    db_project.write_config(config)
    env["REPLICATOR_HASH_SALT"] = "another salt"
    third = db_project.run("sync", "-s", f"{schema}.people", env=env)
    assert third.exit_code == 0, third.output
    assert (
        "reason: columns or where changed: exclude ssn; hash email (salted); where status <> "
        "'test' -> exclude ssn; hash email, name (salted); where status <> 'test'" in third.stderr
    ), third.stderr
    assert _copy(dest_conn, schema, "people") == _expected(
        source_conn, schema, "people", "another salt", hashed=("email", "name")
    )


def test_included_columns_are_all_that_leave_the_source_and_a_new_column_stays_there(
    db_project, schema, source_conn, dest_conn, column_reader
):
    """`columns.include`: the allow-list. The columns it names (and the hashed ones) reach
    the copy; a column the source gains later is never read (the role may not even read
    it), and the next syncs go on without a reload, a full one included."""
    for name in ("people", "accounts"):
        _people(source_conn, schema, name)
        _grant_all_but_ssn(source_conn, schema, name, column_reader)
    shaped = {"columns": {"include": ["id", "name", "status", "updated_at"], "hash": ["email"]}}
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.people", "replication_key": "updated_at", **shaped},
                {"name": f"{schema}.accounts", "mode": "full-refresh", **shaped},
            ]
        }
    )
    url = db_project.env["REPLICATOR_SOURCE_URL"].replace("postgres@", f"{column_reader}@")
    env = {"REPLICATOR_SOURCE_URL": url, "REPLICATOR_HASH_SALT": SALT}
    first = db_project.run("sync", env=env)
    assert first.exit_code == 0, first.output
    for name in ("people", "accounts"):
        assert _columns(dest_conn, schema, name) == ["id", "name", "email", "status", "updated_at"]
        assert _copy(dest_conn, schema, name) == _expected(
            source_conn, schema, name, SALT, where="true"
        )

    for name in ("people", "accounts"):  # a secret column arrives in the source
        table = sql.Identifier(schema, name)
        source_conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN card text DEFAULT 'CARD-1'").format(table)
        )
        source_conn.execute(
            sql.SQL("UPDATE {} SET name = 'renamed', updated_at = now() WHERE id <= 3").format(
                table
            )
        )
    second = db_project.run("sync", env=env)
    assert second.exit_code == 0, second.output
    assert f"{schema}.people: incremental" in second.stderr, second.stderr
    assert "CARD-1" not in second.output
    forced = db_project.run("sync", "-f", env=env)
    assert forced.exit_code == 0, forced.output
    for name in ("people", "accounts"):
        assert _columns(dest_conn, schema, name) == ["id", "name", "email", "status", "updated_at"]
        assert _copy(dest_conn, schema, name) == _expected(
            source_conn, schema, name, SALT, where="true"
        )
    verified = db_project.run("verify", "--json", env=env)
    assert verified.exit_code == 0, verified.output


def test_a_model_composes_with_the_shaping_and_no_salt_hashes_the_bare_value(
    db_project, schema, source_conn, dest_conn
):
    _people(source_conn, schema)
    db_project.write(
        f"models/{schema}/people.sql",
        "SELECT id, name, email, status, updated_at FROM {{ source }} WHERE id <= 100",
    )
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.people",
                    "replication_key": "updated_at",
                    "deletes": "delete",
                    "columns": {"hash": ["email"]},
                    "where": "status <> 'test'",
                }
            ]
        }
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    expected = [row for row in _expected(source_conn, schema, "people", "") if row[0] <= 100]
    assert _copy(dest_conn, schema, "people") == expected


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"columns": {"exclude": ["updated_at"]}},
            "the replication key updated_at cannot be excluded or hashed",
        ),
        (
            {"primary_key": ["id"], "columns": {"hash": ["id"]}},
            "primary key column(s) id cannot be excluded or hashed",
        ),
        ({"columns": {"exclude": ["a"], "hash": ["a"]}}, "a both excluded and hashed"),
        ({"where": "x = 1; DROP TABLE t"}, "expected one SQL expression"),
        ({"where": "status <> 'test'"}, '"where" on a cursor table needs "deletes"'),
        (
            {"columns": {"hide": ["a"]}},
            "tables[0].columns.hide: unknown key; expected one of: exclude, hash, include",
        ),
        (
            {"columns": {"include": ["id", "updated_at"], "exclude": ["ssn"]}},
            '"include" (the columns that leave the source) and "exclude" (the ones that do '
            "not) cannot be given together",
        ),
        (
            {"primary_key": ["id"], "columns": {"include": ["name"], "hash": ["id"]}},
            "updated_at (the replication key or primary key) must be",
        ),
        ({"columns": {"include": []}}, "tables[0].columns.include: expected at least one"),
    ],
)
def test_shaping_that_cannot_work_is_refused_before_anything_runs(project, table, message):
    project.write_config(
        {"tables": [{"name": "s.people", "replication_key": "updated_at", **table}]}
    )
    result = project.run("compile")
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


def test_a_source_key_column_or_an_unknown_column_fails_the_table_with_the_fix(
    db_project, schema, source_conn
):
    _people(source_conn, schema)
    for columns, message in (
        ({"hash": ["id"]}, "primary key column(s) id cannot be excluded or hashed"),
        ({"exclude": ["sssn"]}, "columns: no column sssn in the source table (it has "),
        ({"hash": ["emial"]}, "id, name, ssn, email, status, updated_at); did you mean email"),
        ({"include": ["name"]}, 'primary key column(s) id must be in "columns": {"include"'),
        ({"include": ["id", "name"], "hash": ["id"]}, "id cannot be excluded or hashed"),
    ):
        db_project.write_config(
            {"tables": [{"name": f"{schema}.people", "mode": "full-refresh", "columns": columns}]}
        )
        result = db_project.run("sync")
        assert result.exit_code == 1
        assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "SELECT id, name, ssn AS social, email, status, updated_at FROM {{ source }}",
            "reads excluded column(s) ssn",
        ),
        (
            "SELECT id, name, email, status, updated_at FROM {{ source }} WHERE ssn > ''",
            "reads excluded column(s) ssn",
        ),
        (
            "SELECT p.id, p.name, p.email, p.status, p.updated_at, row_to_json(p)::text AS j "
            "FROM {{ source }} AS p",
            "reads whole rows of",
        ),
        (
            "SELECT id, name, email, email AS contact, status, updated_at FROM {{ source }}",
            "uses hashed column(s) email other than selected as they are",
        ),
        (
            "SELECT id, name, lower(email) AS email, status, updated_at FROM {{ source }}",
            "uses hashed column(s) email other than selected as they are",
        ),
    ],
)
def test_a_model_that_reads_a_shaped_column_another_way_is_refused(
    db_project, schema, source_conn, dest_conn, model, message
):
    """An excluded column renamed, filtered on, or read in a whole row; a hashed one renamed
    or in an expression: the shaping wraps the model's output by name, so each would carry
    the value (or what it tells) into the copy. The table fails before anything is read."""
    _people(source_conn, schema, rows=5)
    db_project.write(f"models/{schema}/people.sql", model)
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.people",
                    "mode": "full-refresh",
                    "columns": {"exclude": ["ssn"], "hash": ["email"]},
                }
            ]
        }
    )
    result = db_project.run("sync")
    assert result.exit_code == 1 and message in result.stderr, result.output
    assert "ssn-1" not in result.output and "user1@x.test" not in result.output
    copied = dest_conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchone()
    assert copied == (0,)


def test_a_failing_filter_does_not_tell_the_value_it_failed_on(
    db_project, schema, source_conn, httpserver
):
    """PostgreSQL's `invalid input syntax for type integer: "ssn-1"` quotes the value of an
    excluded column: the table's error, wherever it goes, says the value was there only."""
    _people(source_conn, schema, rows=5)
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.people",
                    "mode": "full-refresh",
                    "columns": {"exclude": ["ssn"]},
                    "where": "ssn::int > 0",
                }
            ],
            "webhook": {"url": httpserver.url_for("/hook")},
        }
    )
    result = db_project.run("sync", env=IN_PROCESS)
    assert result.exit_code == 1
    assert 'invalid input syntax for type integer: "***"' in result.output, result.output
    status = db_project.run("status", "--json", env=IN_PROCESS)
    told = [
        result.output,
        status.stdout,
        *(p.read_text() for p in (db_project.path / "sync-state").glob("*.json")),
        *(request.get_data(as_text=True) for request, _ in httpserver.log),
    ]
    assert len(told) >= 4 and not [t for t in told if "ssn-" in t], told


def test_what_is_written_of_the_salt_says_which_without_a_fast_way_back_to_it(
    db_project, schema, source_conn, dest_conn
):
    """A table's state holds a slow fingerprint of the salt (a change of salt reloads the
    copy), not a fast one (SHA-256 of a fixed text and the salt: a weak salt falls to a
    dictionary); no output or status shows it, and a new salt is said as such."""
    _people(source_conn, schema)
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.people",
                    "replication_key": "updated_at",
                    "columns": {"hash": ["email"]},
                }
            ]
        }
    )
    env = {**IN_PROCESS, "REPLICATOR_HASH_SALT": SALT}
    first = db_project.run("sync", env=env)
    assert first.exit_code == 0, first.output
    (state_file,) = (db_project.path / "sync-state").glob("*people*.json")
    older = hashlib.sha256(f"replicator hash salt {SALT}".encode()).hexdigest()[:12]
    state = state_file.read_text()
    assert older not in state
    (written,) = re.findall(r"\(salt ([0-9a-f]+)\)", state)

    again = db_project.run("sync", env=env)
    assert again.exit_code == 0, again.output
    assert f"{schema}.people: noop" in again.stderr, again.stderr

    changed = db_project.run("sync", env={**env, "REPLICATOR_HASH_SALT": "another salt"})
    assert changed.exit_code == 0, changed.output
    assert (
        f"{schema}.people: full_reload" in changed.stderr
        and "hash email (salted): the hash salt (REPLICATOR_HASH_SALT) changed" in changed.stderr
    ), changed.stderr
    assert _copy(dest_conn, schema, "people") == _expected(
        source_conn, schema, "people", "another salt", where="true"
    )
    status = db_project.run("status", "--json", env=env)
    told = first.output + again.output + changed.output + status.stdout
    assert written not in told and older not in told and not re.search(r"\(salt [0-9a-f]", told)
