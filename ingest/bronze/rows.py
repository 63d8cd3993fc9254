"""Decoded envelope -> one bronze row plus the Arrow schema that row needs.

Bronze keeps the full envelope. With schemas, the Connect schema gives every column a real type (``before``,
``after``, ``source``, ``transaction`` become structs); without schemas, the envelope's parts are kept as JSON text
(layout ``json``). cdclake's own columns carry the ``_cdc_`` prefix, which no Iceberg metadata column uses.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from ingest.config import InfiniteTimestamps
from ingest.debezium.envelope import Envelope, RawRecord, RecordKind
from ingest.debezium.types import (
    Converter,
    InexactNumberError,
    arrow_type,
    canonical_json,
    converter,
    json_text,
    narrowed_decimals,
    struct_converter,
    struct_fields,
    with_snapshot_as_text,
)
from ingest.errors import DecodeError

log = logging.getLogger(__name__)


class Layout(enum.StrEnum):
    TYPED = "typed"  # columns typed from the Connect schema
    JSON = "json"  # schemas.enable=false: envelope parts kept as JSON text


UTC_US = pa.timestamp("us", tz="UTC")
HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
COORDINATE_FIELDS = [
    pa.field("_cdc_topic", pa.string()),
    pa.field("_cdc_partition", pa.int32()),
    pa.field("_cdc_offset", pa.int64()),
    pa.field("_cdc_kafka_ts", UTC_US),
    pa.field("_cdc_ingested_at", UTC_US),
    # The record's Kafka headers in order, null when it has none (see RawRecord.headers).
    pa.field("_cdc_headers", HEADERS_TYPE),
]
CHANGE_FIELDS = [
    # Source position parsed to integers per connector; see ingest.debezium.ordering.
    pa.field("_cdc_order", pa.list_(pa.int64())),
    # The Debezium key as canonical JSON (sorted keys): the identity silver groups by, also for MongoDB.
    pa.field("_cdc_key_json", pa.string()),
]
_JSON_LONG_FIELDS = frozenset({"ts_ms", "ts_us", "ts_ns"})
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LAST_KAFKA_TS_MS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC) - _EPOCH) // dt.timedelta(
    milliseconds=1
)
INGESTED_AT_COLUMN = "_cdc_ingested_at"  # when cdclake landed the record: freshness, lag, the partitions
PARTITION_SOURCE_COLUMN = INGESTED_AT_COLUMN
# cdclake's own columns beside a record's: a top-level value field of one of these names is a dead letter (it would
# replace the record's Kafka coordinates, or make two columns of one name).
RESERVED_COLUMNS = frozenset(f.name for f in [*COORDINATE_FIELDS, *CHANGE_FIELDS]) | {"key"}


@dataclass(frozen=True, slots=True)
class BronzeRow:
    layout: Layout
    schema: pa.Schema
    row: dict[str, Any]


Compiled = tuple[pa.Schema, Converter | None, Converter | None]
_IDENTITY_CACHE = 512


def _fingerprint(schema: dict[str, Any] | None) -> bytes:
    return b"" if schema is None else orjson.dumps(schema)


class RowBuilder:
    """Builds bronze rows; converters and Arrow schemas are compiled once per distinct Connect schema."""

    def __init__(self, variable_scale: int = 10, infinite_timestamps: InfiniteTimestamps = "dead_letter") -> None:
        self._variable_scale = variable_scale
        self._infinite = infinite_timestamps
        self._compiled: dict[tuple[RecordKind, bytes, bytes], tuple[pa.Schema, Converter | None, Converter | None]] = {}
        # The same schema dicts (shared by every record whose schema bytes are equal, see SchemaSplitter) skip the
        # fingerprint. Entries hold the dicts, so their ids cannot be reused while cached.
        self._by_identity: dict[tuple[RecordKind, int, int], tuple[object, object, Compiled]] = {}
        # Schemaless rows: one schema object per shape (field names and types), as typed rows have per Connect
        # schema. A schema per record made every buffered record a new schema to check, merge and compare with
        # the batch's others (quadratic in the batch: 680 µs per record with 16k buffered).
        self._json_schemas: dict[tuple[tuple[str, pa.DataType], ...], pa.Schema] = {}

    def _compile(self, envelope: Envelope) -> Compiled:
        kind = RecordKind.CHANGE if envelope.kind is RecordKind.TOMBSTONE else envelope.kind
        return self._compiled_for(kind, envelope.key_schema, envelope.value_schema)

    def schema_for(
        self, kind: RecordKind, key_schema: dict[str, Any] | None, value_schema: dict[str, Any] | None
    ) -> pa.Schema:
        """The Arrow schema (the very object :meth:`build` gives its rows) of records with these schemas."""
        return self._compiled_for(kind, key_schema, value_schema)[0]

    def _compiled_for(
        self, kind: RecordKind, key_schema: dict[str, Any] | None, value_schema: dict[str, Any] | None
    ) -> Compiled:
        identity = (kind, id(key_schema), id(value_schema))
        known = self._by_identity.get(identity)
        if known is not None and known[0] is key_schema and known[1] is value_schema:
            return known[2]
        compiled = self._compile_new(kind, key_schema, value_schema)
        if len(self._by_identity) >= _IDENTITY_CACHE:
            self._by_identity.clear()
        self._by_identity[identity] = (key_schema, value_schema, compiled)
        return compiled

    def _compile_new(
        self, kind: RecordKind, key_schema: dict[str, Any] | None, value_schema: dict[str, Any] | None
    ) -> Compiled:
        cache_key = (kind, _fingerprint(key_schema), _fingerprint(value_schema))
        compiled = self._compiled.get(cache_key)
        if compiled is not None:
            return compiled
        for schema, part in ((key_schema, "key"), (value_schema, "value")):
            for narrowed in narrowed_decimals(schema, part):  # once per schema: compiled ones are cached
                log.warning("%s: %s", (value_schema or key_schema or {}).get("name") or "a record", narrowed)
        scale = self._variable_scale
        fields = list(COORDINATE_FIELDS)
        if kind is RecordKind.CHANGE:
            fields += CHANGE_FIELDS
        key_conv: Converter | None = None
        if key_schema is not None:
            fields.append(pa.field("key", arrow_type(key_schema, variable_scale=scale)))
            key_conv = converter(key_schema, variable_scale=scale, infinite=self._infinite)
        value_conv: Converter | None = None
        if value_schema is not None:
            if value_schema.get("type") != "struct":
                raise DecodeError("value schema is not a struct")
            value_schema = with_snapshot_as_text(value_schema)
            value_fields = struct_fields(value_schema, variable_scale=scale)
            _refuse_reserved(field.name for field in value_fields)
            fields += value_fields
            value_conv = struct_converter(value_schema, variable_scale=scale, infinite=self._infinite)
        compiled = (pa.schema(fields), key_conv, value_conv)
        self._compiled[cache_key] = compiled
        return compiled

    def build(self, record: RawRecord, envelope: Envelope, ingested_at: dt.datetime) -> BronzeRow:
        row = coordinate_values(record, ingested_at)
        is_change = envelope.kind in (RecordKind.CHANGE, RecordKind.TOMBSTONE)
        if is_change:
            row["_cdc_order"] = envelope.ordering
            row["_cdc_key_json"] = canonical_json(with_exact_numbers(envelope.key, record.key))
        typed = envelope.value_schema is not None or (envelope.payload is None and envelope.key_schema is not None)
        if typed:
            schema, key_conv, value_conv = self._compile(envelope)
            key, payload = envelope.key, envelope.payload
            try:
                if key_conv is not None and key is not None:
                    row["key"] = key_conv(key, "key")
                if value_conv is not None and payload is not None:
                    row.update(value_conv(payload, "value"))
            except InexactNumberError:
                # A decimal as a JSON number with a fraction (decimal.format=NUMERIC): orjson gave a double, whose
                # digits may be lost. Read the record again keeping every number as written.
                if key_conv is not None and key is not None:
                    row["key"] = key_conv(_exact_payload(record.key), "key")
                if value_conv is not None and payload is not None:
                    row.update(value_conv(_exact_payload(record.value), "value"))
            return BronzeRow(Layout.TYPED, schema, row)
        return self._json_row(record, envelope, row, is_change)

    def tombstone_row(
        self, record: RawRecord, envelope: Envelope, ingested_at: dt.datetime, layout: Layout
    ) -> BronzeRow:
        """A tombstone in the layout of its table. Its own layout would follow its key alone: with keys and values
        converted differently (key.converter.schemas.enable=false, the value converter's true, or the reverse),
        every delete's tombstone would be a dead letter. Typed without a key schema: no key column (the key is in
        _cdc_key_json); as JSON: the key as JSON text."""
        row = coordinate_values(record, ingested_at)
        row["_cdc_order"] = envelope.ordering
        row["_cdc_key_json"] = canonical_json(with_exact_numbers(envelope.key, record.key))
        if layout is Layout.JSON:
            return self._json_row(record, envelope, row, True)
        if envelope.key_schema is not None:
            return self.build(record, envelope, ingested_at)
        return BronzeRow(Layout.TYPED, _KEYLESS_TOMBSTONE_SCHEMA, row)

    def _json_row(self, record: RawRecord, envelope: Envelope, row: dict[str, Any], is_change: bool) -> BronzeRow:
        fields = list(COORDINATE_FIELDS)
        if is_change:
            fields += CHANGE_FIELDS
        fields.append(pa.field("key", pa.string()))
        key = envelope.key
        row["key"] = key if isinstance(key, str) else json_text(with_exact_numbers(key, record.key))
        payload = with_exact_numbers(envelope.payload, record.value)
        if payload is not None and envelope.kind is RecordKind.CHANGE:
            _refuse_reserved(payload)
            for name, value in payload.items():
                if name == "op":
                    fields.append(pa.field(name, pa.string()))
                    row[name] = value
                elif name in _JSON_LONG_FIELDS and (value is None or type(value) in (int, orjson.Fragment)):
                    if value is not None and (type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX):
                        raise DecodeError(f"value.{name}: expected int64, got {json_text(value)}")
                    fields.append(pa.field(name, pa.int64()))
                    row[name] = value
                else:
                    fields.append(pa.field(name, pa.string()))
                    row[name] = json_text(value)
        elif payload is not None:
            fields.append(pa.field("payload", pa.string()))
            row["payload"] = canonical_json(payload)
        elif is_change:
            fields.append(pa.field("op", pa.string()))
        return BronzeRow(Layout.JSON, self._json_schema(fields), row)

    def _json_schema(self, fields: list[pa.Field]) -> pa.Schema:
        shape = tuple((field.name, field.type) for field in fields)
        schema = self._json_schemas.get(shape)
        if schema is None:
            schema = pa.schema(fields)
            if len(self._json_schemas) < _MAX_JSON_SHAPES:  # bounded: field names could vary without end
                self._json_schemas[shape] = schema
        return schema


_KEYLESS_TOMBSTONE_SCHEMA = pa.schema([*COORDINATE_FIELDS, *CHANGE_FIELDS])
_MAX_JSON_SHAPES = 4096


def _refuse_reserved(names: Iterable[str]) -> None:
    taken = sorted(RESERVED_COLUMNS.intersection(names))
    if taken:
        raise DecodeError(f"value field {taken[0]} has the name of one of cdclake's own columns")


def _exact_payload(data: bytes | None) -> Any:
    """A key or value (JSON converter) read with its numbers as written: fractions as decimal.Decimal."""
    document = _exact_document(data)
    if isinstance(document, dict) and document.keys() == {"schema", "payload"}:
        return document["payload"]
    return document  # schemas.enable=false: the payload itself (its schema known from the topic)


def _exact_document(data: bytes | None) -> Any:
    try:
        return json.loads(data or b"null", parse_float=decimal.Decimal)
    except ValueError as exc:
        raise DecodeError(f"not JSON: {exc}") from None


# A JSON number orjson may have read as a double that lost digits: an integer of 20 digits or more, or a negative
# one of 19 (beyond 64 bits; orjson reads every 64-bit integer exactly, Debezium's ts_us and ts_ns among them), one
# with a fraction or an exponent and 16 significant digits or more (decimal.format=NUMERIC writes decimals as JSON
# numbers), or an exponent of 3 digits (beyond a double's range). Digits in a string may match too: that document
# is only read once more for nothing.
_LONG_NUMBER = re.compile(rb"-[0-9]{19}|[0-9]{20,}|(?=[0-9.]{17})[0-9]+\.[0-9]|[0-9]{16,}[eE]|[eE][-+]?[0-9]{3}")


def with_exact_numbers(value: Any, data: bytes | None, *, enveloped: bool = True) -> Any:
    """``value``, orjson's reading of ``data`` (of its payload when ``enveloped``), with every number a double does
    not hold exactly as written (an ``orjson.Fragment``, which orjson writes back verbatim): what bronze keeps as JSON
    text and ``_cdc_key_json`` keep every digit, so distinct keys never merge."""
    if value is None or data is None or not _LONG_NUMBER.search(data):
        return value
    return _as_written(_exact_payload(data) if enveloped else _exact_document(data))


def _as_written(value: Any) -> Any:
    if isinstance(value, dict):
        return {name: _as_written(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_as_written(item) for item in value]
    if isinstance(value, decimal.Decimal):
        number = float(value)  # as orjson reads it, where that is exact: the text stays what it always was
        return number if decimal.Decimal(repr(number)) == value else orjson.Fragment(str(value))
    if type(value) is int and not _INT64_MIN <= value < 2**64:  # orjson writes 64-bit integers only
        return orjson.Fragment(str(value))
    return value


def kafka_timestamp(timestamp_ms: int | None) -> dt.datetime | None:
    """A record's Kafka timestamp, exact to the millisecond; None when it has none or one no timestamp column holds
    (CreateTime is whatever the producer set: a year past 9999 must not stop the ingester)."""
    if timestamp_ms is None or not 0 <= timestamp_ms <= LAST_KAFKA_TS_MS:
        return None
    return _EPOCH + dt.timedelta(milliseconds=timestamp_ms)


def coordinate_values(record: RawRecord, ingested_at: dt.datetime) -> dict[str, Any]:
    """The COORDINATE_FIELDS of ``record``'s row (data tables and the dead-letter table alike)."""
    kafka_ts = kafka_timestamp(record.timestamp_ms)
    return {
        "_cdc_topic": record.topic,
        "_cdc_partition": record.partition,
        "_cdc_offset": record.offset,
        "_cdc_kafka_ts": kafka_ts,
        "_cdc_ingested_at": ingested_at,
        "_cdc_headers": record.headers,
    }
