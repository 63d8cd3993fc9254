"""The embedded broker and helpers shared by the Kafka tests (imported by them; not a conftest).

One Tansu broker serves the whole session; every test publishes under its own topic prefix and consumer group,
so tests never see each other's records.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.broker import Delivered, OutgoingRecord, Record, TansuBroker, tansu_binary
from ingest.bronze.tables import BronzeTables
from ingest.cli.ingest_cmd import build_pipeline
from ingest.config import Settings
from ingest.errors import SetupError
from ingest.lakehouse import load_catalog
from ingest.pipeline import Pipeline
from ingest.testing.kafka_mock import MockKafkaCluster
from tests.conftest import make_settings
from tests.missing import missing_runtime

Coordinate = tuple[str, int, int]
COORDINATES = ["_cdc_topic", "_cdc_partition", "_cdc_offset"]
FAST_GROUP_JOIN = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"}
_counter = itertools.count(1)


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    try:
        tansu_binary()
    except SetupError as exc:
        missing_runtime(str(exc))
    with TansuBroker() as running:
        yield running


def unique(name: str) -> str:
    """A name no other test of this session uses (topic prefixes, consumer groups)."""
    return f"{name}{next(_counter)}"


def retopic(records: Iterable[OutgoingRecord], prefix: str) -> list[Record]:
    """The same records on ``prefix + topic`` (the decoder does not look at topic names, except heartbeats)."""
    return [
        Record(prefix + r.topic, r.key, r.value, partition=r.partition, timestamp_ms=r.timestamp_ms, headers=r.headers)
        for r in records
    ]


def publish(
    broker: TansuBroker, records: list[Record], partitions: int, producer: dict[str, Any] | None = None
) -> set[Coordinate]:
    """Create the records' topics (if new) and publish them (``producer``: librdkafka settings of the producer);
    returns the delivered coordinates."""
    broker.create_topics(sorted({r.topic for r in records}), partitions=partitions, exist_ok=True)
    delivered: list[Delivered] = broker.produce(records, config=producer)
    assert len(delivered) == len(records)
    return set(delivered)


def kafka_settings(
    root: Path,
    broker: TansuBroker | MockKafkaCluster,
    *,
    topics: list[str] | None = None,
    topic_pattern: str | None = None,
    consumer: dict[str, str] | None = None,
    group_id: str | None = None,
    **ingest: Any,
) -> Settings:
    source: dict[str, Any] = {
        "type": "kafka",
        "bootstrap_servers": broker.bootstrap_servers,
        "group_id": group_id or unique("cdclake-test-"),
        # Tansu holds a group's first join for about session.timeout.ms / 2: keep it short in tests.
        "consumer": {**FAST_GROUP_JOIN, **(consumer or {})},
    }
    if topic_pattern is not None:
        source["topic_pattern"] = topic_pattern
    else:
        source["topics"] = topics or []
    return make_settings(root, source=source, ingest=ingest)


def run_kafka(settings: Settings) -> Pipeline:
    """What `cdclake ingest --once` does, in process."""
    pipeline = build_pipeline(settings)
    pipeline.run(once=True)
    return pipeline


def bronze_rows(settings: Settings, columns: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every bronze table's rows (``columns`` where the table has them)."""
    catalog = load_catalog(settings)
    tables = BronzeTables(catalog, settings.lakehouse.bronze_namespace)
    result: dict[str, list[dict[str, Any]]] = {}
    for name in tables.list_tables():
        table = catalog.load_table(tables.identifier(name))
        if columns is None:
            scan = table.scan()
        else:
            present = {field.name for field in table.schema().fields}
            scan = table.scan(selected_fields=tuple(c for c in columns if c in present))
        result[name] = scan.to_arrow().to_pylist()
    return result


def bronze_coordinates(settings: Settings) -> Counter[Coordinate]:
    """How often each (topic, partition, offset) is in bronze, over all tables including dead letters."""
    counts: Counter[Coordinate] = Counter()
    for rows in bronze_rows(settings, COORDINATES).values():
        counts.update((r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]) for r in rows)
    return counts


def lost_and_duplicated(
    expected: set[Coordinate], counts: Counter[Coordinate]
) -> tuple[set[Coordinate], set[Coordinate]]:
    lost = {c for c in expected if counts[c] == 0}
    duplicated = {c for c, n in counts.items() if n > 1}
    return lost, duplicated


# Tansu answers ListOffsets "latest" with the base offset of the partition's last record batch + 1, not its end
# (measured: 10 records produced in one batch, high watermark 1). One record per batch makes that the true end, so
# status tests read the lag that Kafka would report.
ONE_RECORD_BATCHES = {"batch.num.messages": 1, "linger.ms": 0}
