"""Ingest benchmark: Debezium envelopes (schemas on) from the embedded broker to committed bronze.

Publishes N change events of one realistic table (PostgreSQL connector, 11 columns incl. a decimal, a date and
timestamps) to one topic, then measures in the same run:

1. the raw consume rate of that topic: a bare confluent-kafka consumer with cdclake's own librdkafka settings,
   touching every key and value (the ceiling for anything reading this broker from Python);
2. cdclake's ingest rate: ``Pipeline`` + ``KafkaSource`` (what `cdclake ingest --once` runs), broker to
   committed Iceberg bronze, steady state (first record to last commit) and end to end (incl. group join).

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
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from ingest.broker import Record, TansuBroker

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
TOPIC = "benchdb.inventory.orders"
PARTITIONS = 3
MAX_RECORDS = 100_000
TARGET_EVENTS_PER_S = 100_000
QUICK_EVENTS = 100_000


# -- the events ---------------------------------------------------------------------------------------------------
def _field(kind: str, column: str, optional: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "optional": optional, **extra, "field": column}


ROW_FIELDS = [
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
SOURCE_FIELDS = [
    _field("string", "version"),
    _field("string", "connector"),
    _field("string", "name"),
    _field("int64", "ts_ms"),
    _field("string", "snapshot", optional=True, name="io.debezium.data.Enum", version=1, default="false"),
    _field("string", "db"),
    _field("string", "sequence", optional=True),
    _field("string", "schema"),
    _field("string", "table"),
    _field("int64", "txId", optional=True),
    _field("int64", "lsn", optional=True),
    _field("int64", "xmin", optional=True),
]
ROW_SCHEMA = {"type": "struct", "fields": ROW_FIELDS, "optional": True, "name": f"{TOPIC}.Value"}
VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {**ROW_SCHEMA, "field": "before"},
        {**ROW_SCHEMA, "field": "after"},
        {
            "type": "struct",
            "fields": SOURCE_FIELDS,
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
        },
        _field("string", "op"),
        _field("int64", "ts_ms", optional=True),
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
    ],
    "optional": False,
    "name": f"{TOPIC}.Envelope",
    "version": 1,
}
KEY_SCHEMA = {"type": "struct", "fields": [_field("int32", "id", default=0)], "optional": False, "name": f"{TOPIC}.Key"}
STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
NOTES = ("", "leave at the door", "gift wrap please", "call before delivery", "fragile: glassware inside")


def _decimal_bytes(value: Decimal, scale: int) -> str:
    unscaled = int(value.scaleb(scale))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


def _row(rng: random.Random, key: int, micros: int) -> dict[str, Any]:
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


def envelopes(n: int, seed: int = 0) -> Iterator[Record]:
    """``n`` change events: inserts of new keys, updates (with before images) and some deletes + tombstones."""
    rng = random.Random(seed)
    key_prefix = b'{"schema":' + orjson.dumps(KEY_SCHEMA) + b',"payload":'
    value_prefix = b'{"schema":' + orjson.dumps(VALUE_SCHEMA) + b',"payload":'
    rows: dict[int, dict[str, Any]] = {}
    live: list[int] = []
    next_key = 1
    lsn = 30_000_000
    micros = 1_717_200_000_000_000
    emitted = 0
    while emitted < n:
        lsn += rng.randrange(50, 500)
        micros += rng.randrange(1000, 100_000)
        draw = rng.random()
        after: dict[str, Any] | None
        if len(live) < 100 or draw < 0.3:
            key, op, before = next_key, "c", None
            next_key += 1
            after = _row(rng, key, micros)
            live.append(key)
        elif draw < 0.95:
            key = live[rng.randrange(len(live))]
            op, before = "u", rows[key]
            after = {**before, "status": rng.choice(STATUSES), "quantity": rng.randrange(1, 20)}
        else:
            index = rng.randrange(len(live))
            key = live[index]
            live[index] = live[-1]
            live.pop()
            op, before, after = "d", rows[key], None
        ts_ms = micros // 1000
        payload = {
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.3.Final",
                "connector": "postgresql",
                "name": "benchdb",
                "ts_ms": ts_ms,
                "snapshot": "false",
                "db": "benchdb",
                "sequence": f'["{lsn - 100}","{lsn}"]',
                "schema": "inventory",
                "table": "orders",
                "txId": 700 + lsn // 1000,
                "lsn": lsn,
                "xmin": None,
            },
            "op": op,
            "ts_ms": ts_ms + 3,
            "transaction": None,
        }
        if after is None:
            del rows[key]
        else:
            rows[key] = after
        key_bytes = key_prefix + orjson.dumps({"id": key}) + b"}"
        partition = key % PARTITIONS
        yield Record(TOPIC, key_bytes, value_prefix + orjson.dumps(payload) + b"}", partition, ts_ms)
        emitted += 1
        if op == "d" and emitted < n:
            yield Record(TOPIC, key_bytes, None, partition, ts_ms)  # the tombstone after a delete
            emitted += 1


# -- measurements -------------------------------------------------------------------------------------------------
@dataclass
class Results:
    events: int
    partitions: int
    value_bytes: int = 0
    produce_s: float = 0.0
    raw_consume_s: float = 0.0
    ingest_steady_s: float = 0.0
    ingest_total_s: float = 0.0
    ingest_join_s: float = 0.0
    commit_s: float = 0.0
    flushes: int = 0
    written: int = 0
    load_average: float = field(default_factory=lambda: os.getloadavg()[0])
    notes: list[str] = field(default_factory=list)

    def rate(self, seconds: float) -> float:
        return self.events / seconds if seconds > 0 else 0.0


def produce(broker: TansuBroker, events: int, results: Results) -> None:
    broker.create_topics([TOPIC], partitions=results.partitions)
    started = time.perf_counter()
    sizes = 0

    def counted() -> Iterator[Record]:
        nonlocal sizes
        for record in envelopes(events):
            sizes += len(record.value or b"")
            yield record

    broker.produce(counted(), report=False, timeout_s=600)
    results.produce_s = time.perf_counter() - started
    results.value_bytes = sizes


def raw_consume(broker: TansuBroker, results: Results) -> None:
    """A bare consumer with cdclake's librdkafka settings; assigned directly (no group join), from the start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from ingest.config import SourceSettings
    from ingest.sources.kafka import consumer_config

    settings = SourceSettings(bootstrap_servers=broker.bootstrap_servers, topics=[TOPIC], group_id="bench-raw")
    consumer = Consumer(consumer_config(settings))
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(results.partitions)])
    seen = 0
    at_eof: set[int] = set()
    started: float | None = None
    checksum = 0
    while len(at_eof) < results.partitions:
        for message in consumer.consume(num_messages=5000, timeout=1.0):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(message.partition() or 0)
                continue
            if started is None:
                started = time.perf_counter()
            # Touch what the pipeline reads, so the baseline is not flattered by lazy access.
            value = message.value()
            checksum += len(message.key() or b"") + (len(value) if value else 0) + (message.offset() or 0)
            message.timestamp()
            message.topic()
            seen += 1
    finished = time.perf_counter()
    consumer.close()
    if seen != results.events:
        results.notes.append(f"raw consumer read {seen} events, expected {results.events}")
    results.raw_consume_s = finished - (started or finished)


