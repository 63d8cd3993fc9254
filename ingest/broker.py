"""An embedded Kafka-protocol broker (Tansu) for the demo, the tests and the benchmarks.

``TansuBroker`` starts ``.cdclake/bin/tansu`` (assembled by ``make setup``) on a free loopback port with the
in-memory storage engine (or any ``--storage-engine`` URL, e.g. ``s3://tansu/`` with SeaweedFS settings in
``env``), waits until it answers metadata requests, and stops it on exit::

    with TansuBroker() as broker:
        broker.create_topics(["dbserver1.inventory.customers"], partitions=3)
        broker.produce(records)
        ...  # point source.bootstrap_servers at broker.bootstrap_servers

Tansu quirks (see docs/environment.md): ListOffsets "latest" is unreliable, so consumers detect catch-up with
partition EOF; CreatePartitions is unsupported, so create topics with their final partition count.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from ingest.child_process import ChildProcess
from ingest.errors import CdclakeError, SetupError
from ingest.lakehouse import runtime_dir

log = logging.getLogger(__name__)

MEMORY_STORAGE = "memory://tansu/"
# (topic, partition, offset) of a delivered record.
Delivered = tuple[str, int, int]


class BrokerError(CdclakeError):
    """The embedded broker did not start, or refused a request (the message says which)."""


class OutgoingRecord(Protocol):
    """What ``produce`` needs of a record; ``ingest.fakes.KafkaRecord`` and :class:`Record` both fit."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int | None: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def timestamp_ms(self) -> int | None: ...

    @property
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A record to publish; ``value=None`` is a tombstone, ``partition=None`` lets the producer choose."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    timestamp_ms: int | None = None
    headers: list[tuple[str, bytes | None]] | None = None


