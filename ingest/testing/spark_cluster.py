"""A Spark standalone cluster and a Spark Thrift Server on loopback, from the pyspark wheel alone.

``SparkCluster`` starts ``org.apache.spark.deploy.master.Master`` and N ``org.apache.spark.deploy.worker.Worker``
with pyspark's ``bin/spark-class`` (every daemon on 127.0.0.1, free ports, work and scratch directories in a
temporary directory) and waits until the master reports all workers alive. ``ThriftServer`` submits
``org.apache.spark.sql.hive.thriftserver.HiveThriftServer2`` (what ``sbin/start-thriftserver.sh`` runs; the
pyspark wheel ships ``spark-hive-thriftserver_2.12``) to that cluster with the lakehouse's Spark settings, so dbt's
``thrift`` method (target ``cluster`` of the generated profile) can run on it::

    with SparkCluster(workers=2, cores=1, memory="1g") as cluster:
        conf = {**spark_conf(settings), "spark.master": cluster.master_url}
        with ThriftServer(conf) as thrift:
            ...  # dbt.thrift_host: 127.0.0.1, dbt.thrift_port: thrift.port

Settings reach spark-submit through a properties file (mode 0600, in the temporary directory), not the command
line, so a catalog password never shows in ``ps``. Everything started is stopped on exit, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from ingest.errors import CdclakeError, SetupError

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
LOOPBACK = "127.0.0.1"


class ClusterError(CdclakeError):
    """A daemon of the local Spark cluster did not start (the message has the tail of its output)."""


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (``bin/spark-class``, ``jars/``), matching the client."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise SetupError(f"{home}/bin/spark-class is missing: reinstall pyspark (make setup)")
    return home


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _loopback_environment(base: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # A user's SPARK_CONF_DIR (spark-defaults.conf, spark-env.sh) must not leak into this private cluster.
    conf_dir = base / "conf"
    conf_dir.mkdir(exist_ok=True)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOCAL_HOSTNAME": LOOPBACK,
            "SPARK_LOCAL_DIRS": str(base / "local"),
            "PYSPARK_PYTHON": sys.executable,
            "TZ": "UTC",
        }
    )
    env.update(extra or {})
    return env


class _Daemon:
    """One JVM child process in its own session (so its executors go with it), output to a log file."""

    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, limit: int = 3000) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-limit:].strip()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (Spark's shutdown hooks stop executors and the context), then SIGKILL of its process group."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs: killing it", self.name, timeout_s)
        # Children it left behind (an executor of a killed worker) share its process group, which we created.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout_s)
        self._log.close()


class SparkCluster:
    """A standalone master and ``workers`` workers on 127.0.0.1 (context manager: started on enter).

    ``daemon_java_options`` go to the master's and workers' JVMs (``SPARK_DAEMON_JAVA_OPTS``); executors take
    theirs from the application (``spark.executor.extraJavaOptions``).
    """

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        *,
        daemon_memory: str = "256m",
        daemon_java_options: str = "",
        base_dir: Path | None = None,
        startup_timeout_s: float = 120.0,
    ) -> None:
        if workers < 1 or cores < 1:
            raise ValueError("a cluster needs at least one worker with one core")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.daemon_memory = daemon_memory
        self.daemon_java_options = daemon_java_options
        self.startup_timeout_s = startup_timeout_s
        self._parent = base_dir
        self.base: Path | None = None
        self.port: int | None = None
        self.web_ui_port: int | None = None
        self._daemons: list[_Daemon] = []

    @property
    def master_url(self) -> str:
        if self.port is None:
            raise ClusterError("the cluster is not running: start() it first")
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def web_ui_url(self) -> str:
        if self.web_ui_port is None:
            raise ClusterError("the cluster is not running: start() it first")
        return f"http://{LOOPBACK}:{self.web_ui_port}"

    def start(self) -> SparkCluster:
        if self.base is not None:
            return self
        self.base = Path(tempfile.mkdtemp(prefix="cdclake-spark-", dir=self._parent))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info(
            "spark cluster at %s (%d workers x %d core(s), %s)", self.master_url, self.workers, self.cores, self.memory
        )
        return self

    def _start(self) -> None:
        assert self.base is not None
        daemon_env = {"SPARK_DAEMON_MEMORY": self.daemon_memory, "SPARK_DAEMON_JAVA_OPTS": self.daemon_java_options}
        env = _loopback_environment(self.base, daemon_env)
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.port, self.web_ui_port = free_port(), free_port()
        master = _Daemon(
            "spark master",
            [
                spark_class,
                MASTER_CLASS,
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.web_ui_port),
            ],
            env,
            self.base,
            self.base / "master.log",
        )
        self._daemons.append(master)
        deadline = time.monotonic() + self.startup_timeout_s
        self._wait(lambda: _listening(self.port or 0), master, deadline, "the master to listen")
        for index in range(1, self.workers + 1):
            work_dir = self.base / f"worker-{index}"
            work_dir.mkdir()
            worker = _Daemon(
                f"spark worker {index}",
                [
                    *(spark_class, WORKER_CLASS, "--host", LOOPBACK, "--port", "0", "--webui-port", "0"),
                    *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work_dir)),
                    self.master_url,
                ],
                env,
                self.base,
                self.base / f"worker-{index}.log",
            )
            self._daemons.append(worker)
        self._wait(lambda: self.alive_workers() >= self.workers, master, deadline, f"{self.workers} worker(s)")

    def _wait(self, ready: Callable[[], bool], master: _Daemon, deadline: float, what: str) -> None:
        while not ready():
            for daemon in self._daemons:
                if not daemon.alive:
                    raise ClusterError(
                        f"{daemon.name} exited with code {daemon.process.returncode}; its output:\n{daemon.tail()}"
                    )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {self.startup_timeout_s:.0f}s waiting for {what}; master output:\n{master.tail()}"
                )
            time.sleep(0.25)

    def status(self) -> dict[str, object]:
        """The master's JSON status (``aliveworkers``, ``cores``, ``activeapps``, ...)."""
        with urllib.request.urlopen(f"{self.web_ui_url}/json/", timeout=2.0) as response:  # noqa: S310 (loopback)
            data = json.loads(response.read())
        assert isinstance(data, dict)
        return data

    def alive_workers(self) -> int:
        try:
            alive = self.status().get("aliveworkers", 0)
        except (OSError, ValueError):
            return 0
        return int(alive) if isinstance(alive, int) else 0

    def stop(self) -> None:
        """Workers first (they stop their executors), then the master; the temporary directory goes too."""
        daemons, self._daemons = self._daemons, []
        for daemon in reversed(daemons):
            try:
                daemon.stop()
            except Exception:  # keep stopping the others
                log.exception("stopping %s failed", daemon.name)
        base, self.base = self.base, None
        self.port = self.web_ui_port = None
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def _properties_file(path: Path, conf: Mapping[str, str]) -> None:
    """spark-defaults / java.util.Properties format, readable by us only (it may hold a catalog password)."""
    lines = []
    for key, value in sorted(conf.items()):
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"{key}={escaped}")
    path.touch(mode=0o600)
    path.write_text("\n".join(lines) + "\n")


