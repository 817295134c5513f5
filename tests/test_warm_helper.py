"""The warm helper (`replicator warm start`): a command it runs behaves as one run in its own
process (the same copy, output, exit code and signals), with the client's environment and
folder; it is never used by another installation, and stops once its code changed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbcompare import assert_same_table, leftovers
from engines import IN_PROCESS
from psycopg import sql
from waiting import wait_for

import replicator
from replicator.base.identifiers import TableName
from replicator.cli.warm import wire


class Helper:
    """A helper of this checkout, in a cache folder of the test's own."""

    def __init__(self, cache: Path, **env: str) -> None:
        self.env = {**os.environ, "REPLICATOR_CACHE_DIR": str(cache), **env}

    def cli(self, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "replicator", *args],
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kw,
        )

    def run(self, *args: str, env: dict[str, str] | None = None, **kw):
        process = self.cli(*args, env=env, **kw)
        out, err = process.communicate(timeout=300)
        return process.returncode, out, err

    def status(self) -> dict:
        code, out, err = self.run("warm", "status", "--json")
        report = json.loads(out)
        assert (code == 0) == report["running"], (code, out, err)
        return report

    def commands_run(self) -> int:
        return self.status()["commands_run"]


@pytest.fixture
def helper(tmp_path: Path) -> Iterator[Helper]:
    """Started in an environment without the test's connection settings: a command that
    works through it took the client's."""
    started = Helper(tmp_path / "cache")
    code, out, err = started.run("warm", "start")
    assert code == 0, err
    assert "warm helper started" in out, out
    yield started
    started.run("warm", "stop")


@pytest.fixture
def copy_helper(tmp_path: Path) -> Iterator[tuple[Helper, Path]]:
    """A helper of a copy of the package (first on PYTHONPATH), and that copy's
    `__init__.py`: a test may change it without the helpers of tests running beside it
    seeing their code change too."""
    copy = tmp_path / "package"
    shutil.copytree(
        Path(replicator.__file__).parent,
        copy / "replicator",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    # PYTHONSAFEPATH: `python -m` must not find the checkout's package in the working folder
    started = Helper(tmp_path / "cache", PYTHONPATH=str(copy), PYTHONSAFEPATH="1")
    code, _, err = started.run("warm", "start")
    assert code == 0, err
    assert started.run("--version")[0] == 0
    assert started.commands_run() == 1, "the clients and the helper load the same copy"
    yield started, copy / "replicator" / "__init__.py"
    started.run("warm", "stop")


def _changed(module: Path) -> None:
    """As an upgrade or an edit changes it: another mtime."""
    before = module.stat()
    os.utime(module, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))


def _table(conn, schema: str, rows: int) -> None:
    table = sql.Identifier(schema, "orders")
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, updated_at timestamptz)").format(
            table
        )
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, md5(g::text), now() FROM generate_series(1, %s) g"
        ).format(table),
        (rows,),
    )


def _project_env(db_project) -> dict[str, str]:
    return {**db_project.env, **IN_PROCESS}


def test_a_sync_through_the_helper_copies_as_one_in_its_own_process(
    helper, db_project, source_conn, dest_conn, schema
):
    """Run from the project's folder (no --project-dir), with the connection settings only
    in the client's environment: the child took both; the helper counted the command. With
    REPLICATOR_WARM=off the next one runs in its own process."""
    _table(source_conn, schema, 500)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    code, _, err = helper.run("sync", env=_project_env(db_project), cwd=db_project.path)
    assert code == 0, err
    assert f"{schema}.orders: full_reload" in err, err
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500
    assert helper.commands_run() == 1
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'x', updated_at = now() WHERE id <= 7").format(
            sql.Identifier(schema, "orders")
        )
    )
    code, _, err = helper.run(
        "sync", env={**_project_env(db_project), "REPLICATOR_WARM": "off"}, cwd=db_project.path
    )
    assert code == 0, err
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500
    assert helper.commands_run() == 1  # the status commands themselves run in-process


