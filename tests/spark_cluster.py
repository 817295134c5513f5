"""A real Spark standalone cluster for the tests: one master and workers, separate processes.

Started from the installed pyspark's `bin/spark-class` (the pip package has no sbin scripts).
Each worker has its own work folder (where its executors keep their logs and unpack the
shipped archives) and runs its executors' Python as the system `python3`, which does not
have replicator installed: a copy task that runs there runs from the shipped environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from replicator.postgres.pgcluster import free_port
from replicator.spark.session import QUICK_JIT

SPARK_HOME = Path(pyspark.__file__).parent
SYSTEM_PYTHON = "/usr/bin/python3"


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Spark process exited: {log.read_text()[-2000:]}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing answers on port {port}: {log.read_text()[-2000:]}")


@dataclass
class Worker:
    folder: Path
    port: int
    process: subprocess.Popen | None = None

    def tasks_run(self, app_id: str) -> int:
        """How many tasks this worker's executor ran for the application."""
        return sum(
            log.read_text(errors="replace").count("Running task ")
            for log in self.folder.glob(f"work/{app_id}/*/stderr")
        )


@dataclass
class SparkCluster:
    folder: Path
    workers: int = 2
    master_port: int = field(default_factory=free_port)
    master_process: subprocess.Popen | None = None
    nodes: list[Worker] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, args: list[str], folder: Path) -> subprocess.Popen:
        folder.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOG_DIR": str(folder),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": SYSTEM_PYTHON,
            # The master's and workers' own JVMs: C1 alone, as the tool's executors (a
            # master and two workers took 22.5-24.8 CPU-seconds over their first 30 s with
            # both compilers, 12.6-13.3 with C1, and answered in 8 s instead of 12-13).
            "SPARK_DAEMON_JAVA_OPTS": QUICK_JIT,
        }
        for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_DRIVER_PYTHON"):
            env.pop(key, None)  # the workers see no trace of the tests' virtualenv
        # No virtualenv's bin folder (this one, or one the calling shell activated): the
        # executors' `python3` is found on this PATH and must not have replicator.
        venv_bin = str(Path(sys.prefix) / "bin")
        env["PATH"] = os.pathsep.join(
            p
            for p in env.get("PATH", "").split(os.pathsep)
            if p and p != venv_bin and not (Path(p).parent / "pyvenv.cfg").exists()
        )
        log = folder / f"{name}.log"
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            cwd=folder,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> SparkCluster:
        web = free_port()
        self.master_process = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.master_port)),
                *("--webui-port", str(web)),
            ],
            self.folder / "master",
        )
        _wait_for_port(self.master_port, self.master_process, self.folder / "master/master.log")
        self.nodes = [Worker(self.folder / f"worker-{n}", free_port()) for n in range(self.workers)]
        for worker in self.nodes:  # they start side by side
            self._spawn_worker(worker)
        for worker in self.nodes:
            self._wait_registered(worker)
        return self

    def start_worker(self, worker: Worker) -> None:
        """(Re)start one worker and wait until the master knows it."""
        self._spawn_worker(worker)
        self._wait_registered(worker)

    def _spawn_worker(self, worker: Worker) -> None:
        worker.process = self._spawn(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--port", str(worker.port)),
                *("--webui-port", str(free_port())),
                *("--cores", "1", "--memory", "1g"),
                *("--work-dir", str(worker.folder / "work")),
                self.url,
            ],
            worker.folder,
        )

    def _wait_registered(self, worker: Worker, timeout: float = 60) -> None:
        log = worker.folder / "worker.log"
        deadline = time.monotonic() + timeout
        while "Successfully registered with master" not in log.read_text(errors="replace"):
            assert worker.process is not None
            if worker.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not register: {log.read_text()[-2000:]}")
            time.sleep(0.2)

    def kill_worker(self, worker: Worker) -> None:
        """SIGKILL the worker and every executor it started (its process group)."""
        assert worker.process is not None
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait()

    def stop(self) -> None:
        processes = [n.process for n in self.nodes] + [self.master_process]
        for process in processes:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            if process is not None:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
