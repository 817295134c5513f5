"""Throwaway PostgreSQL clusters for tests and `replicator demo`: initdb in a folder, a free
port, sockets in the folder, stopped and removed at the end.

initdb refuses to run as root, so as root the folder is handed to the `postgres` user and
every server binary runs through `runuser -u postgres --`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path

PG_BIN_ENV = "REPLICATOR_PG_BIN"


def find_pg_bin() -> Path:
    """The folder holding initdb and pg_ctl: $REPLICATOR_PG_BIN, Debian's newest, or PATH."""
    override = os.environ.get(PG_BIN_ENV)
    candidates = [override] if override else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for folder in candidates:
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install the `postgresql` "
        f"package or set {PG_BIN_ENV}"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PgCluster:
    """One throwaway server. `url()` gives a libpq URI for user postgres over TCP."""

    def __init__(self, folder: Path, *, logical: bool = False, durable: bool = False) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.logfile = folder / "server.log"
        self.logical = logical
        self.durable = durable
        self.port = free_port()
        self.bin = find_pg_bin()
        self.running = False

    def _command(self, *args: str) -> list[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return command

    def stop_command(self) -> list[str]:
        """The exact command that stops this server (what `demo --keep` prints)."""
        return self._command("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = self._command(*args)
        return subprocess.run(
            command, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )

    def start(self) -> PgCluster:
        self._own_folder()
        try:
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"initdb failed: {exc.stderr.strip()}") from None
        return self._configure_and_start({})

    def start_standby(self, primary: PgCluster | int) -> PgCluster:
        """A hot standby of the server on `primary` (a cluster, or a port on 127.0.0.1),
        streaming from it: a base backup of it, then started in recovery."""
        port = primary if isinstance(primary, int) else primary.port
        self._own_folder()
        try:
            self._run(
                "pg_basebackup",
                *("-h", "127.0.0.1", "-p", str(port), "-U", "postgres"),
                *("-D", str(self.data), "-R", "-X", "stream", "-c", "fast"),
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"pg_basebackup failed: {exc.stderr.strip()}") from None
        return self._configure_and_start({"hot_standby": "on"})

    def _own_folder(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # The server user must reach its folder: a private temp dir above it gets o+x.
            parent = self.folder.parent
            parent.chmod(parent.stat().st_mode | 0o711)
            shutil.chown(self.folder, "postgres", "postgres")

    def _configure_and_start(self, extra: dict[str, str]) -> PgCluster:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.folder}'",
            "max_connections": "100",
            "wal_level": "logical" if self.logical else "replica",
            # a log source keeps each commit's time: the tests check a history table's
            # versions against pg_xact_commit_timestamp (docs/guides/history.md)
            "track_commit_timestamp": "on" if self.logical else "off",
            "logging_collector": "off",
            **extra,
        }
        if not self.durable:  # throwaway data: trade crash safety for speed
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        try:
            self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "start"
            )
        except subprocess.CalledProcessError as exc:
            log = self.logfile.read_text(errors="replace") if self.logfile.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr}\n{log}") from None
        self.running = True
        return self

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def restart(self) -> None:
        """Stop (fast: every session is terminated) and start again, on the same port."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-m", "fast", "-w", "restart"
        )

    def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
