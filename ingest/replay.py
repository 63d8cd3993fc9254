"""Land dead letters again (`cdclake replay-dead-letters`): after a fix (a setting such as
``ingest.infinite_timestamps``, a new cdclake), the records that failed are decoded anew, those that decode now
land in their bronze tables, and leave the dead-letter table.

The stages are ingest's, read from the dead-letter table instead of a topic: each record (raw key and value,
Kafka coordinates, timestamp and headers, as they arrived) goes through the same per-record decode and schema
checks (:class:`ingest.pipeline.Pipeline` with ``replaying``), and lands with its original coordinates, so silver
orders it by its position like any late change. A record that fails again stays a dead letter.

Exactly once, in two commits per table, each safe to repeat:

1. the data commit appends the records that decode now, leaving out any whose coordinates the table holds
   already (:class:`ingest.bronze.tables.TableBatch` ``replay``), and moves the table's offsets past those at
   its end (a partition whose latest records were dead letters);
2. the dead-letter table drops the records their data table now holds.

A replay killed between the two leaves records in both tables; the next replay finds them in their data table
and only drops them as dead letters. Only records a partition has landed past are taken: dead letters after a
gap (records of a flush whose data commit failed, which ingest reads again), or of a partition with no record in
its table yet, wait until ingest has landed past them. A running ingester is no obstacle: each commit is checked
against the very table state it lands on, and offsets only move forward.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import And, EqualTo, In, Or
from pyiceberg.table import Table

from ingest.bronze.dead_letters import landed_up_to
from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.tables import (
    OFFSETS_PROPERTY,
    REPLAYED_PROPERTY,
    BronzeTables,
    decode_offsets,
    held_coordinates,
    retry_commit,
    without_pyiceberg_retries,
)
from ingest.config import Settings
from ingest.debezium.envelope import RawRecord
from ingest.pipeline import Pipeline

log = logging.getLogger(__name__)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_COMMIT_ATTEMPTS = 8


@dataclass
class TopicReplay:
    """What a replay did with one topic's dead letters."""

    landed: int = 0  # now in their data table (this replay's, or an earlier one's that died before step 2)
    still_dead: int = 0  # failed again
    waiting: int = 0  # after records their partition has not landed (a gap, or none yet): replayed once it has
    mapped_elsewhere: int = 0  # ingest.table_mapping sends their topic to another table now


@dataclass
class ReplayResult:
    topics: dict[str, TopicReplay] = field(default_factory=dict)  # those with dead letters, of those asked for


class _NoSource:
    """The pipeline's source, unused: a replay hands it its records itself (accept_batch)."""

    def start(self, resolve: Any) -> None:
        return None

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        return []

    def caught_up(self, once: bool = False) -> bool:
        return True

    def commit_advisory(self, offsets: Mapping[tuple[str, int], int]) -> None:
        return None

    def lag(self) -> dict[tuple[str, int], int]:
        return {}

    def close(self) -> None:
        return None


def replay_dead_letters(
    settings: Settings, tables: BronzeTables, topics: Iterable[str] = (), *, dry_run: bool = False
) -> ReplayResult:
    """Land again the dead letters of ``topics`` (all, when none) that decode now; see the module's docstring.
    One topic at a time: only its dead letters (raw bytes included) are held in memory. ``dry_run``: decode and
    check them only, commit nothing (``landed`` counts those that would land)."""
    result = ReplayResult()
    dead_table = tables.load(DEAD_LETTER_TABLE)
    if dead_table is None or dead_table.current_snapshot() is None:
        return result
    held = dead_table.scan(selected_fields=("_cdc_topic",)).to_arrow()["_cdc_topic"].unique().to_pylist()
    wanted = sorted(set(topics) & set(held)) if topics else sorted(held)
    pipeline = Pipeline(settings.ingest, tables, _NoSource(), fast_path=False, replaying=True)
    dead_offsets = decode_offsets(dead_table.properties.get(OFFSETS_PROPERTY))
    equal: Any = EqualTo
    for topic in wanted:
        letters = dead_table.scan(row_filter=equal("_cdc_topic", topic)).to_arrow()
        letters = letters.sort_by([("_cdc_partition", "ascending"), ("_cdc_offset", "ascending")])
        counts = result.topics[topic] = TopicReplay()
        taken = _replayable(tables, dead_table, dead_offsets, pipeline.table_for(topic), letters, counts)
        if not taken:
            continue
        log.info("replaying %d dead letter(s) of %s", len(taken), topic, extra={"topic": topic})
        started = time.monotonic()
        ingested_at = dt.datetime.now(dt.UTC)
        if dry_run:  # a pipeline of its own, whose buffer is never committed
            pipeline = Pipeline(settings.ingest, tables, _NoSource(), fast_path=False, replaying=True)
        for chunk in _chunks([_raw_record(row) for row in taken], 1000):
            pipeline.accept_batch(chunk, ingested_at)
            if pipeline.flush_due() and not dry_run:
                pipeline.flush()
        if dry_run:
            counts.still_dead = pipeline.stats.dead_letters
            counts.landed = len(taken) - counts.still_dead
            continue
        pipeline.flush()
        _drop_landed(tables, taken, counts)
        log.info(
            "%s: %d landed, %d still dead letters (%.1f s)",
            topic,
            counts.landed,
            counts.still_dead,
            time.monotonic() - started,
            extra={"topic": topic},
        )
    return result


