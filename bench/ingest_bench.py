"""Ingest benchmark: Debezium envelopes (schemas on) from the embedded broker to committed bronze.

Publishes N change events of one table to one topic, then measures in the same run:

1. the raw consume rate of that topic: a bare confluent-kafka consumer with cdclake's own librdkafka settings,
   touching every key and value (the ceiling for anything reading this broker from Python);
2. cdclake's ingest rate: ``Pipeline`` + ``KafkaSource`` (what `cdclake ingest --once` runs), broker to
   committed Iceberg bronze, steady state (first record to last commit) and end to end (incl. group join).

Both also report the CPU time they took per event, theirs and the broker's: on a shared machine the rates move
with the load, the CPU time less.

Topic batches (``--compression``, repeatable; default: ``none`` then ``lz4``): each encoding is published to a broker
of its own and measured on its own, beside its own raw consume rate. ``lz4`` is what Kafka Connect writes with
``producer.override.compression.type=lz4`` (or a topic's ``compression.type``): the schema every record repeats
compresses well, and the co-located broker then has far fewer bytes to hand out.

Tables (``--table``):

- ``customers`` (default): the smallest realistic envelope with schemas, Debezium 3.6.3's PostgreSQL connector
  on a 4-column table, schemas byte for byte those of the recorded fixture
  (tests/fixtures/debezium/postgres, ``inventory.customers``, REPLICA IDENTITY FULL); about 2.8 KB per value, of
  which 2.3 KB is the schema.
- ``orders``: 11 columns incl. a decimal, a date and timestamps, the same connector's envelope; about 4.2 KB.

Run with ``make bench`` / ``python -m bench`` (``--events N``, ``--quick``). Results go to the "Ingest" section
of docs/benchmarks.md (not for ``--quick`` runs).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import platform
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from bench.docs import BENCHMARKS_DOC, notes_line, replace_section
from ingest.broker import Record, TansuBroker
from ingest.pipeline import POLL_BATCH

DOCS = BENCHMARKS_DOC
SECTION = "## Ingest"
ORDERS_TOPIC = "benchdb.inventory.orders"
CUSTOMERS_TOPIC = "benchdb.inventory.customers"
PARTITIONS = 3
MAX_RECORDS = 100_000
# Raw record bytes (schema included) count toward max_bytes; the fast path holds ~1/7 of that as Arrow columns.
MAX_BYTES = 512 * 1024 * 1024
TARGET_EVENTS_PER_S = 100_000
QUICK_EVENTS = 100_000
# What Debezium 3.6 puts on every record by default (io.debezium.connector.common.DebeziumHeaderProducer), as Kafka
# Connect's default header converter (SimpleHeaderConverter) writes them: plain strings.
CONTEXT_HEADERS: list[tuple[str, bytes | None]] = [
    ("__debezium.context.connectorLogicalName", b"benchdb"),
    ("__debezium.context.taskId", b"0"),
    ("__debezium.context.connectorName", b"postgresql"),
    ("__debezium.context.runId", b"5b0b2c1e-39b4-4c5c-9d0b-6f1f4c1d7a10"),
]
# librdkafka's compression.type values; what the default run measures, in this order.
COMPRESSIONS = ("none", "lz4", "zstd", "gzip", "snappy")
DEFAULT_COMPRESSIONS = ("none", "lz4")


# -- the events ---------------------------------------------------------------------------------------------------
def _field(kind: str, column: str, optional: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "optional": optional, **extra, "field": column}


# `inventory.orders`: 11 columns incl. a decimal, a date and timestamps.
ORDER_FIELDS = [
    _field("int32", "id", default=0),
    _field("int64", "customer_id"),
    _field("string", "status"),
    _field(
        "bytes",
        "amount",
        name="org.apache.kafka.connect.data.Decimal",
        version=1,
        parameters={"scale": "2", "connect.decimal.precision": "12"},
    ),
    _field("string", "currency"),
    _field("int32", "quantity"),
    _field("int32", "ship_date", optional=True, name="io.debezium.time.Date", version=1),
    _field("int64", "created_at", name="io.debezium.time.MicroTimestamp", version=1),
    _field("string", "updated_at", name="io.debezium.time.ZonedTimestamp", version=1),
    _field("boolean", "is_gift", optional=True),
    _field("string", "note", optional=True),
]
STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
NOTES = ("", "leave at the door", "gift wrap please", "call before delivery", "fragile: glassware inside")


def _decimal_bytes(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


def _new_order(rng: random.Random, key: int, micros: int) -> dict[str, Any]:
    return {
        "id": key,
        "customer_id": 10_000 + rng.randrange(50_000),
        "status": rng.choice(STATUSES),
        "amount": _decimal_bytes(Decimal(rng.randrange(100, 10_000_000)) / 100, 2),
        "currency": "EUR",
        "quantity": rng.randrange(1, 20),
        "ship_date": 19_700 + rng.randrange(400) if rng.random() < 0.8 else None,
        "created_at": micros - rng.randrange(10**10),
        "updated_at": dt.datetime.fromtimestamp(micros / 1e6, tz=dt.UTC).isoformat().replace("+00:00", "Z"),
        "is_gift": rng.random() < 0.1,
        "note": rng.choice(NOTES) or None,
    }


def _changed_order(rng: random.Random, before: dict[str, Any]) -> dict[str, Any]:
    return {**before, "status": rng.choice(STATUSES), "quantity": rng.randrange(1, 20)}


# Debezium 3.6.3, PostgreSQL connector, `inventory.customers(id serial PK, first_name, last_name, email)`.
CUSTOMER_FIELDS = [
    _field("int32", "id", default=0),
    _field("string", "first_name"),
    _field("string", "last_name"),
    _field("string", "email"),
]
SOURCE_FIELDS_3 = [
    _field("string", "version"),
    _field("string", "connector"),
    _field("string", "name"),
    _field("int64", "ts_ms"),
    _field(
        "string",
        "snapshot",
        optional=True,
        name="io.debezium.data.Enum",
        version=1,
        parameters={"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        default="false",
    ),
    _field("string", "db"),
    _field("string", "sequence", optional=True),
    _field("int64", "ts_us", optional=True),
    _field("int64", "ts_ns", optional=True),
    _field("string", "schema"),
    _field("string", "table"),
    _field("int64", "txId", optional=True),
    _field("int64", "lsn", optional=True),
    _field("int64", "xmin", optional=True),
    _field("string", "origin", optional=True),
    _field("int64", "origin_lsn", optional=True),
]


def debezium3_schemas(topic: str, row_fields: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The key and value schemas Debezium 3.6.3's JSON converter writes for a PostgreSQL table keyed by ``id``."""
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": f"{topic}.Value"}
    value = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "fields": SOURCE_FIELDS_3,
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "version": 1,
                "field": "source",
            },
            {
                "type": "struct",
                "fields": [
                    _field("string", "id"),
                    _field("int64", "total_order"),
                    _field("int64", "data_collection_order"),
                ],
                "optional": True,
                "name": "event.block",
                "version": 1,
                "field": "transaction",
            },
            _field("string", "op"),
            _field("int64", "ts_ms", optional=True),
            _field("int64", "ts_us", optional=True),
            _field("int64", "ts_ns", optional=True),
        ],
        "optional": False,
        "name": f"{topic}.Envelope",
        "version": 2,
    }
    key = {"type": "struct", "fields": [_field("int32", "id", default=0)], "optional": False, "name": f"{topic}.Key"}
    return key, value


