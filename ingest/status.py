"""What the lakehouse holds and how far behind it is: the logic of `cdclake status`, without any CLI.

Everything is read from Iceberg metadata through pyiceberg (no Spark): per bronze table the row count (snapshot
summary ``total-records``), the committed offsets (table property ``cdclake.offsets``), the time of the last
ingest commit, the consumer lag against the broker (Kafka sources only), the dead letters per topic, and for the
silver table of the same name and every silver table, in any namespace, whose applied snapshot is one of bronze's, the
bronze snapshot it has applied (``cdclake.bronze_snapshot_id``) and whether bronze has moved on since.

Compaction and manifest rewrites add ``replace`` snapshots to bronze that carry no new rows: they neither count as
ingest commits nor make silver "behind".
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, In
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from ingest.bronze.dead_letters import dead_letters_landed_up_to, landed_up_to
from ingest.bronze.naming import DEAD_LETTER_TABLE, bronze_table_name
from ingest.bronze.rows import INGESTED_AT_COLUMN
from ingest.bronze.tables import OFFSETS_PROPERTY, decode_offsets
from ingest.config import Settings, SourceSettings
from ingest.debezium.envelope import HEARTBEAT_PREFIX
from ingest.errors import ConfigError
from ingest.snapshots import (
    APPLIED_RECORDS_PROPERTY,
    APPLIED_SNAPSHOT_PROPERTY,
    ancestors,
    held_from_snapshot,
    held_transaction_count,
    integer_property,
    silver_positions,
)
from ingest.sources.base import TopicSelection
from ingest.text import first_few

log = logging.getLogger(__name__)

APPLIED_AT_COLUMN = "_cdc_applied_at"
DEFAULT_STALE_AFTER_S = 3600.0

TopicPartition = tuple[str, int]


class Watermarks(NamedTuple):
    """A partition's log per the broker: its first offset (records before it were deleted) and its end."""

    low: int
    high: int


# For each asked partition: the broker's watermarks, or the error that prevented reading them.
WatermarkReader = Callable[[Sequence[TopicPartition]], Mapping[TopicPartition, "Watermarks | Exception"]]
# When each partition's first record (at its log start) was written; partitions it could not read are left out.
FirstRecordTimes = Callable[[Sequence[TopicPartition]], Mapping[TopicPartition, dt.datetime]]
# The partitions each named topic has, per the cluster's metadata (topics it does not know are left out); given
# None, those of every topic but the internal ones.
PartitionLister = Callable[[Sequence[str] | None], Mapping[str, Sequence[int]]]


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    next_offset: int | None  # None: no record of the partition landed yet (ingest reads it from the log's start)
    high_watermark: int | None = None
    lag: int | None = None
    lag_error: str | None = None  # why lag is n/a (None with lag None: no broker to ask, e.g. a file source)
    log_start: int | None = None  # the log's first offset, when it lies beyond next_offset: records were deleted


@dataclass
class SilverStatus:
    table: str
    applied_snapshot_id: int | None
    applied_snapshot_at: dt.datetime | None  # commit time of that bronze snapshot, while bronze still keeps it
    behind: bool | None  # None: cannot tell (silver records no applied snapshot)
    behind_since: dt.datetime | None  # first bronze commit with new rows that silver has not applied
    applied_at_max: dt.datetime | None  # max(_cdc_applied_at)
    last_commit: dt.datetime | None  # silver's current snapshot
    # Source transactions whose changes silver holds until all of them have landed (complete_transactions).
    held_transactions: int = 0


@dataclass
class BronzeStatus:
    name: str
    table: str
    rows: int | None
    snapshot_id: int | None
    last_commit: dt.datetime | None
    last_commit_from: str | None  # "snapshot" (the last ingest snapshot) or "data" (max _cdc_ingested_at)
    partitions: list[PartitionStatus] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    dead_letters_latest_error: dict[str, str] = field(default_factory=dict)  # topic -> why its last one is one
    # Every silver table built from it: `silver.<name>` first, then those found by the bronze snapshot they applied
    # (other names or namespaces: a history beside a current state, a model with an alias or a schema of its own).
    silvers: list[SilverStatus] = field(default_factory=list)

    @property
    def silver(self) -> SilverStatus | None:
        """The first of :attr:`silvers` (the silver table of the same name, when there is one)."""
        return self.silvers[0] if self.silvers else None

    @property
    def lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        return None if not lags or any(lag is None for lag in lags) else sum(lag for lag in lags if lag is not None)


