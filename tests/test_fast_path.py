"""The fast path (schema bytes parsed once, poll batches typed as Arrow columns) equals the per-record path.

Differential: the same records go through ``Pipeline(fast_path=True)`` and ``Pipeline(fast_path=False)`` (the
reference: every document parsed in full, rows built one by one); the buffered bronze tables (as the commit would
write them, sorted by offset), the dead letters with their reasons, the offsets and the counters must be equal.
"""

from __future__ import annotations

import base64
import datetime as dt
import importlib
import itertools
import math
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.bronze.columnar import conform_table, node_for
from ingest.bronze.evolution import merge_schemas
from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.tables import BronzeTables, Offsets
from ingest.config import IngestSettings
from ingest.debezium.envelope import Decoder, RawRecord, decode
from ingest.debezium.types import converter
from ingest.errors import DecodeError
from ingest.fakes import build_stream
from ingest.pipeline import Pipeline
from ingest.sources.file import parse_line
from tests.conftest import FIXTURES
from tests.test_envelope import HEARTBEAT_KEY_SCHEMA, HEARTBEAT_VALUE_SCHEMA

INGESTED_AT = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
PG_DUMP = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
PG_TOAST_DUMP = FIXTURES / "debezium" / "postgres" / "toast.jsonl"
SEEDS = sorted((FIXTURES / "debezium" / "seeds").glob("*.jsonl"))


class NoTables:
    """Bronze without a catalog: nothing committed yet (the decode and buffer stages only)."""

    def load(self, name: str) -> None:
        return None

    def identifier(self, name: str) -> str:
        return f"bronze.{name}"


def buffered(pipeline: Pipeline) -> dict[str, tuple[pa.Table, Offsets]]:
    """Each buffered table as its commit would append it (to a new table), sorted by Kafka coordinates."""
    out = {}
    for name, batch in pipeline._buffer.items():
        target = None
        for schema in batch.schemas:
            target = merge_schemas(name, target, schema)
        assert target is not None
        parts = [pa.Table.from_pylist(batch.rows, schema=target)]
        parts += [conform_table(table, target) for table in batch.tables]
        data = pa.concat_tables(parts).sort_by(
            [("_cdc_topic", "ascending"), ("_cdc_partition", "ascending"), ("_cdc_offset", "ascending")]
        )
        out[name] = (data, dict(batch.offsets))
    return out


def run(records: list[RawRecord], fast: bool, poll: int, staged: bool = False, **overrides: Any) -> Pipeline:
    """``staged``: each poll through stage_batch (decoded on the decode thread while the next one is grouped), as
    Pipeline.run does, else accept_batch."""
    pipeline = Pipeline(
        IngestSettings().model_copy(update=overrides),
        cast(BronzeTables, NoTables()),
        source=cast(Any, None),
        fast_path=fast,
    )
    pipeline._batch_decoder.strict = True
    accept = pipeline.stage_batch if staged else pipeline.accept_batch
    for start in range(0, len(records), poll):
        accept(records[start : start + poll], INGESTED_AT)
    pipeline.complete_staged()
    pipeline._stop_threads()
    return pipeline


def assert_same(records: list[RawRecord], poll: int = 5000, **overrides: Any) -> dict[str, tuple[pa.Table, Offsets]]:
    """The fast path, with polls accepted one by one and staged, equals the per-record path."""
    slow = run(records, False, poll, **overrides)
    slow_tables = assert_fast_equals(slow, run(records, True, poll, **overrides))
    assert_fast_equals(slow, run(records, True, poll, staged=True, **overrides))
    return slow_tables


def assert_fast_equals(slow: Pipeline, fast: Pipeline) -> dict[str, tuple[pa.Table, Offsets]]:
    # Both must be committable: a reference that cannot build its tables is a failure here, not something the fast
    # path has to match (a value neither can store is a dead letter on both).
    slow_tables = buffered(slow)
    fast_tables = buffered(fast)
    assert sorted(fast_tables) == sorted(slow_tables)
    # The kind and layout a new table is created with (silver's scaffold reads the kind).
    kinds = {name: (batch.kind, batch.layout) for name, batch in slow._buffer.items()}
    assert {name: (batch.kind, batch.layout) for name, batch in fast._buffer.items()} == kinds
    for name, (table, offsets) in slow_tables.items():
        fast_table, fast_offsets = fast_tables[name]
        assert fast_table.schema.equals(table.schema), name
        if not fast_table.equals(table):  # Arrow's equality never holds for NaN: compare the values, NaN as NaN
            for column in table.column_names:
                left, right = fast_table.column(column).to_pylist(), table.column(column).to_pylist()
                assert nan_marked(left) == nan_marked(right), f"{name}.{column}"
        assert fast_offsets == offsets, name
    assert (fast.stats.records_in, fast.stats.dead_letters, fast.stats.skipped) == (
        slow.stats.records_in,
        slow.stats.dead_letters,
        slow.stats.skipped,
    )
    assert fast._topic_schemas == slow._topic_schemas
    return slow_tables


