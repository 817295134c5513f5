"""A `replicator sync --follow` process for tests, its log read as it comes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any


class Follow:
    """`sync --follow --interval 0.2` of a project, its stderr gathered line by line."""

    def __init__(self, project: Any, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "replicator", "sync", "--follow", "--interval", "0.2"]
        self.process = subprocess.Popen(
            [*command, "--project-dir", str(project.path)],
            env={**os.environ, **project.env, **env},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(self.process.stderr), daemon=True
        )
        self._reader.start()

    def runs_finished(self) -> int:
        """How many runs it said it finished so far."""
        return sum("follow: run " in line for line in list(self.lines))

    def stop(self, signum: int) -> tuple[int, str]:
        """Send the signal; its exit code and everything it logged."""
        self.process.send_signal(signum)
        self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        return self.process.returncode, "".join(self.lines)
