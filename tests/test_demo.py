"""`replicator demo` (what `make demo` runs) on a copy of the repository's demo project."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from replicator.cli import cli

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[1]


def test_demo_syncs_twice_and_verifies_every_table(tmp_path):
    project = tmp_path / "demo"
    project.mkdir()
    shutil.copy(ROOT / "tables-config.json", project)
    shutil.copytree(ROOT / "models", project / "models")
    shutil.copytree(ROOT / "macros", project / "macros")
    result = CliRunner().invoke(cli, ["demo", "--project-dir", str(project)])
    assert result.exit_code == 0, result.output
    for table in ("public.customers", "public.orders", "public.events", "public.countries"):
        assert f"demo: {table}:" in result.stdout
    assert result.stdout.count(", identical") == 4
    assert "DIFFERENT" not in result.stdout
    assert sorted(p.name for p in (project / "sync-state").glob("*.json")) == [
        "public.countries.json",
        "public.customers.json",
        "public.events.json",
        "public.orders.json",
    ]
