"""The console script and `python -m replicator`: the command handed to the warm helper when
one is up (warm_client.py), else the CLI loaded here with the garbage collector paused.

Loading the CLI creates hundreds of thousands of objects (modules, classes, pydantic models)
and none of them is garbage, yet the collector would scan them again and again as they
arrive: paused, a start takes a fifth less. The modules of the command named (`sync` loads
nearly 400 more) are loaded in the same pause. They are then frozen (never scanned again)
and the collector runs as usual for the command itself.

`--help` and `--version` need click alone, a fraction of a start with the project's modules
(psycopg, pydantic, jinja2), which every other command loads here.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

# What each command imports first (the function behind it imports them again, for free):
# the most-run commands only; any other loads its modules after the pause.
COMMAND_MODULES = {
    "sync": ("replicator.sync.run", "replicator.project.project"),
    "verify": ("replicator.commands.verify", "replicator.project.project"),
    "status": ("replicator.commands.status", "replicator.project.project"),
}


def main() -> None:
    for name in ("stdin", "stdout", "stderr"):  # closed by the caller (`>&-`): Python's None
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w"))  # noqa: SIM115
    from .warm.client import run_in_helper

    code = run_in_helper(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    gc.disable()
    try:
        from .main import CONTEXT
        from .main import main as run

        if {*CONTEXT["help_option_names"], "--version"}.isdisjoint(sys.argv[1:]):
            command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
            for module in COMMAND_MODULES.get(command or "", ()):
                importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()
    run()
