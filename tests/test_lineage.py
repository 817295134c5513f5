"""OpenLineage events of `sync` (report/lineage.py): START then COMPLETE or FAIL per table, as
the client's own classes read them back; named as the spec names PostgreSQL tables, without a
secret; an endpoint down or silent costs a warning and a few seconds; no configuration, no
import."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from engines import IN_PROCESS
from openlineage.client import event_v2
from openlineage.client.facet_v2 import (
    error_message_run,
    parent_run,
    schema_dataset,
    tags_run,
)
from openlineage.client.facet_v2 import output_statistics_output_dataset as output_statistics
from openlineage.client.serde import Serde
from psycopg import sql
from waiting import wait_for

from replicator.postgres.pgcluster import free_port
from replicator.report.lineage_events import Endpoint

LINEAGE_PATH = "/api/v1/lineage"  # the client's default endpoint under OPENLINEAGE_URL
SALT = "salt-never-in-lineage"
WEBHOOK_SECRET = "webhook-secret-never-in-lineage"


@pytest.fixture
def tables(source_conn, schema) -> str:
    """`orders` (3 rows, a cursor) and `countries` (2 rows) in the test's schema."""
    for statement in (
        "CREATE TABLE {}.orders (id int PRIMARY KEY, email varchar(80), note text, "
        "amount numeric(10,2), updated_at timestamptz NOT NULL)",
        "INSERT INTO {}.orders SELECT g, 'a' || g || '@x.org', 'n', g * 1.5, now() "
        "FROM generate_series(1, 3) g",
        "CREATE TABLE {}.countries (code text PRIMARY KEY, name text)",
        "INSERT INTO {}.countries VALUES ('fr', 'France'), ('jp', 'Japan')",
    ):
        source_conn.execute(sql.SQL(statement).format(sql.Identifier(schema)))
    return schema


@pytest.fixture
def receiver(httpserver) -> Any:
    """An OpenLineage HTTP endpoint (what Marquez answers: 201)."""
    httpserver.expect_request(LINEAGE_PATH, method="POST").respond_with_data("", status=201)
    return httpserver


def bodies(httpserver) -> list[bytes]:
    return [request.data for request, _ in httpserver.log if request.path == LINEAGE_PATH]


def received(httpserver, count: int) -> list[event_v2.RunEvent]:
    """The endpoint's events once it has `count`, each parsed by `parse`."""
    wait_for(lambda: len(bodies(httpserver)) >= count, 10, f"{count} lineage events")
    return [parse(body) for body in bodies(httpserver)]


def parse(body: bytes) -> event_v2.RunEvent:
    """The event rebuilt with the client's own classes (their validators: a UUID runId, an
    ISO eventTime, a known eventType) and nothing they do not model: serialized again by the
    client, it is the body as received."""
    doc = json.loads(body)
    run, job = doc["run"], doc["job"]
    event = event_v2.RunEvent(
        eventType=event_v2.RunState(doc["eventType"]),
        eventTime=doc["eventTime"],
        producer=doc["producer"],
        run=event_v2.Run(
            runId=run["runId"], facets={k: RUN_FACETS[k](v) for k, v in run["facets"].items()}
        ),
        job=event_v2.Job(namespace=job["namespace"], name=job["name"], facets=job["facets"]),
        inputs=[
            event_v2.InputDataset(d["namespace"], d["name"], facets=_dataset_facets(d))
            for d in doc["inputs"]
        ],
        outputs=[
            event_v2.OutputDataset(
                d["namespace"],
                d["name"],
                facets=_dataset_facets(d),
                outputFacets={k: OUTPUT_FACETS[k](v) for k, v in d["outputFacets"].items()},
            )
            for d in doc["outputs"]
        ],
    )
    assert event.schemaURL == doc["schemaURL"]
    assert Serde.to_dict(event) == doc
    return event


def _parent(f: dict[str, Any]) -> parent_run.ParentRunFacet:
    root = f["root"]
    return parent_run.ParentRunFacet(
        run=parent_run.Run(runId=f["run"]["runId"]),
        job=parent_run.Job(namespace=f["job"]["namespace"], name=f["job"]["name"]),
        root=parent_run.Root(
            run=parent_run.RootRun(runId=root["run"]["runId"]),
            job=parent_run.RootJob(namespace=root["job"]["namespace"], name=root["job"]["name"]),
        ),
        producer=f["_producer"],
    )


RUN_FACETS = {
    "parent": _parent,
    "errorMessage": lambda f: error_message_run.ErrorMessageRunFacet(
        message=f["message"], programmingLanguage=f["programmingLanguage"], producer=f["_producer"]
    ),
    "tags": lambda f: tags_run.TagsRunFacet(
        tags=[tags_run.TagsRunFacetFields(**t) for t in f["tags"]], producer=f["_producer"]
    ),
}
OUTPUT_FACETS = {
    "outputStatistics": lambda f: output_statistics.OutputStatisticsOutputDatasetFacet(
        rowCount=f["rowCount"], size=f.get("size"), producer=f["_producer"]
    ),
}