def tansu_binary() -> Path:
    """The Tansu binary that ``make setup`` links into the runtime directory."""
    path = runtime_dir() / "bin" / "tansu"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise SetupError(f"{path} is missing: run `make setup` to install the embedded Kafka-protocol broker (Tansu)")
    return path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TansuBroker:
    """A Tansu broker subprocess on 127.0.0.1 (context manager: started on enter, stopped on exit)."""

    def __init__(
        self,
        port: int | None = None,
        storage_engine: str = MEMORY_STORAGE,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 20.0,
        binary: Path | None = None,
    ) -> None:
        self.binary = binary
        self.port = port
        self.storage_engine = storage_engine
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self._child: ChildProcess | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if self.port is None or self._child is None:
            raise BrokerError("the broker is not running: start() it first")
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    @property
    def pid(self) -> int | None:
        """The broker's process id (the benchmark reads its CPU time), None when it is not running."""
        return None if self._child is None else self._child.process.pid

    def start(self) -> TansuBroker:
        if self._child is not None:
            return self
        binary = self.binary or tansu_binary()
        fixed_port = self.port is not None
        attempts = 1 if fixed_port else 3
        for attempt in range(1, attempts + 1):
            port = self.port if fixed_port and self.port is not None else free_port()
            self._spawn(binary, port)
            try:
                self._wait_ready()
            except BrokerError:
                output = self._output_tail()
                self.stop()
                if attempt == attempts:
                    raise BrokerError(
                        f"tansu did not start on 127.0.0.1:{port} within {self.startup_timeout_s:.0f}s; "
                        f"its output: {output or '(none)'}"
                    ) from None
                log.warning("tansu did not start on port %d (attempt %d), retrying", port, attempt)
                continue
            log.info("tansu listening on %s (storage %s)", self.bootstrap_servers, self.storage_engine)
            return self
        raise AssertionError("unreachable")

    def _spawn(self, binary: Path, port: int) -> None:
        url = f"tcp://127.0.0.1:{port}"
        command = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url]
        self._child = ChildProcess(
            [*command, "--storage-engine", self.storage_engine], env={**os.environ, **self.env}, log_prefix="tansu-"
        )
        self.port = port

    def _wait_ready(self) -> None:
        """Wait for the listener (plain TCP, so no client logs refused connections), then for metadata."""
        assert self.port is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            assert self._child is not None
            if not self._child.running:
                raise BrokerError(f"tansu exited with code {self._child.returncode}")
            if time.monotonic() > deadline:
                raise BrokerError("timed out")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.02)
        admin = self.admin()
        while True:
            try:
                admin.list_topics(timeout=1.0)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise BrokerError("timed out waiting for metadata") from None
                time.sleep(0.05)

    def _output_tail(self) -> str:
        return "" if self._child is None else self._child.output_tail()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the broker; kill it if it has not exited after ``timeout_s``."""
        child, self._child = self._child, None
        if child is not None:
            child.stop(timeout_s)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------------------------------
    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": f"127.0.0.1:{self.port}"}, logger=log)

    def create_topics(
        self, names: Iterable[str], partitions: int = 1, exist_ok: bool = False, timeout_s: float = 10.0
    ) -> None:
        """Create topics with ``partitions`` partitions each (Tansu cannot add partitions later)."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return
        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in wanted],
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result(timeout_s)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if exist_ok and isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise BrokerError(f"cannot create topic {name!r}: {exc}") from exc
        # Wait until the metadata shows every partition, so producers and consumers see them at once.
        deadline = time.monotonic() + timeout_s
        while True:
            topics = admin.list_topics(timeout=timeout_s).topics
            if all(name in topics and len(topics[name].partitions) >= partitions for name in wanted):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"topics {wanted} did not appear in the broker's metadata within {timeout_s}s")
            time.sleep(0.05)

    def producer(self, config: Mapping[str, Any] | None = None) -> Producer:
        """An idempotent producer (per-partition order is kept across retries); ``config`` overrides."""
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
        settings.update(config or {})
        return Producer(settings, logger=log)

    def produce(
        self,
        records: Iterable[OutgoingRecord],
        keep_partitions: bool = True,
        report: bool = True,
        timeout_s: float = 60.0,
        config: Mapping[str, Any] | None = None,
    ) -> list[Delivered]:
        """Publish keyed records (``value=None`` is a tombstone) and wait until all are acknowledged.

        With ``keep_partitions`` each record goes to its own ``partition`` (a fake stream's partitioning);
        otherwise the producer's partitioner chooses by key. Returns the delivered (topic, partition, offset)
        in acknowledgement order when ``report``, else an empty list. Raises :class:`BrokerError` if any
        record was not delivered. ``config`` overrides the producer's settings (e.g. ``compression.type``).
        """
        delivered: list[Delivered] = []
        failures: list[str] = []

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(f"{message.topic()}[{message.partition()}]: {error.str()}")
            elif report:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None
                assert partition is not None
                assert offset is not None
                delivered.append((topic, partition, offset))

        producer = self.producer(config)
        for record in records:
            kwargs: dict[str, Any] = {"key": record.key, "value": record.value, "on_delivery": on_delivery}
            if keep_partitions and record.partition is not None:
                kwargs["partition"] = record.partition
            if record.timestamp_ms is not None:
                kwargs["timestamp"] = record.timestamp_ms
            if record.headers is not None:
                kwargs["headers"] = record.headers
            while True:
                try:
                    producer.produce(record.topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)  # the local queue is full: serve delivery reports, then retry
            producer.poll(0)
        left = producer.flush(timeout_s)
        if left:
            failures.append(f"{left} record(s) still unacknowledged after {timeout_s}s")
        if failures:
            raise BrokerError(f"{len(failures)} produce failure(s), first: {failures[0]}")
        return delivered

    def topics(self) -> dict[str, int]:
        """Topic name -> partition count, as the broker's metadata reports them."""
        metadata = self.admin().list_topics(timeout=10.0)
        return {name: len(topic.partitions) for name, topic in metadata.topics.items()}
