"""Wall time and peak resident memory of a command's whole process tree (from /proc)."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    seconds: float
    peak_rss_mb: float
    returncode: int


def _children(pid: int) -> list[int]:
    found = []
    try:  # the process may exit while its threads are listed
        tasks = list(Path(f"/proc/{pid}/task").glob("*/children"))
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return found


def _tree_rss_kb(root: int) -> int:
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
        stack += _children(pid)
    return total


def run_measured(command: str, env: dict[str, str] | None = None) -> Measured:
    """Run a shell command; sample the RSS of its process tree every 20 ms."""
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-o", "pipefail", "-c", command],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    seconds = time.monotonic() - started
    done.set()
    sampler.join()
    return Measured(seconds, peak[0] / 1024, code)