def nan_marked(value: Any) -> Any:
    """``value`` with each float NaN in it replaced by the string "NaN" (so that equal values compare equal)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [nan_marked(item) for item in value]
    if isinstance(value, dict):
        return {key: nan_marked(item) for key, item in value.items()}
    return value


def file_records(path: Path) -> list[RawRecord]:
    return [parse_line(line, str(path)) for line in path.read_bytes().splitlines() if line.strip()]


def fake_records(source: str, seed: int, partitions: int) -> list[RawRecord]:
    stream = build_stream(source, seed=seed, n_keys=25, n_changes=120, partitions=partitions)
    return [RawRecord(r.topic, r.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in stream.records]


def fast_share(records: list[RawRecord]) -> float:
    """The share of records the fast path kept (to show the tests exercise it)."""
    pipeline = Pipeline(IngestSettings(), cast(BronzeTables, NoTables()), source=cast(Any, None))
    groups = pipeline._batch_decoder.group(records, [pipeline.table_for(r.topic) for r in records])
    kept = 0
    for group in {id(g): g for g in groups if g is not None}.values():
        pipeline._batch_decoder.build(group, records, INGESTED_AT)
        kept += len(group.rows)
    return kept / len(records)


# -- real and generated streams -----------------------------------------------------------------------------------
@pytest.mark.parametrize("poll", [5000, 7, 1])
def test_real_postgres_stream(poll: int) -> None:
    records = file_records(PG_DUMP)
    tables = assert_same(records, poll=poll)
    assert DEAD_LETTER_TABLE in tables  # the oversized numeric
    if poll == 5000:
        assert fast_share(records) > 0.5


@pytest.mark.parametrize("poll", [5000, 3])
@pytest.mark.parametrize("hstore_map", [False, True], ids=["hstore_json", "hstore_map"])
def test_real_postgres_toast_stream(poll: int, hstore_map: bool) -> None:
    """Placeholders of unchanged TOASTed values (text, bytes, arrays, hstore as JSON text or as a map) type like any
    value, on both paths. (The fast path takes no Connect maps: such a table goes record by record.)"""
    records = file_records(PG_TOAST_DUMP.with_name("toast_hstore_map.jsonl") if hstore_map else PG_TOAST_DUMP)
    assert DEAD_LETTER_TABLE not in assert_same(records, poll=poll)
    if poll == 5000 and not hstore_map:
        assert fast_share(records) > 0.9


@pytest.mark.parametrize("poll", [5000, 1])
def test_real_postgres_logical_decoding_messages(poll: int) -> None:
    """Messages (op m) take the reference path on both (their topic's plan is not eligible), beside the changes."""
    tables = assert_same(file_records(PG_DUMP.with_name("messages.jsonl")), poll=poll)
    assert DEAD_LETTER_TABLE not in tables
    assert tables["dbserver1_message"][0].num_rows == 2


def without_transaction_blocks(records: list[RawRecord]) -> list[RawRecord]:
    """``records`` as a connector with provide.transaction.metadata off sends them: no transaction block."""
    out = []
    for record in records:
        document = orjson.loads(record.value) if record.value else None
        if isinstance(document, dict) and isinstance(document.get("payload"), dict) and "op" in document["payload"]:
            document["payload"]["transaction"] = None
            record = record._replace(value=orjson.dumps(document))
        out.append(record)
    return out


@pytest.mark.parametrize("source", ["oracle", "mongodb", "informix"])
def test_changes_without_their_place_in_a_transaction_are_warned_about_on_both_paths(
    source: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Oracle, MongoDB and Informix changes of one transaction can share a position; without transaction metadata
    such ties fall to the op, and a delete and re-insert of one key in one transaction leaves it deleted. Each
    path warns once per connector, naming the setting; never with the metadata on, nor for snapshot reads."""
    import ingest.debezium.ordering as ordering_module

    records = [r for r in fake_records(source, 3, 1) if not r.topic.endswith(".transaction")]
    snapshot_reads = [r for r in records if r.value and b'"op":"r"' in r.value.replace(b" ", b"")]
    assert snapshot_reads
    message = f"connector {source}: streamed changes carry no transaction block"
    for with_metadata, expected in ((records, False), (without_transaction_blocks(snapshot_reads), False)):
        monkeypatch.setattr(ordering_module, "_UNPLACED_CONNECTORS", set())
        caplog.clear()
        fast_share(with_metadata)
        for record in with_metadata:
            decode(record)
        assert (message in caplog.text) is expected
    unplaced = without_transaction_blocks(records)
    for path in ("fast", "reference"):
        monkeypatch.setattr(ordering_module, "_UNPLACED_CONNECTORS", set())
        caplog.clear()
        if path == "fast":
            assert fast_share(unplaced) > (0.0 if source == "mongodb" else 0.8)
        else:
            for record in unplaced:
                decode(record)
        assert caplog.text.count(message) == 1, path
        assert "provide.transaction.metadata=true" in caplog.text
    assert_same(unplaced)


def in_oplog_mode(records: list[RawRecord]) -> list[RawRecord]:
    """MongoDB change events as the connector's oplog mode marks a transaction's changes: ``source.stxnid``
    (``"<lsid>:<txnNumber>"``) instead of change streams' ``lsid`` and ``txnNumber``."""
    out = []
    for record in records:
        document = orjson.loads(record.value) if record.value else None
        payload = document.get("payload") if isinstance(document, dict) else None
        if isinstance(payload, dict) and isinstance(payload.get("source"), dict):
            source = payload["source"]
            if source.get("txnNumber") is not None:
                source["stxnid"] = f"{source['lsid']}:{source['txnNumber']}"
            source["lsid"] = source["txnNumber"] = None
            record = record._replace(value=orjson.dumps(document))
        out.append(record)
    return out


def test_mongodb_oplog_mode_transactions_without_their_place_are_warned_about_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Oplog mode marks transactions by ``source.stxnid`` alone: both paths warn about its changes without a
    transaction block (once), as they do in change-streams mode; and not with the metadata on."""
    import ingest.debezium.ordering as ordering_module

    records = in_oplog_mode([r for r in fake_records("mongodb", 3, 1) if not r.topic.endswith(".transaction")])
    assert any(b'"stxnid":"' in r.value for r in records if r.value)
    assert not any(b'"txnNumber":1' in r.value for r in records if r.value)
    message = "connector mongodb: streamed changes carry no transaction block"
    unplaced = without_transaction_blocks(records)
    for path, stream, expected in (("fast", records, 0), ("fast", unplaced, 1), ("reference", unplaced, 1)):
        monkeypatch.setattr(ordering_module, "_UNPLACED_CONNECTORS", set())
        caplog.clear()
        if path == "fast":
            assert fast_share(stream) > 0.0
        else:
            for record in stream:
                decode(record)
        assert caplog.text.count(message) == expected, path
    assert_same(unplaced)


def heartbeats(topic: str, count: int, schemas: bool) -> list[RawRecord]:
    """Heartbeats as Debezium sends them to ``<topic.heartbeat.prefix>.<topic.prefix>``."""
    key_schema, value_schema = HEARTBEAT_KEY_SCHEMA, HEARTBEAT_VALUE_SCHEMA
    out = []
    for offset in range(count):
        key: Any = {"serverName": "server1"}
        value: Any = {"ts_ms": 1705312800000 + offset}
        if schemas:
            key, value = {"schema": key_schema, "payload": key}, {"schema": value_schema, "payload": value}
        out.append(RawRecord(topic, 0, offset, 1705312800000, orjson.dumps(key), orjson.dumps(value)))
    return out


@pytest.mark.parametrize("schemas", [False, True], ids=["schemaless", "schemas"])
@pytest.mark.parametrize("poll", [5000, 3])
def test_heartbeats_on_a_custom_topic_prefix_are_skipped_on_both_paths(schemas: bool, poll: int) -> None:
    """``topic.heartbeat.prefix`` is configurable: heartbeats on ``hb.server1`` (between change events) are
    skipped as heartbeats on both paths, never dead letters; the change events beside them still land."""
    changes = [r for r in fake_records("db2", 1, 1) if not r.topic.endswith(".transaction")][:40]
    beats = heartbeats("hb.server1", 6, schemas)
    records = [*changes[:20], *beats[:3], *changes[20:], *beats[3:]]
    tables = assert_same(records, poll)
    assert DEAD_LETTER_TABLE not in tables
    assert "hb_server1" not in tables
    for fast in (False, True):
        pipeline = run(records, fast, poll)
        assert (pipeline.stats.skipped, pipeline.stats.dead_letters) == (len(beats), 0)
    assert fast_share(changes) > 0.8


def test_db2_snapshot_reads_without_commit_lsn_take_their_change_lsn_on_both_paths() -> None:
    """Db2 snapshot reads that carry a change_lsn but no commit_lsn order by that change_lsn in the commit place on
    both paths (not -1, which lost a repair snapshot to older streamed changes); with neither, all -1."""
    records = [r for r in fake_records("db2", 2, 1) if not r.topic.endswith(".transaction")]
    rewritten, expected = [], {}
    for index, record in enumerate(records):
        document = orjson.loads(record.value) if record.value else None
        payload = document.get("payload") if isinstance(document, dict) else None
        if isinstance(payload, dict) and payload.get("op") == "r":
            source = payload["source"]
            lsn, source["commit_lsn"] = source["commit_lsn"], None
            source["change_lsn"] = lsn if index % 3 else None
            position = [int(part, 16) for part in lsn.split(":")] if index % 3 else [-1, -1, -1]
            expected[(record.topic, record.offset)] = position + position
            record = record._replace(value=orjson.dumps(document))
        rewritten.append(record)
    assert len(expected) > 3
    tables = assert_same(rewritten)
    found = {}
    for table, _offsets in tables.values():
        if "_cdc_order" in table.column_names:
            for row in table.select(["_cdc_topic", "_cdc_offset", "_cdc_order"]).to_pylist():
                found[(row["_cdc_topic"], row["_cdc_offset"])] = row["_cdc_order"]
    assert {coordinates: found[coordinates] for coordinates in expected} == expected


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_examples(path: Path) -> None:
    assert_same(file_records(path))


@pytest.mark.parametrize("source", ["db2", "informix", "oracle", "mongodb"])
@pytest.mark.parametrize(("seed", "partitions"), [(1, 1), (2, 3), (3, 2)])
def test_fake_streams(source: str, seed: int, partitions: int) -> None:
    records = fake_records(source, seed, partitions)
    assert_same(records)
    assert_same(records, poll=37)
    if source != "mongodb":  # MongoDB's images are JSON strings, typed all the same
        assert fast_share(records) > 0.8


def test_mixed_topics_in_one_poll() -> None:
    records = [r for source in ("db2", "oracle", "informix") for r in fake_records(source, 5, 2)]
    records.sort(key=lambda r: (r.offset, r.topic))  # interleaved, each partition still in order
    assert_same(records)


def with_headers(records: list[RawRecord]) -> list[RawRecord]:
    """Kafka headers on most of ``records``: Debezium's context headers, and on some a primary-key change's
    `__debezium.oldkey`, a repeated name, a null value and bytes that are not UTF-8; none on every fifth."""
    context = [("__debezium.context.connectorLogicalName", b"dbserver1"), ("__debezium.context.taskId", b"0")]
    odd = [("__debezium.oldkey", b'{"id":1001}'), ("x", None), ("x", b"\xff\x00")]
    return [
        r._replace(headers=None if i % 5 == 0 else context + (odd if i % 7 == 0 else [])) for i, r in enumerate(records)
    ]


@pytest.mark.parametrize("poll", [5000, 7])
def test_headers_are_kept_in_order_on_both_paths(poll: int) -> None:
    """Each row, dead letters included, holds its record's headers as they came (null for none)."""
    records = with_headers(file_records(PG_DUMP) + fake_records("informix", 4, 2))
    sent = {(r.topic, r.partition, r.offset): r.headers for r in records}
    tables = assert_same(records, poll=poll)
    kept = {}
    for table, _ in tables.values():
        for row in table.select(["_cdc_topic", "_cdc_partition", "_cdc_offset", "_cdc_headers"]).to_pylist():
            headers = row["_cdc_headers"]
            coordinates = (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"])
            kept[coordinates] = None if headers is None else [(h["key"], h["value"]) for h in headers]
    assert kept == sent
    assert sum(headers is not None and len(headers) == 5 for headers in kept.values()) > 10
    assert fast_share(records) > 0.5


def upgraded_connector_records(source: str) -> list[RawRecord]:
    """One topic whose connector is upgraded mid-stream: ``source.snapshot`` a boolean (the seeds' form), then the
    io.debezium.data.Enum text of later connectors, at the offsets after."""
    old = build_stream(source, seed=1, n_keys=5, n_changes=10, snapshot_style="seed").records
    new = build_stream(source, seed=1, n_keys=5, n_changes=10, snapshot_style="enum").records
    topic = old[0].topic
    first = [r for r in old if r.topic == topic and r.partition == 0]
    later = [r for r in new if r.topic == topic and r.partition == 0]
    return [RawRecord(r.topic, 0, offset, r.timestamp_ms, r.key, r.value) for offset, r in enumerate(first + later)]


@pytest.mark.parametrize("source", ["db2", "informix", "oracle", "mongodb"])
def test_a_boolean_snapshot_flag_and_its_later_text_share_one_column(source: str) -> None:
    """A boolean source.snapshot is kept as the text later connectors send, so an upgrade changes no column type
    (a boolean column cannot widen to string: every later record was a dead letter)."""
    records = upgraded_connector_records(source)
    tables = assert_same(records)
    assert DEAD_LETTER_TABLE not in tables
    ((data, _),) = tables.values()
    assert data.schema.field("source").type.field("snapshot").type == pa.string()
    flags = [None if source is None else source["snapshot"] for source in data.column("source").to_pylist()]
    booleans = [orjson.loads(r.value)["payload"]["source"]["snapshot"] if r.value else None for r in records]
    assert flags == [("true" if flag else "false") if isinstance(flag, bool) else flag for flag in booleans]
    assert {"true", "false", "last"} <= set(flags)
    assert {True, False} <= set(booleans)
    assert fast_share(records) > 0.8


def test_the_merge_benchmarks_bronze_rows_fill_every_bronze_column() -> None:
    """The merge benchmark writes its synthetic bronze with Spark SQL (ROW_SQL) into a table of bronze's columns:
    a column bronze gains (`_cdc_headers`, 2026-12-02) must be written too, or every `make bench` fails."""
    from ingest.bronze.rows import CHANGE_FIELDS, COORDINATE_FIELDS

    bench = importlib.import_module("bench.merge_bench")
    written = [sql.rsplit(" as ", 1)[-1] for sql in bench.ROW_SQL]  # `op` is a column as it is
    assert written == bench.BRONZE_SCHEMA.names
    assert written[: len(COORDINATE_FIELDS) + len(CHANGE_FIELDS)] == [f.name for f in COORDINATE_FIELDS + CHANGE_FIELDS]


@pytest.mark.parametrize("table", ["customers", "orders"])
def test_benchmark_envelopes(table: str) -> None:
    envelopes = importlib.import_module("bench.ingest_bench").envelopes
    records = [
        RawRecord(r.topic, r.partition, offset, r.timestamp_ms, r.key, r.value)
        for offset, r in enumerate(envelopes(3000, seed=4, table=table))
    ]
    assert_same(records)
    assert fast_share(records) == 1.0


@pytest.mark.parametrize("poll", [5000, 37])
def test_topics_sharing_a_table_in_one_poll(poll: int) -> None:
    """Two topics mapped to one table, interleaved, one of them partly without keys: the fast path's bookkeeping
    per group (offsets, each topic's last schemas, buffered sizes) equals the per-record loop's."""
    envelopes = importlib.import_module("bench.ingest_bench").envelopes
    records = []
    for offset, r in enumerate(envelopes(600, seed=3)):
        topic = "a.inventory.customers" if offset % 3 else "b.inventory.customers"
        key = None if topic.startswith("b") and offset % 2 and r.value is not None else r.key
        records.append(RawRecord(topic, r.partition, offset, r.timestamp_ms, key, r.value))
    shared = {"a.inventory.customers": "shared", "b.inventory.customers": "shared"}
    assert_same(records, poll=poll, table_mapping=shared)
    assert fast_share(records) == 1.0


def with_transaction_metadata(changes: int, per_transaction: int) -> list[RawRecord]:
    """The benchmark's customers events in transactions of ``per_transaction`` changes, each wrapped in BEGIN and END
    records on ``benchdb.transaction`` (the recorded stream's), as with ``provide.transaction.metadata=true``."""
    envelopes = importlib.import_module("bench.ingest_bench").envelopes
    recorded = [r for r in file_records(PG_DUMP) if r.topic == "dbserver1.transaction"]
    begin, end = recorded[0], recorded[1]
    block = b'"transaction":{"id":"728:22260096","total_order":1,"data_collection_order":1}'
    offsets: dict[tuple[str, int], int] = {}
    records: list[RawRecord] = []

    def add(topic: str, partition: int, key: bytes | None, value: bytes | None) -> None:
        offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
        records.append(RawRecord(topic, partition, offset, 1_700_000_000_000, key, value))

    changes_left = list(envelopes(changes, seed=2))
    while changes_left:
        transaction, changes_left = changes_left[:per_transaction], changes_left[per_transaction:]
        add("benchdb.transaction", 0, begin.key, begin.value)
        for r in transaction:
            value = None if r.value is None else r.value.replace(b'"transaction":null', block)
            add(r.topic, r.partition, r.key, value)
        add("benchdb.transaction", 0, end.key, end.value)
    return records


@pytest.mark.parametrize("poll", [5000, 37])
def test_transaction_metadata_beside_data_topics(poll: int) -> None:
    """Transaction metadata (BEGIN/END) beside the data topic, both on the fast path."""
    records = with_transaction_metadata(900, 4)
    tables = assert_same(records, poll=poll)
    assert {"benchdb_transaction", "benchdb_inventory_customers"} <= tables.keys()
    assert fast_share(records) == 1.0  # BEGIN/END included
    # One table for both topics: then the whole poll goes through the per-record loop, with the same outcome (the
    # two layouts' key columns conflict: dead letters).
    shared = {"benchdb.transaction": "everything", "benchdb.inventory.customers": "everything"}
    assert_same(records, poll=poll, table_mapping=shared, on_type_conflict="dead_letter")


def transaction_ordered(connectors: list[str], blocks: list[Any]) -> list[RawRecord]:
    """Change events of one table whose ``transaction`` blocks are ``blocks`` (one record each), the connector of
    each taken in turn from ``connectors``; the source struct carries every connector's position fields."""
    source_fields = [
        {"type": "string", "optional": False, "field": "connector"},
        *({"type": "string", "optional": True, "field": name} for name in ("commit_scn", "scn", "commit_lsn")),
        *({"type": "int64", "optional": True, "field": name} for name in ("ts_ms", "ord")),
    ]
    schema = {
        "type": "struct",
        "fields": [
            {"type": "struct", "optional": True, "field": "after", "fields": [{"type": "int32", "field": "id"}]},
            {"type": "struct", "optional": False, "field": "source", "fields": source_fields},
            {"type": "string", "optional": False, "field": "op"},
            {
                "type": "struct",
                "optional": True,
                "field": "transaction",
                "fields": [
                    {"type": "string", "optional": False, "field": "id"},
                    {"type": "int64", "optional": True, "field": "total_order"},
                ],
            },
        ],
    }
    sources = {
        "oracle": {"connector": "oracle", "commit_scn": "90", "scn": "80"},
        "mongodb": {"connector": "mongodb", "ts_ms": 5000, "ord": 2},
        "informix": {"connector": "informix", "commit_lsn": "70"},
    }
    records = []
    for offset, block in enumerate(blocks):
        connector = connectors[offset % len(connectors)]
        payload = {"after": {"id": offset}, "source": sources[connector], "op": "c", "transaction": block}
        value = orjson.dumps({"schema": schema, "payload": payload})
        records.append(RawRecord("o.s.t", 0, offset, 1_700_000_000_000, None, value))
    return records


@pytest.mark.parametrize("connectors", [["oracle"], ["mongodb"], ["informix"], ["oracle", "informix", "mongodb"]])
def test_transaction_places_end_the_ordering_of_oracle_mongodb_and_informix(connectors: list[str]) -> None:
    """``transaction.total_order`` as the last component (-1 without a block), on both paths; a place that is not a
    position is a dead letter. One connector: the columns path; several in one table: the per-row path."""
    good = [{"id": "t", "total_order": n} for n in (1, 2, 3)] + [None, {"id": "t", "total_order": None}]
    odd = [{"id": "t", "total_order": "4"}, {"id": "t", "total_order": -1}, {"id": "t", "total_order": 2**63}]
    tables = assert_same(transaction_ordered(connectors, good + odd))
    orders = tables["o_s_t"][0].sort_by("_cdc_offset").column("_cdc_order").to_pylist()
    expected = {"oracle": [90, 80], "mongodb": [5000, 2], "informix": [70, -1]}
    assert orders == [
        [*expected[connector], place]
        for connector, place in zip(itertools.cycle(connectors), [1, 2, 3, -1, -1], strict=False)
    ]
    assert tables[DEAD_LETTER_TABLE][0].num_rows == len(odd)
    if len(connectors) == 1:
        assert fast_share(transaction_ordered(connectors, good)) == 1.0


ODD_TRANSACTION_PAYLOADS = [
    b'{"status":"COMMIT","id":"1:2","event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"status":null,"id":"1:2","event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"status":"BEGIN","id":null,"event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"status":"BEGIN","event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"id":"1:2","event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"status":"END","id":"1:2","event_count":"3","data_collections":null,"ts_ms":1}',
    b'{"status":"END","id":"1:2","event_count":2,"data_collections":[null,{"data_collection":"a","event_count":1}],'
    b'"ts_ms":1}',
    b'{"status":"END","id":"1:2","event_count":2,"data_collections":[{"data_collection":"a"}],"ts_ms":1}',
    b'{"status":"END","id":"1:2","event_count":2,"data_collections":[],"ts_ms":null}',
    b'{"status":"BEGIN","id":"1:2","event_count":null,"data_collections":null,"ts_ms":1,"ddl":"x"}',
    b'{"status":"BEGIN","id":"1:2","event_count":null,"data_collections":null}',
    b'{"status":"BEGIN","id":"1:2","id":"3:4","event_count":null,"data_collections":null,"ts_ms":1}',
    b'{"status":"B\\u0045GIN","id":"1:2","event_count":null,"data_collections":null,"ts_ms":1}',
]


@pytest.mark.parametrize("odd", ODD_TRANSACTION_PAYLOADS)
def test_odd_transaction_metadata(odd: bytes) -> None:
    """A transaction-metadata record the fast path must not take as it is goes back to the reference, which
    decides (a dead letter, a row, or a record of another kind)."""
    records = with_transaction_metadata(60, 3)
    recorded = next(r for r in records if r.topic == "benchdb.transaction")
    assert recorded.value is not None
    prefix = recorded.value[: recorded.value.index(b',"payload":') + len(b',"payload":')]
    odd_records = []
    for index, record in enumerate(records):
        if record.topic == "benchdb.transaction" and index % 5 == 0:
            record = record._replace(value=prefix + odd + b"}")
        odd_records.append(record)
    assert_same(odd_records)


def test_benchmark_customers_are_real_debezium_envelopes() -> None:
    """The benchmark's default events carry, byte for byte, the schemas of the recorded Debezium 3.6.3 stream."""
    bench = importlib.import_module("bench.ingest_bench")
    recorded = next(r for r in file_records(PG_DUMP) if r.topic == "dbserver1.inventory.customers" and r.value)
    assert recorded.key is not None
    assert recorded.value is not None
    generated = next(bench.envelopes(1))

    def schema_bytes(document: bytes) -> bytes:
        return document[: document.index(b',"payload":')]

    assert generated.key is not None
    assert generated.value is not None
    renamed = [schema_bytes(d).replace(b"dbserver1.", b"benchdb.") for d in (recorded.key, recorded.value)]
    assert [schema_bytes(generated.key), schema_bytes(generated.value)] == renamed
    # And the payload has the recorded one's fields, in the same order.
    assert list(orjson.loads(generated.value)["payload"]) == list(orjson.loads(recorded.value)["payload"])
    source = orjson.loads(generated.value)["payload"]["source"]
    assert list(source) == list(orjson.loads(recorded.value)["payload"]["source"])


def test_replays_are_skipped_alike() -> None:
    records = fake_records("db2", 1, 1)
    fast, slow = run(records, True, 5000), run(records, False, 5000)
    for pipeline in (fast, slow):
        pipeline._committed = {name: {tp: 40 for tp in batch.offsets} for name, batch in pipeline._buffer.items()}
        pipeline._buffer.clear()
        pipeline.accept_batch(records, INGESTED_AT)
    assert fast.stats.skipped == slow.stats.skipped > 0
    assert {n: t.num_rows for n, (t, _) in buffered(fast).items()} == {
        n: t.num_rows for n, (t, _) in buffered(slow).items()
    }


# -- the schema splitter ----------------------------------------------------------------------------------------
def test_decoder_equals_full_parse_on_fixtures() -> None:
    decoder = Decoder()
    records = file_records(PG_DUMP) + [r for p in SEEDS for r in file_records(p)] + fake_records("oracle", 1, 2)
    for record in records:
        assert outcome(decoder.decode, record) == outcome(decode, record)


def outcome(decode_one: Any, record: RawRecord) -> Any:
    try:
        return decode_one(record)
    except DecodeError as error:
        return f"DecodeError: {error}"


@pytest.mark.parametrize(
    "value",
    [
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"}}',
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"}} ',  # trailing whitespace: not split
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"}}x',
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"},"payload":1}',
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"},"schema":null}',
        b'{"schema":{"type":"struct","fields":[],"parameters":{"x":",\\"payload\\":"}},"payload":{"op":"c"}}',
        b'{"schema":{"type":"struct","fields":[],"parameters":{"payload":"1"}},"payload":{"op":"c"}}',
        b'{"schema":{"type":"struct","fields":[]},"payload":{"op":"c"',
        b'{"schema":{"type":"struct","fields":[]},"payload":"\xff"}',
        b'{"schema":{"type":"struct","fields":[]},"payload":null}',
        b'{"schema":{"type":"struct","fields":[]},"payload":' + b"[" * 1100 + b"]" * 1100 + b"}",
        b'{"payload":{"op":"c"},"schema":{"type":"struct","fields":[]}}',
        b'{"schema":null,"payload":{"op":"c"}}',
    ],
)
def test_decoder_equals_full_parse_on_odd_documents(value: bytes) -> None:
    decoder = Decoder()
    prefix = b'{"schema":{"type":"struct","fields":[]},"payload":'
    # Teach the splitter the plain prefix first, then the odd document.
    for data in (prefix + b'{"op":"r"}}', value):
        record = RawRecord("t", 0, 0, 0, None, data)
        assert outcome(decoder.decode, record) == outcome(decode, record)


# -- generated typed envelopes ------------------------------------------------------------------------------------
def b64(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


# (Connect field schema, good values, odd values the reference may reject or convert specially)
COLUMNS: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "i8": ({"type": "int8"}, st.integers(-128, 127), st.sampled_from([128, -129, 1.0, True, "1"])),
    "i32": ({"type": "int32"}, st.integers(-(2**31), 2**31 - 1), st.sampled_from([2**31, 1.5, "x", False])),
    "i64": ({"type": "int64"}, st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63, 2**64 - 1, 1e3, None])),
    "f32": (
        {"type": "float"},
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        # beyond float32: dead letters, not inf; below its smallest: dead letters, not 0.0
        st.sampled_from(["NaN", True, 0, 1e300, -3.5e38, 3.4028235e38, 1e-50, -(2.0**-150), 1.4e-45]),
    ),
    "f64": (
        {"type": "double"},
        st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60),
        st.sampled_from(["Infinity", "-Infinity", "1", 2**64 - 1]),
    ),
    "flag": ({"type": "boolean"}, st.booleans(), st.sampled_from([0, 1, "true"])),
    "text": ({"type": "string"}, st.text(max_size=12), st.sampled_from([1, 2.5, True, ["a"], {"a": 1}])),
    "blob": (
        {"type": "bytes"},
        st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
        st.sampled_from(["!!", "abc", "é", 5]),
    ),
    "amount": (
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        st.integers(-(10**10) + 1, 10**10 - 1).map(b64),
        st.sampled_from([b64(10**10), b64(10**30), 12.5, "*"]),
    ),
    "big": (
        {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "0"}},
        st.integers(-(10**29), 10**29).map(b64),
        st.sampled_from([b64(10**38), b64(-(10**37) - 7), 3]),
    ),
    "vsd": (
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
        st.builds(lambda s, v: {"scale": s, "value": b64(v)}, st.integers(0, 12), st.integers(-(10**20), 10**20)),
        st.sampled_from(
            [
                {"scale": 1},
                {"scale": "1", "value": "AQ=="},
                {"scale": 1, "value": "AQ==", "x": 1},
                {"scale": -100, "value": "AQ=="},  # 1E+100: used to stop the ingester
            ]
        ),
    ),
    "day": (
        {"type": "int32", "name": "io.debezium.time.Date"},
        st.integers(-719162, 2932896),
        st.sampled_from([-719163, 2932897, 2**31 - 1]),
    ),
    "tod": ({"type": "int32", "name": "org.apache.kafka.connect.data.Time"}, st.integers(0, 86_399_999), st.just(-1)),
    "tod_ns": (
        {"type": "int64", "name": "io.debezium.time.NanoTime"},
        st.integers(-(10**12), 86_399_999_999_999),
        st.just(1.0),
    ),
    "ts_ms": (
        {"type": "int64", "name": "io.debezium.time.Timestamp"},
        st.integers(-62135596800000, 253402300799999),
        st.sampled_from([-62135596800001, 253402300800000, 2**62]),
    ),
    "ts_us": (
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        st.integers(-62135596800000000, 253402300799999999),
        st.sampled_from([253402300800000000, -(2**63)]),
    ),
    "ts_ns": (
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        st.integers(-(2**63), 2**63 - 1),
        st.just("1"),
    ),
    "zoned": (
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 1, 1), timezones=st.just(dt.UTC)).map(
            lambda d: d.isoformat().replace("+00:00", "Z")
        ),
        st.sampled_from(["2024-01-01T00:00:00", "yesterday", "2024-02-30T00:00:00Z", "2024-01-01T00:00:00.123456789Z"]),
    ),
    "tags": (
        {"type": "array", "items": {"type": "string"}, "optional": True},
        st.lists(st.text(max_size=3) | st.none(), max_size=3),
        st.sampled_from(["abc", [1], {"a": "b"}]),
    ),
    "point": (
        {
            "type": "struct",
            "fields": [{"type": "int32", "field": "x"}, {"type": "double", "field": "y", "optional": True}],
        },
        st.fixed_dictionaries({"x": st.integers(-5, 5), "y": st.floats(-1, 1) | st.none()}),
        st.sampled_from([{"x": 1, "z": 2}, {"y": 1.0}, [1, 2], {"x": None}]),
    ),
}
NAMES = sorted(COLUMNS)


