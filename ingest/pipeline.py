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
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, cast

import pyarrow as pa

from ingest.bronze.columnar import BatchDecoder, Group
from ingest.bronze.dead_letters import DEAD_LETTER_SCHEMA, dead_letter_row, dead_lettered_offsets, landed_up_to
from ingest.bronze.evolution import merge_schemas, normalized
from ingest.bronze.naming import DEAD_LETTER_TABLE, bronze_table_name
from ingest.bronze.rows import BronzeRow, Layout, RowBuilder
from ingest.bronze.tables import (
    DEAD_LETTER_KIND,
    LAYOUT_PROPERTY,
    LAYOUT_PROVISIONAL_PROPERTY,
    OFFSETS_PROPERTY,
    BronzeTables,
    Offsets,
    TableBatch,
    decode_offsets,
    merge_offsets,
)
from ingest.config import IngestSettings
from ingest.debezium.envelope import Decoder, Envelope, RawRecord, RecordKind, decode
from ingest.errors import ConfigError, DecodeError, TypeConflictError
from ingest.metrics import IngestMetrics
from ingest.sources.base import Source

log = logging.getLogger(__name__)
POLL_BATCH = 5000
# Polls decoded on the decode thread and not yet booked, at most (see Pipeline.stage_batch).
STAGED_POLLS = 3
# Below this many records a poll takes the per-record path (the columnar one has a fixed cost per group).
FAST_PATH_MIN_RECORDS = 8
# Dead letters logged one by one per topic and flush; the rest in one line when the buffer goes to the commit.
DEAD_LETTERS_LOGGED_PER_FLUSH = 10
# What decoding a malformed record can raise besides DecodeError, where no check foresaw it: still the record's
# fault, and a dead letter (raised, it would stop the ingester on that record at every restart). ArithmeticError:
# OverflowError, and decimal's Overflow (a Connect Decimal with a huge negative scale).
UNFORESEEN_RECORD_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
    ArithmeticError,
)
_KEY, _VALUE = attrgetter("key"), attrgetter("value")
_COORDINATES = ["_cdc_topic", "_cdc_partition"]


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


def _batch_kind(kind: RecordKind) -> str:
    """``TableBatch.kind`` of a table whose first records are of ``kind`` (as _accept_one names it)."""
    return "change" if kind in (RecordKind.CHANGE, RecordKind.TOMBSTONE) else kind.value


@dataclass
class StagedPoll:
    """A poll between grouping and booking (Pipeline.stage_batch)."""

    records: list[RawRecord]
    ingested_at: dt.datetime
    groups: list[Group | None]  # of each record (None: the per-record path)
    built: list[Group]  # the distinct groups, in order of first appearance
    size: int  # the records' RawRecord.size, summed (what they add to the buffer's bytes)
    decoded: Future[None] | None = None  # their decoding on the decode thread

    @property
    def done(self) -> bool:
        return self.decoded is None or self.decoded.done()


def _size_of(records: list[RawRecord]) -> int:
    """RawRecord.size, summed (without a Python call per record)."""
    keys = sum(map(len, filter(None, map(_KEY, records))))
    return 64 * len(records) + keys + sum(map(len, filter(None, map(_VALUE, records))))


