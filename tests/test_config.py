"""tables-config.json validation, through the CLI: every error class is exit 2 with a message
naming the file, the JSON path and what was expected, and nothing is written."""

from __future__ import annotations

import json

import pytest

from replicator.base.errors import ConfigError
from replicator.project.config import parse_config

VALID = {
    "tables": [
        {"name": "public.orders", "replication_key": "updated_at"},
        {"name": "public.countries", "mode": "full-refresh"},
    ]
}


def test_smallest_valid_config_defaults(project):
    config = parse_config(json.dumps(VALID))
    orders, countries = config.tables
    assert orders.mode == "incremental-deduped"
    assert str(orders.target) == "public.orders"
    assert countries.mode == "full-refresh" and countries.replication_key is None
    assert config.spark.master is None and config.webhook is None


def test_names_follow_postgres_rules():
    config = parse_config(
        json.dumps(
            {
                "tables": [
                    {
                        "name": 'Public."Order.Lines"',
                        "replication_key": '"UpdatedAt"',
                        "primary_key": ["ID", '"Line No"'],
                        "destination": 'dw."Sales ""EU"""',
                    },
                ]
            }
        )
    )
    table = config.tables[0]
    assert (table.name.schema, table.name.name) == ("public", "Order.Lines")
    assert table.replication_key == "UpdatedAt"
    assert table.primary_key == ("id", "Line No")
    assert (table.target.schema, table.target.name) == ("dw", 'Sales "EU"')
    assert table.written_name == 'Public."Order.Lines"'


def test_comment_keys_are_ignored():
    config = parse_config(
        json.dumps({"//": "top", "tables": [{"//": "why", "name": "a.b", "mode": "full-refresh"}]})
    )
    assert str(config.tables[0].name) == "a.b"