FIRST_NAMES = ("Sally", "George", "Edward", "Anne", "Maria", "Jonas", "Aiko", "Priya", "Liam", "Noor")
LAST_NAMES = ("Thomas", "Bailey", "Walker", "Kretchmar", "Garcia", "Berg", "Tanaka", "Sharma", "Murphy", "Haddad")


def _new_customer(rng: random.Random, key: int, micros: int) -> dict[str, Any]:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    return {
        "id": key,
        "first_name": first,
        "last_name": last,
        "email": f"{first.lower()}.{last.lower()}{key}@example.com",
    }


def _changed_customer(rng: random.Random, before: dict[str, Any]) -> dict[str, Any]:
    return {**before, "last_name": rng.choice(LAST_NAMES)}


@dataclass(frozen=True)
class BenchTable:
    """A PostgreSQL table whose change events the benchmark publishes."""

    topic: str
    row_fields: list[dict[str, Any]]
    new_row: Callable[[random.Random, int, int], dict[str, Any]]  # (rng, key, micros): an inserted row
    changed_row: Callable[[random.Random, dict[str, Any]], dict[str, Any]]  # (rng, row): that row updated
    description: str


TABLES = {
    "customers": BenchTable(CUSTOMERS_TOPIC, CUSTOMER_FIELDS, _new_customer, _changed_customer, "4 columns"),
    "orders": BenchTable(
        ORDERS_TOPIC, ORDER_FIELDS, _new_order, _changed_order, "11 columns incl. a decimal, a date and timestamps"
    ),
}


