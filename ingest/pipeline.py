"""The ingest pipeline: read -> decode -> write -> commit, with bronze as the only durable state.

- read: the source hands over raw records, positioned from bronze's offsets.
- decode: each record becomes a bronze row (or a dead letter with a reason); replays below a table's committed
  offset are skipped.
- write: rows are buffered per table until ``max_records``, ``max_bytes`` or ``latency_threshold_s`` (IBM CDC's
  unit-of-work latency threshold), whichever comes first.
- commit: dead letters first, then each touched table once (in parallel), each with the offsets it covers.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from ingest.bronze.columnar import BatchDecoder, Group
from ingest.bronze.dead_letters import DEAD_LETTER_SCHEMA, dead_letter_row
from ingest.bronze.evolution import merge_schemas, normalized
from ingest.bronze.naming import DEAD_LETTER_TABLE, bronze_table_name
from ingest.bronze.rows import Layout, RowBuilder
from ingest.bronze.tables import (
    LAYOUT_PROPERTY,
    OFFSETS_PROPERTY,
    BronzeTables,
    Offsets,
    TableBatch,
    decode_offsets,
    merge_offsets,
)
from ingest.config import IngestSettings
from ingest.debezium.envelope import Decoder, Envelope, RawRecord, RecordKind, decode
from ingest.errors import DecodeError, TypeConflictError
from ingest.metrics import IngestMetrics
from ingest.sources.base import Source

log = logging.getLogger(__name__)
POLL_BATCH = 5000
# Below this many records a poll takes the per-record path (the columnar one has a fixed cost per group).
FAST_PATH_MIN_RECORDS = 8


@dataclass
class IngestStats:
    records_in: int = 0
    written: int = 0
    dead_letters: int = 0
    skipped: int = 0
    flushes: int = 0
    tables: set[str] = field(default_factory=set)
    started_at: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        return self.records_in / max(time.monotonic() - self.started_at, 1e-9)


class Pipeline:
    def __init__(
        self,
        settings: IngestSettings,
        tables: BronzeTables,
        source: Source,
        metrics: IngestMetrics | None = None,
        on_progress: Callable[[IngestStats], None] | None = None,
        *,
        fast_path: bool = True,
    ) -> None:
        """``fast_path=False`` decodes and builds every record on its own with the reference functions
        (``decode`` parsing each document in full, ``RowBuilder``): slower, and what the fast path must equal."""
        self.settings = settings
        self.tables = tables
        self.source = source
        self.metrics = metrics or IngestMetrics()
        self.on_progress = on_progress
        self.stats = IngestStats()
        self.stop_requested = threading.Event()
        self._builder = RowBuilder(settings.variable_scale_decimal_scale)
        self._committed: dict[str, Offsets] = {}
        self._schemas: dict[str, pa.Schema | None] = {}
        self._seen_schemas: dict[str, set[int]] = {}
        self._layouts: dict[str, str | None] = {}
        # Last Connect schemas seen per topic, for records that arrive without one (see _with_known_schema).
        self._topic_schemas: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
        self._buffer: dict[str, TableBatch] = {}
        self._buffered_records = 0
        self._buffered_bytes = 0
        self._first_buffered_at: float | None = None
        self._lock = threading.RLock()
        self._table_names: dict[str, str] = {}
        self._skips: dict[str, int] = {}
        self.fast_path = fast_path
        decoder = Decoder()
        self._decode = decoder.decode if fast_path else decode
        self._batch_decoder = BatchDecoder(decoder.splitter, self._builder, settings.variable_scale_decimal_scale)

    # -- positions ------------------------------------------------------------------------------------------
    def table_for(self, topic: str) -> str:
        return bronze_table_name(topic, self.settings.table_mapping)

    def _load_table_state(self, name: str) -> None:
        table = self.tables.load(name)
        if table is None:
            self._committed[name], self._schemas[name], self._layouts[name] = {}, None, None
            return
        stored = decode_offsets(table.properties.get(OFFSETS_PROPERTY))
        self._committed[name] = merge_offsets(self._committed.get(name, {}), stored)
        self._schemas[name] = normalized(table.schema().as_arrow())
        self._layouts[name] = table.properties.get(LAYOUT_PROPERTY)
        self._seen_schemas[name] = set()

    def _offsets(self, name: str) -> Offsets:
        if name not in self._committed:
            self._load_table_state(name)
        return self._committed[name]

    def resolve(self, topic: str, partition: int) -> int | None:
        """Where a partition resumes: the offset its bronze table committed (fresh from the catalog)."""
        with self._lock:
            name = self.table_for(topic)
            self._load_table_state(name)
            self._load_table_state(DEAD_LETTER_TABLE)
            return self._committed[name].get((topic, partition))

    # -- decode & buffer --------------------------------------------------------------------------------------
    def _check_schema(self, name: str, schema: pa.Schema, row_layout: Layout) -> None:
        """Reject (as a dead letter) a record whose columns cannot be unioned into the table's."""
        seen = self._seen_schemas.setdefault(name, set())
        if id(schema) in seen:
            return
        layout = self._layouts.get(name)
        if layout is not None and layout != row_layout.value:
            raise DecodeError(
                f"table {self.tables.identifier(name)} holds {layout} records but this record is "
                f"{row_layout.value} (schemas.enable differs between records of one topic)"
            )
        merged = merge_schemas(self.tables.identifier(name), self._schemas.get(name), schema)
        self._schemas[name] = merged
        self._layouts[name] = row_layout.value
        seen.add(id(schema))

    def accept(self, record: RawRecord, ingested_at: dt.datetime) -> None:
        self.accept_batch([record], ingested_at)

    def accept_batch(self, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        """Decode and buffer one poll's records, in order. Metrics are counted once per batch."""
        counts: dict[str, int] = {}
        for record in records:
            counts[record.topic] = counts.get(record.topic, 0) + 1
        try:
            if self.fast_path and len(records) >= FAST_PATH_MIN_RECORDS:
                self._accept_columnar(records, ingested_at)
            else:
                for record in records:
                    self._accept_one(record, ingested_at)
        finally:
            self.stats.records_in += sum(counts.values())
            for topic, count in counts.items():
                self.metrics.records_in.labels(topic).inc(count)
            self._publish_skips()

    def _accept_columnar(self, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        """The fast path (ingest.bronze.columnar): typed change events of a poll are decoded and typed as Arrow
        columns per (table, schemas); records it does not keep go through :meth:`_accept_one`. The bookkeeping
        (schemas per topic, schema checks, dead letters, offsets) then runs record by record in poll order,
        exactly as for the per-record path."""
        names: list[str | None] = []
        offsets: dict[str, Offsets] = {}  # the committed offsets of each table (loaded once, as _offsets does)
        for record in records:
            topic = record.topic
            name = self._table_names.get(topic)
            if name is None:
                name = self._table_names[topic] = self.table_for(topic)
            committed = offsets.get(name)
            if committed is None:
                committed = offsets[name] = self._offsets(name)
            names.append(None if record.offset < committed.get((topic, record.partition), -1) else name)
        groups = self._batch_decoder.group(records, names)
        built: dict[int, Group] = {}
        for group in groups:
            if group is not None and id(group) not in built:
                built[id(group)] = group
                self._batch_decoder.build(group, records, ingested_at)
        # Phase 3, in poll order: what _accept_one does after building a row, inlined for the fast rows.
        topic_schemas = self._topic_schemas
        buffer = self._buffer
        buffered_bytes = 0
        buffered_records = 0
        done = 0  # records before this one are buffered (or dead letters): their rows must reach the batches
        try:
            for done, record in enumerate(records):
                group = groups[done]
                row = None if group is None else group.rows.get(done)
                if group is None or row is None:
                    self._accept_one(record, ingested_at)
                    continue
                name, schema = group.name, group.plan.schema
                key_schema, value_schema = group.key_schema, group.value_schema
                topic = record.topic
                known = topic_schemas.get(topic)  # as _with_known_schema records them
                if known is None:
                    topic_schemas[topic] = (key_schema, value_schema)
                elif (key_schema is not None and known[0] is not key_schema) or (
                    value_schema is not None and known[1] is not value_schema
                ):
                    topic_schemas[topic] = (key_schema or known[0], value_schema or known[1])
                seen = self._seen_schemas.get(name)
                if seen is None or id(schema) not in seen:
                    try:
                        self._check_schema(name, schema, Layout.TYPED)
                    except DecodeError as error:
                        if isinstance(error, TypeConflictError) and self.settings.on_type_conflict == "fail":
                            raise
                        self._dead_letter(record, name, error, ingested_at)
                        group.dropped.append(row)
                        continue
                batch = buffer.get(name)
                if batch is None:
                    batch = buffer[name] = TableBatch(name, Layout.TYPED, "change")
                schemas = batch.schemas
                if not schemas or (schemas[-1] is not schema and all(known is not schema for known in schemas)):
                    schemas.append(schema)
                batch.offsets[(topic, record.partition)] = record.offset + 1
                buffered_records += 1
                buffered_bytes += record.size
            done = len(records)
        finally:
            # Also when a record raised (on_type_conflict: fail): the rows whose offsets were recorded stay.
            if buffered_records:
                self._buffered_records += buffered_records
                self._buffered_bytes += buffered_bytes
                if self._first_buffered_at is None:
                    self._first_buffered_at = time.monotonic()
            for group in built.values():
                table = group.kept(done)
                if table is not None and table.num_rows:
                    self._buffer[group.name].tables.append(table)

    def _accept_one(self, record: RawRecord, ingested_at: dt.datetime) -> None:
        name = self._table_names.get(record.topic)
        if name is None:
            name = self._table_names[record.topic] = self.table_for(record.topic)
        tp = (record.topic, record.partition)
        if record.offset < self._offsets(name).get(tp, -1):
            self._skip("replay")
            return
        try:
            envelope = self._with_known_schema(record.topic, self._decode(record))
            if envelope.kind is RecordKind.HEARTBEAT and self.settings.skip_heartbeats:
                self._skip("heartbeat")
                return
            row = self._builder.build(record, envelope, ingested_at)
            self._check_schema(name, row.schema, row.layout)
        except DecodeError as error:
            if isinstance(error, TypeConflictError) and self.settings.on_type_conflict == "fail":
                raise
            self._dead_letter(record, name, error, ingested_at)
            return
        batch = self._buffer.get(name)
        if batch is None:
            kind = "change" if envelope.kind in (RecordKind.CHANGE, RecordKind.TOMBSTONE) else envelope.kind.value
            batch = self._buffer[name] = TableBatch(name, row.layout, kind)
        if all(schema is not row.schema for schema in batch.schemas):
            batch.schemas.append(row.schema)
        batch.rows.append(row.row)
        batch.offsets[tp] = record.offset + 1
        self._note_buffered(record)

    def _with_known_schema(self, topic: str, envelope: Envelope) -> Envelope:
        """A record without a schema on a topic whose records had one is read with the topic's last schema.

        Debezium's documentation examples elide the schema of some events of a topic; a converter misconfigured
        on one worker does the same. The record must still fit that schema, or it becomes a dead letter.
        """
        if envelope.kind is not RecordKind.CHANGE and envelope.kind is not RecordKind.TOMBSTONE:
            return envelope
        key_schema, value_schema = self._topic_schemas.get(topic, (None, None))
        if envelope.value_schema is not None or envelope.key_schema is not None:
            self._topic_schemas[topic] = (envelope.key_schema or key_schema, envelope.value_schema or value_schema)
            if envelope.value_schema is not None or envelope.payload is None:
                return envelope
        if value_schema is None or envelope.payload is None:
            return envelope
        return replace(envelope, key_schema=envelope.key_schema or key_schema, value_schema=value_schema)

    def _dead_letter(self, record: RawRecord, name: str, error: Exception, ingested_at: dt.datetime) -> None:
        tp = (record.topic, record.partition)
        if record.offset < self._offsets(DEAD_LETTER_TABLE).get(tp, -1):
            self._skip("replay")
            return
        log.warning(
            "dead letter %s[%d]@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            error,
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
        )
        batch = self._buffer.get(DEAD_LETTER_TABLE)
        if batch is None:
            batch = self._buffer[DEAD_LETTER_TABLE] = TableBatch(DEAD_LETTER_TABLE, Layout.TYPED, "dead_letter")
            batch.schemas.append(DEAD_LETTER_SCHEMA)
        batch.rows.append(dead_letter_row(record, self.tables.identifier(name), error, ingested_at))
        batch.offsets[tp] = record.offset + 1
        self.stats.dead_letters += 1
        self.metrics.dead_letters.labels(record.topic).inc()
        # The data table's offset must also move past this record once it commits, or a restart re-reads it.
        data_batch = self._buffer.get(name)
        if data_batch is not None and tp in data_batch.offsets:
            data_batch.offsets[tp] = record.offset + 1
        self._note_buffered(record)

    def _skip(self, reason: str) -> None:
        self.stats.skipped += 1
        self._skips[reason] = self._skips.get(reason, 0) + 1

    def _publish_skips(self) -> None:
        for reason, count in self._skips.items():
            self.metrics.records_skipped.labels(reason).inc(count)
        self._skips.clear()

    def _note_buffered(self, record: RawRecord) -> None:
        self._buffered_records += 1
        self._buffered_bytes += record.size
        if self._first_buffered_at is None:
            self._first_buffered_at = time.monotonic()

    # -- commit -------------------------------------------------------------------------------------------------
    def flush_due(self) -> bool:
        if self._first_buffered_at is None:
            return False
        return (
            self._buffered_records >= self.settings.max_records
            or self._buffered_bytes >= self.settings.max_bytes
            or time.monotonic() - self._first_buffered_at >= self.settings.latency_threshold_s
        )

    def flush(self) -> None:
        with self._lock:
            if not self._buffer:
                return
            started = time.monotonic()
            buffer, self._buffer = self._buffer, {}
            self._buffered_records = self._buffered_bytes = 0
            self._first_buffered_at = None
            # Dead letters first: a crash before the data tables commit re-reads those records, and the dead
            # letters among them are then recognised by the dead-letter table's offsets.
            dead = buffer.pop(DEAD_LETTER_TABLE, None)
            if dead is not None:
                self._commit(dead)
            batches = list(buffer.values())
            if len(batches) == 1 or self.settings.writer_threads == 1:
                for batch in batches:
                    self._commit(batch)
            else:
                with ThreadPoolExecutor(max_workers=self.settings.writer_threads, thread_name_prefix="commit") as pool:
                    for future in [pool.submit(self._commit, batch) for batch in batches]:
                        future.result()
            advisory: dict[tuple[str, int], int] = {}
            for batch in [*batches, *([dead] if dead else [])]:
                for tp, offset in batch.offsets.items():
                    advisory[tp] = max(offset, advisory.get(tp, 0))
            self.source.commit_advisory(advisory)
            elapsed = time.monotonic() - started
            self.metrics.flush_seconds.observe(elapsed)
            self.metrics.last_commit.set_to_current_time()
            self.metrics.progress()
            self.stats.flushes += 1
            log.info(
                "flushed %d table(s) in %.2fs",
                len(batches) + (dead is not None),
                elapsed,
                extra={"tables": sorted(b.name for b in batches), "seconds": round(elapsed, 3)},
            )

    def _commit(self, batch: TableBatch) -> None:
        try:
            written = self.tables.commit(batch)
        except Exception:
            self.metrics.commit_failures.labels(batch.name).inc()
            raise
        if batch.name == DEAD_LETTER_TABLE:
            self._committed[batch.name] = merge_offsets(self._committed.get(batch.name, {}), batch.offsets)
            return
        self.stats.written += written
        self.stats.tables.add(batch.name)
        self.metrics.records_written.labels(batch.name).inc(written)
        # The commit may have evolved the schema, and other writers may have moved offsets: re-read the table's
        # state (offsets, schema) when its next record arrives.
        self._committed.pop(batch.name, None)

    def revoke(self, partitions: list[tuple[str, int]]) -> None:
        """Before partitions move to another process, commit what is buffered (rebalance callback)."""
        self.flush()
        for topic, _partition in partitions:
            self._committed.pop(self.table_for(topic), None)

    # -- loop ---------------------------------------------------------------------------------------------------
    def run(self, once: bool = False) -> IngestStats:
        """Run until stopped (or, with ``once``, until every partition is read to its end); commit on exit."""
        self.source.start(self.resolve)
        self.metrics.health_reason = "running"
        # What exists now (modules, catalog, settings) lives as long as the service: keep it out of the cyclic
        # collector's full passes, which otherwise walk it every few polls (~6% of the ingest time).
        gc.freeze()
        try:
            while not self.stop_requested.is_set():
                timeout = 0.2 if once else 1.0
                if self._first_buffered_at is not None:
                    left = self.settings.latency_threshold_s - (time.monotonic() - self._first_buffered_at)
                    timeout = max(min(timeout, left), 0.0)
                capacity = max(min(POLL_BATCH, self.settings.max_records - self._buffered_records), 1)
                records = self.source.poll(capacity, timeout)
                if records:
                    self.accept_batch(records, dt.datetime.now(dt.UTC))
                if self.flush_due():
                    self.flush()
                if not records and self.source.caught_up():
                    self.metrics.progress()
                    if once:
                        break
                if self.on_progress is not None:
                    self.on_progress(self.stats)
                self._update_lag()
            self.flush()
        finally:
            self.source.close()
        return self.stats

    def _update_lag(self) -> None:
        for (topic, partition), lag in self.source.lag().items():
            self.metrics.lag.labels(topic, str(partition)).set(lag)