def _errors(project, document) -> tuple[int, str]:
    project.write_config(document)
    before = project.files()
    result = project.run("status")
    assert project.files() == before, "a config error must not write anything"
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            '{"tables": [\n  {"name": "public.orders",}\n]}',
            "tables-config.json:2:28: invalid JSON: Expecting property name",
            id="syntax",
        ),
        pytest.param(
            {"tables": [{"name": "public.orders", "replication_kee": "updated_at"}]},
            'tables[0].replication_kee: unknown key; did you mean "replication_key"?',
            id="unknown-key-suggestion",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "full-refresh"}], "webhok": {}},
            'webhok: unknown key; did you mean "webhook"?',
            id="unknown-top-key",
        ),
        pytest.param(
            {
                "tables": [
                    {"name": "a.b", "mode": "full-refresh"},
                    {"name": "a.c", "replication_key": 5},
                ]
            },
            "tables[1].replication_key: expected a column name (string), got 5",
            id="wrong-type",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "primary_key": "id"}]},
            'tables[0].primary_key: expected a list, got "id"',
            id="pk-not-list",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "incremental"}]},
            "tables[0].mode: expected one of incremental-deduped, incremental-append, "
            'full-refresh, cdc, got "incremental"; did you mean',
            id="bad-mode",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "cdc", "replication_key": "u"}]},
            'tables[0]: "replication_key" does not apply to mode "cdc" (every insert, update, '
            "delete and truncate comes from the log)",
            id="cdc-with-a-replication-key",
        ),
        pytest.param(
            {
                "tables": [
                    {
                        "name": "a.b",
                        "mode": "cdc",
                        "initial_load": "skip",
                        "deletes": "delete",
                        "lookback": 0,
                    }
                ]
            },
            'tables[0]: "lookback", "deletes" do not apply to mode "cdc"',
            id="cdc-with-several-cursor-options",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "cdc"}], "cdc": {"create": False}},
            'cdc: "create": false uses a slot and a publication a DBA made: name both',
            id="cdc-not-created-needs-names",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "cdc"}], "cdc": {"slot": "My-Slot"}},
            "cdc.slot: a replication slot name is 1 to 63 lower-case letters, digits or "
            'underscores, got "My-Slot"',
            id="cdc-bad-slot-name",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "cdc"}], "cdc": {"max_retained_wal": "2 gigs"}},
            'cdc.max_retained_wal: expected a size above 0 with a unit, like "2GB", "512MB" or '
            '"10TB", got "2 gigs"',
            id="cdc-bad-max-retained-wal",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "cdc"}], "cdc": {"max_retained_wal": 2048}},
            "cdc.max_retained_wal: expected a string, got 2048",
            id="cdc-max-retained-wal-a-number",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "mode": "incremental"}]},
            'did you mean "incremental-deduped" or "incremental-append"?',
            id="bad-mode-the-start-of-two",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "CDC"}]},
            """got "CDC"; did you mean "cdc"?""",
            id="mode-in-capitals",
        ),
        pytest.param(
            {"tables": [{"name": "orders", "replication_key": "u"}]},
            'tables[0].name: expected "schema.table"',
            id="unqualified-name",
        ),
        pytest.param(
            {"tables": [{"name": "a.b"}]},
            'tables[0]: set "replication_key" for an incremental table',
            id="no-key",
        ),
        pytest.param(
            {
                "tables": [
                    {"name": "a.b", "mode": "full-refresh"},
                    {"name": "A.B", "mode": "full-refresh"},
                ]
            },
            "tables: source table a.b is listed twice",
            id="duplicate",
        ),
        pytest.param(
            {
                "tables": [
                    {"name": "a.b", "mode": "full-refresh", "destination": "w.x"},
                    {"name": "a.c", "mode": "full-refresh"},
                    {"name": "a.d", "mode": "full-refresh", "destination": "w.x"},
                ]
            },
            "tables: destination table w.x is listed twice (tables[0] and tables[2])\n",
            id="duplicate-destination-names-the-entries",
        ),
        pytest.param(
            '{"tables": [\n  {"name": "a.b", "mode": "full-refresh"},\n]}',
            "invalid JSON: Expecting value (a comma before a closing } or ] is not JSON)",
            id="trailing-comma",
        ),
        pytest.param(
            '{"tables": [\n  {"name": "a.b", "mode": "full-refresh",\n  {"name": "a.c"}\n]}',
            "tables-config.json:3:3: invalid JSON: Expecting property name enclosed in double "
            "quotes (is a } or ] missing before it?)",
            id="missing-brace",
        ),
        pytest.param(
            '{"tables": [\n  // the orders\n  {"name": "a.b", "mode": "full-refresh"}\n]}',
            "tables-config.json:2:3: invalid JSON: Expecting value (JSON has no comments: write "
            'one as a key, `"//": "your note"`)',
            id="comment",
        ),
        pytest.param({"tables": []}, "tables: expected at least one table", id="empty"),
        pytest.param({}, "tables: required key is missing", id="missing-tables"),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "full-refresh"}], "webhook": {"url": "ftp://x"}},
            "webhook.url: expected an http:// or https:// URL",
            id="webhook-url",
        ),
        pytest.param(
            {
                "tables": [{"name": "a.b", "mode": "full-refresh"}],
                "spark": {"conf": {"driver.memory": "1g"}},
            },
            "spark.conf: Spark settings start with 'spark.'",
            id="spark-conf",
        ),
        pytest.param(
            '{"tables": [{"name": "a.b", "name": "a.c", "mode": "cdc", "mode": "x"}, '
            '{"name": "b.c", "deletes": "mark", "deletes": "delete"}]}',
            'tables[0]: keys "name", "mode" given more than once: JSON keeps only the last '
            "value of each; give each once",
            id="duplicate-json-key",
        ),
        pytest.param(
            '{"tables": [{"name": "a.b", "mode": "cdc"}, {"name": "b.c", "deletes": "mark", '
            '"deletes": "delete"}]}',
            'tables[1]: key "deletes" given more than once',
            id="duplicate-json-key-in-a-second-object",
        ),
        pytest.param(
            '{"tables": [{"name": "a.b", "replication_key": "u", "lookback": "x", '
            '"lookback": "y"}]}',
            'tables[0].lookback: expected a whole number, got "y"',  # checked all the same
            id="a-duplicate-hides-no-other-error",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "deletes": None}]},
            "tables[0].deletes: expected one of ignore, delete, mark, got null",
            id="null-as-json",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "mode": True}]},
            "got true",
            id="true-as-json",
        ),
        pytest.param("[1, 2]", 'expected a JSON object like {"tables": [...]}', id="not-object"),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "on_schema_change": "reload"}]},
            'tables[0].on_schema_change: expected one of full_reload, fail, evolve, got "reload"; '
            'did you mean "full_reload"?',
            id="bad-schema-policy",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u"}], "on_schema_change": "ignore"},
            'on_schema_change: expected one of full_reload, fail, evolve, got "ignore"',
            id="bad-top-schema-policy",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "mode": "full-refresh", "initial_load": "skip"}]},
            '"initial_load": "skip" needs an incremental mode',
            id="skip-backfill-full-refresh",
        ),
        pytest.param(
            {
                "tables": [
                    {
                        "name": "a.b",
                        "mode": "full-refresh",
                        "destination": "_replicator.loaded_partitions",
                    }
                ]
            },
            "tables[0]: destination _replicator.loaded_partitions is in replicator's own "
            'bookkeeping schema (partition markers, ownership records); set "destination" to '
            "a table in another schema",
            id="destination-internal-schema",
        ),
        pytest.param(
            {"tables": [{"name": "pg_catalog.pg_class", "mode": "full-refresh"}]},
            "tables[0]: destination pg_catalog.pg_class is in a PostgreSQL system schema",
            id="destination-defaults-to-a-system-schema",
        ),
        pytest.param(
            {
                "tables": [
                    {"name": "a.b", "mode": "full-refresh", "destination": "pg_toast.x"},
                    {
                        "name": "a.c",
                        "mode": "full-refresh",
                        "destination": "information_schema.tables",
                    },
                ]
            },
            "tables[1]: destination information_schema.tables is in a PostgreSQL system schema",
            id="destination-system-schemas",
        ),
        pytest.param(
            {"tables": [{"name": "a.b", "replication_key": "u", "initial_load": "none"}]},
            'tables[0].initial_load: expected one of full, skip, got "none"',
            id="bad-initial-load",
        ),
    ],
)
def test_config_errors_exit_2_with_path_and_fix(project, document, expected):
    code, stderr = _errors(project, document)
    assert code == 2
    assert f"{project.path / 'tables-config.json'}" in stderr
    assert expected in stderr
    assert "Traceback" not in stderr