def ingest(broker: TansuBroker, results: Results, root: Path, profile: Path | None) -> None:
    import yaml

    from ingest.cli.ingest_cmd import build_pipeline
    from ingest.config import load_settings

    config = root / "cdclake.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": broker.bootstrap_servers,
                    "topics": [TOPIC],
                    "group_id": "bench-cdclake",
                },
                "ingest": {"max_records": MAX_RECORDS, "latency_threshold_s": 30.0},
            }
        )
    )
    pipeline = build_pipeline(load_settings(config, environ={}))
    first_record: list[float] = []
    poll, flush = pipeline.source.poll, pipeline.flush

    def timed_poll(max_records: int, timeout_s: float) -> Any:
        batch = poll(max_records, timeout_s)
        if batch and not first_record:
            first_record.append(time.perf_counter())
        return batch

    def timed_flush() -> None:
        began = time.perf_counter()
        flush()
        results.commit_s += time.perf_counter() - began

    pipeline.source.poll = timed_poll  # type: ignore[method-assign]
    pipeline.flush = timed_flush  # type: ignore[method-assign]
    profiler = None
    if profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    started = time.perf_counter()
    stats = pipeline.run(once=True)
    finished = time.perf_counter()
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
    if stats.dead_letters:
        results.notes.append(f"{stats.dead_letters} dead letters")


# -- report -------------------------------------------------------------------------------------------------------
def table(results: Results) -> list[tuple[str, str, str]]:
    raw = results.rate(results.raw_consume_s)

    def row(figure: str, seconds: float, versus_raw: bool = True) -> tuple[str, str, str]:
        rate = results.rate(seconds)
        megabytes = results.value_bytes / seconds / 1e6 if seconds > 0 else 0.0
        ratio = f"{rate / raw:.2f}x" if versus_raw and raw else "-"
        return figure, f"{rate:,.0f} events/s, {megabytes:,.0f} MB/s ({seconds:.1f} s)", ratio

    rows = [
        row("produce (setup: confluent-kafka producer, idempotent)", results.produce_s, versus_raw=False),
        row("raw consume (bare confluent-kafka consumer, same settings)", results.raw_consume_s),
        row("cdclake ingest, broker -> committed bronze (steady state)", results.ingest_steady_s),
        row("cdclake ingest, end to end (incl. start-up and group join)", results.ingest_total_s),
    ]
    commit_share = results.commit_s / results.ingest_steady_s if results.ingest_steady_s else 0.0
    rows.append(
        (
            "of which bronze commits (Arrow table + Parquet + Iceberg commit)",
            f"{results.commit_s:.1f} s in {results.flushes} flushes ({commit_share:.0%} of steady state)",
            "-",
        )
    )
    return rows


