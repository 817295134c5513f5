"""`check`'s findings about Spark: Java and the JDBC driver, the master, and what a
cluster's executors get and can reach."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ... import __version__
from ...base.errors import ReplicatorError
from ...project.project import Project
from ...project.settings import DEST_URL, SOURCE_URL, SPARK_MASTER
from ...project.spark_remote import Remote
from ...spark.connect_session import server_version
from ...spark.engine_choice import EngineChoice
from ...spark.executor_env import platform_tag
from ...spark.runner import spark_error_message
from ...spark.session import JDBC_PACKAGE, is_local, jdbc_jar
from .findings import Finding


def spark_findings(project: Project) -> Iterator[Finding]:
    if project.settings.spark_remote:  # no JVM here: the server has what Spark needs
        yield _spark_remote(project)
        return
    yield from _spark_prerequisites(project)
    yield from _spark_master(project)
    yield from _spark_executors(project)
    yield from _executor_reach(project)


def _spark_remote(project: Project) -> Finding:
    """Whether the Spark Connect server answers (a session opened and released), and its
    Spark version."""
    settings = project.settings
    assert settings.spark_remote is not None
    remote = Remote.parse(settings.spark_remote)
    kind = "warm Spark server" if settings.warm_server else "Spark Connect server"
    try:
        version = server_version(remote)
    except ReplicatorError as exc:
        return Finding("error", "spark", str(exc))
    except Exception as exc:  # the server answered its port, then failed the session
        return Finding("error", "spark", f"the {kind} at {remote}: {spark_error_message(exc)}")
    choice = EngineChoice.for_settings(settings).describe()
    used = f"; copies run on it {choice}, other copies in this process"
    return Finding(
        "ok",
        "spark",
        f"{kind} at {remote} answers: Spark {version}" + (used if settings.warm_server else ""),
    )


def _spark_prerequisites(project: Project) -> Iterator[Finding]:
    """Java 17+ and the PostgreSQL JDBC driver, which the Spark path needs."""

    java = shutil.which("java", path=None)
    if java is None:
        yield Finding(
            "error",
            "spark",
            "java not found on PATH (Spark needs Java 17+)",
            "apt-get install openjdk-17-jre-headless, or set JAVA_HOME and PATH",
        )
    else:
        version = subprocess.run(
            [java, "-version"], capture_output=True, text=True, stdin=subprocess.DEVNULL
        ).stderr.splitlines()
        yield Finding("ok", "spark", f"java: {version[0] if version else java}")
    conf = project.settings.spark_conf
    if "spark.jars" in conf or "spark.jars.packages" in conf:
        yield Finding("ok", "spark", "JDBC driver: from spark.conf")
    elif (jar := jdbc_jar()) is not None:
        state = "ok" if jar.is_file() else "error"
        yield Finding(
            state, "spark", f"JDBC driver: {jar}" + ("" if jar.is_file() else " does not exist")
        )
    else:
        yield Finding(
            "warn",
            "spark",
            f"no local JDBC driver: Spark will download {JDBC_PACKAGE} from Maven Central",
            "apt-get install libpostgresql-jdbc-java, or set REPLICATOR_JDBC_JAR",
        )


def _spark_master(project: Project) -> Iterator[Finding]:
    """A cluster master (spark://, k8s://, mesos://) must answer on its port; local[*] needs
    nothing, yarn is found through HADOOP_CONF_DIR and is not probed."""

    master = project.settings.spark_master or "local[*]"
    if master.startswith("local"):
        yield Finding("ok", "spark", f"master {master} (in this process)")
        return
    if master == "yarn":
        yield Finding("ok", "spark", "master yarn (found through HADOOP_CONF_DIR; not probed)")
        return
    address = master.removeprefix("k8s://")
    scheme, _, rest = (address if "://" in address else f"tcp://{address}").partition("://")
    default_port = {"spark": 7077, "mesos": 5050, "https": 443, "http": 80}.get(scheme)
    fix = f"start the master or fix spark.master / {SPARK_MASTER}"
    # spark://h1:7077,h2:7077 lists standby masters: one answering is enough.
    problems = []
    for netloc in rest.split("/")[0].split(","):
        try:
            parts = urlsplit(f"tcp://{netloc}")
            host, port = parts.hostname, parts.port or default_port
        except ValueError:
            host, port = None, None
        if not host or not port:
            problems.append(f"{netloc}: no host and port")
            continue
        try:
            with socket.create_connection((host, port), timeout=5):
                pass
        except OSError as exc:
            problems.append(f"{host}:{port} not reachable ({exc.strerror or exc})")
            continue
        yield Finding("ok", "spark", f"master {master}: {host}:{port} answers")
        return
    yield Finding("error", "spark", f"master {master}: {'; '.join(problems)}", fix)


def _spark_executors(project: Project) -> Iterator[Finding]:
    """What a cluster's executors run our tasks with (nothing to say for a local master)."""
    settings = project.settings
    if is_local(settings.spark_master):
        return
    if settings.ship_environment:
        tag = platform_tag()
        yield Finding(
            "ok",
            "spark",
            "executors get replicator's Python environment with each run (spark.archives, "
            f"built for {tag}): their python3 must be Python "
            f"{sys.version_info.major}.{sys.version_info.minor} on that platform",
        )
    else:
        yield Finding(
            "ok",
            "spark",
            "executors use their own Python (spark.ship_environment is false): it needs "
            f"replicator {__version__} and its dependencies installed",
        )


def _executor_reach(project: Project) -> Iterator[Finding]:
    """On a cluster the copy tasks connect from the executors' hosts: a loopback host or a
    socket in a connection string is each executor's own machine, not the database's."""
    if is_local(project.settings.spark_master):
        return
    for variable in (SOURCE_URL, DEST_URL):
        try:
            url = project.env.optional_connection(variable)
            hosts = (conninfo_to_dict(url).get("host") or "") if url else None
        except (ReplicatorError, psycopg.Error):
            continue  # the connection finding says what is wrong with it
        if hosts is None:
            continue
        local = [h for h in hosts.split(",") if h in _LOOPBACK or h.startswith(("/", "127."))]
        if local or not hosts:
            yield Finding(
                "warn",
                "spark",
                f"{variable} names {', '.join(local) or 'no host (a local socket)'}: on a "
                "cluster each executor connects from its own host, where that is not the "
                "database",
                "use a host name or address the executors can reach",
            )


_LOOPBACK = frozenset({"localhost", "::1"})
