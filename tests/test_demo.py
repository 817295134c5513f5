"""`replicator demo` (what `make demo` runs): two syncs and an md5 check of every table, in a
temporary copy, so that a real project it is run in is left exactly as it was."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli.main import cli

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_demo_leaves_the_project_untouched_and_keep_prints_working_commands(tmp_path, httpserver):
    """Run inside a project that has sync-state and a webhook: the demo syncs its own copy,
    posts nothing, and with --keep prints commands that really stop and remove what it
    kept."""
    project = tmp_path / "demo"
    project.mkdir()
    config = json.loads((ROOT / "tables-config.json").read_text())
    config["webhook"] = {"url": httpserver.url_for("/hook")}
    (project / "tables-config.json").write_text(json.dumps(config))
    shutil.copytree(ROOT / "models", project / "models")
    shutil.copytree(ROOT / "macros", project / "macros")
    (project / "sync-state").mkdir()
    (project / "sync-state" / "public.orders.json").write_text('{"a real": "state"}')
    before = _snapshot(project)
    result = CliRunner().invoke(
        cli,
        ["demo", "--keep", "--project-dir", str(project)],
        env={"REPLICATOR_WEBHOOK_URL": httpserver.url_for("/env-hook")},
    )
    commands = [
        shlex.split(line)
        for line in result.stdout.split("stop and remove them with:\n", 1)[-1].splitlines()
        if line.startswith("  ")
    ]
    try:
        assert result.exit_code == 0, result.output
        for table in ("public.customers", "public.orders", "public.events", "public.countries"):
            assert f"demo: {table}:" in result.stdout
        assert result.stdout.count(", identical") == 4
        assert "DIFFERENT" not in result.stdout
        assert _snapshot(project) == before, "the project's files are exactly as they were"
        assert httpserver.log == [], "no webhook was posted"
        assert "<dir>" not in result.stdout
        assert len(commands) == 3, result.stdout
    finally:
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (command, done.stderr)
    kept = Path(commands[-1][-1])
    assert not kept.exists()


def test_the_demo_runs_in_a_project_init_just_made(tmp_path):
    """A newcomer's first two commands: every table the scaffold lists is made and checked."""
    project = tmp_path / "pipeline"
    runner = CliRunner()
    assert runner.invoke(cli, ["init", str(project)]).exit_code == 0
    result = runner.invoke(cli, ["demo", "--project-dir", str(project)])
    assert result.exit_code == 0, result.output
    tables = json.loads((project / "tables-config.json").read_text())["tables"]
    assert result.stdout.count(", identical") == len(tables) == 4, result.stdout