def postgres_envelopes(table: BenchTable, n: int, seed: int = 0) -> Iterator[Record]:
    """``n`` change events of ``table`` as Debezium 3.6.3's PostgreSQL connector streams them: inserts, updates
    (REPLICA IDENTITY FULL: with the before image) and ~5% deletes, each followed by its tombstone."""
    rng = random.Random(seed)
    key_schema, value_schema = debezium3_schemas(table.topic, table.row_fields)
    key_prefix = b'{"schema":' + orjson.dumps(key_schema) + b',"payload":'
    value_prefix = b'{"schema":' + orjson.dumps(value_schema) + b',"payload":'
    name = table.topic.rsplit(".", 1)[1]
    rows: dict[int, dict[str, Any]] = {}
    live: list[int] = []
    next_key = 1
    lsn = 30_000_000
    micros = 1_717_200_000_000_000
    tx_id = 800
    emitted = 0
    while emitted < n:
        commit_lsn = lsn
        lsn += rng.randrange(50, 500)
        micros += rng.randrange(1000, 100_000)
        tx_id += 1
        draw = rng.random()
        after: dict[str, Any] | None
        if len(live) < 100 or draw < 0.3:
            key, op, before = next_key, "c", None
            next_key += 1
            after = table.new_row(rng, key, micros)
            live.append(key)
        elif draw < 0.95:
            key = live[rng.randrange(len(live))]
            op, before = "u", rows[key]
            after = table.changed_row(rng, before)
        else:
            index = rng.randrange(len(live))
            key = live[index]
            live[index] = live[-1]
            live.pop()
            op, before, after = "d", rows[key], None
        ts_ms, emitted_us = micros // 1000, micros + rng.randrange(500, 5000)
        payload = {
            "before": before,
            "after": after,
            "source": {
                "version": "3.6.3.Final",
                "connector": "postgresql",
                "name": "benchdb",
                "ts_ms": ts_ms,
                "snapshot": "false",
                "db": "benchdb",
                "sequence": f'["{commit_lsn}","{lsn}"]',
                "ts_us": micros,
                "ts_ns": micros * 1000,
                "schema": "inventory",
                "table": name,
                "txId": tx_id,
                "lsn": lsn,
                "xmin": None,
                "origin": None,
                "origin_lsn": None,
            },
            "transaction": None,
            "op": op,
            "ts_ms": emitted_us // 1000,
            "ts_us": emitted_us,
            "ts_ns": emitted_us * 1000 + rng.randrange(1000),
        }
        if after is None:
            del rows[key]
        else:
            rows[key] = after
        key_bytes = key_prefix + orjson.dumps({"id": key}) + b"}"
        partition = key % PARTITIONS
        yield Record(table.topic, key_bytes, value_prefix + orjson.dumps(payload) + b"}", partition, ts_ms)
        emitted += 1
        if op == "d" and emitted < n:
            yield Record(table.topic, key_bytes, None, partition, ts_ms)  # the tombstone after a delete
            emitted += 1


