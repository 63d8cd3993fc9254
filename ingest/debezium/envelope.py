"""The Debezium envelope: one Kafka record (key + value, JSON converter) decoded into what bronze stores.

The one place that knows the envelope's shape: ``schemas.enable`` on or off, tombstones, change events
(``c u d r t``), transaction-metadata BEGIN/END records, schema-change records and heartbeats.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ingest.debezium.ordering import ordering
from ingest.errors import DecodeError

OPS = frozenset("cudrt")
HEARTBEAT_PREFIX = "__debezium-heartbeat"


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A record as the broker (or a topic dump) hands it over, before any decoding."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None

    @property
    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + 64


class RecordKind(enum.StrEnum):
    CHANGE = "change"
    TOMBSTONE = "tombstone"
    TRANSACTION = "transaction"
    SCHEMA_CHANGE = "schema_change"
    HEARTBEAT = "heartbeat"


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded record. ``payload``/``key`` are JSON-level values; schemas are None when not enabled."""

    kind: RecordKind
    key: Any
    key_schema: dict[str, Any] | None
    payload: dict[str, Any] | None
    value_schema: dict[str, Any] | None
    ordering: list[int] | None

    @property
    def typed(self) -> bool:
        return self.value_schema is not None if self.payload is not None else self.key_schema is not None


def _parse(data: bytes, part: str) -> tuple[Any, dict[str, Any] | None]:
    """Parse one JSON-converter document; return (payload, schema or None)."""
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        reason = "not valid UTF-8" if "utf-8" in str(exc).lower() else "not valid JSON"
        raise DecodeError(f"{part}: {reason} ({exc})") from None
    if isinstance(document, dict) and document.keys() == {"schema", "payload"}:
        schema = document["schema"]
        if schema is not None and not isinstance(schema, dict):
            raise DecodeError(f"{part}: 'schema' must be an object")
        return document["payload"], schema
    return document, None


def _check_key_matches(key: Any, payload: Mapping[str, Any]) -> None:
    """The key's columns must equal the same columns of the row image (catches mis-keyed records)."""
    if not isinstance(key, dict):
        return
    image = payload.get("after") if payload.get("op") != "d" else payload.get("before")
    if not isinstance(image, dict):
        return
    lowered = {name.lower(): value for name, value in image.items()}
    for name, value in key.items():
        if name in image:
            found = image[name]
        elif name.lower() in lowered:  # Debezium docs show key ID vs value id; tolerate case only
            found = lowered[name.lower()]
        else:
            continue
        if found != value:
            side = "before" if payload.get("op") == "d" else "after"
            raise DecodeError(f"key field {name}={value!r} does not match {side}.{name}={found!r}")


def _validate_change(payload: dict[str, Any]) -> None:
    op = payload.get("op")
    if op not in OPS:
        raise DecodeError(f"unknown op {op!r} (expected one of c, u, d, r, t)")
    after = payload.get("after")
    if op in "cr" and after is None:
        raise DecodeError(f"op {op!r} without an 'after' image")
    if op == "u" and after is None and payload.get("patch") is None and payload.get("updateDescription") is None:
        raise DecodeError("op 'u' without 'after', 'patch' or 'updateDescription'")


def decode(record: RawRecord) -> Envelope:
    """Decode one record. Raises :class:`DecodeError` (with a reason naming the problem) for a dead letter."""
    if record.topic.startswith(HEARTBEAT_PREFIX):
        return Envelope(RecordKind.HEARTBEAT, None, None, None, None, None)
    key: Any = None
    key_schema: dict[str, Any] | None = None
    if record.key is not None:
        key, key_schema = _parse(record.key, "key")
    if record.value is None:
        return Envelope(RecordKind.TOMBSTONE, key, key_schema, None, None, None)
    payload, value_schema = _parse(record.value, "value")
    if payload is None:  # schemas.enable=true tombstones carry {"schema": null, "payload": null}
        return Envelope(RecordKind.TOMBSTONE, key, key_schema, None, None, None)
    if not isinstance(payload, dict):
        raise DecodeError(f"value: expected a JSON object, got {type(payload).__name__}")
    if "op" in payload:
        _validate_change(payload)
        _check_key_matches(key, payload)
        return Envelope(RecordKind.CHANGE, key, key_schema, payload, value_schema, ordering(payload.get("source")))
    if payload.get("status") in ("BEGIN", "END") and "id" in payload:
        return Envelope(RecordKind.TRANSACTION, key, key_schema, payload, value_schema, None)
    if "ddl" in payload or "tableChanges" in payload or "databaseName" in payload:
        return Envelope(RecordKind.SCHEMA_CHANGE, key, key_schema, payload, value_schema, None)
    raise DecodeError("value has no 'op' field and is not a transaction or schema-change record")