def test_output_and_exit_codes_are_those_of_a_run_without_it(helper, db_project, tmp_path):
    """Usage errors (exit 2, both log formats), an unknown command, --version: the same
    stdout, stderr and exit code with the helper and without it."""
    db_project.write_config('{"tables": [{"name": "public.x", "mode": "bogus"}]}')
    cases = [
        ("sync", "--project-dir", str(db_project.path)),
        ("sync", "--log-format", "json", "--project-dir", str(db_project.path)),
        ("sync", "--project-dir", str(tmp_path / "none")),
        ("no-such-command",),
        ("--version",),
        ("compile", "--project-dir", str(db_project.path)),
    ]
    for args in cases:
        warm = helper.run(*args, env=db_project.env)
        alone = helper.run(*args, env={**db_project.env, "REPLICATOR_WARM": "off"})
        assert _timeless(warm) == _timeless(alone), args
    assert helper.run("sync", "--project-dir", str(db_project.path))[0] == 2
    assert helper.commands_run() == len(cases) + 1


def test_sigterm_to_the_client_interrupts_the_run(helper, cdc_project, writer, schema, tmp_path):
    """SIGTERM (cron's timeout, systemd) to the client reaches the run, which stops as it
    would alone: exit 143, its own message, no traceback. Other commands run meanwhile."""
    client, _, _ = _sync_at_its_drain(helper, cdc_project, writer, schema, tmp_path)
    assert helper.run("--version")[0] == 0  # another command meanwhile: its own child
    assert helper.status()["running_now"] == 1
    client.send_signal(signal.SIGTERM)
    _, err = client.communicate(timeout=120)
    assert client.returncode == 143, err
    assert "run interrupted by SIGTERM" in err, err
    assert "Traceback" not in err, err
    assert helper.status()["running_now"] == 0