def envelopes(n: int, seed: int = 0, table: str = "customers") -> Iterator[Record]:
    """``n`` change events of one of the benchmark's tables (``TABLES``)."""
    return postgres_envelopes(TABLES[table], n, seed)


# -- measurements -------------------------------------------------------------------------------------------------
def _cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system, all threads) of this process, or of process ``pid`` (0.0 where unknown)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Results:
    events: int
    partitions: int
    table: str = "customers"
    value_bytes: int = 0
    produce_s: float = 0.0
    raw_consume_s: float = 0.0
    raw_cpu_s: float = 0.0  # the consumer process
    raw_broker_cpu_s: float = 0.0
    ingest_steady_s: float = 0.0
    ingest_total_s: float = 0.0
    ingest_join_s: float = 0.0
    ingest_cpu_s: float = 0.0  # the ingesting process, all threads
    ingest_broker_cpu_s: float = 0.0
    commit_s: float = 0.0  # summed duration of the bronze commits
    commit_wait_s: float = 0.0  # of which the read/decode loop waited for
    flushes: int = 0
    written: int = 0
    load_average: tuple[float, float, float] = field(default_factory=os.getloadavg)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    notes: list[str] = field(default_factory=list)
    compression: str = "none"  # of the topic's batches (the producer's compression.type)
    context_headers: bool = False  # each record carries Debezium's context headers (CONTEXT_HEADERS)

    @property
    def batches(self) -> str:
        encoding = "uncompressed" if self.compression == "none" else f"{self.compression}-compressed"
        return encoding + (", context headers" if self.context_headers else "")

    def rate(self, seconds: float) -> float:
        return self.events / seconds if seconds > 0 else 0.0

    def per_event_us(self, seconds: float) -> float:
        return seconds / self.events * 1e6 if self.events else 0.0


def produce(broker: TansuBroker, events: int, results: Results) -> None:
    topic = TABLES[results.table].topic
    broker.create_topics([topic], partitions=results.partitions)
    started = time.perf_counter()
    sizes = 0

    def counted() -> Iterator[Record]:
        nonlocal sizes
        for record in envelopes(events, table=results.table):
            sizes += len(record.value or b"")
            yield replace(record, headers=CONTEXT_HEADERS) if results.context_headers else record

    broker.produce(counted(), report=False, timeout_s=600, config={"compression.type": results.compression})
    results.produce_s = time.perf_counter() - started
    results.value_bytes = sizes


def _broker_pid(broker: TansuBroker) -> int | None:
    return broker.pid


