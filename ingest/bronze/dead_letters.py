"""The dead-letter table: records that could not be decoded or typed, kept raw with the reason.

Ingest continues past them; `cdclake status` counts them. One table for all topics (``bronze._cdc_dead_letters``),
committed before the data tables of the same flush so a crash between the two never loses a dead letter.

Its offsets (the greatest per partition) may then lie beyond the data table's. The records in between were each
either dead-lettered or buffered for the data table when the process died; which one is decided by the table
itself (:func:`dead_lettered_offsets`), not by the offsets nor by decoding them again, which can come out
differently after a restart (a topic's remembered Connect schema, the order partitions arrive in). A record is in
exactly one of the two tables.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.table import Table

from ingest.bronze.rows import COORDINATE_FIELDS, coordinate_values
from ingest.debezium.envelope import RawRecord

DEAD_LETTER_SCHEMA = pa.schema(
    [
        *COORDINATE_FIELDS,
        pa.field("_cdc_destination", pa.string()),
        pa.field("_cdc_error_kind", pa.string()),
        pa.field("_cdc_error", pa.string()),
        pa.field("_cdc_raw_key", pa.binary()),
        pa.field("_cdc_raw_value", pa.binary()),
    ]
)


def dead_letter_row(record: RawRecord, destination: str, error: Exception, ingested_at: dt.datetime) -> dict[str, Any]:
    return {
        **coordinate_values(record, ingested_at),
        "_cdc_destination": destination,
        "_cdc_error_kind": type(error).__name__,
        "_cdc_error": str(error)[:4000],
        "_cdc_raw_key": record.key,
        "_cdc_raw_value": record.value,
    }


def dead_lettered_offsets(
    table: Table, topic: str, partition: int, low: int, high: int, destination: str | None = None
) -> set[int]:
    """The offsets in ``[low, high)`` of the partition's records that ``table`` (the dead-letter table) holds; with
    ``destination``, only those meant for that bronze table. A topic deleted and created again numbers its records
    from 0: landed into another table (ingest.table_mapping), its records at the offsets of the old topic's dead
    letters are not those dead letters."""
    # pyiceberg's predicates are pydantic models: mypy reads their generated signature, not their __init__.
    equal: Any = EqualTo
    at_least: Any = GreaterThanOrEqual
    below: Any = LessThan
    condition = And(
        equal("_cdc_topic", topic),
        equal("_cdc_partition", partition),
        at_least("_cdc_offset", low),
        below("_cdc_offset", high),
    )
    if destination is not None:
        condition = And(condition, equal("_cdc_destination", destination))
    offsets = table.scan(row_filter=condition, selected_fields=("_cdc_offset",)).to_arrow()["_cdc_offset"]
    return set(offsets.to_pylist())


def landed_up_to(
    dead_table: Table | None, tp: tuple[str, int], offset: int, dead_offset: int, destination: str | None = None
) -> int:
    """Where a partition's landed records end: the data table's offset moves only with a record of its own, so past
    it come the records the dead-letter table holds (a partition whose latest records were dead letters has no lag,
    and resumes after them: a topic's retention may have deleted them since). Only a run of consecutive ones:
    records the dead-letter commit's flush did not get into the data table (its commit failed after the dead
    letters') are not landed."""
    if dead_table is None or dead_offset <= offset:
        return offset
    held = dead_lettered_offsets(dead_table, tp[0], tp[1], offset, dead_offset, destination)
    return _end_of_run(held, offset)


def dead_letters_landed_up_to(
    dead_table: Table | None, tp: tuple[str, int], dead_offset: int, destination: str | None = None
) -> int:
    """Where a partition with no record in its data table has landed: through the run of dead letters from its first
    (a topic's retention may have cut earlier offsets), as landed_up_to counts them."""
    held = set() if dead_table is None else dead_lettered_offsets(dead_table, tp[0], tp[1], 0, dead_offset, destination)
    return _end_of_run(held, min(held, default=dead_offset))


def _end_of_run(held: set[int], offset: int) -> int:
    """The first offset from ``offset`` on that ``held`` lacks."""
    while offset in held:
        offset += 1
    return offset