@st.composite
def typed_streams(draw: st.DrawFn) -> list[RawRecord]:
    """A few records of one table with schemas: mostly good values, some odd ones, absent and null fields."""
    columns = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    optional = {name: draw(st.booleans()) for name in columns}
    id_type = draw(st.sampled_from(["int32", "int64", "string"]))
    texts = draw(st.lists(st.text(max_size=6), min_size=4, max_size=4))
    row_fields = [{"type": id_type, "optional": False, "field": "id"}] + [
        {**COLUMNS[name][0], "optional": optional[name], "field": name} for name in columns
    ]
    row_schema = {"type": "struct", "fields": row_fields, "optional": True, "name": "g.s.t.Value"}
    source_fields = [
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": True, "field": "commit_lsn"},
        {"type": "string", "optional": True, "field": "change_lsn"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "lsn"},
    ]
    value_schema = {
        "type": "struct",
        "name": "g.s.t.Envelope",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "fields": source_fields, "optional": False, "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }
    key_name = draw(st.sampled_from(["id", "ID"]))
    key_schema = {"type": "struct", "fields": [{"type": id_type, "optional": False, "field": key_name}]}
    records = []
    count = draw(st.integers(1, 12))
    for offset in range(count):
        key_id: Any = draw(st.integers(0, 3))
        if id_type == "string":
            key_id = texts[key_id]
        row: dict[str, Any] = {"id": key_id}
        clean = draw(st.integers(0, 9)) < 6  # most records are well-formed: the fast path must keep them right
        for name in columns:
            kind = "good" if clean else draw(st.sampled_from(["good"] * 3 + ["odd", "null", "absent"]))
            if kind == "good":
                row[name] = draw(COLUMNS[name][1])
            elif kind == "odd":
                row[name] = draw(COLUMNS[name][2])
            elif kind == "null":
                row[name] = None
        if not clean and draw(st.booleans()):
            row["extra"] = 1
        if not clean and draw(st.booleans()):
            row["id"] = draw(st.sampled_from([f"{key_id}x", None, 7, str(key_id) if id_type != "string" else 7]))
        connector = draw(st.sampled_from(["informix", "postgresql", "db2"] + ([] if clean else ["cobol", None])))
        odd_positions = [] if clean else ["-1", "1e3", "99999999999999999999", "٣"]
        source: dict[str, Any] = {
            "connector": connector,
            "commit_lsn": draw(st.sampled_from([None, "12", "007", "00000025:00000a1e:0001", *odd_positions])),
            "change_lsn": draw(st.sampled_from([None, "13", "00000025:00000a1e:0002", *odd_positions])),
            "sequence": draw(
                st.sampled_from([None, '["1","2"]', '[null,"5"]', *([] if clean else ['["a","b"]', "[1,2]", '["1"]'])])
            ),
            "lsn": draw(st.sampled_from([None, 5, -3])),
        }
        op = draw(st.sampled_from(["c", "u", "d", "r"] + ([] if clean else ["x", None])))
        payload: dict[str, Any] = {"before": row if op in ("u", "d") else None, "after": None if op == "d" else row}
        payload.update({"source": source, "op": op, "ts_ms": draw(st.none() | st.integers(0, 10**13))})
        if not clean and draw(st.booleans()):
            del payload["after"]
        key_payload: Any = {key_name: key_id}
        key = b'{"schema":' + orjson.dumps(key_schema) + b',"payload":' + orjson.dumps(key_payload) + b"}"
        value_bytes = b'{"schema":' + orjson.dumps(value_schema) + b',"payload":' + orjson.dumps(payload) + b"}"
        if draw(st.integers(0, 19)) == 0:
            value_bytes = value_bytes.replace(b'"op":', b'"op": ', 1)  # whitespace: a full parse
        timestamp = draw(st.sampled_from([1_700_000_000_000, None, -1, 0, 9_000_000_000_000]))
        records.append(RawRecord("g.s.t", 0, offset, timestamp, key, value_bytes))
        if op == "d" and draw(st.booleans()):
            records.append(RawRecord("g.s.t", 0, offset + 1000, timestamp, key, None))
    return records


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(typed_streams())
def test_generated_typed_envelopes(records: list[RawRecord]) -> None:
    records = sorted(records, key=lambda r: r.offset)
    assert_same(records, poll=max(len(records), 8))


TYPICAL: dict[str, Any] = {
    "i8": -7,
    "i32": 123456,
    "i64": -(2**40),
    "f32": 1.5,
    "f64": -2.25,
    "flag": True,
    "text": 'a "quoted" \\ é',
    "blob": base64.b64encode(b"\x00\xff").decode(),
    "amount": b64(-12345),
    "big": b64(10**25 + 3),
    "vsd": {"scale": 3, "value": b64(1500)},
    "day": 19000,
    "tod": 1500,
    "tod_ns": -1_500_001,
    "ts_ms": 1559729468470,
    "ts_us": -1559729468470123,
    "ts_ns": -1559729468470123456,
    "zoned": "2019-06-05T12:11:08.47+02:00",
    "tags": ["x", None],
    "point": {"x": 1, "y": None},
}


def test_every_column_kind_takes_the_fast_path() -> None:
    """Good values of every column kind are kept by the fast path (not all sent back to the reference)."""
    records = []
    for offset, name in enumerate(NAMES):
        schema = COLUMNS[name][0]
        value = TYPICAL[name]
        fields = [{"type": "int32", "field": "id"}, {**schema, "optional": True, "field": name}]
        row_schema = {"type": "struct", "fields": fields, "optional": True}
        value_schema = {
            "type": "struct",
            "fields": [
                {**row_schema, "field": "after"},
                {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]},
                {"type": "string", "field": "op"},
            ],
        }
        payload = {"after": {"id": 1, name: value}, "source": {"connector": "informix"}, "op": "c"}
        data = b'{"schema":' + orjson.dumps(value_schema) + b',"payload":' + orjson.dumps(payload) + b"}"
        records.append(RawRecord(f"k.s.{name}", 0, offset, 1, None, data))
    padded = [r for r in records for _ in range(2)]
    padded = [RawRecord(r.topic, r.partition, i, r.timestamp_ms, r.key, r.value) for i, r in enumerate(padded)]
    assert_same(padded)
    assert fast_share(padded) == 1.0