def _replayable(
    tables: BronzeTables,
    dead_table: Table,
    dead_offsets: Mapping[tuple[str, int], int],
    table_name: str,
    letters: pa.Table,
    counts: TopicReplay,
) -> list[dict[str, Any]]:
    """A topic's dead letters that a replay may take (the others counted in ``counts``): those meant for the table
    its records go to now, and landed past (below where the partition has landed)."""
    destination = tables.identifier(table_name)
    taken: list[dict[str, Any]] = []
    landed_to: dict[int, int] = {}
    for row in letters.to_pylist():
        if row["_cdc_destination"] != destination:
            counts.mapped_elsewhere += 1
            continue
        partition = int(row["_cdc_partition"])
        end = landed_to.get(partition)
        if end is None:
            end = landed_to[partition] = _landed_end(
                tables, dead_table, dead_offsets, (str(row["_cdc_topic"]), partition), destination
            )
        if row["_cdc_offset"] >= end:
            counts.waiting += 1
            continue
        taken.append(row)
    return taken


def _landed_end(
    tables: BronzeTables,
    dead_table: Table,
    dead_offsets: Mapping[tuple[str, int], int],
    tp: tuple[str, int],
    destination: str,
) -> int:
    """Where the partition has landed, as ingest resumes (ingest.bronze.dead_letters): a dead letter below it lies in
    the data table's past or in its run of dead letters, never after a record not landed yet."""
    offset = tables.offsets(destination.rpartition(".")[2]).get(tp)
    if offset is None:
        # No record of the partition in its table yet: whether those before its first dead letter have landed is
        # not known (a flush whose data commit is pending or failed), and moving the table's offset past them
        # would lose them. Its dead letters wait until one lands.
        return -1
    return landed_up_to(dead_table, tp, offset, dead_offsets.get(tp, 0), destination)


def _raw_record(row: Mapping[str, Any]) -> RawRecord:
    """The record as it arrived, from its dead letter."""
    kafka_ts = row["_cdc_kafka_ts"]
    headers = row["_cdc_headers"]
    return RawRecord(
        topic=str(row["_cdc_topic"]),
        partition=int(row["_cdc_partition"]),
        offset=int(row["_cdc_offset"]),
        timestamp_ms=None if kafka_ts is None else (kafka_ts - _EPOCH) // dt.timedelta(milliseconds=1),
        key=row["_cdc_raw_key"],
        value=row["_cdc_raw_value"],
        headers=None if headers is None else [(header["key"], header["value"]) for header in headers],
    )


def _chunks(records: list[RawRecord], size: int) -> Iterable[list[RawRecord]]:
    for start in range(0, len(records), size):
        yield records[start : start + size]


def _drop_landed(tables: BronzeTables, taken: list[dict[str, Any]], counts: TopicReplay) -> None:
    """Step 2: the dead letters (of one topic, one destination) that their data table now holds leave the
    dead-letter table, in one commit."""
    destination = str(taken[0]["_cdc_destination"])
    table = tables.load(destination.rpartition(".")[2])
    coordinates = pa.Table.from_pylist(
        [{k: row[k] for k in ("_cdc_topic", "_cdc_partition", "_cdc_offset")} for row in taken]
    )
    held = set() if table is None else held_coordinates(table, coordinates)
    landed: list[tuple[str, int, int, str]] = []
    for row in taken:
        key = (str(row["_cdc_topic"]), int(row["_cdc_partition"]), int(row["_cdc_offset"]))
        if key in held:
            landed.append((*key, destination))
    counts.landed += len(landed)
    counts.still_dead += len(taken) - len(landed)
    if landed:
        _delete_dead_letters(tables, landed)


def _delete_dead_letters(tables: BronzeTables, landed: list[tuple[str, int, int, str]]) -> None:
    """Delete these dead letters, retried from the table's latest state when another writer committed meanwhile."""
    equal: Any = EqualTo
    in_: Any = In
    both: Any = And
    parts: dict[tuple[str, int, str], list[int]] = {}
    for topic, partition, offset, destination in landed:
        parts.setdefault((topic, partition, destination), []).append(offset)
    conditions = [
        both(
            both(equal("_cdc_topic", topic), equal("_cdc_partition", partition)),
            both(equal("_cdc_destination", destination), in_("_cdc_offset", sorted(offsets))),
        )
        for (topic, partition, destination), offsets in sorted(parts.items())
    ]
    condition = conditions[0] if len(conditions) == 1 else Or(*conditions)

    def delete() -> None:
        table = tables.load(DEAD_LETTER_TABLE)
        assert table is not None
        # Its rewritten files must not be re-based on another writer's (a compaction's) without reading them again.
        without_pyiceberg_retries(table)
        with warnings.catch_warnings():  # the table asks for merge-on-read deletes, which pyiceberg cannot write
            warnings.filterwarnings("ignore", "Merge on read is not yet supported", UserWarning)
            table.delete(delete_filter=condition, snapshot_properties={REPLAYED_PROPERTY: str(len(landed))})

    retry_commit(
        delete,
        _COMMIT_ATTEMPTS,
        lambda attempts: (
            f"{tables.identifier(DEAD_LETTER_TABLE)}: deleting {len(landed)} replayed dead letter(s) "
            f"failed {attempts} times (they are in their data tables: run the replay again)"
        ),
    )