def _dataset_facets(dataset: dict[str, Any]) -> dict[str, Any]:
    facets = dict(dataset["facets"])
    if "schema" in facets:
        schema = facets.pop("schema")
        fields = [
            schema_dataset.SchemaDatasetFacetFields(
                name=f["name"], type=f["type"], ordinal_position=f["ordinal_position"]
            )
            for f in schema["fields"]
        ]
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=fields, producer=schema["_producer"]
        )
    assert not set(facets) - {"schema"}, facets
    return facets


def by_job(events: list[event_v2.RunEvent]) -> dict[str, list[event_v2.RunEvent]]:
    jobs: dict[str, list[event_v2.RunEvent]] = {}
    for event in events:
        jobs.setdefault(event.job.name, []).append(event)
    return jobs


def states(events: list[event_v2.RunEvent]) -> list[str]:
    return [e.eventType.value for e in events]


def columns(dataset: Any) -> list[tuple[str, str]]:
    return [(f.name, f.type) for f in dataset.facets["schema"].fields]


def port(url: str) -> int:
    return urlsplit(url).port


def test_each_table_sends_start_then_complete_with_its_datasets_and_no_secret(
    db_project, tables, receiver, password_role, pg_servers
):
    """OPENLINEAGE_URL from the project's .env; a source URL with a password, a hash salt
    and a webhook secret set: none of them in any event, namespaces host:port only. Per
    table START then COMPLETE sharing a runId, the sync run as the parent, the source table
    in, the copy out (its own columns: one excluded, one hashed), rowCount the rows synced;
    a table with nothing new (the no-op screen) still sends both, rowCount 0."""
    schema = tables
    encoded = quote(password_role.password, safe="")
    source_port, dest_port = port(pg_servers.source_url), port(pg_servers.dest_url)
    db_project.env["REPLICATOR_SOURCE_URL"] = (
        f"postgresql://{password_role.name}:{encoded}@127.0.0.1:{source_port}/postgres"
    )
    db_project.write(
        ".env",
        f"OPENLINEAGE_URL={receiver.url_for('/')}\nREPLICATOR_HASH_SALT={SALT}\n"
        f"REPLICATOR_WEBHOOK_URL={receiver.url_for('/hook')}\n"
        f"REPLICATOR_WEBHOOK_SECRET={WEBHOOK_SECRET}\n",
    )
    receiver.expect_request("/hook").respond_with_data("ok")
    orders = {
        "name": f"{schema}.orders",
        "replication_key": "updated_at",
        "columns": {"exclude": ["note"], "hash": ["email"]},
    }
    db_project.write_config(
        {"tables": [orders, {"name": f"{schema}.countries", "mode": "full-refresh"}]}
    )
    db_project.sync(env=IN_PROCESS)
    assert not [k for k in os.environ if k.startswith("OPENLINEAGE")], "environment as it was"

    jobs = by_job(received(receiver, 4))
    hook = json.loads(next(r.data for r, _ in receiver.log if r.path == "/hook"))
    name = f"replicator.{db_project.path.name}"
    assert sorted(jobs) == [f"{name}.{schema}.countries", f"{name}.{schema}.orders"]
    sync_run = str(uuid.UUID(hook["run_id"]))
    rows = {t["name"]: t["rows"] for t in hook["tables"]}
    assert rows == {f"{schema}.orders": 3, f"{schema}.countries": 2}
    for table, events in jobs.items():
        start, complete = events
        assert states(events) == ["START", "COMPLETE"]
        assert start.run.runId == complete.run.runId != sync_run
        assert start.eventTime <= complete.eventTime
        for event in events:
            assert event.job.namespace == "replicator"
            parent = event.run.facets["parent"]
            assert (parent.job.name, parent.run.runId) == (name, sync_run)
            assert (parent.root.job.name, parent.root.run.runId) == (name, sync_run)
            (source,), (copy,) = event.inputs, event.outputs
            short = table.removeprefix(f"{name}.")
            assert (source.namespace, source.name) == (
                f"postgres://127.0.0.1:{source_port}",
                f"postgres.{short}",
            )
            assert (copy.namespace, copy.name) == (
                f"postgres://127.0.0.1:{dest_port}",
                f"postgres.{short}",
            )
        statistics = complete.outputs[0].outputFacets["outputStatistics"]
        assert statistics.rowCount == rows[table.removeprefix(f"{name}.")]
        assert statistics.size > 0
        assert "outputStatistics" not in start.outputs[0].outputFacets
    start, complete = jobs[f"{name}.{schema}.orders"]
    for event in (start, complete):
        assert columns(event.inputs[0]) == [
            ("id", "integer"),
            ("email", "character varying(80)"),
            ("note", "text"),
            ("amount", "numeric(10,2)"),
            ("updated_at", "timestamp with time zone"),
        ]
        assert columns(event.outputs[0]) == [
            ("id", "integer"),
            ("email", "text"),
            ("amount", "numeric(10,2)"),
            ("updated_at", "timestamp with time zone"),
        ]
    assert columns(jobs[f"{name}.{schema}.countries"][1].outputs[0]) == [
        ("code", "text"),
        ("name", "text"),
    ]

    db_project.run_process("sync", env=IN_PROCESS)  # nothing new: the screen's noop
    events = received(receiver, 8)[4:]
    jobs = by_job(events)
    start, complete = jobs[f"{name}.{schema}.orders"]
    assert states([start, complete]) == ["START", "COMPLETE"]
    assert start.run.runId == complete.run.runId
    assert complete.outputs[0].outputFacets["outputStatistics"].rowCount == 0
    assert complete.inputs[0].name == f"postgres.{schema}.orders"
    assert states(jobs[f"{name}.{schema}.countries"]) == ["START", "COMPLETE"]

    everything = b"\n".join(bodies(receiver)).decode()
    for secret in (password_role.password, encoded, SALT, WEBHOOK_SECRET, password_role.name):
        assert secret not in everything


