"""The options every command shares (`--project-dir`, `-v`, `-q`, `--log-format`), accepted
before the command name as well as after it, as dbt accepts them; and how a command's errors
and interruptions become exit codes."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ..base import interrupts
from ..base.errors import ConfigError, ReplicatorError, UsageError
from ..base.redact import redact
from ..report.logs import configure_logging, error_line

if TYPE_CHECKING:
    from ..project.project import Project

log = logging.getLogger("replicator.cli")

_SHARED = ("project_dir", "verbose", "quiet", "log_format")


def shared_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--project-dir, -v, -q, --log-format: on the group (before the command name) and on
    each command (after it)."""
    options = [
        click.option(
            "--project-dir",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="The project directory (default: the current directory).",
        ),
        click.option("-v", "--verbose", count=True, help="More detail: SQL, tracebacks."),
        click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors."),
        click.option(
            "--log-format",
            type=click.Choice(["text", "json"]),
            default=None,
            help="text (default), or one JSON object per line for everything printed.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _effective(ctx: click.Context, name: str) -> Any:
    """A shared option's value: given after the command name, else before it (on `state`
    or on `replicator` itself); -v counts add up."""
    chain = []
    while ctx is not None:
        chain.append(ctx)
        ctx = ctx.parent
    if name == "verbose":
        return sum(c.params.get(name) or 0 for c in chain)
    for level in chain:  # the innermost given wins
        if level.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            return level.params.get(name)
    return None


def common(command: Callable[..., Any]) -> Callable[..., Any]:
    """The shared options; errors and interruptions become exit codes."""

    @shared_options
    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        for name in _SHARED:
            kwargs.pop(name)
        shared = {name: _effective(ctx, name) for name in _SHARED}
        verbose = shared["verbose"]
        configure_logging(verbose, bool(shared["quiet"]), shared["log_format"] or "text")
        ctx.meta["replicator.verbose"] = verbose
        project_dir = shared["project_dir"] or Path(".")
        try:
            with interrupts.handled():
                code = command(project_dir=project_dir, **kwargs)
        except interrupts.Interrupted as exc:  # cleaned up on the way here
            if not exc.reported:
                log.error("%s", exc.describe())
            sys.exit(exc.exit_code)
        except ReplicatorError as exc:
            _report(exc, verbose)
            sys.exit(exc.exit_code)
        except BrokenPipeError:
            quiet_broken_pipe()
        except Exception as exc:  # a bug: one readable line, the traceback under -v
            _report(exc, verbose, prefix="internal error: ")
            sys.exit(1)
        sys.exit(code or 0)

    return wrapper


def _report(exc: BaseException, verbose: int, prefix: str = "") -> None:
    if verbose and not isinstance(exc, UsageError):  # a usage error's place is its message
        click.echo(redact("".join(traceback.format_exception(exc))), err=True)
    problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
    code = exc.exit_code if isinstance(exc, ReplicatorError) else 1
    for problem in problems:
        click.echo(error_line(f"{prefix}{problem}", code), err=True)


select_option = click.option(
    "-s",
    "--select",
    "names",
    multiple=True,
    metavar="TABLE",
    help=(
        "Only these tables (repeatable; the schema may be left out when the name is unique; "
        "a pattern such as 'tenant_*.orders' selects every configured table it matches)."
    ),
)
json_option = click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (also with --log-format json)."
)


def quiet_broken_pipe() -> None:
    """The reader went away (`| head`): what it wanted was printed; exit 0 without a word."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)


def load_expanded(project_dir: Path) -> Project:
    """The project with its table patterns expanded against the source's catalog (a
    command that works on the selected tables; imported late: plan/ pulls in psycopg)."""
    from ..plan.selection import expand_project
    from ..project.project import Project

    return expand_project(Project.load(project_dir))
