"""The run lock: a second process is refused with exit 75; a killed holder frees it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

_HOLDER = """
import sys, time
from pathlib import Path
from replicator.project.runlock import run_lock
with run_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold(state_dir):
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(state_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_process_gets_75_then_lock_is_freed_by_sigkill(project):
    project.write_config({"tables": [{"name": "public.orders", "mode": "full-refresh"}]})
    holder = _hold(project.path / "sync-state")
    try:
        result = project.run("refresh", "public.orders")
        assert result.exit_code == 75
        assert f"holds the lock {project.path / 'sync-state' / '.lock'}" in result.stderr
        assert f"pid {holder.pid}" in result.stderr
        assert not (project.path / "sync-state" / "public.orders.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.time() + 5
    while True:
        result = project.run("refresh", "public.orders")
        if result.exit_code != 75 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert result.exit_code == 0, result.output
    state = json.loads((project.path / "sync-state" / "public.orders.json").read_text())
    assert state["pending_full_reload"] is True


def test_separate_process_exit_code_is_75(project):
    """Through the real console script, as cron would run it."""
    project.write_config({"tables": [{"name": "public.orders", "mode": "full-refresh"}]})
    holder = _hold(project.path / "sync-state")
    try:
        proc = project.run_process("state", "reset", "public.orders")
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 75, proc.stderr
    assert "another replicator process" in proc.stderr