def test_a_failing_table_sends_fail_with_its_error(db_project, tables, receiver):
    """A model that fails while its rows are read: START (its columns known) then FAIL with
    the error; a table missing from the source fails before its load: START then FAIL all
    the same; the other table completes; the run exits 1 as before."""
    schema = tables
    db_project.write(
        f"models/{schema}/orders.sql", "SELECT id, 100 / (id - 2) AS ratio FROM {{ source }}"
    )
    db_project.configure(schema, "missing", "orders", "countries", mode="full-refresh")
    done = db_project.run("sync", env={**IN_PROCESS, "OPENLINEAGE_URL": receiver.url_for("/")})
    assert done.exit_code == 1, done.output
    jobs = by_job(received(receiver, 6))
    name = f"replicator.{db_project.path.name}.{schema}"
    assert {job: states(events) for job, events in jobs.items()} == {
        f"{name}.missing": ["START", "FAIL"],
        f"{name}.orders": ["START", "FAIL"],
        f"{name}.countries": ["START", "COMPLETE"],
    }
    start, fail = jobs[f"{name}.orders"]
    assert start.run.runId == fail.run.runId
    assert columns(start.outputs[0]) == [("id", "integer"), ("ratio", "integer")]
    error = fail.run.facets["errorMessage"]
    assert "division by zero" in error.message
    assert error.programmingLanguage == "python"
    assert "outputStatistics" not in fail.outputs[0].outputFacets
    error = jobs[f"{name}.missing"][1].run.facets["errorMessage"]
    assert error.message.startswith(f"{schema}.missing: source table does not exist")
    assert "errorMessage" not in jobs[f"{name}.countries"][1].run.facets


