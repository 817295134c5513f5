"""`_replicator.runs`: every run leaves one row per table (succeeded, failed, interrupted or
not started), old rows go after `history_days`, `status --history` shows them, and the
metrics file says the same as the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from engines import IN_PROCESS
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from waiting import wait_for

from replicator.postgres.pgcluster import free_port
from replicator.report.charts import MIN_SLOTS, PAD, WIDTH, sparkline
from replicator.report.history_rows import RunRow
from replicator.report.html_page import failures, table_view

_CLI = (sys.executable, "-m", "replicator")
SLOW_MODEL = "SELECT t.id, t.v FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(120)) AS slow"


@pytest.fixture(autouse=True)
def _no_spark(monkeypatch):
    monkeypatch.setenv("REPLICATOR_SPARK_MIN_ROWS", IN_PROCESS["REPLICATOR_SPARK_MIN_ROWS"])


@pytest.fixture
def tables(source_conn, schema):
    """Two tables: `a` (20 rows, a replication key) and `b` (5 rows, full refresh)."""
    a, b = sql.Identifier(schema, "a"), sql.Identifier(schema, "b")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, updated_at int NOT NULL)").format(a)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v', g FROM generate_series(1, 20) g").format(a)
    )
    source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(b))
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 5) g").format(b)
    )
    return schema


def _config(project, schema, **top):
    project.write_config(
        {
            "tables": [
                {"name": f"{schema}.a", "replication_key": "updated_at"},
                {"name": f"{schema}.b", "mode": "full-refresh"},
            ],
            **top,
        }
    )


def _runs(dest_conn, schema) -> list[dict]:
    """The history rows of the test's tables, oldest first (none before the first run made
    the table)."""
    if dest_conn.execute("SELECT to_regclass('_replicator.runs')").fetchone()[0] is None:
        return []
    cur = dest_conn.execute(
        "SELECT * FROM _replicator.runs WHERE table_name LIKE %s ORDER BY started_at, table_name",
        (f"{schema}.%",),
    )
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def test_a_successful_run_leaves_one_row_per_table(db_project, tables, dest_conn):
    _config(db_project, tables)
    done = db_project.run("sync")
    assert done.exit_code == 0, done.output
    rows = _runs(dest_conn, tables)
    assert [(r["table_name"], r["status"], r["action"], r["rows"]) for r in rows] == [
        (f"{tables}.a", "success", "full_reload", 20),
        (f"{tables}.b", "success", "full_reload", 5),
    ]
    a = rows[0]
    assert a["run_id"] == rows[1]["run_id"]
    assert a["destination"] == f"{tables}.a"
    assert a["reason"] == "no state" and a["error"] is None
    assert a["cursor_after"] == "20" and a["started_at"] <= a["finished_at"]
    assert a["bytes"] > 0 and a["deleted"] == 0
    assert (
        0 <= a["lag_seconds"] == pytest.approx((a["finished_at"] - a["started_at"]).total_seconds())
    )


def test_a_failed_table_leaves_its_row_and_the_others_theirs(db_project, tables, dest_conn):
    _config(db_project, tables)
    assert db_project.run("sync").exit_code == 0
    db_project.write(f"models/{tables}/b.sql", 'SELECT id, v, "<b>nope</b>" FROM {{ source }}')
    done = db_project.run("sync")
    assert done.exit_code == 1
    a, b = _runs(dest_conn, tables)[2:]
    assert (a["table_name"], a["status"], a["action"]) == (f"{tables}.a", "success", "noop")
    assert (b["table_name"], b["status"]) == (f"{tables}.b", "failed")
    assert 'column "<b>nope</b>" does not exist' in b["error"]
    assert b["rows"] is None and b["lag_seconds"] >= 0  # stale since the first run's success


def test_an_interrupted_run_leaves_its_rows(db_project, tables, source_conn, dest_conn):
    """SIGTERM while `a` reads: `a` is interrupted, `b` (not started) skipped."""
    _config(db_project, tables)
    db_project.write(f"models/{tables}/a.sql", SLOW_MODEL.replace("t.v", "t.v, t.updated_at"))
    process = subprocess.Popen(
        [*_CLI, "sync", "--project-dir", str(db_project.path)],
        env={**os.environ, **db_project.env, **IN_PROCESS},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: source_conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s "
                "AND query LIKE '%%pg_sleep(120)%%' AND pid <> pg_backend_pid()",
                (f"%{tables}%",),
            ).fetchall(),
            60,
            "the slow source query",
        )
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "history was not recorded" not in stderr
    a, b = _runs(dest_conn, tables)
    assert a["status"] == "interrupted"
    assert a["error"].startswith("interrupted by SIGTERM before it finished")
    assert a["lag_seconds"] is None  # never synced
    assert (b["status"], b["action"]) == ("skipped", None)
    assert b["reason"] == "not started: the run was interrupted by SIGTERM"
    assert a["run_id"] == b["run_id"]


def test_rows_older_than_history_days_are_removed(db_project, tables, dest_conn):
    _config(db_project, tables, history_days=7)
    assert db_project.run("sync").exit_code == 0
    for days in (3, 10):
        dest_conn.execute(
            "INSERT INTO _replicator.runs (run_id, table_name, started_at, finished_at, status) "
            "VALUES (%s, %s, now() - make_interval(days => %s), "
            "now() - make_interval(days => %s), 'success')",
            (f"old-{days}", f"{tables}.a", days, days),
        )
    assert db_project.run("sync", "-s", "a").exit_code == 0
    kept = [(r["run_id"], r["table_name"]) for r in _runs(dest_conn, tables)]
    assert ("old-3", f"{tables}.a") in kept
    assert ("old-10", f"{tables}.a") not in kept
    assert len(kept) == 4  # the first run's two, the 3-day-old one, `a` of the second run


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(0, "history_days: expected a number >= 1, got 0", id="zero"),
        pytest.param("90", 'history_days: expected a whole number, got "90"', id="text"),
    ],
)
def test_a_bad_history_days_is_exit_2_and_nothing_written(
    db_project, tables, dest_conn, value, message
):
    _config(db_project, tables, history_days=value)
    done = db_project.run("sync")
    assert done.exit_code == 2
    assert message in done.output
    assert _runs(dest_conn, tables) == []
    assert not list((db_project.path / "sync-state").glob("*.json"))


def test_a_destination_that_refuses_the_history_does_not_fail_the_run(
    db_project, tables, dest_conn
):
    _config(db_project, tables)
    assert db_project.run("sync").exit_code == 0
    function = sql.Identifier(tables, "refuse")
    dest_conn.execute(
        sql.SQL(
            "CREATE FUNCTION {} () RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.table_name LIKE {} THEN RAISE EXCEPTION 'no history here'; END IF; "
            "RETURN NEW; END $$"
        ).format(function, sql.Literal(f"{tables}.%"))
    )
    trigger = sql.Identifier(f"refuse_{tables}"[:60])
    dest_conn.execute(
        sql.SQL(
            "CREATE TRIGGER {} BEFORE INSERT ON _replicator.runs FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(trigger, function)
    )
    try:
        done = db_project.run("sync")
    finally:
        dest_conn.execute(sql.SQL("DROP TRIGGER {} ON _replicator.runs").format(trigger))
    assert done.exit_code == 0, done.output
    assert "history was not recorded in _replicator.runs" in done.output
    assert "no history here" in done.output
    assert len(_runs(dest_conn, tables)) == 2  # the first run's


def test_status_history_shows_each_tables_last_runs(db_project, tables, dest_conn):
    _config(db_project, tables)
    for _ in range(3):
        assert db_project.run("sync").exit_code == 0
    done = db_project.run("status", "--history", "2", "--json")
    assert done.exit_code == 0, done.output
    rows = json.loads(done.stdout)
    assert [(r["table_name"], r["action"]) for r in rows] == [
        (f"{tables}.a", "noop"),
        (f"{tables}.a", "noop"),
        (f"{tables}.b", "full_reload"),
        (f"{tables}.b", "full_reload"),
    ]
    assert rows[0]["started_at"] > rows[1]["started_at"], "newest first"
    # every column but the project's, which the rows shown share
    assert set(rows[0]) == set(_runs(dest_conn, tables)[0]) - {"project_id"}
    one = json.loads(db_project.run("status", "--history", "--json", "-s", "b").stdout)
    assert [r["table_name"] for r in one] == [f"{tables}.b"] * 3  # default 10: all three
    grid = db_project.run("status", "--history")
    assert grid.exit_code == 0, grid.output
    assert grid.stdout.count(f"{tables}.a ") == 3 and "noop" in grid.stdout
    assert "full_reload" in grid.stdout and "mode full-refresh" in grid.stdout


def _metrics(path) -> dict[tuple[str, frozenset], float]:
    """Every sample of the file: (name, its labels) -> value."""
    samples = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def _key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def test_the_metrics_file_says_what_the_run_did(db_project, tables, source_conn, tmp_path):
    folder = tmp_path / "textfile"
    folder.mkdir()
    _config(db_project, tables, metrics={"textfile": str(folder / "replicator.prom")})
    before = datetime.now(UTC).timestamp()
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(tables, "b")))
    assert db_project.run("sync").exit_code == 1
    after = datetime.now(UTC).timestamp()
    assert [p.name for p in folder.iterdir()] == ["replicator.prom"]  # no temporary left
    found = _metrics(folder / "replicator.prom")
    a, b = f"{tables}.a", f"{tables}.b"
    state = json.loads(db_project.run("state", "show").stdout)
    assert found[_key("replicator_table_last_run_status", table=a, status="success")] == 1
    assert found[_key("replicator_table_last_run_status", table=a, status="failed")] == 0
    assert found[_key("replicator_table_last_run_status", table=b, status="failed")] == 1
    assert found[_key("replicator_table_last_run_status", table=b, status="success")] == 0
    assert found[_key("replicator_table_rows", table=a)] == 0  # the 2nd run read none of `a`
    assert _key("replicator_table_rows", table=b) not in found  # its failed run read none
    synced = datetime.fromisoformat(state[f"{tables}.b"]["last_synced_at"].replace("Z", "+00:00"))
    last_success = found[_key("replicator_table_last_success_timestamp_seconds", table=b)]
    assert last_success == pytest.approx(synced.timestamp(), abs=0.001)
    assert found[_key("replicator_table_lag_seconds", table=b)] >= 0
    assert 0 <= found[_key("replicator_table_duration_seconds", table=a)] < after - before
    assert found[_key("replicator_run_tables_failed")] == 1
    assert before < found[_key("replicator_run_finished_timestamp_seconds")] <= after
    assert not any(name == "replicator_slot_retained_wal_bytes" for name, _ in found)
    # A run of `a` alone: `b` keeps its last values.
    assert db_project.run("sync", "-s", "a").exit_code == 0
    again = _metrics(folder / "replicator.prom")
    assert again[_key("replicator_table_last_run_status", table=b, status="failed")] == 1
    assert again[_key("replicator_run_tables_failed")] == 0
    assert again[_key("replicator_run_finished_timestamp_seconds")] > after


def test_a_metrics_folder_that_does_not_exist_is_exit_2(db_project, tables, tmp_path):
    missing = tmp_path / "nowhere"
    _config(db_project, tables, metrics={"textfile": str(missing / "replicator.prom")})
    done = db_project.run("sync")
    assert done.exit_code == 2
    assert f"metrics.textfile: the folder {missing} does not exist: create it" in done.output
    assert not list((db_project.path / "sync-state").glob("*.json"))


def test_the_metrics_file_has_the_slots_retained_wal(cdc_project, source_conn, schema, tmp_path):
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, "c"))
    )
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.c", "mode": "cdc"}], "metrics": {"textfile": "m.prom"}}
    )
    done = cdc_project.run("sync")
    assert done.exit_code == 0, done.output
    slot = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())["slot"]
    found = _metrics(cdc_project.path / "m.prom")  # relative: in the project folder
    assert found[_key("replicator_slot_retained_wal_bytes", slot=slot)] >= 0

    # The table leaves the config: no run reads the slot any more, which keeps WAL. Each
    # sync and check says so with the fix, and the metrics keep its figure.
    cdc_project.write_config(
        {
            "tables": [{"name": f"{schema}.c", "mode": "full-refresh"}],
            "metrics": {"textfile": "m.prom"},
        }
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT generate_series(1, 20000)").format(
            sql.Identifier(schema, "c")
        )
    )
    said = (
        f"replication slot {slot} serves no table (no table of tables-config.json has mode cdc now)"
    )
    for _ in range(2):
        alone = cdc_project.run("sync")
        assert alone.exit_code == 0, alone.output
        assert said in alone.stderr and "`replicator cdc drop` drops it" in alone.stderr
    kept = _metrics(cdc_project.path / "m.prom")[
        _key("replicator_slot_retained_wal_bytes", slot=slot)
    ]
    assert kept > 20000 * 8  # the rows' WAL at least
    checked = cdc_project.run("check")
    assert f"warn  cdc: {said} and keeps " in checked.stdout, checked.stdout
    assert said in cdc_project.run("status").output
    assert cdc_project.run("cdc", "drop").exit_code == 0
    assert said not in cdc_project.run("sync").stderr


def test_each_follow_tick_is_a_run(db_project, tables, dest_conn, tmp_path):
    _config(db_project, tables, metrics={"textfile": "replicator.prom"})
    follow = ["sync", "--follow", "--interval", "0.2", "--log-format", "json"]
    process = subprocess.Popen(
        [*_CLI, *follow, "--project-dir", str(db_project.path)],
        env={**os.environ, **db_project.env, **IN_PROCESS},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_for(lambda: len(_runs(dest_conn, tables)) >= 6, 60, "three runs")
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    rows = _runs(dest_conn, tables)
    assert len({r["run_id"] for r in rows}) * 2 == len(rows)  # both tables in every tick
    assert {r["status"] for r in rows} == {"success"}
    found = _metrics(db_project.path / "replicator.prom")
    finished = found[_key("replicator_run_finished_timestamp_seconds")]
    assert finished == pytest.approx(max(r["finished_at"] for r in rows).timestamp(), abs=1)
    # Each tick's log event says how long it took: the history of its tables fits inside.
    ticks = [e for e in map(json.loads, stderr.splitlines()) if e["event"] == "follow.run"]
    assert len(ticks) * 2 == len(rows)
    by_run: dict[str, list] = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append(r)
    spans = sorted(
        max(r["finished_at"] for r in tick) - min(r["started_at"] for r in tick)
        for tick in by_run.values()
    )
    seconds = sorted(e["seconds"] for e in ticks)
    assert all(s.total_seconds() <= t + 0.001 for s, t in zip(spans, seconds, strict=True))


def test_the_report_is_one_self_contained_page(db_project, tables, tmp_path):
    _config(db_project, tables)
    assert db_project.run("sync").exit_code == 0
    db_project.write(f"models/{tables}/b.sql", 'SELECT id, v, "<b>nope</b>" FROM {{ source }}')
    assert db_project.run("sync").exit_code == 1
    done = db_project.run("report")
    assert done.exit_code == 0, done.output
    page = db_project.path / "report.html"
    assert f"wrote {page}: 2 table(s), 4 run(s)" in done.stdout
    html = page.read_text()
    assert f"{tables}.a" in html and f"{tables}.b" in html
    assert "column &#34;&lt;b&gt;nope&lt;/b&gt;&#34; does not exist" in html  # escaped
    assert "<b>nope</b>" not in html
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert html.count("<polyline") == 2  # a lag line per table
    elsewhere = tmp_path / "out" / "r.html"
    missing = db_project.run("report", "-o", str(elsewhere), "-s", "a")
    assert missing.exit_code == 2 and "does not exist; create it first" in missing.output
    elsewhere.parent.mkdir()
    assert db_project.run("report", "-o", str(elsewhere), "-s", "a").exit_code == 0
    assert f"{tables}.b" not in elsewhere.read_text()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    # make test's system-deps installs it: a page that is never drawn is not a tested page
    assert browser is not None, "chromium is not installed: run `make system-deps`"
    shot = tmp_path / "shot.png"
    headless = [browser, "--headless", "--no-sandbox", "--disable-gpu"]
    headless += ["--window-size=1200,900", f"--user-data-dir={tmp_path / 'profile'}"]
    for option in (f"--screenshot={shot}", "--dump-dom"):
        rendered = subprocess.run(
            [*headless, option, page.as_uri()], capture_output=True, text=True, timeout=120
        )
        assert rendered.returncode == 0, rendered.stderr
    assert shot.stat().st_size > 10_000
    assert f"{tables}.b" in rendered.stdout and "failed" in rendered.stdout


def _row(minute: int, status: str, error: str | None = None, lag: float | None = 1.0) -> RunRow:
    start = datetime(2026, 11, 25, 9, minute, tzinfo=UTC)
    return RunRow(
        f"r{minute}", "s.t", "s.t", start, start, None, None, status, 1, None, 0, error, None,
        None, lag,
    )  # fmt: skip


def test_failures_fold_streaks_of_the_same_error():
    runs = [_row(5, "failed", "x"), _row(4, "failed", "x"), _row(3, "success")]
    runs += [_row(2, "failed", "y"), _row(1, "failed", "x"), _row(0, "interrupted", "x")]
    view = table_view("s.t", "s.t", runs)  # newest first, as history.recent gives them
    folded = [(f.first.run_id, f.last.run_id, f.count) for f in failures([view])]
    assert folded == [("r4", "r5", 2), ("r2", "r2", 1), ("r1", "r1", 1), ("r0", "r0", 1)]


def test_a_lag_line_skips_runs_without_a_lag():
    line = sparkline([2.0, None, 4.0], floor=1.0)
    xs = [float(point.split(",")[0]) for point in line.points.split()]
    slot = (WIDTH - 2 * PAD) / MIN_SLOTS  # three runs take three slots at the right
    assert xs == pytest.approx([WIDTH - PAD - 2.5 * slot, WIDTH - PAD - 0.5 * slot], abs=0.1)
    assert line.last == pytest.approx((xs[1], PAD), abs=0.1)  # the biggest: at the top


def test_a_destination_out_of_reach_still_gets_the_metrics_file(db_project, tables):
    _config(db_project, tables, metrics={"textfile": "replicator.prom"})
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    done = db_project.run("sync", env={"REPLICATOR_DEST_URL": unreachable})
    assert done.exit_code == 1
    assert done.output.count("cannot connect to the destination database") == 1, done.output
    assert "history was not recorded: the destination was out of reach" in done.output
    found = _metrics(db_project.path / "replicator.prom")
    assert found[_key("replicator_run_tables_failed")] == 2
    assert found[_key("replicator_table_last_run_status", table=f"{tables}.a", status="failed")]


def test_a_cdc_tables_time_is_its_own_not_the_tables_synced_before_it(
    cdc_project, tables, writer, dest_conn
):
    """A `cdc` table is planned first and applied after the run's other tables: its row in
    `_replicator.runs` (and so its duration in `status --history` and the metrics) starts
    when its log is read, after the table synced in between has finished."""
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(sql.Identifier(tables, "c"))
    )
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{tables}.c", "mode": "cdc"},
                {"name": f"{tables}.b", "mode": "full-refresh"},
            ]
        }
    )
    assert cdc_project.run("sync").exit_code == 0
    cdc_project.write("models/" + f"{tables}/b.sql", SLOW_MODEL.replace("120", "1"))
    writer.execute(sql.SQL("INSERT INTO {} VALUES (1, 'one')").format(sql.Identifier(tables, "c")))
    done = cdc_project.run("sync")
    assert done.exit_code == 0, done.output
    (run_id,) = dest_conn.execute(
        "SELECT run_id FROM _replicator.runs ORDER BY finished_at DESC LIMIT 1"
    ).fetchone()
    rows = dict(
        (name.split(".")[1], (started, finished))
        for name, started, finished in dest_conn.execute(
            "SELECT table_name, started_at, finished_at FROM _replicator.runs WHERE run_id = %s",
            (run_id,),
        ).fetchall()
    )
    assert rows["c"][0] >= rows["b"][1], rows


def test_projects_that_share_a_destination_see_their_own_runs(db_project, tables, tmp_path):
    """Two projects on one destination (each its own copies): `status --history` and the
    report of one never show the other's runs (its refused tables showed as failures)."""
    db_project.write_config({"tables": [{"name": f"{tables}.b", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    other = type(db_project)(tmp_path / "other", dict(db_project.env))
    (other.path / "sync-state").mkdir(parents=True)
    other.write_config({"tables": [{"name": f"{tables}.b", "mode": "full-refresh"}]})
    refused = other.run("sync")
    assert refused.exit_code == 1, "the copy is the first project's"
    shown = json.loads(db_project.run("status", "--history", "5", "--json").stdout)
    assert [row["status"] for row in shown] == ["success"], shown
    theirs = json.loads(other.run("status", "--history", "5", "--json").stdout)
    assert [row["status"] for row in theirs] == ["failed"], theirs
    page = tmp_path / "report.html"
    assert db_project.run("report", "-o", str(page)).exit_code == 0
    assert "another replicator project keeps" not in page.read_text()
