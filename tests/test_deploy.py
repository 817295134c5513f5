"""deploy/: the Prometheus rules pass `promtool check rules` and their unit tests pass
`promtool test rules`, with every alert tested firing and not firing; every series the rules
and the Grafana dashboard query is one the tool writes (names, labels and status values read
from a file the tool's own code wrote); the rules fire on the files of real runs; and the
systemd units pass `systemd-analyze verify` and keep the tool's exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from replicator.base.errors import Busy
from replicator.report import metrics
from replicator.report.history_rows import STATUSES, RunRow

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
SYSTEMD = ROOT / "deploy" / "systemd"
RULES = PROMETHEUS / "replicator-alerts.yml"
RULE_TESTS = PROMETHEUS / "replicator-alerts.test.yml"
DASHBOARD = PROMETHEUS / "grafana-dashboard.json"
SERVICE = SYSTEMD / "replicator-sync.service"
TIMER = SYSTEMD / "replicator-sync.timer"
# What a scrape of node_exporter adds to every series of the file.
SCRAPE_LABELS = {"job": "node", "instance": "etl1:9100"}
SHIPPED_BINARY = "/srv/pipeline/.venv/bin/replicator"


# --- what the tool writes ---------------------------------------------------------------


@dataclass(frozen=True)
class Catalog:
    """The series of a metrics file: each name's label names, and the `status` values."""

    labels: dict[str, frozenset[str]]
    statuses: frozenset[str]

    @classmethod
    def read(cls, text: str) -> Catalog:
        labels: dict[str, set[str]] = {}
        statuses: set[str] = set()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels.setdefault(sample.name, set()).update(sample.labels)
                if "status" in sample.labels:
                    statuses.add(sample.labels["status"])
        return cls({k: frozenset(v) for k, v in labels.items()}, frozenset(statuses))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    """A file written by report/metrics.py with every series in it: a table with a last
    run and a last success, and a slot."""
    finished = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    row = RunRow(
        run_id="r1",
        table_name="shop.orders",
        destination="shop.orders",
        started_at=finished - timedelta(seconds=2),
        finished_at=finished,
        action="incremental",
        reason=None,
        status="success",
        rows=120,
        bytes=4096,
        deleted=0,
        error=None,
        cursor_before="100",
        cursor_after="120",
        lag_seconds=2.0,
    )
    registry = metrics.registry_for(
        [metrics.TableFigures("shop.orders", row, finished)],
        metrics.RunFigures(finished, 0),
        {"replicator_3f9a1c": 24_576_000},
    )
    path = tmp_path_factory.mktemp("textfile") / "replicator.prom"
    assert metrics.write(path, registry)
    text = path.read_text()
    empty = [f.name for f in text_string_to_metric_families(text) if not f.samples]
    assert empty == [], "the figures leave these series out"
    found = Catalog.read(text)
    assert found.statuses == set(STATUSES)
    return found


# --- the names a PromQL expression uses ---------------------------------------------------

