"""librdkafka's built-in mock cluster, for the broker answers Tansu never gives.

Tansu (the broker of the test suite) answers a fetch beyond the end of a partition with no records instead of
``OFFSET_OUT_OF_RANGE``, and drops the connection on DeleteRecords, so a partition whose stored offset the log no
longer holds cannot be made there. librdkafka ships a small in-process Kafka cluster for its own tests
(``test.mock.num.brokers``) that speaks the real protocol over a loopback port, consumer groups included::

    with MockKafkaCluster() as cluster:
        cluster.produce("t", [(b"key", b"value")], partition=0)
        ...  # any client, cdclake's KafkaSource too, connects to cluster.bootstrap_servers

The cluster lives inside a producer; its address is only told in a log line of that producer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from types import TracebackType

from confluent_kafka import KafkaError, Message, Producer

from ingest.errors import CdclakeError

ADDRESS_LINE = re.compile(r"Mock cluster enabled: .* replaced with (\S+)")
# The mock's group coordinator refuses sessions shorter than Kafka's group.min.session.timeout.ms default.
CONSUMER_SETTINGS = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


class MockClusterError(CdclakeError):
    """The mock cluster did not start, or refused a record."""


class _AddressCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.address: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = ADDRESS_LINE.search(record.getMessage())
        if match is not None:
            self.address = match.group(1)


class MockKafkaCluster:
    def __init__(self, start_timeout_s: float = 10.0) -> None:
        self._start_timeout_s = start_timeout_s
        self._producer: Producer | None = None
        self._address: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._address is None:
            raise MockClusterError("the mock cluster is not started")
        return self._address

    def start(self) -> MockKafkaCluster:
        catcher = _AddressCatcher()
        logger = logging.getLogger(f"{__name__}.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(catcher)
        # bootstrap.servers is required and ignored: the mock cluster replaces it.
        self._producer = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "mock"}, logger=logger)
        deadline = time.monotonic() + self._start_timeout_s
        while catcher.address is None and time.monotonic() < deadline:
            self._producer.poll(0.05)
        if catcher.address is None:
            raise MockClusterError("librdkafka did not report the mock cluster's address")
        self._address = catcher.address
        return self

    def produce(self, topic: str, records: Iterable[tuple[bytes | None, bytes | None]], partition: int = 0) -> int:
        """Publish (key, value) pairs to one partition (the topic is created on first use); returns how many."""
        if self._producer is None:
            raise MockClusterError("the mock cluster is not started")
        failures: list[str] = []

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(error.str())

        count = 0
        for key, value in records:
            self._producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
            count += 1
        left = self._producer.flush(10.0)
        if failures or left:
            raise MockClusterError(f"{topic}[{partition}]: {left} record(s) unsent, failures: {failures[:3]}")
        return count

    def stop(self) -> None:
        if self._producer is not None:
            self._producer.flush(1.0)
            self._producer = None  # the cluster ends with its producer
        self._address = None

    def __enter__(self) -> MockKafkaCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