def test_key_columns_masked_in_the_value_take_the_fast_path() -> None:
    """Debezium masks (column.mask.with.N.chars, column.mask.hash.*) and truncates a character column in the value
    only: such a key column differs from its image in every change, and both paths land the changes alike; a null
    key field beside a value still goes to the dead letters on both."""
    key_schema = {"type": "struct", "fields": [{"type": "string", "optional": True, "field": "CODE"}]}
    row = {
        "type": "struct",
        "optional": True,
        "fields": [{"type": "string", "field": "CODE"}, {"type": "int32", "optional": True, "field": "N"}],
    }
    value_schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]},
            {"type": "string", "field": "op"},
        ],
    }
    records = []
    for offset, (code, image) in enumerate(
        [("ABC123", "******"), ("ABC124", "ABC"), ("ABC125", "6d2b5a1c0f3e"), ("ABC126", "ABC126")] * 3
        + [(None, "******")]
    ):
        key = b'{"schema":' + orjson.dumps(key_schema) + b',"payload":' + orjson.dumps({"CODE": code}) + b"}"
        payload = {"before": None, "after": {"CODE": image, "N": offset}, "source": {"connector": "db2"}, "op": "c"}
        value = b'{"schema":' + orjson.dumps(value_schema) + b',"payload":' + orjson.dumps(payload) + b"}"
        records.append(RawRecord("db2server.DB2INST1.CODES", 0, offset, 1, key, value))
    tables = assert_same(records)
    landed = tables["db2server_db2inst1_codes"][0]
    assert landed.column("key").to_pylist() == [{"CODE": f"ABC12{i % 4 + 3}"} for i in range(12)]
    assert DEAD_LETTER_TABLE in tables  # the null key field
    assert fast_share(records) == 12 / 13


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**47), 2**47).map(b64) | st.sampled_from(["AB==", "/w==", "gA==", "", "QQ", "a=b="])))
def test_short_base64_decimals_match_the_reference(values: list[str]) -> None:
    """Decimals decoded column-wise equal the reference converter's, or the column takes the per-value path."""
    schema = {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "3", "connect.decimal.precision": "15"},
    }
    node = node_for(schema, 10)
    converted, bad = node.convert(pa.array([*values, None], pa.string()))
    reference = converter(schema)
    flags = [False] * (len(values) + 1) if bad is None else bad.to_pylist()
    for value, got, flagged in zip([*values, None], converted.to_pylist(), flags, strict=True):
        if value is None:
            assert got is None
            continue
        try:
            expected = reference(value, "c")
        except DecodeError:
            assert flagged
            continue
        assert flagged or got == expected, value