_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\''
_NOT_NAMES = re.compile(
    rf"{_STRING}|\{{[^}}]*\}}|\[[^\]]*\]"
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
# a name: not part of a longer word, a number (1e9, 5m) or a Grafana $variable, nor a function
_NAME = re.compile(r"(?<![\w:$])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_MATCHER = re.compile(rf"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*({_STRING})")
_SELECTOR = re.compile(rf"\{{((?:{_STRING}|[^}}\"'])*)\}}")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (label matchers, ranges and grouping labels
    left out)."""
    bare = _NOT_NAMES.sub(" ", expr)
    return {m for m in _NAME.findall(bare) if m.lower() not in _KEYWORDS}


def labels_used(expr: str) -> list[tuple[str, str]]:
    """(label, value) of every matcher, and (label, "") of every grouping label."""
    matched = [
        (name, value[1:-1])
        for selector in _SELECTOR.findall(expr)
        for name, value in _MATCHER.findall(selector)
    ]
    grouping = [name for names in _LABEL_LIST.findall(expr) for name in names.split(",")]
    grouped = [(name.strip(), "") for name in grouping]
    return [(name, value) for name, value in matched + grouped if name]


def problems(expr: str, catalog: Catalog, recorded: frozenset[str] = frozenset()) -> list[str]:
    """What in `expr` the tool does not write: a metric name, a label, a `status` value."""
    names = metric_names(expr)
    wrong = [f"metric {n}" for n in sorted(names - set(catalog.labels) - recorded)]
    if not names & set(catalog.labels):
        wrong.append("no metric the tool writes")
    known = set(SCRAPE_LABELS).union(*catalog.labels.values())
    for label, value in labels_used(expr):
        if label not in known:
            wrong.append(f"label {label}")
        elif label == "status" and not value.startswith("$"):
            wrong += [f"status {v}" for v in value.split("|") if v not in catalog.statuses]
    return wrong


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        pytest.param(
            "time() - replicator_table_last_success_timestamp_seconds"
            " > 3 * scalar(replicator:sync_interval_seconds)",
            {"replicator_table_last_success_timestamp_seconds", "replicator:sync_interval_seconds"},
            id="functions",
        ),
        pytest.param(
            'sum by (table) (rate(replicator_table_rows{table=~"a|b",instance="$i"}[$__range]))',
            {"replicator_table_rows"},
            id="matchers-ranges-grouping",
        ),
        pytest.param(
            "replicator_tabel_lag_seconds offset 5m > 1e9 and on(instance) up",
            {"replicator_tabel_lag_seconds", "up"},
            id="misspelled",
        ),
    ],
)
def test_the_names_of_an_expression(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize(
    ("expr", "wrong"),
    [
        pytest.param(
            "replicator_table_lag_second > 1",
            ["metric replicator_table_lag_second", "no metric the tool writes"],
        ),
        pytest.param('replicator_table_rows{tabel="x"}', ["label tabel"]),
        pytest.param(
            'replicator_table_last_run_status{status=~"failed|failure"} == 1', ["status failure"]
        ),
        pytest.param("vector(1)", ["no metric the tool writes"]),
        pytest.param('max by (instance) (replicator_table_rows{table=~"$table"})', []),
    ],
)
def test_the_check_finds_what_the_tool_does_not_write(catalog, expr, wrong):
    assert problems(expr, catalog) == wrong


# --- the rules ----------------------------------------------------------------------------


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _rules(document: Any) -> Iterator[dict[str, Any]]:
    for group in document["groups"]:
        yield from group["rules"]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not installed: run `make system-deps`"
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def test_the_rules_pass_promtool_check():
    done = _promtool("check", "rules", RULES.name, cwd=PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_pass_their_promtool_unit_tests():
    done = _promtool("test", "rules", RULE_TESTS.name, cwd=PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    alerts = {rule["alert"] for rule in _rules(_yaml(RULES)) if "alert" in rule}
    tests = _yaml(RULE_TESTS)
    assert tests["rule_files"] == [RULES.name]
    firing, quiet = set(), set()
    for test in tests["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert alerts - firing == set(), "never tested firing"
    assert alerts - quiet == set(), "never tested quiet"
    assert firing | quiet <= alerts, "tests of alerts the rules do not have"


def test_the_rules_query_only_what_the_tool_writes(catalog):
    rules = list(_rules(_yaml(RULES)))
    recorded = frozenset(rule["record"] for rule in rules if "record" in rule)
    wrong = {
        rule["alert"]: problems(rule["expr"], catalog, recorded)
        for rule in rules
        if "alert" in rule
    }
    assert {name: found for name, found in wrong.items() if found} == {}
    for rule in rules:  # the settings: constants, reading nothing
        if "record" in rule:
            assert metric_names(rule["expr"]) == set(), rule


# --- the rules on the files of real runs --------------------------------------------------


def _series(text: str) -> list[dict[str, str]]:
    """A metrics file as a promtool test's input_series, as node_exporter would export it:
    each sample with the scrape's labels, its value for 10 minutes."""
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, **SCRAPE_LABELS}
            selector = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            value = f"{sample.value:f}"  # never 1e+09, which promtool reads as 1e + 09
            series = f"{sample.name}{{{selector}}}"
            found.append({"series": series, "values": " ".join([value] * 11)})
    return found


def _probe_rules(folder: Path) -> dict[str, dict[str, str]]:
    """The rules with one annotation per alert, its value (`{{ $value }}`), in place of the
    shipped text that replicator-alerts.test.yml checks; the alerts' own labels."""
    document = _yaml(RULES)
    for rule in _rules(document):
        if "alert" in rule:
            rule["annotations"] = {"value": "{{ $value }}"}
    (folder / RULES.name).write_text(yaml.safe_dump(document))
    return {rule["alert"]: rule.get("labels", {}) for rule in _rules(document) if "alert" in rule}


def _fired(folder: Path, text: str, expected: dict[str, list[dict[str, Any]]]) -> None:
    """promtool evaluates the rules over the file's series at 5m: each alert named fires
    exactly as `expected` says (labels beyond the alert's own and the scrape's, its value)."""
    own = _probe_rules(folder)
    cases = [
        {
            "eval_time": "5m",
            "alertname": name,
            "exp_alerts": [
                {
                    "exp_labels": {**own[name], **SCRAPE_LABELS, **alert["labels"]},
                    "exp_annotations": {"value": alert["value"]},
                }
                for alert in alerts
            ],
        }
        for name, alerts in expected.items()
    ]
    test = {"input_series": _series(text), "interval": "1m", "alert_rule_test": cases}
    document = {"rule_files": [RULES.name], "evaluation_interval": "1m", "tests": [test]}
    (folder / "real.test.yml").write_text(yaml.safe_dump(document))
    done = _promtool("test", "rules", "real.test.yml", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_fire_on_the_files_of_real_runs(db_project, source_conn, schema, tmp_path):
    """A sync that succeeds alerts nothing; one in which a table fails (its source table was
    dropped) fires ReplicatorTablesFailed with the file's count. The time-based alerts are
    left to replicator-alerts.test.yml: promtool's clock starts at 0, a real file's at now."""
    for name in ("a", "b"):
        table = sql.Identifier(schema, name)
        source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(table))
        source_conn.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, 5)").format(table))
    db_project.configure(
        schema, "a", "b", mode="full-refresh", top={"metrics": {"textfile": "replicator.prom"}}
    )
    textfile = db_project.path / "replicator.prom"
    quiet = {"ReplicatorTablesFailed": [], "ReplicatorTableLagHigh": []}
    db_project.sync()
    _fired(tmp_path, textfile.read_text(), {**quiet, "ReplicatorMetricsAbsent": []})
    source_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "b")))
    assert db_project.run("sync").exit_code == 1
    failed = [{"labels": {}, "value": "1"}]
    _fired(tmp_path, textfile.read_text(), {**quiet, "ReplicatorTablesFailed": failed})