def test_every_problem_is_listed_at_once(project):
    code, stderr = _errors(
        project,
        {
            "tables": [
                {"name": "a.b", "replication_kee": "u"},
                {"name": "c", "mode": "full-refresh"},
            ]
        },
    )
    assert code == 2
    assert "tables[0].replication_kee" in stderr and "tables[1].name" in stderr


def test_problems_pydantic_finds_in_rounds_are_listed_in_one_run(project):
    """A duplicated table beside a typo'd key elsewhere, and a table's keys that do not go
    together beside a typo'd key or a bad value in the same table: all in one run. A typo'd
    key hides nothing, but the key it stands for is not assumed missing."""
    code, stderr = _errors(
        project,
        {
            "tables": [
                {"name": "a.b", "mode": "full-refresh"},
                {"name": "a.c", "mode": "full-refresh", "replication_kee": "u"},
                {"name": "A.B", "mode": "full-refresh"},
                {"name": "a.d", "mode": "full-refresh", "deletes": "delete", "lookbak": 3},
                {
                    "name": "a.e",
                    "mode": "incremental-append",
                    "replication_key": "u",
                    "deletes": "mark",
                    "partitions": 0,
                },
                {"name": "a.f", "modee": "full-refresh"},
            ]
        },
    )
    assert code == 2
    expected = [
        'tables[1].replication_kee: unknown key; did you mean "replication_key"?',
        "tables: source table a.b is listed twice (tables[0] and tables[2])",
        'tables[3]: "deletes" applies to incremental modes',
        'tables[3].lookbak: unknown key; did you mean "lookback"?',
        'tables[4]: "deletes": "mark" needs mode incremental-deduped',
        "tables[4].partitions: expected a number >= 1, got 0",
        'tables[5].modee: unknown key; did you mean "mode"?',
    ]
    lines = stderr.splitlines()
    for text in expected:
        assert sum(text in line for line in lines) == 1, (text, stderr)
    assert "tables[5]: " not in stderr, "the typo'd mode is not taken for a missing one"
    assert "destination table a.b" not in stderr, "one pair, said once"
    assert len([line for line in lines if "tables-config.json: " in line]) == len(expected)


def test_missing_config_file_is_exit_2(project):
    result = project.run("status")
    assert result.exit_code == 2
    assert "tables-config.json: not found" in result.stderr


@pytest.mark.parametrize("command", [["compile"], ["check"]])
def test_missing_connection_setting_names_the_variable(project, command):
    project.write_config(VALID)
    result = project.run(*command)
    assert result.exit_code == 2
    assert "REPLICATOR_SOURCE_URL is not set" in result.stderr
    assert str(project.path / ".env") in result.stderr
    if command == ["check"]:
        assert "REPLICATOR_DEST_URL is not set" in result.stderr