class ThriftServer:
    """A Spark Thrift Server (HiveServer2 protocol, no authentication) on 127.0.0.1 with the given Spark settings.

    ``conf`` is every Spark setting of the lakehouse (``ingest.lakehouse.spark_conf``) with ``spark.master``
    pointing at the cluster. The server enables Hive support (a Derby metastore, kept in the temporary directory);
    Iceberg tables still resolve through ``spark.sql.defaultCatalog``.
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        *,
        port: int | None = None,
        driver_memory: str = "1g",
        base_dir: Path | None = None,
        startup_timeout_s: float = 180.0,
    ) -> None:
        self.conf = dict(conf)
        self.port = port
        self.driver_memory = driver_memory
        self.startup_timeout_s = startup_timeout_s
        self._parent = base_dir
        self.base: Path | None = None
        self._daemon: _Daemon | None = None

    @property
    def host(self) -> str:
        return LOOPBACK

    def start(self) -> ThriftServer:
        if self._daemon is not None:
            return self
        self.base = Path(tempfile.mkdtemp(prefix="cdclake-thrift-", dir=self._parent))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info("spark thrift server on %s:%d (master %s)", self.host, self.port, self.conf.get("spark.master"))
        return self

    def _start(self) -> None:
        assert self.base is not None
        if self.port is None:
            self.port = free_port()
        scratch = self.base / "hive"
        class_path = [jar for jar in self.conf.get("spark.jars", "").split(",") if jar]
        if self.conf.get("spark.driver.extraClassPath"):
            class_path.append(self.conf["spark.driver.extraClassPath"])
        conf = {
            **self.conf,
            # HiveServer2 runs statements on threads whose context class loader does not see `spark.jars`
            # (ClassNotFoundException: org.apache.iceberg.hadoop.HadoopCatalog): put them on the driver's class path.
            # Executors still get them through spark.jars.
            "spark.driver.extraClassPath": ":".join(class_path),
            "spark.app.name": self.conf.get("spark.app.name", "cdclake-thrift-server"),
            "spark.driver.memory": self.driver_memory,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            # HiveServer2's own settings; Derby metastore and scratch space stay in our directory.
            "spark.hadoop.hive.server2.thrift.bind.host": LOOPBACK,
            "spark.hadoop.hive.server2.thrift.port": str(self.port),
            "spark.hadoop.hive.server2.transport.mode": "binary",
            "spark.hadoop.javax.jdo.option.ConnectionURL": (
                f"jdbc:derby:;databaseName={self.base / 'metastore_db'};create=true"
            ),
            "spark.hadoop.hive.exec.scratchdir": str(scratch / "scratch"),
            "spark.hadoop.hive.exec.local.scratchdir": str(scratch / "local"),
            "spark.hadoop.hive.downloaded.resources.dir": str(scratch / "resources"),
            "spark.hadoop.hive.server2.logging.operation.log.location": str(scratch / "operation_logs"),
            "spark.hadoop.hive.server2.logging.operation.enabled": "false",
        }
        properties = self.base / "spark-thrift.conf"
        _properties_file(properties, conf)
        command = [
            str(spark_home() / "bin" / "spark-submit"),
            "--properties-file",
            str(properties),
            "--class",
            THRIFT_SERVER_CLASS,
            "--name",
            conf["spark.app.name"],
            "spark-internal",
        ]
        env = _loopback_environment(self.base, {"SPARK_SUBMIT_OPTS": f"-Dderby.system.home={self.base}"})
        self._daemon = _Daemon("spark thrift server", command, env, self.base, self.base / "thrift-server.log")
        deadline = time.monotonic() + self.startup_timeout_s
        while not _listening(self.port):
            if not self._daemon.alive:
                raise ClusterError(
                    f"the thrift server exited with code {self._daemon.process.returncode}; "
                    f"its output:\n{self._daemon.tail()}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the thrift server did not listen on {self.host}:{self.port} within "
                    f"{self.startup_timeout_s:.0f}s; its output:\n{self._daemon.tail()}"
                )
            time.sleep(0.5)

    def output_tail(self, limit: int = 3000) -> str:
        return "" if self._daemon is None else self._daemon.tail(limit)

    def stop(self) -> None:
        daemon, self._daemon = self._daemon, None
        if daemon is not None:
            daemon.stop(timeout_s=30.0)
        base, self.base = self.base, None
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)

    def __enter__(self) -> ThriftServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