def test_a_run_stopped_by_sigterm_still_sends_its_events(db_project, tables, receiver):
    """START is sent as the load begins (here, while its source query sleeps); SIGTERM then
    stops the run, which sends the table's FAIL before it exits 143 as before."""
    schema = tables
    db_project.write(
        f"models/{schema}/orders.sql",
        "SELECT t.* FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(120)) AS slow",
    )
    db_project.configure(schema, "orders", mode="full-refresh")
    env = {**os.environ, **db_project.env, **IN_PROCESS, "OPENLINEAGE_URL": receiver.url_for("/")}
    process = subprocess.Popen(
        [sys.executable, "-m", "replicator", "sync", "--project-dir", str(db_project.path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        (start,) = received(receiver, 1)
        assert states([start]) == ["START"]
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    start, fail = received(receiver, 2)
    assert states([start, fail]) == ["START", "FAIL"]
    assert start.run.runId == fail.run.runId
    assert fail.run.facets["errorMessage"].message.startswith("interrupted by SIGTERM")


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(64)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


def _timed_sync(project, env: dict[str, str]) -> tuple[float, Any]:
    began = time.monotonic()
    done = project.run_process("sync", env={**IN_PROCESS, **env})
    return time.monotonic() - began, done


@pytest.mark.parametrize("endpoint", ["nothing-listening", "never-answers"])
def test_an_endpoint_down_or_silent_warns_and_costs_seconds(
    db_project, tables, endpoint, silent_endpoint
):
    """The run exits 0 with a warning, and ends within a few seconds of the same run
    without lineage (measured alike: 0.1 s down, 2.1 s silent)."""
    db_project.configure(tables, "orders", "countries", mode="full-refresh")
    url = f"http://127.0.0.1:{free_port()}" if endpoint == "nothing-listening" else silent_endpoint
    without, plain = _timed_sync(db_project, {})
    assert plain.returncode == 0, plain.stderr
    seconds, done = _timed_sync(db_project, {"OPENLINEAGE_URL": url})
    assert done.returncode == 0, done.stderr
    assert "OpenLineage:" in done.stderr and "not sent" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert seconds < without + 6, (seconds, without)


def test_without_configuration_nothing_is_imported(db_project, tables, receiver):
    """No OpenLineage setting (or OPENLINEAGE_DISABLED): the client is never imported and
    nothing is sent or printed; with OPENLINEAGE_URL it is, and events arrive."""
    db_project.configure(tables, "countries", mode="full-refresh")
    profile = {**IN_PROCESS, "PYTHONPROFILEIMPORTTIME": "1"}
    url = receiver.url_for("/")
    for env in ({}, {"OPENLINEAGE_URL": url, "OPENLINEAGE_DISABLED": "true"}):
        done = db_project.run_process("sync", env={**profile, **env})
        assert done.returncode == 0, done.stderr
        assert "import time:" in done.stderr
        assert "openlineage" not in done.stderr, env
        assert "eventType" not in done.stdout
    done = db_project.run_process("sync", env={**profile, "OPENLINEAGE_URL": url})
    assert done.returncode == 0, done.stderr
    assert "| openlineage.client" in done.stderr
    assert states(received(receiver, 2)) == ["START", "COMPLETE"]


def test_the_project_folders_openlineage_yml_and_namespace(db_project, tables, receiver):
    """An openlineage.yml in the project folder is the client's configuration wherever the
    command runs from, and OPENLINEAGE_NAMESPACE names the jobs' namespace; one that names
    no transport sends nothing and prints no event (the client's console fallback)."""
    db_project.configure(tables, "countries", mode="full-refresh")
    db_project.write(
        "openlineage.yml", f"transport:\n  type: http\n  url: {receiver.url_for('/')}\n"
    )
    db_project.sync(env={**IN_PROCESS, "OPENLINEAGE_NAMESPACE": "warehouse"})
    events = received(receiver, 2)
    assert states(events) == ["START", "COMPLETE"]
    assert {e.job.namespace for e in events} == {"warehouse"}
    assert {e.run.facets["parent"].job.namespace for e in events} == {"warehouse"}

    db_project.write("openlineage.yml", "facets:\n  environment_variables: []\n")
    done = db_project.run_process("sync", env=IN_PROCESS)
    assert done.returncode == 0, done.stderr
    assert "openlineage.yml names no transport type" in done.stderr
    assert "eventType" not in done.stdout + done.stderr
    assert len(bodies(receiver)) == 2


@pytest.mark.parametrize(
    ("conninfo", "namespace", "database"),
    [
        pytest.param(
            "postgresql://u:p%40ss@db.example.com:6432/shop",
            "postgres://db.example.com:6432",
            "shop",
            id="uri-with-password",
        ),
        pytest.param(
            "host=a.example,b.example port=5433,5434 dbname=x password=secret",
            "postgres://a.example:5433",
            "x",
            id="several-hosts",
        ),
        pytest.param("dbname=x user=u", "postgres://localhost:5432", "x", id="socket-default"),
        pytest.param("postgresql://u@h/", "postgres://h:5432", "u", id="database-is-the-user"),
    ],
)
def test_dataset_namespaces_are_host_and_port_only(monkeypatch, conninfo, namespace, database):
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    assert Endpoint.of(conninfo) == Endpoint(namespace, database)


def test_a_history_table_is_an_output_with_its_columns_and_the_versions_written(
    db_project, tables, receiver
):
    schema = tables
    db_project.write(".env", f"OPENLINEAGE_URL={receiver.url_for('/')}\n")
    db_project.write_config(
        {"tables": [{"name": f"{schema}.countries", "mode": "full-refresh", "history": True}]}
    )
    db_project.sync(env=IN_PROCESS)
    start, complete = received(receiver, 2)
    for event in (start, complete):
        _copy, history = event.outputs
        assert history.name == f"postgres.{schema}.countries_history"
        assert columns(history) == [
            ("code", "text"),
            ("name", "text"),
            ("_valid_from", "timestamp with time zone"),
            ("_valid_to", "timestamp with time zone"),
            ("_is_current", "boolean"),
            ("_op", "text"),
        ]
    assert complete.outputs[1].outputFacets["outputStatistics"].rowCount == 2  # two versions