def test_a_signal_the_client_ignores_is_ignored_by_its_run(
    helper, cdc_project, writer, schema, tmp_path, source_conn, dest_conn
):
    """`nohup replicator sync`: the client ignores SIGHUP, and so does its run, which goes on
    to the end as it would without the helper."""
    client, pause, _ = _sync_at_its_drain(
        helper,
        cdc_project,
        writer,
        schema,
        tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    client.send_signal(signal.SIGHUP)
    pause.touch()
    _, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert assert_same_table(source_conn, dest_conn, schema, "events") == 1003


def test_a_client_killed_mid_run_takes_its_run_down(
    helper, cdc_project, writer, schema, tmp_path, dest_conn, source_conn
):
    """A client killed outright (SIGKILL) cannot relay anything: the helper sees it gone and
    stops its run with SIGTERM, which cleans up; the next run converges."""
    client, _, env = _sync_at_its_drain(helper, cdc_project, writer, schema, tmp_path)
    client.kill()
    client.wait(timeout=60)
    wait_for(lambda: helper.status()["running_now"] == 0, 120, "the helper's run to stop")
    code, _, err = helper.run(
        "sync", "--project-dir", str(cdc_project.path), env=env | {"REPLICATOR_PAUSE_AT": ""}
    )
    assert code == 0, err
    assert assert_same_table(source_conn, dest_conn, schema, "events") == 1003
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []


def test_a_run_killed_by_a_signal_kills_its_client_alike(helper, db_project, source_conn, schema):
    """The run dies by SIGKILL (a failpoint, as an OOM kill would): the client dies by the
    same signal, as the shell would have seen without the helper."""
    _table(source_conn, schema, 50)
    db_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    env = {**_project_env(db_project), "REPLICATOR_FAILPOINT": "after-load-before-swap"}
    code, _, err = helper.run("sync", "--project-dir", str(db_project.path), env=env)
    assert code == -signal.SIGKILL, err


def test_the_helper_forks_from_a_single_thread(helper):
    """A thread of the helper's (numpy's OpenBLAS starts one per core) would be missing from
    every child, holding whatever lock it held at the fork."""
    pid = helper.status()["pid"]
    assert os.listdir(f"/proc/{pid}/task") == [str(pid)]


def test_the_helper_holds_what_its_commands_load_before_any_runs(helper):
    """Its children fork with libpq (psycopg), pydantic's core and numpy (the log drain's
    rows) mapped already: a helper that loads only the CLI leaves each command to load them
    again, the very start it is there to save."""
    maps = Path(f"/proc/{helper.status()['pid']}/maps").read_text()
    for library in ("/libpq", "/_pydantic_core", "/_multiarray_umath"):
        assert library in maps, f"{library} is not loaded in the helper"


def test_the_helper_stops_once_its_code_changed(copy_helper):
    """A module's file changed under the helper (an upgrade, an edit): the next command runs
    in its own process, with the new code, and the helper stops."""
    helper, module = copy_helper
    _changed(module)
    code, out, err = helper.run("--version")
    assert (code, out.strip()) == (0, f"replicator, version {replicator.__version__}")
    assert "warm helper was started before replicator or a library changed" in err, err
    code, out, _ = helper.run("warm", "status")
    assert code == 1, out
    assert "not running" in out


def test_warm_start_replaces_a_helper_of_older_code(copy_helper):
    """After an upgrade `warm status` says the helper is out of date, and `warm start`
    replaces it with one of the new code, which then runs the commands."""
    helper, module = copy_helper
    old_pid = helper.status()["pid"]
    _changed(module)
    code, out, _ = helper.run("warm", "status")
    assert code == 0 and "changed since it started" in out, out
    code, out, err = helper.run("warm", "start")
    assert code == 0 and "warm helper started" in out, (out, err)
    status = helper.status()
    assert status["pid"] != old_pid and status["current"], status
    assert helper.run("--version")[0] == 0
    assert helper.commands_run() == 1


def test_what_the_child_cannot_take_runs_in_the_client(
    helper, db_project, source_conn, schema, tmp_path
):
    """A closed stderr or stdout (`2>&-`): /dev/null takes its place before the socket could
    take its number (the run's output would go to the helper, which would stop it), and the
    command runs as it would without the helper. A working folder that was removed: the
    command runs in the client."""
    _table(source_conn, schema, 20)
    db_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    args = ("sync", "-q", "--project-dir", str(db_project.path))
    process = helper.cli(*args, env=_project_env(db_project), preexec_fn=lambda: os.close(2))
    process.stderr.close()
    assert process.wait(timeout=300) == 0
    process = helper.cli(*args, env=_project_env(db_project), preexec_fn=lambda: os.close(1))
    process.stdout.close()
    assert process.wait(timeout=300) == 0, process.stderr.read()  # stdout closed: no output
    gone = tmp_path / "gone"
    gone.mkdir()
    process = helper.cli(*args, env=_project_env(db_project), cwd=gone, preexec_fn=gone.rmdir)
    assert process.communicate(timeout=300)[0] == "" and process.returncode == 0
    assert helper.commands_run() == 2  # the two runs with a closed descriptor


def test_the_run_takes_the_clients_nice_value(helper, cdc_project, writer, schema, tmp_path):
    """`nice -n 7 replicator sync` in a crontab: the child that does the work runs at nice 7,
    not at the helper's."""
    client, pause, _ = _sync_at_its_drain(
        helper, cdc_project, writer, schema, tmp_path, preexec_fn=lambda: os.nice(7)
    )
    nice = [_nice(pid) for pid in _children(helper.status()["pid"])]
    pause.touch()
    _, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert nice == [7]


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry))
    return found


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_env_only_settings_in_dotenv_are_said_to_be_ignored(db_project):
    """REPLICATOR_WARM (and REPLICATOR_CACHE_DIR) are read before a project is: in .env
    they do nothing, and the run says so instead of calling them unknown."""
    db_project.write(".env", "REPLICATOR_WARM=off\n")
    db_project.write_config({"tables": []})
    result = db_project.run("ls")
    assert "REPLICATOR_WARM is read from the process environment only" in result.stderr
    assert "unknown setting" not in result.stderr


def test_warm_status_without_a_cache_folder_says_not_running(tmp_path):
    off = Helper(tmp_path)
    off.env["REPLICATOR_CACHE_DIR"] = "off"
    code, out, _ = off.run("warm", "status", "--json")
    assert code == 1 and json.loads(out)["running"] is False, out


PIDS_CGROUP = Path("/sys/fs/cgroup/pids")  # cgroup v1's process-count controller