@dataclass
class LakehouseStatus:
    generated_at: dt.datetime
    catalog: str
    bronze_namespace: str
    silver_namespace: str
    source: str | None
    tables: list[BronzeStatus]
    dead_letters_without_table: dict[str, int]  # topic -> count, for destinations that have no bronze table
    lag_checked: bool  # whether the broker was asked
    # topic -> when the last of those dead letters was landed, and why it is one
    dead_letters_without_table_latest: dict[str, dt.datetime] = field(default_factory=dict)
    dead_letters_without_table_latest_error: dict[str, str] = field(default_factory=dict)
    # Topics of the subscription that hold records but have no bronze table (and no dead letter): nothing landed.
    # topic -> its records in the cluster (the sum over its partitions of high watermark - log start).
    topics_without_table: dict[str, int] = field(default_factory=dict)
    # topic -> when its oldest record was written (absent: not known), for --stale-after
    topics_without_table_since: dict[str, dt.datetime] = field(default_factory=dict)


# -- small readers -------------------------------------------------------------------------------------------------
def _utc_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _utc_us(us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(us / 1_000_000, tz=dt.UTC)


def _list_tables(catalog: Catalog, namespace: str) -> list[str]:
    try:
        return sorted(identifier[-1] for identifier in catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []


def _load(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def _is_data_change(snapshot: Snapshot) -> bool:
    """False for compaction / manifest rewrites, which commit no new rows."""
    return snapshot.summary is None or snapshot.summary.operation != Operation.REPLACE


def total_records(table: Table) -> int | None:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return 0
    value = snapshot.summary["total-records"] if snapshot.summary is not None else None
    return None if value is None else int(value)


def column_max_timestamp(table: Table, column: str) -> dt.datetime | None:
    """max(column) of a timestamp column from the data files' upper bounds; reads the column if a file has none."""
    from pyiceberg.conversions import from_bytes

    try:
        field_ = table.schema().find_field(column)
    except ValueError:
        return None
    if table.current_snapshot() is None:
        return None
    best: int | None = None
    for task in table.scan().plan_files():
        data_file = task.file
        if not data_file.record_count:
            continue
        bound = (data_file.upper_bounds or {}).get(field_.field_id)
        if bound is None:
            if (data_file.null_value_counts or {}).get(field_.field_id) == data_file.record_count:
                continue
            return _scan_max_timestamp(table, column)  # no metrics for this column: read it
        value = int(from_bytes(field_.field_type, bound))  # type: ignore[arg-type]
        best = value if best is None or value > best else best
    return None if best is None else _utc_us(int(best))


def _scan_max_timestamp(table: Table, column: str) -> dt.datetime | None:
    data = table.scan(selected_fields=(column,)).to_arrow()
    if data.num_rows == 0:
        return None
    value = pc.max(data.column(column)).as_py()
    if value is None:
        return None
    assert isinstance(value, dt.datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def last_ingest_commit(table: Table) -> tuple[dt.datetime | None, str | None]:
    """When the ingester last committed rows: the newest snapshot carrying offsets, else max(_cdc_ingested_at).

    The fallback covers bronze after compaction plus expiry, when no ingest snapshot is left.
    """
    ingest = [s for s in table.snapshots() if s.summary is not None and s.summary[OFFSETS_PROPERTY] is not None]
    if ingest:
        return _utc_ms(max(s.timestamp_ms for s in ingest)), "snapshot"
    from_data = column_max_timestamp(table, INGESTED_AT_COLUMN)
    return (from_data, "data") if from_data is not None else (None, None)


@dataclass
class DeadLetters:
    count: int
    latest: dt.datetime | None  # when the last of them was landed
    latest_error: str | None = None  # why the last of them is one ("<kind>: <error>")


def count_dead_letters(
    catalog: Catalog, bronze_namespace: str, destinations: Iterable[str] | None = None
) -> dict[str, dict[str, DeadLetters]]:
    """Dead letters as {destination table: {topic: DeadLetters}}; ``destinations`` (``ns.table``) filters the
    scan."""
    table = _load(catalog, f"{bronze_namespace}.{DEAD_LETTER_TABLE}")
    if table is None or table.current_snapshot() is None:
        return {}
    wanted = None if destinations is None else sorted(set(destinations))
    if wanted == []:
        return {}
    # (pyiceberg's pydantic-based predicates confuse mypy's view of their constructors)
    in_: Any = In
    row_filter: BooleanExpression = AlwaysTrue() if wanted is None else in_("_cdc_destination", wanted)
    fields = ("_cdc_destination", "_cdc_topic", INGESTED_AT_COLUMN)
    data = table.scan(row_filter=row_filter, selected_fields=fields).to_arrow()
    counts: dict[str, dict[str, DeadLetters]] = {}
    if data.num_rows == 0:
        return counts
    grouped = data.group_by(["_cdc_destination", "_cdc_topic"]).aggregate(
        [([], "count_all"), (INGESTED_AT_COLUMN, "max")]
    )
    for row in grouped.to_pylist():
        destination = str(row["_cdc_destination"])
        latest = row[f"{INGESTED_AT_COLUMN}_max"]
        counts.setdefault(destination, {})[str(row["_cdc_topic"])] = DeadLetters(int(row["count_all"]), latest)
    _add_latest_errors(table, row_filter, counts)
    return counts


def _add_latest_errors(table: Table, row_filter: BooleanExpression, counts: dict[str, dict[str, DeadLetters]]) -> None:
    """Each topic's latest dead letter's reason: the error of its last landed (of one flush: the greatest offset).
    Only the rows of those flushes are read with their errors (up to 4,000 characters each)."""
    times = {letters.latest for topics in counts.values() for letters in topics.values() if letters.latest}
    if not times:
        return
    in_: Any = In
    recent = And(row_filter, in_(INGESTED_AT_COLUMN, sorted(when.isoformat() for when in times)))
    fields = ("_cdc_destination", "_cdc_topic", INGESTED_AT_COLUMN, "_cdc_offset", "_cdc_error_kind", "_cdc_error")
    rows = table.scan(row_filter=recent, selected_fields=fields).to_arrow().to_pylist()
    for row in sorted(rows, key=lambda row: (row[INGESTED_AT_COLUMN], row["_cdc_offset"])):  # the last one wins
        letters = counts.get(str(row["_cdc_destination"]), {}).get(str(row["_cdc_topic"]))
        if letters is not None and row[INGESTED_AT_COLUMN] == letters.latest:
            letters.latest_error = f"{row['_cdc_error_kind']}: {row['_cdc_error']}"


# -- consumer lag ---------------------------------------------------------------------------------------------------
class _QuietLibrdkafka:
    """librdkafka's own log lines (connection refused, every retry) go to debug: the status shows the error once."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        log.debug(msg, *args)


def kafka_partitions(source: SourceSettings, timeout_s: float = 5.0) -> PartitionLister:
    """A lister of the partitions of topics, from one metadata request (which raises when the cluster does not
    answer: its watermarks are not asked for then, to wait for one timeout, not two)."""

    def list_partitions(topics: Sequence[str] | None) -> dict[str, list[int]]:
        from confluent_kafka import Consumer

        from ingest.sources.kafka import consumer_config

        if topics is not None and not topics:
            return {}
        consumer = Consumer(consumer_config(source), logger=_QuietLibrdkafka())
        try:
            metadata = consumer.list_topics(timeout=timeout_s)
        finally:
            consumer.close()
        wanted = None if topics is None else set(topics)
        return {
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if (name in wanted if wanted is not None else not name.startswith("__")) and topic.error is None
        }

    return list_partitions


def kafka_watermarks(source: SourceSettings, timeout_s: float = 5.0) -> WatermarkReader:
    """A reader of high watermarks with ``get_watermark_offsets(cached=False)``.

    Errors are returned per partition, never raised. After a broker-wide failure (unreachable, authentication,
    timeout) the remaining partitions get the same error instead of another timeout each.
    """

    def read(partitions: Sequence[TopicPartition]) -> dict[TopicPartition, Watermarks | Exception]:
        from confluent_kafka import Consumer, KafkaError, KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        from ingest.sources.kafka import consumer_config

        results: dict[TopicPartition, Watermarks | Exception] = {}
        if not partitions:
            return results
        try:
            consumer = Consumer(consumer_config(source), logger=_QuietLibrdkafka())
        except (KafkaException, ValueError, TypeError) as exc:
            return dict.fromkeys(partitions, exc)
        deadline = time.monotonic() + timeout_s
        try:
            for index, (topic, partition) in enumerate(partitions):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    results.update(dict.fromkeys(partitions[index:], TimeoutError(f"no answer within {timeout_s}s")))
                    break
                try:
                    low, high = consumer.get_watermark_offsets(
                        KafkaTopicPartition(topic, partition), timeout=remaining, cached=False
                    )
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    code = error.code() if isinstance(error, KafkaError) else None
                    results[(topic, partition)] = exc
                    if code not in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART):
                        results.update(dict.fromkeys(partitions[index + 1 :], exc))
                        break
                    continue
                results[(topic, partition)] = Watermarks(
                    -1 if low is None else int(low), -1 if high is None else int(high)
                )
        finally:
            consumer.close()
        return results

    return read


def kafka_first_record_times(source: SourceSettings, timeout_s: float = 5.0) -> FirstRecordTimes:
    """A reader of each partition's first record's timestamp: assigned at its log start, one record each (a
    consumer of its own, which commits nothing)."""

    def read(partitions: Sequence[TopicPartition]) -> dict[TopicPartition, dt.datetime]:
        from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_NOT_AVAILABLE, Consumer
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        from ingest.sources.kafka import consumer_config

        found: dict[TopicPartition, dt.datetime] = {}
        if not partitions:
            return found
        consumer = Consumer(consumer_config(source), logger=_QuietLibrdkafka())
        try:
            consumer.assign(
                [KafkaTopicPartition(topic, partition, OFFSET_BEGINNING) for topic, partition in partitions]
            )
            deadline = time.monotonic() + timeout_s
            while len(found) < len(partitions) and (remaining := deadline - time.monotonic()) > 0:
                message = consumer.poll(min(remaining, 0.5))
                if message is None or message.error() is not None:
                    continue
                topic, partition = message.topic(), message.partition()
                if topic is None or partition is None:
                    continue
                tp = (topic, partition)
                kind, ms = message.timestamp()
                if tp not in found and kind != TIMESTAMP_NOT_AVAILABLE and ms >= 0:
                    found[tp] = _utc_ms(ms)
                consumer.pause([KafkaTopicPartition(tp[0], tp[1])])  # one record of each is enough
        finally:
            consumer.close()
        return found

    return read


def _error_text(error: Exception) -> str:
    from confluent_kafka import KafkaError

    inner = error.args[0] if error.args else None
    if isinstance(inner, KafkaError):
        return str(inner.str())
    return str(error) or type(error).__name__


def apply_watermarks(partitions: list[PartitionStatus], marks: Mapping[TopicPartition, Watermarks | Exception]) -> None:
    """Fill lag = high watermark - next offset, or say why it is n/a; note a log that starts after the next offset.
    A partition with nothing landed lags by every record its log holds.

    A high watermark below bronze's next offset means the topic was recreated or another cluster answers (ingest
    stops on such a partition, see operations.md), or a broker whose ListOffsets "latest" is unreliable (Tansu
    answers with the base offset of the last batch plus one): shown as n/a, not as a negative lag.
    """
    for part in partitions:
        mark = marks.get((part.topic, part.partition))
        if mark is None:
            part.lag_error = "not asked"
        elif isinstance(mark, Exception):
            part.lag_error = _error_text(mark)
        elif mark.high < 0:
            part.lag_error = "broker returned no high watermark"
        elif part.next_offset is None:
            part.high_watermark = mark.high
            part.lag = mark.high - max(mark.low, 0)
        elif mark.high < part.next_offset:
            part.high_watermark = mark.high
            part.lag_error = (
                f"the log ends at offset {mark.high}, below bronze's next offset {part.next_offset}: the topic was "
                "recreated, bootstrap_servers names another cluster, or the broker's ListOffsets 'latest' is "
                "unreliable"
            )
        else:
            part.high_watermark = mark.high
            part.lag = mark.high - part.next_offset
            if mark.low > part.next_offset:
                part.log_start = mark.low


# -- silver -----------------------------------------------------------------------------------------------------------
def silver_status(silver: Table, identifier: str, bronze: Table) -> SilverStatus:
    applied = integer_property(silver.properties.get(APPLIED_SNAPSHOT_PROPERTY))
    applied_records = integer_property(silver.properties.get(APPLIED_RECORDS_PROPERTY))
    current = silver.current_snapshot()
    last_commit = None if current is None else _utc_ms(current.timestamp_ms)
    applied_snapshot = None if applied is None else bronze.snapshot_by_id(applied)
    behind, since = _behind(bronze, applied, applied_records, last_commit)
    held = held_transaction_count(silver)
    if held:
        # Silver has not applied the held changes: it is behind since the first bronze commit after the snapshot
        # it reads again from (held since its first run: since an unknown time).
        held_from = held_from_snapshot(silver)
        behind, since = True, None if held_from is None else _behind(bronze, held_from, None, last_commit)[1]
    return SilverStatus(
        table=identifier,
        applied_snapshot_id=applied,
        applied_snapshot_at=None if applied_snapshot is None else _utc_ms(applied_snapshot.timestamp_ms),
        behind=behind,
        behind_since=since,
        applied_at_max=column_max_timestamp(silver, APPLIED_AT_COLUMN),
        last_commit=last_commit,
        held_transactions=held,
    )


def _behind(
    bronze: Table, applied: int | None, applied_records: int | None, silver_commit: dt.datetime | None
) -> tuple[bool | None, dt.datetime | None]:
    """Whether bronze holds rows silver has not applied, and since when (the first such bronze commit).

    ``applied_records``: bronze's row count at the applied snapshot, as silver recorded it (None for a silver table
    from before cdclake recorded it)."""
    current = bronze.current_snapshot()
    if current is None:
        return False, None
    if applied is None:
        return None, None
    pending: list[Snapshot] = []
    found = False
    for snapshot in ancestors(bronze):
        if snapshot.snapshot_id == applied:
            found = True
            break
        pending.append(snapshot)
    data = [s for s in pending if _is_data_change(s)]
    if data:
        return True, _utc_ms(min(s.timestamp_ms for s in data))
    if found:
        return False, None
    # The applied snapshot has been expired and every retained snapshot is a rewrite. Bronze is append-only and a
    # rewrite keeps its row count: more rows than at the applied snapshot are rows silver has not applied. When
    # they came is gone with their snapshots; the newest ingest time is the latest they can have come.
    records = total_records(bronze)
    if applied_records is not None and records is not None:
        return (True, column_max_timestamp(bronze, INGESTED_AT_COLUMN)) if records > applied_records else (False, None)
    # A silver table without the count: compare times (silver's commit time, which its own compaction moves on).
    ingested = column_max_timestamp(bronze, INGESTED_AT_COLUMN)
    if ingested is not None and silver_commit is not None and ingested > silver_commit:
        return True, ingested
    return False, None


# -- the whole lakehouse -------------------------------------------------------------------------------------------
def collect_status(
    settings: Settings,
    catalog: Catalog | None = None,
    tables: Sequence[str] | None = None,
    watermarks: WatermarkReader | None = None,
    check_lag: bool = True,
    lag_timeout_s: float = 5.0,
    now: dt.datetime | None = None,
    partitions: PartitionLister | None = None,
    first_record_times: FirstRecordTimes | None = None,
) -> LakehouseStatus:
    """The status of every bronze table (or of ``tables``, names without namespace).

    ``watermarks`` and ``partitions`` default to asking the configured Kafka cluster; file sources have no lag.
    """
    if catalog is None:
        from ingest.lakehouse import load_catalog

        catalog = load_catalog(settings)
    lake = settings.lakehouse
    names = [name for name in _list_tables(catalog, lake.bronze_namespace) if name != DEAD_LETTER_TABLE]
    if tables:
        unknown = sorted(set(tables) - set(names))
        if unknown:
            raise ConfigError(
                f"no bronze table {', '.join(unknown)} in {lake.catalog_name}.{lake.bronze_namespace} "
                f"(it has {', '.join(names) or 'none'}; names are without the namespace)"
            )
        wanted = set(tables)
        names = [name for name in names if name in wanted]
    destinations = None if not tables else [f"{lake.bronze_namespace}.{name}" for name in tables]
    dead = count_dead_letters(catalog, lake.bronze_namespace, destinations)
    dead_table = _load(catalog, f"{lake.bronze_namespace}.{DEAD_LETTER_TABLE}")
    dead_offsets = {} if dead_table is None else decode_offsets(dead_table.properties.get(OFFSETS_PROPERTY))

    result: list[BronzeStatus] = []
    # Bronze snapshot id -> the silver tables that applied up to it, in any namespace (one pass over the catalog,
    # which keeps the tables it loaded for the silver status below).
    silver_tables: dict[str, Table] = {}
    applied_by = silver_positions(catalog, lake.bronze_namespace, silver_tables)
    for name in names:
        identifier = f"{lake.bronze_namespace}.{name}"
        table = _load(catalog, identifier)
        if table is None:  # dropped meanwhile
            continue
        last_commit, last_from = last_ingest_commit(table)
        current = table.current_snapshot()
        offsets = {
            tp: landed_up_to(dead_table, tp, offset, dead_offsets.get(tp, offset), identifier)
            for tp, offset in decode_offsets(table.properties.get(OFFSETS_PROPERTY)).items()
        }
        # A partition whose every record so far was a dead letter has no offset in the data table: it is where the
        # dead-letter table says (its lag is asked for like any other's).
        for tp, dead_offset in dead_offsets.items():
            if tp not in offsets and bronze_table_name(tp[0], settings.ingest.table_mapping) == name:
                offsets[tp] = dead_letters_landed_up_to(dead_table, tp, dead_offset, identifier)
        status = BronzeStatus(
            name=name,
            table=identifier,
            rows=total_records(table),
            snapshot_id=None if current is None else current.snapshot_id,
            last_commit=last_commit,
            last_commit_from=last_from,
            partitions=[
                PartitionStatus(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())
            ],
            dead_letters={topic: letters.count for topic, letters in sorted(dead.get(identifier, {}).items())},
            dead_letters_latest_error={
                topic: letters.latest_error
                for topic, letters in sorted(dead.pop(identifier, {}).items())
                if letters.latest_error is not None
            },
        )
        # The silver table of the same name (shown even before it records an applied snapshot), then every other
        # whose applied snapshot is one of this table's.
        same_name = f"{lake.silver_namespace}.{name}"
        others = {
            silver_id
            for snapshot in table.snapshots()
            for silver_id in applied_by.get(snapshot.snapshot_id, ())
            if silver_id != same_name
        }
        for silver_id in [same_name, *sorted(others)]:
            silver = silver_tables.get(silver_id) or _load(catalog, silver_id)
            if silver is not None:
                status.silvers.append(silver_status(silver, silver_id, table))
        result.append(status)

    source = settings.source
    lag_checked = False
    topics_without_table: dict[str, int] = {}
    topics_without_table_since: dict[str, dt.datetime] = {}
    if check_lag and (watermarks is not None or (source is not None and source.type == "kafka")):
        if watermarks is None:
            assert source is not None
            watermarks = kafka_watermarks(source, lag_timeout_s)
            partitions = partitions or kafka_partitions(source, lag_timeout_s)
        failed = None if partitions is None else add_unlanded_partitions(result, partitions)
        asked = [(p.topic, p.partition) for status in result for p in status.partitions]
        # The whole lakehouse asked for (no TABLES): the subscription's topics that have no table yet.
        unlanded: list[PartitionStatus] = []
        if not tables and failed is None and partitions is not None and source is not None:
            known = {p.topic for status in result for p in status.partitions} | {topic for topic, _ in dead_offsets}
            unlanded = unlanded_topic_partitions(source, settings.ingest.table_mapping, set(names), known, partitions)
        try:
            every = asked + [(p.topic, p.partition) for p in unlanded]
            marks = watermarks(every) if failed is None else dict.fromkeys(asked, failed)
        except Exception as exc:  # a broken reader must not break the status
            marks = dict.fromkeys(asked, exc)
        for status in result:
            apply_watermarks(status.partitions, marks)
        apply_watermarks(unlanded, marks)
        waiting = [(part, part.lag) for part in unlanded if part.lag]
        for part, records in waiting:
            topics_without_table[part.topic] = topics_without_table.get(part.topic, 0) + records
        if waiting:
            if first_record_times is None:
                assert source is not None
                first_record_times = kafka_first_record_times(source, lag_timeout_s)
            try:
                times = first_record_times([(part.topic, part.partition) for part, _ in waiting])
            except Exception:  # a broken reader must not break the status: the topics' age is not known
                times = {}
            for (topic, _partition), written in times.items():
                since = topics_without_table_since.get(topic)
                topics_without_table_since[topic] = written if since is None else min(since, written)
        lag_checked = True

    orphans: dict[str, int] = {}
    orphans_latest: dict[str, dt.datetime] = {}
    orphans_error: dict[str, str] = {}
    for topics in dead.values():
        for topic, letters in topics.items():
            orphans[topic] = orphans.get(topic, 0) + letters.count
            if letters.latest is not None and letters.latest >= orphans_latest.get(topic, letters.latest):
                orphans_latest[topic] = letters.latest
                if letters.latest_error is not None:
                    orphans_error[topic] = letters.latest_error
    return LakehouseStatus(
        generated_at=now or dt.datetime.now(dt.UTC),
        catalog=lake.catalog_name,
        bronze_namespace=lake.bronze_namespace,
        silver_namespace=lake.silver_namespace,
        source=None if source is None else source.type,
        tables=result,
        dead_letters_without_table=dict(sorted(orphans.items())),
        lag_checked=lag_checked,
        dead_letters_without_table_latest=orphans_latest,
        dead_letters_without_table_latest_error=dict(sorted(orphans_error.items())),
        topics_without_table=dict(sorted(topics_without_table.items())),
        topics_without_table_since=topics_without_table_since,
    )


def unlanded_topic_partitions(
    source: SourceSettings,
    mapping: Mapping[str, str],
    tables: set[str],
    known: set[str],
    partitions: PartitionLister,
) -> list[PartitionStatus]:
    """The partitions of the subscription's topics (source.topics, or those source.topic_pattern takes) that map to
    no bronze table and are not ``known`` (landed, or dead letters): nothing of them landed. Heartbeat topics never
    land (skipped by design): Debezium's default prefix and source.heartbeat_topic_prefixes. Empty when the listing
    fails (the lag check of the tables says why)."""
    selection = TopicSelection.of(source.topics, source.topic_pattern)
    try:
        listed = partitions(None if source.topic_pattern else sorted(source.topics))
    except Exception:  # a broken lister must not break the status
        return []
    heartbeats = (HEARTBEAT_PREFIX, *source.heartbeat_topic_prefixes)
    return [
        PartitionStatus(topic, partition, None)
        for topic, numbers in sorted(listed.items())
        if selection.follows(topic)
        and not topic.startswith(heartbeats)
        and topic not in known
        and bronze_table_name(topic, mapping) not in tables
        for partition in numbers
    ]


def add_unlanded_partitions(tables: list[BronzeStatus], partitions: PartitionLister) -> Exception | None:
    """The partitions of each table's topics that have nothing in bronze yet (added to the topic, or never read:
    ingest down, or their member stuck): listed from the cluster, as ingest would read them. Returns why the
    listing failed (the cluster does not answer), if it did."""
    topics = sorted({p.topic for table in tables for p in table.partitions})
    try:
        listed = partitions(topics)
    except Exception as exc:  # a broken lister must not break the status
        return exc
    for table in tables:
        known = {(p.topic, p.partition) for p in table.partitions}
        added = [
            PartitionStatus(topic, partition, None)
            for topic in sorted({p.topic for p in table.partitions})
            for partition in listed.get(topic, ())
            if (topic, partition) not in known
        ]
        if added:
            table.partitions = sorted([*table.partitions, *added], key=lambda p: (p.topic, p.partition))
    return None


def stale_problems(
    status: LakehouseStatus, stale_after_s: float, now: dt.datetime | None = None, max_lag: int | None = None
) -> list[str]:
    """Why the lakehouse counts as stale: records deleted from a topic before they were landed, bronze not committed
    for too long, silver behind for too long, or (``max_lag``) a partition further behind its topic than that."""
    now = now or status.generated_at
    limit = dt.timedelta(seconds=stale_after_s)
    problems: list[str] = []
    if max_lag is not None:
        # Per partition: one stalled partition hides behind its table's other partitions, which keep committing.
        for table in status.tables:
            unknown = [f"{part.topic}[{part.partition}]" for part in table.partitions if part.lag is None]
            for part in table.partitions:
                if part.lag is not None and part.lag > max_lag:
                    problems.append(
                        f"{part.topic}[{part.partition}]: {part.lag:,} record(s) not landed in {table.table}, more "
                        f"than --max-lag {max_lag:,}"
                    )
            # A lag that could not be read cannot be shown to be within --max-lag (a broker down is no all-clear).
            if unknown:
                reasons = list(dict.fromkeys(part.lag_error for part in table.partitions if part.lag_error))
                if not status.lag_checked:
                    why = "not checked: --no-lag, or a source without a broker"
                else:
                    why = reasons[0] if reasons else "not read"
                problems.append(
                    f"{table.table}: lag unknown for {first_few(unknown, 3)} ({why}), cannot check --max-lag "
                    f"{max_lag:,}"
                )
    for topic, count in status.topics_without_table.items():
        # As a table's last commit: stale once its oldest record waited longer (or when that is not known).
        since = status.topics_without_table_since.get(topic)
        if since is None or now - since > limit:
            waited = "" if since is None else f" for {format_age(now - since)}"
            problems.append(
                f"topic {topic}: {count:,} record(s) in the cluster{waited} and no bronze table: nothing of it has "
                "landed (is ingest running, and does its subscription take the topic? A heartbeat topic: "
                "name its prefix in source.heartbeat_topic_prefixes)"
            )
    for topic, count in status.dead_letters_without_table.items():
        # Only while they keep coming: those of a table since dropped or mapped elsewhere stay in the dead-letter
        # table, and made every later status stale.
        latest = status.dead_letters_without_table_latest.get(topic)
        if latest is None or now - latest <= limit:
            problems.append(f"topic {topic}: {count} record(s), every one a dead letter: no bronze table")
    for table in status.tables:
        for part in table.partitions:
            if part.log_start is not None and part.next_offset is not None:
                problems.append(
                    f"{part.topic}[{part.partition}]: the log starts at offset {part.log_start}, after bronze's next "
                    f"offset {part.next_offset}: {part.log_start - part.next_offset} offset(s) were deleted before "
                    "they were landed (records, or a transactional producer's commit marker; ingest stops there "
                    "until source.consumer.auto.offset.reset: earliest accepts the gap)"
                )
        if table.last_commit is None:
            problems.append(f"{table.table}: no ingest commit found")
        elif now - table.last_commit > limit and not is_idle(status, table):
            problems.append(
                f"{table.table}: last commit {format_age(now - table.last_commit)} ago "
                f"({table.last_commit:%Y-%m-%d %H:%M:%S}Z), older than {stale_after_s:g}s"
            )
        for silver in table.silvers:
            if not silver.behind:
                continue
            holding = (
                f", holding the changes of {silver.held_transactions:,} incomplete source transaction(s)"
                if silver.held_transactions
                else ""
            )
            if silver.behind_since is None:
                problems.append(f"{silver.table}: behind {table.table} (since an unknown time){holding}")
            elif now - silver.behind_since > limit:
                problems.append(
                    f"{silver.table}: behind {table.table} for {format_age(now - silver.behind_since)}, "
                    f"longer than {stale_after_s:g}s{holding}"
                )
    return problems


def is_idle(status: LakehouseStatus, table: BronzeStatus) -> bool:
    """Whether nothing waits for ``table``: its lag was read and is 0 on every partition. An old last commit then
    means a quiet source (idle), not a stalled ingest (stale); with its lag unknown or not checked, it is stale."""
    return status.lag_checked and bool(table.partitions) and all(part.lag == 0 for part in table.partitions)


def idle_tables(status: LakehouseStatus, stale_after_s: float, now: dt.datetime | None = None) -> list[str]:
    """The bronze tables whose last commit is older than ``stale_after_s`` while nothing waits for them."""
    now = now or status.generated_at
    limit = dt.timedelta(seconds=stale_after_s)
    return [
        table.table
        for table in status.tables
        if table.last_commit is not None and now - table.last_commit > limit and is_idle(status, table)
    ]


def format_age(delta: dt.timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172_800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def status_document(status: LakehouseStatus, stale_after_s: float, problems: list[str]) -> dict[str, Any]:
    """The JSON form of `cdclake status --json` (stable keys for scripts)."""
    idle = idle_tables(status, stale_after_s)

    def silver(item: SilverStatus | None) -> dict[str, Any] | None:
        if item is None:
            return None
        return {
            "table": item.table,
            "applied_bronze_snapshot_id": item.applied_snapshot_id,
            "applied_bronze_snapshot_at": _iso(item.applied_snapshot_at),
            "behind": item.behind,
            "behind_since": _iso(item.behind_since),
            "applied_at_max": _iso(item.applied_at_max),
            "last_commit": _iso(item.last_commit),
            "held_transactions": item.held_transactions,
        }

    return {
        "generated_at": _iso(status.generated_at),
        "catalog": status.catalog,
        "bronze_namespace": status.bronze_namespace,
        "silver_namespace": status.silver_namespace,
        "source": status.source,
        "lag_checked": status.lag_checked,
        "stale_after_s": stale_after_s,
        "stale": bool(problems),
        "problems": problems,
        # Bronze tables not committed for stale_after_s with nothing waiting (lag 0 everywhere): not a problem.
        "idle": idle,
        "tables": [
            {
                "name": table.name,
                "table": table.table,
                "rows": table.rows,
                "snapshot_id": table.snapshot_id,
                "last_commit": _iso(table.last_commit),
                "last_commit_from": table.last_commit_from,
                "idle": table.table in idle,
                "lag": table.lag,
                "offsets": [
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "next_offset": p.next_offset,
                        "high_watermark": p.high_watermark,
                        "lag": p.lag,
                        "lag_error": p.lag_error,
                        "log_start": p.log_start,
                    }
                    for p in table.partitions
                ],
                "dead_letters": table.dead_letters,
                "dead_letters_latest_error": table.dead_letters_latest_error,
                "silver": silver(table.silver),  # the first of silver_tables (kept for scripts written before)
                "silver_tables": [silver(item) for item in table.silvers],
            }
            for table in status.tables
        ],
        "dead_letters_without_table": status.dead_letters_without_table,
        "dead_letters_without_table_latest_error": status.dead_letters_without_table_latest_error,
        "topics_without_table": {
            topic: {"records": count, "since": _iso(status.topics_without_table_since.get(topic))}
            for topic, count in status.topics_without_table.items()
        },
    }