# -- through Iceberg ------------------------------------------------------------------------------------------------
def bronze(root: Path, records: list[RawRecord], fast: bool, stale: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Commit ``records`` to a lakehouse under ``root``; ``stale``: another writer commits the first half while
    this pipeline buffers everything (the commit must drop what is already there)."""
    from ingest.lakehouse import load_catalog
    from tests.conftest import make_settings

    settings = make_settings(root)
    tables = BronzeTables(load_catalog(settings), "bronze")
    source = cast(Any, type("NoSource", (), {"commit_advisory": lambda self, offsets: None})())
    pipeline = Pipeline(settings.ingest, tables, source, fast_path=fast)
    pipeline.accept_batch(records, INGESTED_AT)
    if stale:
        other = Pipeline(settings.ingest, tables, source, fast_path=not fast)
        other.accept_batch(records[: len(records) // 2], INGESTED_AT)
        other.flush()
    pipeline.flush()
    out = {}
    for name in tables.list_tables():
        rows = load_catalog(settings).load_table(f"bronze.{name}").scan().to_arrow().to_pylist()
        out[name] = sorted(rows, key=lambda r: (r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]))
    return out


@pytest.mark.parametrize("stale", [False, True])
def test_committed_bronze_is_the_same(tmp_path: Path, stale: bool) -> None:
    records = with_headers(file_records(PG_DUMP) + fake_records("informix", 4, 2))
    fast = bronze(tmp_path / "fast", records, True, stale)
    slow = bronze(tmp_path / "slow", records, False, stale)
    assert sorted(fast) == sorted(slow)
    for name, rows in slow.items():
        assert fast[name] == rows, name
    counts = {r.topic: 0 for r in records}
    for rows in fast.values():
        for row in rows:
            if row.get("_cdc_destination") is None:
                counts[row["_cdc_topic"]] += 1
    assert sum(counts.values()) + len(fast.get(DEAD_LETTER_TABLE, [])) == len(records)  # each exactly once