@contextlib.contextmanager
def _no_more_processes(pid: int) -> Iterator[None]:
    """The process alone in a pids cgroup with a limit of what it has: its fork fails with
    EAGAIN, as under a user's process limit (which root, running the tests, would not get)."""
    group = PIDS_CGROUP / f"replicator-test-{pid}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"no pids cgroup here to limit a process's forks: {exc}")
    try:
        (group / "cgroup.procs").write_text(str(pid))
        (group / "pids.max").write_text("1")
        yield
    finally:
        with contextlib.suppress(OSError):  # the process may have died (the old code did)
            (PIDS_CGROUP / "cgroup.procs").write_text(str(pid))
        group.rmdir()


def test_a_helper_that_cannot_fork_lets_the_command_run_by_itself(helper):
    """At a process limit the helper cannot fork: the command runs in its client, as it
    would without the helper, and the helper stays up for the commands after."""
    with _no_more_processes(helper.status()["pid"]):
        code, out, err = helper.run("--version")
        assert (code, out.strip()) == (0, f"replicator, version {replicator.__version__}"), err
        assert helper.status()["running"], "the helper outlived the failed fork"
        assert helper.commands_run() == 0
    assert helper.run("--version")[0] == 0
    assert helper.commands_run() == 1


def test_a_helper_whose_socket_was_removed_stops(helper):
    """No command could reach it any more (a cleaner emptied the folder): it exits rather
    than linger for good."""
    status = helper.status()
    os.unlink(status["socket"])
    wait_for(lambda: not Path(f"/proc/{status['pid']}").exists(), 60, "the helper to exit")


def test_another_installation_never_reaches_this_helper(helper, tmp_path):
    """The socket's name comes from the Python environment and the package folder: another
    virtual environment (here, another sys.prefix) looks elsewhere, and finds nothing."""
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.prefix = '/opt/other'; "
            "from replicator.cli.warm import wire; print(wire.socket_path())",
        ],
        env=helper.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = helper.status()["socket"]
    assert other != ours and Path(ours).exists() and not Path(other).exists()


def test_warm_start_says_why_it_cannot_start(tmp_path):
    """No cache folder, or one whose socket path would be too long: exit 2, what and how to
    fix it, nothing started."""
    off = Helper(tmp_path)
    off.env["REPLICATOR_CACHE_DIR"] = "off"
    code, _, err = off.run("warm", "start")
    assert code == 2 and "REPLICATOR_CACHE_DIR is off" in err, err
    deep = tmp_path / ("d" * 90)
    long = Helper(deep)
    code, _, err = long.run("warm", "start")
    assert code == 2 and "set REPLICATOR_CACHE_DIR to a shorter folder" in err, err
    assert not (deep / "warm").exists() or not any((deep / "warm").glob("*.sock"))
    assert wire.SOCKET_PATH_MAX == 107


def _timeless(result: tuple[int, str, str]) -> tuple[int, str, str]:
    """A command's result without the time on each JSON log line."""
    code, out, err = result
    return code, out, re.sub(r'"time": "[^"]*"', '"time": ""', err)


def _sync_at_its_drain(
    helper: Helper, project, writer, schema: str, tmp_path: Path, **popen
) -> tuple[subprocess.Popen, Path, dict[str, str]]:
    """A `sync` of a new `cdc` table through the helper, waiting before its drain until the
    test creates the pause file: the client, that file and the run's environment."""
    _cdc_table(project, writer, schema)
    pause = tmp_path / "pause"
    env = {**_project_env(project), "REPLICATOR_PAUSE_AT": f"cdc-before-drain={pause}"}
    client = helper.cli("sync", "--project-dir", str(project.path), env=env, **popen)
    wait_for(lambda: Path(f"{pause}.reached").exists(), 120, "the run at its drain")
    return client, pause, env


def _cdc_table(project, writer, schema: str) -> None:
    events = sql.Identifier(schema, "events")
    writer.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(events))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, md5(g::text) FROM generate_series(1, 1000) g").format(
            events
        )
    )
    project.write_config({"tables": [{"name": f"{schema}.events", "mode": "cdc"}]})
    first = project.run("sync", env=IN_PROCESS)
    assert first.exit_code == 0, first.output
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'new' FROM generate_series(1001, 1003) g").format(events)
    )
