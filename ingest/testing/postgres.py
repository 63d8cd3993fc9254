"""A private PostgreSQL cluster for a server-backed Iceberg JDBC catalog (tests, benchmarks, trials).

``PrivatePostgres`` runs ``initdb`` (trust authentication) in a temporary directory, starts the server on a free
loopback port with ``pg_ctl -w start``, creates a database and always stops the server and removes the directory
on exit::

    with PrivatePostgres(database="iceberg") as pg:
        catalog_uri = pg.sqlalchemy_uri  # postgresql+psycopg2://postgres@127.0.0.1:PORT/iceberg

PostgreSQL refuses to run as root; as root, ``initdb``/``pg_ctl`` run as the ``postgres`` system user via
``runuser -u postgres``. The server binaries must be on PATH (Debian: ``postgresql``). By default the cluster
trades durability for speed (``fsync=off``): it is thrown away on exit anyway.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from ingest.errors import CdclakeError, SetupError

log = logging.getLogger(__name__)

SUPERUSER = "postgres"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
# Throw-away clusters do not need crash safety; these make catalog commits cheap.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class PostgresError(CdclakeError):
    """The private PostgreSQL cluster could not be created, started or stopped (the message says why)."""


def server_program(name: str) -> str:
    """A PostgreSQL server program (initdb, pg_ctl): on PATH, else the newest in Debian's
    /usr/lib/postgresql/<version>/bin, which the postgresql package does not put on PATH."""
    found = shutil.which(name)
    if found is not None:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: [int(part) for part in re.findall(r"[0-9]+", path.parent.parent.name)],
    )
    if not versions:
        raise SetupError(f"`{name}` is not installed: run `make setup` (it installs Debian's postgresql package)")
    return str(versions[-1])


def server_available() -> bool:
    try:
        server_program("initdb"), server_program("pg_ctl")
    except SetupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _system_user() -> str | None:
    """The user to run the server as: ourselves, or (as root) the ``postgres`` system user."""
    if os.geteuid() != 0:
        return None
    for name in (SUPERUSER, "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        if shutil.which("runuser") is None:
            raise SetupError("running as root needs `runuser` (util-linux) to start PostgreSQL as another user")
        return name
    raise SetupError("running as root but there is no 'postgres' system user to run PostgreSQL as")


class PrivatePostgres:
    """A PostgreSQL server of our own on 127.0.0.1 (context manager: started on enter, removed on exit)."""

    def __init__(
        self,
        database: str = "iceberg",
        *,
        port: int | None = None,
        durable: bool = False,
        settings: Mapping[str, str] | None = None,
        startup_timeout_s: int = 60,
        base_dir: Path | None = None,
    ) -> None:
        if not _IDENTIFIER.match(database):
            raise ValueError(f"database name {database!r} must match {_IDENTIFIER.pattern}")
        self.database = database
        self.port = port
        self.server_settings = {**({} if durable else FAST_SETTINGS), **(settings or {})}
        self.startup_timeout_s = startup_timeout_s
        self._parent = base_dir
        self.base: Path | None = None
        self._run_as: str | None = None
        self._started = False
        self._initdb, self._pg_ctl = "initdb", "pg_ctl"  # resolved by start()

    # -- where things are -------------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def data_dir(self) -> Path:
        if self.base is None:
            raise PostgresError("the cluster is not created: start() it first")
        return self.base / "data"

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / "server.log"

    def uri(self, database: str | None = None) -> str:
        if self.port is None or not self._started:
            raise PostgresError("the server is not running: start() it first")
        return f"postgresql+psycopg2://{SUPERUSER}@{self.host}:{self.port}/{database or self.database}"

    @property
    def sqlalchemy_uri(self) -> str:
        """``postgresql+psycopg2://postgres@127.0.0.1:PORT/DB`` (trust authentication: no password)."""
        return self.uri()

    @property
    def running(self) -> bool:
        return self._started

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> PrivatePostgres:
        if self._started:
            return self
        self._initdb, self._pg_ctl = server_program("initdb"), server_program("pg_ctl")
        self._run_as = _system_user()
        self.base = Path(tempfile.mkdtemp(prefix="cdclake-pg-", dir=self._parent))
        try:
            if self._run_as is not None:
                user = pwd.getpwnam(self._run_as)
                os.chown(self.base, user.pw_uid, user.pw_gid)
            self._run([self._initdb, "-D", str(self.data_dir), "-A", "trust", "-U", SUPERUSER, "-E", "UTF8"])
            fixed_port = self.port is not None
            for attempt in range(1, 1 if fixed_port else 4):
                port = self.port if fixed_port and self.port is not None else _free_port()
                try:
                    self._start_server(port)
                    break
                except PostgresError:
                    # Most likely someone took the port between our probe and the server's bind.
                    if fixed_port or attempt == 3:
                        raise
                    log.warning("postgres did not start on port %d (attempt %d), retrying", port, attempt)
            self._started = True
            self._create_database()
        except BaseException:
            self.stop()
            raise
        log.info("private postgres at %s:%s (database %s)", self.host, self.port, self.database)
        return self

    def _start_server(self, port: int) -> None:
        assert self.base is not None
        options = [f"-p {port}", f"-k {self.base}", "-c listen_addresses=127.0.0.1", "-c timezone=UTC"]
        options += [f"-c {key}={value}" for key, value in self.server_settings.items()]
        self.port = port
        self._run(
            [
                self._pg_ctl,
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                " ".join(options),
                "-t",
                str(self.startup_timeout_s),
                "-w",
                "start",
            ]
        )

    def _create_database(self) -> None:
        if self.database != SUPERUSER:
            self.create_database(self.database)

    def create_database(self, name: str) -> str:
        """Create another database on this server (one lakehouse catalog each); returns its SQLAlchemy URI."""
        if not _IDENTIFIER.match(name):
            raise ValueError(f"database name {name!r} must match {_IDENTIFIER.pattern}")
        from sqlalchemy import create_engine, text

        engine = create_engine(self.uri(SUPERUSER), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.uri(name)

    def stop(self) -> None:
        """Stop the server (fast, then immediate shutdown) and remove its directory; safe to call twice."""
        base, self.base = self.base, None
        self._started = False
        if base is None:
            return
        try:
            if (base / "data" / "postmaster.pid").exists():
                data = str(base / "data")
                try:
                    self._run([self._pg_ctl, "-D", data, "-m", "fast", "-t", "30", "-w", "stop"])
                except PostgresError as exc:
                    log.warning("postgres did not stop in time, shutting down immediately: %s", exc)
                    self._run([self._pg_ctl, "-D", data, "-m", "immediate", "-t", "30", "-w", "stop"])
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------------------------------------
    def _run(self, args: Sequence[str]) -> None:
        command = list(args) if self._run_as is None else ["runuser", "-u", self._run_as, "--", *args]
        process = subprocess.run(command, capture_output=True, text=True, check=False)
        if process.returncode != 0:
            detail = "\n".join(part.strip() for part in (process.stdout, process.stderr, self._log_tail()) if part)
            raise PostgresError(f"{' '.join(args[:1])} failed with exit code {process.returncode}: {detail}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except (OSError, PostgresError):
            return ""
        return "\n".join(text.splitlines()[-lines:])
