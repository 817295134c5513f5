"""Real dbt-core 1.10 with dbt-postgres 1.9, in a throwaway virtualenv of the suite's cache
(kept between runs, made once under a lock), as bench/peers.py installs the peers: the
project's own .venv never gets dbt's dependencies."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from conftest import TEST_CACHE

# dbt 1.10 reads `loaded_at_query`; 1.12 does not install here (its parser downloads a wheel
# when installed)
PACKAGES = ("dbt-core>=1.10,<1.11", "dbt-postgres>=1.9,<1.10")
VENV = TEST_CACHE / "dbt-1.10"


def dbt_program() -> Path:
    """The `dbt` of the throwaway virtualenv, installed first when missing."""
    program = VENV / "bin" / "dbt"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / "dbt-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not program.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            installed = subprocess.run(
                [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", *PACKAGES],
                capture_output=True,
                text=True,
            )
            assert installed.returncode == 0, installed.stderr[-3000:]
    return program