def test_malformed_connection_setting_is_exit_2_and_redacted(project):
    project.write_config(VALID)
    result = project.run(
        "check",
        env={
            "REPLICATOR_SOURCE_URL": "host=x password='hunter2secret",
            "REPLICATOR_DEST_URL": "postgresql://u:pw-in-url-xyz@h/db?bogus_option=1",
        },
    )
    assert result.exit_code == 2
    assert "REPLICATOR_SOURCE_URL is not a valid libpq connection string" in result.stderr
    assert "hunter2secret" not in result.output
    assert "pw-in-url-xyz" not in result.output


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres:pa ssXYZ@127.0.0.1:6501/postgres",  # "unexpected spaces in"
        "host=127.0.0.1 password=S3cret QuoteXYZ port=6501",  # 'missing "=" after'
        "host=h password=abc defXYZ=ghi",  # "invalid connection option"
        'host=h password=ab"cd efXYZ"gh x',  # a quote inside what libpq quotes
        'postgresql://u@h/db?password=se"cXYZ%zzret',  # "invalid percent-encoded token"
    ],
)
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_part_of_an_unparsable_connection_string_is_printed(project, url, log_format):
    """libpq's reason quotes the part it could not parse, which may be a password's; the
    reason is said with that part masked, with how to write spaces in a value."""
    project.write_config(VALID)
    project.write(".env", f"REPLICATOR_DEST_URL={url}\n")
    result = project.run("check", "--log-format", log_format, env={"REPLICATOR_SOURCE_URL": url})
    assert result.exit_code == 2, result.output
    for name in ("REPLICATOR_SOURCE_URL", "REPLICATOR_DEST_URL"):
        assert f"{name} is not a valid libpq connection string: " in result.stderr
    assert "XYZ" not in result.output and "S3cret" not in result.output
    assert "single-quote a value that holds spaces" in result.stderr


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://u@h:99999/db", "port '99999' is not a port number (1-65535)"),
        ("postgresql://u@h/db?sslmode=bogus", "sslmode 'bogus' is not one of disable, allow"),
        ("host=h port=5432,x dbname=db", "port 'x' is not a port number"),
        ("host=h connect_timeout=soon", "connect_timeout 'soon' is not a whole number"),
    ],
)
def test_option_values_libpq_would_refuse_are_exit_2_before_anything(project, url, problem):
    """libpq checks these only when it connects: caught here, they are usage errors, and no
    run is recorded as failed."""
    project.write_config(VALID)
    before = project.files()
    result = project.run("sync", env={"REPLICATOR_SOURCE_URL": url, "REPLICATOR_DEST_URL": url})
    assert result.exit_code == 2
    assert f"REPLICATOR_SOURCE_URL: {problem}" in result.stderr
    assert project.files() == before


def test_a_misspelt_setting_in_dotenv_is_named(project):
    project.write_config(VALID)
    project.write(".env", "REPLICATOR_SOURC_URL=postgresql://u@h/db\n")
    result = project.run("sync")
    assert result.exit_code == 2
    assert "unknown setting REPLICATOR_SOURC_URL, ignored; did you mean REPLICATOR_SOURCE_URL?" in (
        result.stderr
    )
    assert "REPLICATOR_SOURCE_URL is not set (REPLICATOR_SOURC_URL is set: a typo?)" in (
        result.stderr
    )


def test_dotenv_supplies_settings_and_environment_wins(project, pg_servers):
    from replicator.project.settings import Environment

    project.write(
        ".env",
        "REPLICATOR_SOURCE_URL=postgresql://from-file/db\n"
        "REPLICATOR_DEST_URL=postgresql://dest-file/db\n",
    )
    env = Environment.load(project.path)
    assert env.connection("REPLICATOR_SOURCE_URL") == "postgresql://from-file/db"
    import os

    os.environ["REPLICATOR_SOURCE_URL"] = "postgresql://from-env/db"
    try:
        env = Environment.load(project.path)
        assert env.connection("REPLICATOR_SOURCE_URL") == "postgresql://from-env/db"
        assert env.connection("REPLICATOR_DEST_URL") == "postgresql://dest-file/db"
    finally:
        del os.environ["REPLICATOR_SOURCE_URL"]


def test_max_retained_wal_sizes():
    def parsed(size):
        document = {"tables": [{"name": "a.b", "mode": "cdc"}], "cdc": {"max_retained_wal": size}}
        cdc = parse_config(json.dumps(document)).cdc
        assert cdc is not None
        return cdc.max_retained_bytes

    assert parsed("2GB") == 2 << 30
    assert parsed("512 mb") == 512 << 20
    assert parsed("1.5GB") == 3 << 29
    assert parse_config('{"tables": [{"name": "a.b", "mode": "cdc"}]}').cdc is None


def test_parse_config_raises_config_error_for_api_users():
    with pytest.raises(ConfigError) as info:
        parse_config("{", "x.json")
    assert info.value.exit_code == 2
    assert info.value.problems[0].startswith("x.json:1:2: invalid JSON")


def test_bad_spark_min_rows_override_is_exit_2_before_anything(db_project):
    db_project.write_config(VALID)
    before = db_project.files()
    result = db_project.run("sync", env={"REPLICATOR_SPARK_MIN_ROWS": "lots"})
    assert result.exit_code == 2
    assert 'REPLICATOR_SPARK_MIN_ROWS must be a whole number of rows, got "lots"' in (result.stderr)
    assert db_project.files() == before
