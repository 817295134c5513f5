"""Where the warm helper listens and how its messages travel (`replicator warm`).

Imported by every command before anything else, so it stays to the standard library's
lightest modules: its whole cost when no helper is up is one `stat` of the socket's path.

One helper per installation and per user: the socket lives in the user's cache folder
($REPLICATOR_CACHE_DIR, default ~/.cache/replicator) under a name derived from this Python
environment (`sys.prefix`) and this package's folder, so two virtual environments (or two
checkouts) never run each other's code. Messages are lines of JSON; a request first sends
its length with the client's stdin, stdout and stderr attached (SCM_RIGHTS), then its body.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import zlib
from typing import Any

import replicator

from ...base.cache import cache_root

OFF_ENV = "REPLICATOR_WARM"  # `off`: every command runs in its own process
# What the client passes on to its run (or, when it ignores one, asks the run to ignore too);
# the run starts from their default handlers.
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
PACKAGE_DIR = os.path.dirname(os.path.abspath(replicator.__file__))
SOCKET_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL
_LENGTH = struct.Struct("!I")
_FDS = struct.Struct("3i")


def installation() -> dict[str, str]:
    """What a helper must share with a client to run its commands: the same environment
    (`sys.prefix`: `python` and `python3` of one virtualenv are one) and package folder."""
    return {"prefix": sys.prefix, "package": PACKAGE_DIR}


def socket_path() -> str | None:
    """This installation's socket, or None when the cache is turned off."""
    base = cache_root()
    if base is None:
        return None
    key = zlib.crc32(f"{sys.prefix}\0{PACKAGE_DIR}".encode())
    return os.path.join(os.path.abspath(base), "warm", f"{key:08x}.sock")


def connect(path: str, timeout: float | None = None) -> socket.socket | None:
    """A connection to the helper at `path`; None when none answers there."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def send_request(conn: socket.socket, request: dict[str, Any], stdio: bool = False) -> None:
    """The request, with this process's stdin, stdout and stderr when `stdio`."""
    body = json.dumps(request).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _FDS.pack(0, 1, 2))] if stdio else []
    conn.sendmsg([_LENGTH.pack(len(body))], ancillary)
    conn.sendall(body)


def receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A request and the descriptors that came with it (the helper's side)."""
    header, ancillary, _, _ = conn.recvmsg(_LENGTH.size, socket.CMSG_SPACE(_FDS.size))
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(data) - len(data) % 4
            fds += list(struct.unpack(f"{whole // 4}i", data[:whole]))
    if len(header) != _LENGTH.size:
        raise ConnectionError("a request without its length")
    (length,) = _LENGTH.unpack(header)
    body = b""
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            raise ConnectionError("a request cut short")
        body += chunk
    return json.loads(body), fds


def send_line(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


class Lines:
    """The JSON lines a connection brings, one at a time."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self) -> dict[str, Any] | None:
        """The next message; None at the end of the connection."""
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(4096)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)


def ask(path: str, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """One request, one answer (ping, stop); None when no helper answers."""
    conn = connect(path, timeout)
    if conn is None:
        return None
    with conn:
        try:
            send_request(conn, request)
            return Lines(conn).next()
        except OSError:
            return None