def raw_consume(
    broker: TansuBroker,
    results: Results,
    overrides: Mapping[str, Any] | None = None,
    between_polls: Callable[[], None] | None = None,
) -> float:
    """A bare consumer with cdclake's librdkafka settings; assigned directly (no group join), from the start.

    For bench.prefetch_probe: ``overrides`` of those settings, ``between_polls`` run after each poll that returned
    something; returns the seconds spent inside ``consume()`` from the first record on."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from ingest.config import SourceSettings
    from ingest.sources.kafka import consumer_config

    topic = TABLES[results.table].topic
    settings = SourceSettings(bootstrap_servers=broker.bootstrap_servers, topics=[topic], group_id="bench-raw")
    consumer = Consumer(consumer_config(settings) | dict(overrides or {}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(results.partitions)])
    seen = 0
    at_eof: set[int] = set()
    started: float | None = None
    cpu = broker_cpu = in_consume = 0.0
    checksum = 0
    while len(at_eof) < results.partitions:
        began = time.perf_counter()
        # The same batch size the pipeline polls with (ingest.pipeline.POLL_BATCH).
        messages = consumer.consume(num_messages=POLL_BATCH, timeout=1.0)
        if started is not None:
            in_consume += time.perf_counter() - began
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(message.partition() or 0)
                continue
            if started is None:
                started = time.perf_counter()
                cpu, broker_cpu = _cpu_seconds(), _cpu_seconds(_broker_pid(broker))
            # Touch what the pipeline reads, so the baseline is not flattered by lazy access.
            value = message.value()
            checksum += len(message.key() or b"") + (len(value) if value else 0) + (message.offset() or 0)
            message.timestamp()
            message.topic()
            message.headers()  # bronze keeps them (_cdc_headers): --context-headers runs pay for them here too
            seen += 1
        if between_polls is not None and messages:
            between_polls()
    finished = time.perf_counter()
    results.raw_cpu_s = _cpu_seconds() - cpu
    results.raw_broker_cpu_s = _cpu_seconds(_broker_pid(broker)) - broker_cpu
    consumer.close()
    if seen != results.events:
        results.notes.append(f"raw consumer read {seen} events, expected {results.events}")
    results.raw_consume_s = finished - (started or finished)
    return in_consume


def ingest(broker: TansuBroker, results: Results, root: Path, profile: Path | None, group_id: str) -> None:
    import yaml

    from ingest.cli.ingest_cmd import build_pipeline
    from ingest.config import load_settings

    root.mkdir(parents=True, exist_ok=True)
    config = root / "cdclake.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": broker.bootstrap_servers,
                    "topics": [TABLES[results.table].topic],
                    "group_id": group_id,
                },
                "ingest": {"max_records": MAX_RECORDS, "max_bytes": MAX_BYTES, "latency_threshold_s": 30.0},
            }
        )
    )
    pipeline = build_pipeline(load_settings(config, environ={}))
    first_record: list[float] = []
    poll, flush, commit = pipeline.source.poll, pipeline._flush, pipeline._commit_buffer
    broker_pid = _broker_pid(broker)
    cpu = [_cpu_seconds(), _cpu_seconds(broker_pid)]

    def timed_poll(max_records: int, timeout_s: float) -> Any:
        batch = poll(max_records, timeout_s)
        if batch and not first_record:
            first_record.append(time.perf_counter())
            cpu[:] = [_cpu_seconds(), _cpu_seconds(broker_pid)]
        return batch

    def timed_flush(wait: bool) -> None:  # the loop's side: waiting for the commit before, or for this one
        began = time.perf_counter()
        flush(wait)
        results.commit_wait_s += time.perf_counter() - began

    def timed_commit(buffer: Any) -> Any:  # the commit itself, wherever it runs
        began = time.perf_counter()
        advisory = commit(buffer)
        results.commit_s += time.perf_counter() - began
        return advisory

    pipeline.source.poll = timed_poll  # type: ignore[method-assign]
    pipeline._flush = timed_flush  # type: ignore[method-assign]
    pipeline._commit_buffer = timed_commit  # type: ignore[method-assign]
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    stats = pipeline.run(once=True)
    finished = time.perf_counter()
    results.ingest_cpu_s = _cpu_seconds() - cpu[0]
    results.ingest_broker_cpu_s = _cpu_seconds(broker_pid) - cpu[1]
    if profiler is not None and profile is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    results.ingest_total_s = finished - started
    results.ingest_join_s = (first_record[0] if first_record else finished) - started
    results.ingest_steady_s = finished - (first_record[0] if first_record else started)
    results.flushes = stats.flushes
    results.written = stats.written
    if stats.records_in != results.events:
        results.notes.append(f"cdclake read {stats.records_in} events, expected {results.events}")
    if stats.written != results.events:  # every event lands, tombstones included: none skipped or lost
        results.notes.append(f"cdclake committed {stats.written} rows to bronze, expected {results.events}")
    if stats.dead_letters:
        results.notes.append(f"{stats.dead_letters} dead letters")


# -- report -------------------------------------------------------------------------------------------------------
def table(results: Results) -> list[tuple[str, str, str]]:
    raw = results.rate(results.raw_consume_s)

    def row(figure: str, seconds: float, versus_raw: bool = True, cpu: tuple[float, float] | None = None) -> Any:
        rate = results.rate(seconds)
        megabytes = results.value_bytes / seconds / 1e6 if seconds > 0 else 0.0
        ratio = f"{rate / raw:.2f}x" if versus_raw and raw else "-"
        value = f"{rate:,.0f} events/s, {megabytes:,.0f} MB/s ({seconds:.1f} s)"
        if cpu is not None:
            value += f"; CPU {results.per_event_us(cpu[0]):.1f} µs/event + broker {results.per_event_us(cpu[1]):.1f}"
        return figure, value, ratio

    rows = [
        row("produce (setup: confluent-kafka producer, idempotent)", results.produce_s, versus_raw=False),
        row(
            "raw consume (bare confluent-kafka consumer, same settings)",
            results.raw_consume_s,
            cpu=(results.raw_cpu_s, results.raw_broker_cpu_s),
        ),
        row(
            "cdclake ingest, broker -> committed bronze (steady state)",
            results.ingest_steady_s,
            cpu=(results.ingest_cpu_s, results.ingest_broker_cpu_s),
        ),
        row("cdclake ingest, end to end (incl. start-up and group join)", results.ingest_total_s),
    ]
    rows.append(
        (
            "of which bronze commits (Parquet + Iceberg commit, in the background)",
            f"{results.commit_s:.1f} s in {results.flushes} flushes; the read/decode loop waited "
            f"{results.commit_wait_s:.1f} s for them ({results.commit_wait_s / max(results.ingest_steady_s, 1e-9):.0%} "
            "of steady state)",
            "-",
        )
    )
    return rows


def _load(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:.1f}" for value in values)


def _runs(runs: list[Results]) -> str:
    return "; ".join(
        f"{index}) {run.rate(run.ingest_steady_s):,.0f} events/s = "
        f"{run.rate(run.ingest_steady_s) / max(run.rate(run.raw_consume_s), 1e-9):.2f}x of "
        f"{run.rate(run.raw_consume_s):,.0f}, CPU {run.per_event_us(run.ingest_cpu_s):.1f} µs/event, "
        f"load {run.load_average[0]:.1f}"
        for index, run in enumerate(runs, 1)
    )


@dataclass
class Report:
    """The median run of one topic encoding, its table rows, and all its runs."""

    results: Results
    rows: list[tuple[str, str, str]]
    runs: list[Results]


def render_markdown(reports: list[Report]) -> str:
    results = reports[0].results
    size = results.value_bytes / max(results.events, 1)
    from importlib.metadata import version

    sample = next(envelopes(1, table=results.table)).value or b""
    schema = sample.index(b',"payload":') - len(b'{"schema":')
    payload = len(sample) - schema - len(b'{"schema":,"payload":}')
    lines = [
        SECTION,
        "",
        "Reproduce with `make bench` (`python -m bench`; `--events N`, default 1,000,000, as `make bench "
        'BENCH_ARGS="--events N"`); this part alone: `python -m bench.ingest_bench --repeat 3` (`--table orders` for '
        "the wider table).",
        "",
        f"{results.events:,} Debezium change events of `{TABLES[results.table].topic}` (PostgreSQL connector, "
        f"{TABLES[results.table].description}, Debezium 3.6.3's envelope, JSON converter with `schemas.enable=true`; "
        f"{size:,.0f} bytes per value on average, tombstones counted as 0; ~5% deletes, each followed by its "
        "tombstone) "
        f"on one topic with {results.partitions} partitions of the embedded Tansu broker (memory storage), "
        f"ingested with `max_records: {MAX_RECORDS:,}`, `max_bytes: {MAX_BYTES // 2**20} MiB` into a "
        f"SQLite-catalog lakehouse on local disk. Target: {TARGET_EVENTS_PER_S:,} events/s and half the raw "
        "consume rate. The topic's record batches are written "
        + " and ".join(f"{report.results.batches}" for report in reports)
        + " (each on a broker of its own, with its own raw consume rate): Kafka Connect compresses what Debezium "
        "produces when `producer.override.compression.type` (or the topic's `compression.type`) says so, and the "
        "schema each record repeats compresses well, so the co-located broker has far fewer bytes to hand out.",
        "",
        "| topic batches | figure | value | vs raw consume |",
        "|---|---|---|---|",
        *[
            f"| {report.results.batches} | {figure} | {value} | {ratio} |"
            for report in reports
            for figure, value, ratio in report.rows
        ],
        "",
        *[f"- {_verdict(report.results)}" for report in reports],
        "",
        *[
            f"With {report.results.batches} batches, the median of {len(report.runs)} runs (raw consume, then "
            "ingest, each time; steady state, ratio to that run's raw consume, ingest CPU, 1-minute load when the "
            f"run started): {_runs(report.runs)}.\n"
            for report in reports
            if len(report.runs) > 1
        ],
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d} on {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"confluent-kafka {version('confluent-kafka')}, pyiceberg {version('pyiceberg')}, "
        f"pyarrow {version('pyarrow')}; load average (1 / 5 / 15 min) {_load(results.load_average)} when it "
        f"started, {_load(reports[-1].results.load_after)} when it ended (a shared machine shows here: other work "
        "takes CPU from both readers and the broker; the CPU time per event rises with the load too, but much less "
        "than the rates fall).",
        "",
        "The broker runs on the same cores: its CPU time per event is beside each reader's. Why not ~1 KB per "
        "event: with `schemas.enable=true` every record carries its Connect schema, which describes each column "
        f"twice (`before`, `after`) and every field of the source block; for this table that is {schema:,} bytes "
        f"of schema before a payload of about {payload:,} bytes (an insert), so no real table gets near 1 KB with "
        "schemas on. How the ingest spends its CPU time, and what runs in parallel: "
        "[architecture.md](architecture.md#the-ingest-fast-path).",
    ]
    notes = [f"{report.results.batches}: {note}" for report in reports for note in report.results.notes]
    if notes:
        lines += ["", *[f"Note: {note}." for note in notes]]
    lines += ["", notes_line(SECTION)]
    return "\n".join(lines) + "\n"


def write_docs(section: str, path: Path = DOCS) -> None:
    """Replace the "Ingest" section of ``path`` (or create the file); other sections stay as they are."""
    replace_section(SECTION, section, path)


def _verdict(results: Results) -> str:
    steady = results.rate(results.ingest_steady_s)
    raw = results.rate(results.raw_consume_s)
    return (
        f"{results.batches} batches: cdclake's steady state "
        f"{'meets' if steady >= TARGET_EVENTS_PER_S else 'is below'} the {TARGET_EVENTS_PER_S:,} events/s target "
        f"and {'meets' if raw and steady >= raw / 2 else 'is below'} half the raw consume rate"
    )


def print_table(results: Results, rows: list[tuple[str, str, str]]) -> None:
    size = results.value_bytes / max(results.events, 1)
    print(
        f"\ningest benchmark: {results.events:,} events of {results.table}, {size:,.0f} B/value, "
        f"{results.partitions} partitions, {results.batches} batches; "
        f"load average {_load(results.load_average)} -> {_load(results.load_after)}"
    )
    widths = [max(len(r[i]) for r in [("figure", "value", "vs raw"), *rows]) for i in range(3)]
    for figure, value, ratio in [("figure", "value", "vs raw"), *rows]:
        print(f"  {figure:<{widths[0]}}  {value:<{widths[1]}}  {ratio:>{widths[2]}}")
    print(f"  {_verdict(results)}")
    for note in results.notes:
        print(f"  note: {note}")


def measure(
    count: int, table_name: str, compression: str, repeat: int, profile: Path | None, context_headers: bool = False
) -> Report:
    """One topic encoding, on a broker of its own: publish once, then ``repeat`` times raw consume + ingest; the
    median run by ingest rate is the report's (``profile``: of the first run)."""
    topic = TABLES[table_name].topic
    first = Results(count, PARTITIONS, table_name, compression=compression, context_headers=context_headers)
    runs: list[Results] = []
    with TansuBroker() as broker, tempfile.TemporaryDirectory(prefix="cdclake-bench-") as tmp:
        print(f"publishing {count:,} events to {topic} ({PARTITIONS} partitions, {first.batches}) ...", flush=True)
        produce(broker, count, first)
        for index in range(repeat):
            results = first
            if index:  # a run of its own: only what publishing measured is shared
                results = Results(
                    count,
                    PARTITIONS,
                    table_name,
                    first.value_bytes,
                    first.produce_s,
                    compression=compression,
                    context_headers=context_headers,
                )
            results.load_average = os.getloadavg()
            print(f"run {index + 1}/{repeat}: raw consume ...", flush=True)
            raw_consume(broker, results)
            print(f"run {index + 1}/{repeat}: cdclake ingest ...", flush=True)
            ingest(broker, results, Path(tmp) / f"run{index}", profile if index == 0 else None, f"bench-{index}")
            results.load_after = os.getloadavg()
            runs.append(results)
    median = sorted(runs, key=lambda run: run.rate(run.ingest_steady_s))[len(runs) // 2]
    return Report(median, table(median), runs)


def main(
    events: int | None = None,
    quick: bool = False,
    write: bool | None = None,
    profile: Path | None = None,
    table_name: str = "customers",
    repeat: int | None = None,
    compressions: Sequence[str] = DEFAULT_COMPRESSIONS,
    context_headers: bool = False,
) -> list[Results]:
    """Run the benchmark, per topic encoding in ``compressions`` (see :func:`measure`; default 3 runs each, 1 for
    ``quick``), and report each encoding's median run. ``quick`` and ``profile`` runs do not touch the docs."""
    count = events if events is not None else (QUICK_EVENTS if quick else 1_000_000)
    repeat = repeat if repeat is not None else (1 if quick or profile else 3)
    reports = [
        measure(count, table_name, compression, repeat, profile if index == 0 else None, context_headers)
        for index, compression in enumerate(compressions)
    ]
    for report in reports:
        print_table(report.results, report.rows)
        if len(report.runs) > 1:
            print(f"  median of {len(report.runs)} runs: {_runs(report.runs)}")
    if write if write is not None else not (quick or profile):
        write_docs(render_markdown(reports))
        print(f"  written to {DOCS}")
    return [report.results for report in reports]


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=None, help="events to publish (default 1,000,000)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events, docs untouched")
    parser.add_argument("--table", choices=sorted(TABLES), default="customers", help="the table whose events to use")
    parser.add_argument("--no-write", action="store_true", help="leave docs/benchmarks.md as it is")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the ingest run here")
    parser.add_argument("--repeat", type=int, default=None, help="raw consume + ingest runs (default 3; quick: 1)")
    parser.add_argument(
        "--compression",
        action="append",
        choices=COMPRESSIONS,
        help=f"the topic's batches (repeatable; default: {' and '.join(DEFAULT_COMPRESSIONS)})",
    )
    parser.add_argument(
        "--context-headers",
        action="store_true",
        help="give every record the context headers Debezium 3.x adds (extended.headers.enabled, its default)",
    )
    args = parser.parse_args(argv)
    main(
        events=args.events,
        quick=args.quick,
        write=False if args.no_write else None,
        profile=args.profile,
        table_name=args.table,
        repeat=args.repeat,
        compressions=args.compression or DEFAULT_COMPRESSIONS,
        context_headers=args.context_headers,
    )
    return 0


if __name__ == "__main__":
    sys.exit(cli())