# --- the dashboard ------------------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a row's panels


def test_the_dashboard_queries_only_what_the_tool_writes(catalog):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels), "panel ids are unique"
    wrong = {
        f"{panel['title']} {target['refId']}": problems(target["expr"], catalog)
        for panel in panels
        for target in panel.get("targets", [])
    }
    assert len(wrong) >= len([p for p in panels if p["type"] != "row"]), "a panel with no query"
    assert {where: found for where, found in wrong.items() if found} == {}


def test_the_dashboards_variables_list_labels_the_tool_writes(catalog):
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    queries = [v["query"]["query"] for v in variables if v["type"] == "query"]
    assert queries, "the dashboard has its host and table variables"
    for query in queries:
        found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert found is not None, query
        assert problems(found[1], catalog) == [], query
        assert found[2] in set(SCRAPE_LABELS).union(*catalog.labels.values()), query


# --- the systemd units --------------------------------------------------------------------


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections: each key's values, in order (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
        elif "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            section.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_systemd_units_verify(tmp_path):
    """`systemd-analyze verify` of the units as shipped, but for ExecStart's binary: this
    installation's replicator in place of /srv/pipeline's. Its warnings (an unknown key, a
    bad value) do not change its exit code: any line naming a unit fails the test."""
    replicator = Path(sys.executable).with_name("replicator")
    assert replicator.is_file(), replicator
    for unit in SYSTEMD.iterdir():
        text = unit.read_text().replace(SHIPPED_BINARY, str(replicator))
        (tmp_path / unit.name).write_text(text)
    units = sorted(str(p) for p in tmp_path.iterdir())
    done = subprocess.run(
        ["systemd-analyze", "verify", *units], capture_output=True, text=True, cwd=tmp_path
    )
    about_ours = [line for line in (done.stdout + done.stderr).splitlines() if "replicator" in line]
    assert done.returncode == 0 and about_ours == [], done.stdout + done.stderr


def test_the_service_runs_a_sync_and_a_held_lock_is_no_failure():
    service = _unit(SERVICE)["Service"]
    command = service["ExecStart"][0].split()
    assert command[0] == SHIPPED_BINARY and command[1] == "sync"
    project = command[command.index("--project-dir") + 1]
    assert service["WorkingDirectory"] == [project]
    assert project in service["ReadWritePaths"][0].split(), "ProtectSystem=strict: sync-state"
    assert str(Busy.exit_code) in service["SuccessExitStatus"][0].split()
    assert service["Type"] == ["oneshot"]


def test_the_timer_starts_the_service_and_the_failure_hook_exists():
    assert _unit(TIMER)["Timer"]["Unit"] == [SERVICE.name]
    assert _unit(TIMER)["Install"]["WantedBy"] == ["timers.target"]
    hook = _unit(SERVICE)["Unit"]["OnFailure"][0]
    template = re.sub(r"@%n\.service$", "@.service", hook)
    assert template != hook and (SYSTEMD / template).is_file(), hook