def _partitions_of(table: pa.Table) -> set[tuple[str, int]]:
    """The (topic, partition) pairs of a bronze Arrow table."""
    pairs = table.select(_COORDINATES).group_by(_COORDINATES).aggregate([])
    return set(zip(pairs["_cdc_topic"].to_pylist(), pairs["_cdc_partition"].to_pylist(), strict=True))


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
        poll_timeout_s: float = 1.0,
        replaying: bool = False,
    ) -> None:
        """``fast_path=False`` decodes and builds every record on its own with the reference functions
        (``decode`` parsing each document in full, ``RowBuilder``): slower, and what the fast path must equal.
        ``poll_timeout_s`` (source.poll_timeout_s): the longest wait for records in one poll.
        ``replaying``: the records are dead letters landed again (ingest.replay; the per-record path only): they lie
        below their tables' offsets and in the dead-letter table by nature, and are not skipped for it."""
        if replaying and fast_path:
            raise ValueError("a replay of dead letters takes the per-record path (fast_path=False)")
        self._replaying = replaying
        self.settings = settings
        self.poll_timeout_s = poll_timeout_s
        self.tables = tables
        self.source = source
        self.metrics = metrics or IngestMetrics()
        self._lag_labels: set[tuple[str, str]] = set()  # the (topic, partition) labels of the lag gauge set
        self.on_progress = on_progress
        self.stats = IngestStats()
        self._dead_letters_logged: dict[str, int] = {}  # per topic, in the buffer
        self.stop_requested = threading.Event()
        self._builder = RowBuilder(settings.variable_scale_decimal_scale, settings.infinite_timestamps)
        self._committed: dict[str, Offsets] = {}
        self._schemas: dict[str, pa.Schema | None] = {}
        self._seen_schemas: dict[str, set[int]] = {}
        self._layouts: dict[str, str | None] = {}
        # Tombstones of tables whose layout is not known yet (no table, nothing buffered): a tombstone's own layout
        # follows the key converter, not the value converter that decides the table's (RowBuilder.tombstone_row).
        # They wait for the first change record of their table to decide it, or for the flush (tombstones alone).
        self._undecided_tombstones: dict[str, list[tuple[RawRecord, Envelope, dt.datetime]]] = {}
        # Tables whose layout tombstones alone decided (a flush of nothing else, stored as LAYOUT_PROVISIONAL_PROPERTY):
        # their first change record decides it again, its tombstones still wait for one.
        self._provisional: set[str] = set()
        # Last Connect schemas seen per topic, for records that arrive without one (see _with_known_schema).
        self._topic_schemas: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
        self._buffer: dict[str, TableBatch] = {}
        self._buffered_records = 0
        self._buffered_bytes = 0
        self._first_buffered_at: float | None = None
        self._lock = threading.RLock()
        # Background commits (settings.background_commit): at most one buffer commits while the next one fills.
        self._committer: ThreadPoolExecutor | None = None
        self._in_flight: Future[dict[tuple[str, int], int]] | None = None
        self._in_flight_buffer: dict[str, TableBatch] = {}  # what that commit writes (its schemas: see below)
        self._commit_error: BaseException | None = None
        # Background decoding (settings.background_decode): polls decode, in order, while the next ones are read;
        # up to STAGED_POLLS of them wait to be booked, so neither the read loop nor the decode thread waits for
        # the other while it books or groups.
        self._decoder: ThreadPoolExecutor | None = None
        self._staged: deque[StagedPoll] = deque()
        # Guards the read-modify-write of _committed, which the commit thread also updates.
        self._committed_lock = threading.Lock()
        self._table_names: dict[str, str] = {}
        # Per partition: which offsets in [low, high) the dead-letter table holds (see _dead_lettered).
        self._dead_letter_window: dict[tuple[str, int], tuple[int, int, set[int]]] = {}
        # Per partition, the offset after the last record the source handed over since the partition was assigned.
        # A Kafka client whose fetch offset went out of range resets it (auto.offset.reset: earliest) and hands over
        # again records that may still be in the buffer, not yet committed: those are dropped (_drop_rewound).
        self._read_to: dict[tuple[str, int], int] = {}
        self._rewound_to: dict[tuple[str, int], int] = {}  # the offset after the last one skipped: one warning a run
        self._skips: dict[str, int] = {}
        self.fast_path = fast_path
        decoder = Decoder()
        self._decode = decoder.decode if fast_path else decode
        self._batch_decoder = BatchDecoder(decoder.splitter, self._builder, settings.variable_scale_decimal_scale)

    # -- positions ------------------------------------------------------------------------------------------
    def table_for(self, topic: str) -> str:
        return bronze_table_name(topic, self.settings.table_mapping)

    def _route(self, topic: str) -> str:
        """The table of ``topic``'s records, decided once per topic. Two topics whose default names collide
        (``db.public.Customers`` and ``db.public.customers``, ``a-b`` and ``a_b``) would mix two source tables' rows
        and keys in one: refused, naming both. A topic ``ingest.table_mapping`` sends to a table shares it on
        purpose, with mapped topics and with the one whose default name it is."""
        name = self.table_for(topic)
        mapping = self.settings.table_mapping
        if topic not in mapping:
            sharing = {other for other, table in self._table_names.items() if table == name}
            sharing |= {other for other, _partition in self._offsets(name)}
            sharing = {other for other in sharing if other != topic and other not in mapping}
            if sharing:
                raise ConfigError(
                    f"topics {topic!r} and {min(sharing)!r} both land in bronze table "
                    f"{self.tables.identifier(name)} by default (lower case, characters outside [a-z0-9_] as _): "
                    "give one a table of its own with ingest.table_mapping"
                )
        self._table_names[topic] = name
        return name

    def _load_table_state(self, name: str) -> None:
        table = self.tables.load(name)
        schema, layout = None, None
        if table is None:
            with self._committed_lock:
                self._committed[name] = {}
        else:
            stored = decode_offsets(table.properties.get(OFFSETS_PROPERTY))
            snapshot = table.current_snapshot()
            if snapshot is not None:
                self.metrics.committed(snapshot.timestamp_ms / 1000)
            with self._committed_lock:
                self._committed[name] = merge_offsets(self._committed.get(name, {}), stored)
            schema = normalized(table.schema().as_arrow())
            layout = table.properties.get(LAYOUT_PROPERTY)
        # Rows still buffered for the table passed their schema checks against what the table will hold once they
        # commit: keep their columns and layout, or a later record of a conflicting type would pass the check and
        # fail the commit (stopping the service) instead of becoming a dead letter.
        # So do the rows of the commit in flight, which the table may not hold yet.
        provisional = table is not None and table.properties.get(LAYOUT_PROVISIONAL_PROPERTY) == "true"
        seen: set[int] = set()
        for pending in (self._in_flight_buffer.get(name), self._buffer.get(name)):
            if pending is None or not pending.schemas:
                continue
            if layout is None:
                provisional = pending.provisional_layout
            elif provisional and not pending.provisional_layout:
                provisional = False
                if layout != pending.layout.value:  # its commit lays the table out again (BronzeTables.commit)
                    schema, layout, seen = None, None, set()
            elif pending.provisional_layout and layout != pending.layout.value:
                continue  # tombstones only, which their commit conforms to the table's layout
            for buffered in pending.schemas:
                schema = merge_schemas(self.tables.identifier(name), schema, buffered)
                seen.add(id(buffered))
            layout = layout or pending.layout.value
        self._schemas[name], self._layouts[name], self._seen_schemas[name] = schema, layout, seen
        if provisional:
            self._provisional.add(name)
        else:
            self._provisional.discard(name)

    def _offsets(self, name: str) -> Offsets:
        committed = self._committed.get(name)
        if committed is None:
            self._load_table_state(name)
            committed = self._committed.get(name, {})
        return committed

    def resolve(self, topic: str, partition: int) -> int | None:
        """Where a partition resumes: the offset its bronze table committed (fresh from the catalog), past the run of
        dead letters that follows it (the data table's offset moves only with a record of its own: resuming before
        dead letters a topic's retention has deleted since would look like records lost)."""
        with self._lock:
            self._finish_commit()  # a commit in flight first
            name = self.table_for(topic)
            self._load_table_state(name)
            self._load_table_state(DEAD_LETTER_TABLE)
            tp = (topic, partition)
            self._dead_letter_window.pop(tp, None)
            self._read_to.pop(tp, None)
            offset = self._committed[name].get(tp)
            dead_offset = self._offsets(DEAD_LETTER_TABLE).get(tp)
            if offset is None or dead_offset is None or dead_offset <= offset:
                return offset
            dead_table = self.tables.load(DEAD_LETTER_TABLE)
            return landed_up_to(dead_table, tp, offset, dead_offset, self.tables.identifier(name))

    def _dead_lettered(self, name: str, tp: tuple[str, int], offset: int) -> bool:
        """Whether the dead-letter table holds this record. Only a record below its offsets can be there: one read
        again after a crash between the dead-letter commit and the data table's (ingest.bronze.dead_letters)."""
        high = self._offsets(DEAD_LETTER_TABLE).get(tp, -1)
        if offset >= high:
            return False
        window = self._dead_letter_window.get(tp)
        if window is None or not window[0] <= offset < window[1]:
            table = self.tables.load(DEAD_LETTER_TABLE)
            destination = self.tables.identifier(name)
            held = set() if table is None else dead_lettered_offsets(table, tp[0], tp[1], offset, high, destination)
            window = self._dead_letter_window[tp] = (offset, high, held)  # records come in offset order
        return offset in window[2]

    # -- decode & buffer --------------------------------------------------------------------------------------
    def _check_schema(self, name: str, schema: pa.Schema, row_layout: Layout, change: bool = True) -> None:
        """Reject (as a dead letter) a record whose columns cannot be unioned into the table's.

        A change record (not a tombstone: ``change`` False) decides the layout of a table whose tombstones alone
        decided it; the table's commit then lays it out again (BronzeTables.commit).
        """
        if change and name in self._provisional:
            self._provisional.discard(name)
            if self._layouts.get(name) != row_layout.value:
                self._schemas[name], self._layouts[name], self._seen_schemas[name] = None, None, set()
            elif name in self._undecided_tombstones:
                # The layout stands: the tombstones that waited for this record go first, in offset order (left
                # for the flush, they came after it and moved the partition's stored offset back below it).
                self._buffer_undecided_tombstones(name)
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
        if layout is None and name in self._undecided_tombstones:
            self._buffer_undecided_tombstones(name)

    def _reject(self, record: RawRecord, name: str, error: Exception, ingested_at: dt.datetime) -> None:
        """A record that could not be decoded or typed: a dead letter (or, for a type conflict with
        ``on_type_conflict: fail``, the end of ingest)."""
        if not isinstance(error, DecodeError):  # no check foresaw it: still the record's fault
            log.warning("decoding %s[%d]@%d failed", record.topic, record.partition, record.offset, exc_info=True)
            error = DecodeError(f"could not be decoded: {type(error).__name__}: {error}")
        if not self._replaying:  # a dead letter landed again that still conflicts stays one
            self._stop_on_type_conflict(error, record)
        self._dead_letter(record, name, error, ingested_at)

    def _stop_on_type_conflict(self, error: DecodeError, record: RawRecord) -> None:
        """With ``on_type_conflict: fail``, a type conflict stops ingest, naming the record and the setting."""
        if isinstance(error, TypeConflictError) and self.settings.on_type_conflict == "fail":
            raise TypeConflictError(
                f"{record.topic}[{record.partition}]@{record.offset}: {error} (ingest.on_type_conflict is 'fail'; "
                "'dead_letter' lands such records in the dead-letter table instead)"
            ) from error

    def _tombstones_wait(self, name: str) -> bool:
        """Whether ``name``'s tombstones wait for a change record (_undecided_tombstones): no change record decided
        its layout yet."""
        return self._layouts.get(name) is None or name in self._provisional

    def _buffer_undecided_tombstones(self, name: str) -> None:
        """Buffer the tombstones that waited for ``name``'s layout (decided now, or at the flush by the first of
        them, provisionally); their records were counted as buffered when they came."""
        for record, envelope, ingested_at in self._undecided_tombstones.pop(name):
            try:
                row = self._row(record, envelope, ingested_at, self._layouts.get(name))
                self._check_schema(name, row.schema, row.layout, change=False)
            except (DecodeError, *UNFORESEEN_RECORD_ERRORS) as error:
                self._reject(record, name, error, ingested_at)
                continue
            self._append_row(name, row, record, "change")

    def accept(self, record: RawRecord, ingested_at: dt.datetime) -> None:
        self.accept_batch([record], ingested_at)

    def accept_batch(self, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        """Decode and buffer one poll's records, in order (after a staged poll). Metrics are counted once per batch."""
        self.complete_staged()
        counted = records
        try:
            if self.fast_path and len(records) >= FAST_PATH_MIN_RECORDS:
                staged = self._stage(records, ingested_at)
                counted = staged.records  # _stage counted the records taken again
                self._decode_staged(staged)
                self._book(staged)
            else:
                read_to = self._read_to
                for record in records:
                    tp = (record.topic, record.partition)
                    if record.offset < read_to.get(tp, -1):
                        self._drop_rewound([record])
                        continue
                    read_to[tp] = record.offset + 1
                    self._accept_one(record, ingested_at)
        finally:
            self._count_in(counted)

    def stage_batch(self, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        """:meth:`accept_batch`, overlapped with reading (``background_decode``): this poll is grouped now and
        decoded on the decode thread while the next ones are read. Polls staged before it are buffered, in order,
        once decoded (the oldest waited for when STAGED_POLLS are staged). Until then (or :meth:`complete_staged`:
        accept_batch, a flush) a staged poll's records are not buffered."""
        if not (self.fast_path and self.settings.background_decode and len(records) >= FAST_PATH_MIN_RECORDS):
            self.accept_batch(records, ingested_at)
            return
        # Grouping reads the bookkeeping's state only where it cannot change in between (table names, committed
        # offsets, the splitter's schema prefixes), so it may run before the polls staged earlier are booked.
        staged = self._stage(records, ingested_at)
        if self._decoder is None:
            self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bronze-decode")
        staged.decoded = self._decoder.submit(self._decode_staged, staged)
        self._staged.append(staged)
        while self._staged and (len(self._staged) > STAGED_POLLS or self._staged[0].done):
            self._book_staged(self._staged.popleft())

    def complete_staged(self) -> None:
        """Buffer the staged polls, oldest first: wait for each one's decoding, then book it as accept_batch does."""
        while self._staged:
            self._book_staged(self._staged.popleft())

    def _book_staged(self, staged: StagedPoll) -> None:
        try:
            if staged.decoded is not None:
                staged.decoded.result()
            self._book(staged)
        finally:
            self._count_in(staged.records)

    @property
    def staged_records(self) -> int:
        return sum(len(staged.records) for staged in self._staged)

    @property
    def staged_bytes(self) -> int:
        return sum(staged.size for staged in self._staged)

    def _count_in(self, records: list[RawRecord]) -> None:
        counts: dict[str, int] = {}
        for record in records:
            counts[record.topic] = counts.get(record.topic, 0) + 1
        self.stats.records_in += len(records)
        for topic, count in counts.items():
            self.metrics.records_in.labels(topic).inc(count)
        self._publish_skips()

    def _stage(self, records: list[RawRecord], ingested_at: dt.datetime) -> StagedPoll:
        """The fast path (ingest.bronze.columnar), phase 1: each record's table (None: a replay) and group."""
        names: list[str | None] = []
        append = names.append
        known: dict[str, tuple[str, Offsets]] = {}  # topic -> table, its committed offsets (loaded as _offsets does)
        read_to = self._read_to
        rewound: list[int] = []
        for record in records:
            topic = record.topic
            table = known.get(topic)
            if table is None:
                name = self._table_names.get(topic)
                if name is None:
                    name = self._route(topic)
                table = known[topic] = (name, self._offsets(name))
            name, committed = table
            tp = (topic, record.partition)
            offset = record.offset
            if offset < read_to.get(tp, -1):
                rewound.append(len(names))
                append(None)
                continue
            read_to[tp] = offset + 1
            append(None if committed and offset < committed.get(tp, -1) else name)
        if rewound:
            taken_again = [records[index] for index in rewound]
            self._drop_rewound(taken_again)
            self._count_in(taken_again)
            dropped = set(rewound)
            records = [record for index, record in enumerate(records) if index not in dropped]
            names = [name for index, name in enumerate(names) if index not in dropped]
        # Records below the dead-letter table's offsets but not the data table's take the per-record path, which
        # asks the dead-letter table whether it holds them (_dead_lettered). Usually there are none.
        window = {
            tp: high
            for tp, high in self._offsets(DEAD_LETTER_TABLE).items()
            if tp[0] in known and high > known[tp[0]][1].get(tp, -1)
        }
        if window:
            for index, record in enumerate(records):
                if names[index] is not None and record.offset < window.get((record.topic, record.partition), -1):
                    names[index] = None
        groups = self._batch_decoder.group(records, names)
        built: dict[int, Group] = {}
        for group in groups:
            if group is not None and id(group) not in built:
                built[id(group)] = group
        return StagedPoll(records, ingested_at, groups, list(built.values()), _size_of(records))

    def _drop_rewound(self, records: list[RawRecord]) -> None:
        """Skip records at offsets this process has read since their partition was assigned: the client went back
        (an offset reset after the broker lost the fetch position). Taken again, those still in the buffer would
        land twice; those committed already are replays anyway. Logged once per partition and going back."""
        for record in records:
            self._skip("rewound")
            tp = (record.topic, record.partition)
            if self._rewound_to.get(tp) != record.offset:
                log.warning(
                    "%s[%d]: the Kafka client went back to offset %d after reading up to offset %d (an offset reset, "
                    "source.consumer.auto.offset.reset, after the broker lost the fetch position: e.g. an unclean "
                    "leader election); the records read before are skipped",
                    record.topic,
                    record.partition,
                    record.offset,
                    self._read_to[tp] - 1,
                )
            self._rewound_to[tp] = record.offset + 1

    def _decode_staged(self, staged: StagedPoll) -> None:
        """Phase 2, each group's Arrow table (on the decode thread for stage_batch: pyarrow's JSON parse and
        compute functions release the GIL)."""
        for group in staged.built:
            self._batch_decoder.build(group, staged.records, staged.ingested_at)

    def _book(self, staged: StagedPoll) -> None:
        """Phase 3: the typed records of a poll, decoded and typed as Arrow columns per (table, schemas), are
        buffered; records the fast path does not keep go through :meth:`_accept_one`. The bookkeeping (schemas per
        topic, schema checks, dead letters, offsets) runs record by record in poll order, exactly as for the
        per-record path (:meth:`_accept_in_order`); or, for the topics whose every record the fast path kept,
        once per group with the same outcome (:meth:`_accept_groups`)."""
        records, groups, built, ingested_at = staged.records, staged.groups, staged.built, staged.ingested_at
        whole, slow = self._split_topics(records, groups, built)
        if whole:
            fast: Iterable[int] = range(len(records))
            fast_records, fast_groups = records, groups
            if slow is not None:
                self._accept_in_order(records, groups, slow[1], slow[0], ingested_at)
                fast = [index for index, group in enumerate(groups) if id(group) in whole]
                fast_records, fast_groups = [records[index] for index in fast], [groups[index] for index in fast]
            size = staged.size if fast_records is records else _size_of(fast_records)
            if self._accept_groups(fast_records, list(whole.values()), fast_groups, size):
                return
            self._accept_in_order(records, groups, list(whole.values()), fast, ingested_at)
            return
        self._accept_in_order(records, groups, built, range(len(records)), ingested_at)

    def _split_topics(
        self, records: list[RawRecord], groups: list[Group | None], built: list[Group]
    ) -> tuple[dict[int, Group], tuple[list[int], list[Group]] | None]:
        """The groups that can be booked at once (by id), and the rest of the poll (positions, groups) for the loop.

        Topics are independent in the bookkeeping unless they share a table: a topic whose every record the fast
        path kept is booked per group (Debezium's data topics), the others record by record (its transaction
        topic beside them), provided no table has records on both sides. Otherwise: nothing at once.
        """
        whole = {id(group): group for group in built if len(group.positions) == len(group.members)}
        if sum(len(group.members) for group in whole.values()) == len(records):
            return whole, None
        slow_topics = {record.topic for record, group in zip(records, groups, strict=True) if id(group) not in whole}
        changed = True
        while changed:  # a group with a record of a slow topic is slow, and makes its other topics slow too
            changed = False
            for key, group in list(whole.items()):
                topics = {topic for topic, _ in _partitions_of(group.table)}
                if topics & slow_topics:
                    del whole[key]
                    slow_topics |= topics
                    changed = True
        slow_tables = {self._table_names[topic] for topic in slow_topics}
        if not whole or any(group.name in slow_tables for group in whole.values()):
            return {}, None
        positions = [index for index, record in enumerate(records) if record.topic in slow_topics]
        return whole, (positions, [group for group in built if id(group) not in whole])

    def _accept_in_order(
        self,
        records: list[RawRecord],
        groups: list[Group | None],
        built: list[Group],
        positions: Iterable[int],
        ingested_at: dt.datetime,
    ) -> None:
        """Phase 3 for the records at ``positions`` (ascending), in poll order: what _accept_one does after building
        a row, inlined for the fast rows (of ``built``, the groups these records belong to); the others go
        through _accept_one."""
        rows = {id(group): group.rows for group in built}
        topic_schemas = self._topic_schemas
        buffer = self._buffer
        buffered_bytes = 0
        buffered_records = 0
        done = 0  # records before this one are buffered (or dead letters): their rows must reach the batches
        try:
            for done in positions:
                record = records[done]
                group = groups[done]
                row = None if group is None else rows[id(group)].get(done)
                if group is None or row is None:
                    self._accept_one(record, ingested_at)
                    continue
                name, schema = group.name, group.plan.schema
                key_schema, value_schema = group.key_schema, group.value_schema
                topic = record.topic
                kind = group.plan.kind
                if kind is RecordKind.CHANGE:  # as _with_known_schema records them
                    topic_schema = topic_schemas.get(topic)
                    if topic_schema is None:
                        topic_schemas[topic] = (key_schema, value_schema)
                    elif (key_schema is not None and topic_schema[0] is not key_schema) or (
                        value_schema is not None and topic_schema[1] is not value_schema
                    ):
                        topic_schemas[topic] = (key_schema or topic_schema[0], value_schema or topic_schema[1])
                if record.value is None and self._tombstones_wait(name):
                    group.dropped.append(row)  # it waits for its table's layout (_undecided_tombstones)
                    self._accept_one(record, ingested_at)
                    continue
                seen = self._seen_schemas.get(name)
                if seen is None or id(schema) not in seen:
                    try:
                        self._check_schema(name, schema, Layout.TYPED)
                    except DecodeError as error:
                        self._stop_on_type_conflict(error, record)
                        group.dropped.append(row)
                        if record.value is None:  # a tombstone takes its table's layout (RowBuilder.tombstone_row)
                            self._accept_one(record, ingested_at)
                        else:
                            self._dead_letter(record, name, error, ingested_at)
                        continue
                batch = buffer.get(name)
                if batch is None:
                    batch = buffer[name] = TableBatch(name, Layout.TYPED, _batch_kind(kind))
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
            for group in built:
                table = group.kept(done)
                if table is not None and table.num_rows:
                    self._buffer[group.name].tables.append(table)

    def _accept_groups(
        self, records: list[RawRecord], groups: list[Group], members: list[Group | None], size: int
    ) -> bool:
        """Phase 3 for a poll whose every record the fast path kept (``groups`` in order of first appearance,
        ``members[i]`` the group of record i, ``size`` the records' bytes as :func:`_size_of` counts them): the
        per-record loop's bookkeeping, once per group where it can be.
        Its outcome is the loop's: each group's schema is checked where the loop first meets it, a topic's last key
        and value schemas win, and each partition's offset is its last record's. False, with only the passed
        schema checks done (which the loop then finds done), when a schema check fails: the loop decides."""
        undecided = {group.name for group in groups if self._tombstones_wait(group.name)}
        if undecided and any(
            record.value is None and cast(Group, members[position]).name in undecided
            for position, record in enumerate(records)
        ):
            return False  # tombstones that must wait for their table's layout (_undecided_tombstones)
        for group in groups:
            seen = self._seen_schemas.get(group.name)
            if seen is None or id(group.plan.schema) not in seen:
                try:
                    self._check_schema(group.name, group.plan.schema, Layout.TYPED)
                except DecodeError:
                    return False
        buffer = self._buffer
        for group in groups:
            batch = buffer.get(group.name)
            if batch is None:
                batch = buffer[group.name] = TableBatch(group.name, Layout.TYPED, _batch_kind(group.plan.kind))
            schema, schemas = group.plan.schema, batch.schemas
            if not schemas or (schemas[-1] is not schema and all(known is not schema for known in schemas)):
                schemas.append(schema)
        # Each partition's last offset and each topic's last key and value schema of a change event (one has a key
        # schema exactly when it has a key, a value schema exactly when it has a value): from the end of the poll
        # backwards, until every partition and topic the groups hold is found (usually in the last few records).
        partitions: set[tuple[str, int]] = set()
        topics: set[str] = set()  # of change events
        for group in groups:
            pairs = _partitions_of(group.table)
            partitions |= pairs
            if group.plan.kind is RecordKind.CHANGE:
                topics |= {topic for topic, _ in pairs}
        last_offsets: dict[tuple[str, int], int] = {}
        key_schemas: dict[str, dict[str, Any] | None] = {}
        value_schemas: dict[str, dict[str, Any] | None] = {}
        for position in range(len(records) - 1, -1, -1):
            topic, partition, offset, _timestamp, key, value, _headers = records[position]
            if (topic, partition) not in last_offsets:
                last_offsets[(topic, partition)] = offset
            group = cast(Group, members[position])
            if group.plan.kind is RecordKind.CHANGE:
                if key is not None and topic not in key_schemas:
                    key_schemas[topic] = group.key_schema
                if value is not None and topic not in value_schemas:
                    value_schemas[topic] = group.value_schema
            if len(last_offsets) == len(partitions) and len(key_schemas) == len(value_schemas) == len(topics):
                break
        table_names = self._table_names
        for (topic, partition), offset in last_offsets.items():
            buffer[table_names[topic]].offsets[(topic, partition)] = offset + 1
        for topic in topics:
            known_key, known_value = self._topic_schemas.get(topic) or (None, None)
            self._topic_schemas[topic] = (key_schemas.get(topic) or known_key, value_schemas.get(topic) or known_value)
        self._buffered_records += len(records)
        self._buffered_bytes += size
        if self._first_buffered_at is None:
            self._first_buffered_at = time.monotonic()
        for group in groups:
            if group.table.num_rows:
                buffer[group.name].tables.append(group.table)
        return True

    def _accept_one(self, record: RawRecord, ingested_at: dt.datetime) -> None:
        name = self._table_names.get(record.topic)
        if name is None:
            name = self._route(record.topic)
        tp = (record.topic, record.partition)
        committed = self._offsets(name)  # loads the table's state (schema, layout) the checks below read
        if not self._replaying and (
            record.offset < committed.get(tp, -1) or self._dead_lettered(name, tp, record.offset)
        ):
            self._skip("replay")
            return
        try:
            envelope = self._with_known_schema(record.topic, self._decode(record))
            if envelope.kind is RecordKind.HEARTBEAT and self.settings.skip_heartbeats:
                self._skip("heartbeat")
                return
            layout = self._layouts.get(name)
            if envelope.kind is RecordKind.TOMBSTONE and self._tombstones_wait(name):
                self._undecided_tombstones.setdefault(name, []).append((record, envelope, ingested_at))
                self._note_buffered(record)
                return
            row = self._row(record, envelope, ingested_at, layout)
            self._check_schema(name, row.schema, row.layout)
        except (DecodeError, *UNFORESEEN_RECORD_ERRORS) as error:
            self._reject(record, name, error, ingested_at)
            return
        kind = "change" if envelope.kind in (RecordKind.CHANGE, RecordKind.TOMBSTONE) else envelope.kind.value
        self._append_row(name, row, record, kind)
        self._note_buffered(record)

    def _row(self, record: RawRecord, envelope: Envelope, ingested_at: dt.datetime, layout: str | None) -> BronzeRow:
        """The record's bronze row; a tombstone's in the layout of its table (``layout``), when that is known."""
        row = self._builder.build(record, envelope, ingested_at)
        if envelope.kind is RecordKind.TOMBSTONE and layout is not None and layout != row.layout.value:
            row = self._builder.tombstone_row(record, envelope, ingested_at, Layout(layout))
        return row

    def _append_row(self, name: str, row: BronzeRow, record: RawRecord, kind: str) -> None:
        batch = self._buffer.get(name)
        if batch is None:
            batch = self._buffer[name] = TableBatch(name, row.layout, kind)
        if all(schema is not row.schema for schema in batch.schemas):
            batch.schemas.append(row.schema)
        batch.rows.append(row.row)
        tp = (record.topic, record.partition)
        batch.offsets[tp] = max(batch.offsets.get(tp, 0), record.offset + 1)  # never back below a row buffered

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
        logged = self._dead_letters_logged.get(record.topic, 0)
        self._dead_letters_logged[record.topic] = logged + 1
        if logged < DEAD_LETTERS_LOGGED_PER_FLUSH:
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
            batch = self._buffer[DEAD_LETTER_TABLE] = TableBatch(DEAD_LETTER_TABLE, Layout.TYPED, DEAD_LETTER_KIND)
            batch.schemas.append(DEAD_LETTER_SCHEMA)
        batch.rows.append(dead_letter_row(record, self.tables.identifier(name), error, ingested_at))
        batch.offsets[tp] = max(batch.offsets.get(tp, 0), record.offset + 1)
        self.stats.dead_letters += 1
        self.metrics.dead_letters.labels(record.topic).inc()
        # The data table's offset must also move past this record once it commits, or a restart re-reads it.
        data_batch = self._buffer.get(name)
        if data_batch is not None and tp in data_batch.offsets:
            data_batch.offsets[tp] = max(data_batch.offsets[tp], record.offset + 1)
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
        """Commit what is buffered, a staged poll included, and wait for it (after the commit in flight, if any)."""
        self.complete_staged()
        self._flush(wait=True)

    def _flush(self, wait: bool) -> None:
        """Hand the buffer to the commit; with ``wait`` False (and ``background_commit``), to the commit thread.

        Commits land in buffer order: a buffer is only handed over once the commit before it has landed.
        """
        with self._lock:
            self._finish_commit()
            for name in list(self._undecided_tombstones):  # no change record decided their table's layout
                self._provisional.add(name)
                self._buffer_undecided_tombstones(name)
                if name in self._buffer:
                    self._buffer[name].provisional_layout = True
            if not self._buffer:
                return
            buffer, self._buffer = self._buffer, {}
            self._buffered_records = self._buffered_bytes = 0
            self._log_unlogged_dead_letters()
            self._first_buffered_at = None
            if wait or not self.settings.background_commit:
                self.source.commit_advisory(self._commit_buffer(buffer))
                return
            if self._committer is None:
                self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bronze-commit")
            self._in_flight_buffer = dict(buffer)  # a copy: the commit pops the dead letters off its own
            self._in_flight = self._committer.submit(self._commit_buffer, buffer)

    def _log_unlogged_dead_letters(self) -> None:
        """One line per topic for the dead letters of the buffer not logged one by one (a topic whose every record
        fails, a converter switched to Avro, would log tens of thousands of lines a second)."""
        for topic, count in sorted(self._dead_letters_logged.items()):
            if count > DEAD_LETTERS_LOGGED_PER_FLUSH:
                unlogged = count - DEAD_LETTERS_LOGGED_PER_FLUSH
                log.warning(
                    "%d more dead letter(s) from %s in this flush, not logged one by one (%s holds each)",
                    unlogged,
                    topic,
                    self.tables.identifier(DEAD_LETTER_TABLE),
                    extra={"topic": topic, "dead_letters": unlogged},
                )
        self._dead_letters_logged = {}

    def _finish_commit(self, block: bool = True) -> None:
        """Collect the background commit (waiting for it unless ``block`` is False): tell the source how far it
        got, or raise its error. After a failed commit nothing else is committed, here or later: the records
        buffered since lie beyond records bronze does not have (a restart re-reads them all)."""
        if self._commit_error is not None:
            raise self._commit_error
        future = self._in_flight
        if future is None or (not block and not future.done()):
            return
        self._in_flight = None
        self._in_flight_buffer = {}
        try:
            advisory = future.result()
        except BaseException as error:
            self._commit_error = error
            raise
        self.source.commit_advisory(advisory)

    def _stop_threads(self) -> None:
        """On the way out: let a commit in flight land (its error is logged, not raised over the one leaving), and
        stop the decode thread."""
        future, self._in_flight = self._in_flight, None
        self._in_flight_buffer = {}
        if future is not None:
            try:
                future.result()
            except Exception as error:
                log.exception("the bronze commit in flight failed")
                # The source's close() may still revoke partitions, and revoke() must not commit a newer buffer.
                if self._commit_error is None:
                    self._commit_error = error
        if self._committer is not None:
            self._committer.shutdown()
            self._committer = None
        self._staged.clear()  # left only when run() raised: never buffered, so a restart reads them again
        if self._decoder is not None:
            self._decoder.shutdown(cancel_futures=True)  # polls not decoded yet: never to be booked
            self._decoder = None

    def _commit_buffer(self, buffer: dict[str, TableBatch]) -> dict[tuple[str, int], int]:
        """Commit one flush's tables; returns the offsets to tell the source (advisory)."""
        started = time.monotonic()
        # Dead letters first: a crash before the data tables commit re-reads those records, and the dead
        # letters among them are then found in the dead-letter table (_dead_lettered), whatever they decode to now.
        dead = buffer.pop(DEAD_LETTER_TABLE, None)
        if dead is not None:
            self._commit(dead)
        batches = [replace(batch, replay=True) if self._replaying else batch for batch in buffer.values()]
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
        elapsed = time.monotonic() - started
        self.metrics.flush_seconds.observe(elapsed)
        self.metrics.progress()
        self.stats.flushes += 1
        log.info(
            "flushed %d table(s) in %.2fs",
            len(batches) + (dead is not None),
            elapsed,
            extra={"tables": sorted(b.name for b in batches), "seconds": round(elapsed, 3)},
        )
        return advisory

    def _commit(self, batch: TableBatch) -> None:
        try:
            written = self.tables.commit(batch, on_retry=lambda name: self.metrics.commit_failures.labels(name).inc())
        except Exception:
            self.metrics.commit_failures.labels(batch.name).inc()
            raise
        if written:  # not when another writer had landed every row already: nothing was committed
            self.metrics.committed(time.time())
        if batch.name == DEAD_LETTER_TABLE:
            with self._committed_lock:
                self._committed[batch.name] = merge_offsets(self._committed.get(batch.name, {}), batch.offsets)
            return
        self.stats.written += written
        self.stats.tables.add(batch.name)
        self.metrics.records_written.labels(batch.name).inc(written)
        # The commit may have evolved the schema, and other writers may have moved offsets: re-read the table's
        # state (offsets, schema) when its next record arrives.
        with self._committed_lock:
            self._committed.pop(batch.name, None)

    def revoke(self, partitions: list[tuple[str, int]]) -> None:
        """Before partitions move to another process, commit what is buffered (rebalance callback); not after a
        failed commit, whose records the buffered ones lie beyond (a restart, or the new owner, reads them all)."""
        if self._commit_error is not None:
            log.warning("partitions revoked after a failed bronze commit: the buffered records are not committed")
        else:
            self.flush()
        for topic, partition in partitions:
            self._committed.pop(self.table_for(topic), None)
            self._read_to.pop((topic, partition), None)

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
                records = self._read(once)
                if self.flush_due():
                    self._flush(wait=False)
                self._finish_commit(block=False)
                self._update_lag()  # also on the last pass of --once: the end-of-partition events moved positions
                if not records and self.source.caught_up(once):
                    if self._in_flight is None:  # idle, not waiting on a commit (a hung one must show in /healthz)
                        self.metrics.progress()
                    if once:
                        break
                if self.on_progress is not None:
                    self.on_progress(self.stats)
            self.flush()
        finally:
            self._stop_threads()
            self.source.close()
        return self.stats

    def _read(self, once: bool) -> list[RawRecord]:
        """One poll, staged (see stage_batch); none when the buffer is full with the staged polls (max_records or
        max_bytes), which are then booked so that it flushes."""
        capacity = self.settings.max_records - self._buffered_records - self.staged_records
        if self._staged and (capacity <= 0 or self._buffered_bytes + self.staged_bytes >= self.settings.max_bytes):
            self.complete_staged()
            return []
        # --once exits when every partition is read to its end: a short wait tells that soon enough.
        timeout = min(0.2, self.poll_timeout_s) if once else self.poll_timeout_s
        if self._first_buffered_at is not None:
            left = self.settings.latency_threshold_s - (time.monotonic() - self._first_buffered_at)
            timeout = max(min(timeout, left), 0.0)
        if self._staged:
            timeout = 0.0  # what the client holds already; if nothing, the staged polls are booked now, not later
        records = self.source.poll(max(min(POLL_BATCH, capacity), 1), timeout)
        if records:
            self.stage_batch(records, dt.datetime.now(dt.UTC))
        else:
            self.complete_staged()
        return records

    def _update_lag(self) -> None:
        lags = {(topic, str(partition)): lag for (topic, partition), lag in self.source.lag().items()}
        for labels, lag in lags.items():
            self.metrics.lag.labels(*labels).set(lag)
        # A partition handed to another member (or whose end is not known) has no lag of this member's to report: a
        # value left behind would stay as it was forever, and sums over the group's members would count it twice.
        for labels in self._lag_labels - lags.keys():
            self.metrics.lag.remove(*labels)
        self._lag_labels = set(lags)