def render_markdown(results: Results, rows: list[tuple[str, str, str]]) -> str:
    size = results.value_bytes / max(results.events, 1)
    from importlib.metadata import version

    lines = [
        "## Ingest",
        "",
        "Reproduce with `make bench` (`python -m bench`; `--events N`, default 1,000,000).",
        "",
        f"{results.events:,} Debezium change events (PostgreSQL connector, JSON converter with `schemas.enable=true`, "
        f"11 columns incl. a decimal, a date and timestamps; {size:,.0f} bytes per value on average; "
        "~5% deletes, each followed by its tombstone) "
        f"on one topic with {results.partitions} partitions of the embedded Tansu broker (memory storage), "
        f"ingested with `max_records: {MAX_RECORDS:,}` into a SQLite-catalog lakehouse on local disk. "
        f"Target: {TARGET_EVENTS_PER_S:,} events/s.",
        "",
        "| figure | value | vs raw consume |",
        "|---|---|---|",
        *[f"| {figure} | {value} | {ratio} |" for figure, value, ratio in rows],
        "",
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d} on {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"confluent-kafka {version('confluent-kafka')}, pyiceberg {version('pyiceberg')}, "
        f"pyarrow {version('pyarrow')}; load average {results.load_average:.1f} when it started (a shared machine "
        "shows here).",
    ]
    if results.notes:
        lines += ["", *[f"Note: {note}." for note in results.notes]]
    return "\n".join(lines) + "\n"


def write_docs(section: str, path: Path = DOCS) -> None:
    """Replace the "Ingest" section of ``path`` (or create the file); other sections stay as they are."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# Benchmarks\n\n" + section)
        return
    text = path.read_text()
    match = re.search(r"^## Ingest[ \t]*\n.*?(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    if match is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        following = text[match.end() :]
        text = text[: match.start()] + section + ("\n" + following if following else "")
    path.write_text(text)


def print_table(results: Results, rows: list[tuple[str, str, str]]) -> None:
    size = results.value_bytes / max(results.events, 1)
    print(f"\ningest benchmark: {results.events:,} events, {size:,.0f} B/value, {results.partitions} partitions")
    widths = [max(len(r[i]) for r in [("figure", "value", "vs raw"), *rows]) for i in range(3)]
    for figure, value, ratio in [("figure", "value", "vs raw"), *rows]:
        print(f"  {figure:<{widths[0]}}  {value:<{widths[1]}}  {ratio:>{widths[2]}}")
    steady = results.rate(results.ingest_steady_s)
    verdict = "meets" if steady >= TARGET_EVENTS_PER_S else "is below"
    print(f"  cdclake steady state {verdict} the {TARGET_EVENTS_PER_S:,} events/s target")
    for note in results.notes:
        print(f"  note: {note}")


def main(
    events: int | None = None, quick: bool = False, write: bool | None = None, profile: Path | None = None
) -> Results:
    """Run the benchmark; ``quick`` (100k events by default) and ``profile`` runs do not touch the docs."""
    count = events if events is not None else (QUICK_EVENTS if quick else 1_000_000)
    results = Results(events=count, partitions=PARTITIONS)
    with TansuBroker() as broker, tempfile.TemporaryDirectory(prefix="cdclake-bench-") as tmp:
        print(f"publishing {count:,} events to {TOPIC} ({PARTITIONS} partitions) ...", flush=True)
        produce(broker, count, results)
        print("raw consume ...", flush=True)
        raw_consume(broker, results)
        print("cdclake ingest ...", flush=True)
        ingest(broker, results, Path(tmp), profile)
    rows = table(results)
    print_table(results, rows)
    if write if write is not None else not (quick or profile):
        write_docs(render_markdown(results, rows))
        print(f"  written to {DOCS}")
    return results


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=None, help="events to publish (default 1,000,000)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EVENTS:,} events, docs untouched")
    parser.add_argument("--profile", type=Path, default=None, help="write a cProfile of the ingest run here")
    args = parser.parse_args(argv)
    main(events=args.events, quick=args.quick, profile=args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
