"""The dead-letter table: records that could not be decoded or typed, kept raw with the reason.

Ingest continues past them; `cdclake status` counts them. One table for all topics (``bronze._cdc_dead_letters``),
committed before the data tables of the same flush so a crash between the two never loses a dead letter.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from ingest.bronze.rows import COORDINATE_FIELDS
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
    kafka_ts = (
        None
        if record.timestamp_ms is None or record.timestamp_ms < 0
        else dt.datetime.fromtimestamp(record.timestamp_ms / 1000, tz=dt.UTC)
    )
    return {
        "_cdc_topic": record.topic,
        "_cdc_partition": record.partition,
        "_cdc_offset": record.offset,
        "_cdc_kafka_ts": kafka_ts,
        "_cdc_ingested_at": ingested_at,
        "_cdc_destination": destination,
        "_cdc_error_kind": type(error).__name__,
        "_cdc_error": str(error)[:4000],
        "_cdc_raw_key": record.key,
        "_cdc_raw_value": record.value,
    }
