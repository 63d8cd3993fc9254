"""The Debezium envelope: one Kafka record (key + value, JSON converter) decoded into what bronze stores.

The one place that knows the envelope's shape: ``schemas.enable`` on or off, tombstones, change events
(``c u d r t``), transaction-metadata BEGIN/END records, schema-change records and heartbeats.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from ingest.debezium.ordering import ordering
from ingest.errors import DecodeError
from ingest.text import first_few

OPS = frozenset("cudrt")
# The default heartbeat topic prefix (``topic.heartbeat.prefix``, ``heartbeat.topics.prefix`` before Debezium 2.0):
# configurable, so a heartbeat is known by its content too (is_heartbeat).
HEARTBEAT_PREFIX = "__debezium-heartbeat"
# The Connect schema of a heartbeat's value (one field, ts_ms); its key's is ServerNameKey (one field, serverName).
HEARTBEAT_SCHEMA = "io.debezium.connector.common.Heartbeat"


class RawRecord(NamedTuple):
    """A record as the broker (or a topic dump) hands it over, before any decoding.

    A named tuple, not a frozen dataclass: one is built per Kafka message, and a tuple builds about three times
    faster (a frozen dataclass sets each field through ``object.__setattr__``).
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    # The record's Kafka headers as the client gives them ((name, value) pairs in order; a name may repeat), None
    # when it has none. Debezium puts a primary-key change's other key here (`__debezium.oldkey`/`newkey`).
    headers: list[tuple[str, bytes | None]] | None = None

    @property
    def size(self) -> int:
        return len(self.key or b"") + len(self.value or b"") + 64


class RecordKind(enum.StrEnum):
    CHANGE = "change"
    TOMBSTONE = "tombstone"
    TRANSACTION = "transaction"
    SCHEMA_CHANGE = "schema_change"
    MESSAGE = "message"  # a logical decoding message (PostgreSQL's pg_logical_emit_message): op m, no images
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
        if data[:1] == b"\x00":
            # Confluent's and Apicurio's serializers open each message with magic byte 0, then the schema's id.
            raise DecodeError(
                f"{part}: not JSON but a schema registry's wire format (magic byte 0): written by the Avro, "
                f"Protobuf or JSON Schema converter; cdclake reads the JSON converter's documents "
                f"({part}.converter=org.apache.kafka.connect.json.JsonConverter)"
            ) from None
        reason = "not valid UTF-8" if "utf-8" in str(exc).lower() else "not valid JSON"
        raise DecodeError(f"{part}: {reason} ({exc})") from None
    if isinstance(document, dict) and document.keys() == {"schema", "payload"}:
        schema = document["schema"]
        if schema is not None and not isinstance(schema, dict):
            raise DecodeError(f"{part}: 'schema' must be an object")
        return document["payload"], schema
    return document, None


def _check_key_matches(key: Any, payload: Mapping[str, Any]) -> None:
    """The key's columns must equal the same columns of the row image (catches mis-keyed records).

    Key fields sent as JSON text are not compared: Debezium's ``column.mask.with.N.chars``,
    ``column.mask.hash.*`` and ``column.truncate.to.N.chars`` change a character column in the value only, never in
    the key, so a masked key column differs from its image by design."""
    if not isinstance(key, dict):
        return
    image = payload.get("after") if payload.get("op") != "d" else payload.get("before")
    if not isinstance(image, dict):
        return
    lowered: dict[str, Any] | None = None
    for name, value in key.items():
        if isinstance(value, str):
            continue
        if name in image:
            found = image[name]
        else:  # Debezium docs show key ID vs value id; tolerate case only
            if lowered is None:
                lowered = {field.lower(): item for field, item in image.items()}
            if name.lower() not in lowered:
                continue
            found = lowered[name.lower()]
        if found != value:
            side = "before" if payload.get("op") == "d" else "after"
            raise DecodeError(f"key field {name}={value!r} does not match {side}.{name}={found!r}")


def _validate_change(payload: dict[str, Any]) -> None:
    op = payload.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise DecodeError(f"unknown op {op!r} (expected one of c, u, d, r, t)")
    after = payload.get("after")
    if op in "cr" and after is None:
        raise DecodeError(f"op {op!r} without an 'after' image")
    if op == "u" and after is None and payload.get("patch") is None and payload.get("updateDescription") is None:
        raise DecodeError("op 'u' without 'after', 'patch' or 'updateDescription'")


def is_heartbeat(key: Any, payload: Mapping[str, Any], value_schema: Mapping[str, Any] | None) -> bool:
    """Whether a record that is no change event (its value has no ``op``) is a Debezium heartbeat on a topic of
    another prefix than the default: its value's schema is the heartbeat's, or (schemaless) its value holds
    ``ts_ms`` alone and its key ``serverName`` alone. A change event always carries ``op``: never one of these."""
    if "op" in payload:
        return False
    if value_schema is not None and value_schema.get("name") == HEARTBEAT_SCHEMA:
        return True
    return payload.keys() == {"ts_ms"} and isinstance(key, dict) and key.keys() == {"serverName"}


def decode(record: RawRecord) -> Envelope:
    """Decode one record. Raises :class:`DecodeError` (with a reason naming the problem) for a dead letter.

    The reference: every document is parsed in full. :class:`Decoder` gives the same results faster.
    """
    return _decode(record, _parse)


def _decode(record: RawRecord, parse: Callable[[bytes, str], tuple[Any, dict[str, Any] | None]]) -> Envelope:
    if record.topic.startswith(HEARTBEAT_PREFIX):
        return Envelope(RecordKind.HEARTBEAT, None, None, None, None, None)
    key: Any = None
    key_schema: dict[str, Any] | None = None
    if record.key is not None:
        key, key_schema = parse(record.key, "key")
    if record.value is None:
        return Envelope(RecordKind.TOMBSTONE, key, key_schema, None, None, None)
    payload, value_schema = parse(record.value, "value")
    if payload is None:  # schemas.enable=true tombstones carry {"schema": null, "payload": null}
        return Envelope(RecordKind.TOMBSTONE, key, key_schema, None, None, None)
    if not isinstance(payload, dict):
        raise DecodeError(f"value: expected a JSON object, got {type(payload).__name__}")
    if payload.get("op") == "m":
        return Envelope(RecordKind.MESSAGE, key, key_schema, payload, value_schema, None)
    if "op" in payload:
        _validate_change(payload)
        _check_key_matches(key, payload)
        order = ordering(payload.get("source"), payload.get("transaction"), record.offset)
        return Envelope(RecordKind.CHANGE, key, key_schema, payload, value_schema, order)
    if is_heartbeat(key, payload, value_schema):
        return Envelope(RecordKind.HEARTBEAT, None, None, None, None, None)
    if payload.get("status") in ("BEGIN", "END") and "id" in payload:
        return Envelope(RecordKind.TRANSACTION, key, key_schema, payload, value_schema, None)
    if "ddl" in payload or "tableChanges" in payload or "databaseName" in payload:
        return Envelope(RecordKind.SCHEMA_CHANGE, key, key_schema, payload, value_schema, None)
    if _FLATTENED_FIELDS & payload.keys():
        # The most common Debezium deployment mistake for a consumer of change events: the connector's
        # `transforms=unwrap` replaced each event by its row, so deletes and positions are gone.
        raise DecodeError(
            "value is a row flattened by Debezium's ExtractNewRecordState SMT (it has "
            + ", ".join(sorted(_FLATTENED_FIELDS & payload.keys()))
            + "), not a change event: cdclake needs the envelope (op, before, after, source); remove that "
            "transform from the connector's `transforms`"
        )
    fields = first_few(sorted(payload), 8) or "none"
    raise DecodeError(
        f"value has no 'op' field and is not a transaction or schema-change record (its fields: {fields})"
    )


# Fields ExtractNewRecordState adds to the row it leaves (`add.fields`, `delete.handling.mode=rewrite`).
_FLATTENED_FIELDS = frozenset({"__op", "__deleted", "__source_ts_ms", "__ts_ms", "__lsn", "__table", "__db"})


# -- the JSON converter's documents, with each distinct schema parsed once ------------------------------------------
_SCHEMA_OPEN = b'{"schema":'
_PAYLOAD_KEY = b',"payload":'
_NO_SCHEMA = b'{"schema":null,'
_PREFIXES_PER_SLOT = 8
_SEPARATORS_TRIED = 16
# orjson refuses documents nested deeper than 1024 levels; a payload parsed on its own sits two levels higher.
_DEEP_PAYLOAD = 2000


class SchemaSplitter:
    """Splits ``{"schema":...,"payload":...}`` documents at the payload, recognising each schema by its bytes.

    The JSON converter writes every record of a table with the same schema bytes (3 KB and more for a Debezium
    envelope) in front of a small payload. The first record with a new schema prefix is parsed in full; the split
    is accepted only if the schema bytes and the payload bytes each parse on their own to exactly the document's
    ``schema`` and ``payload`` (so, JSON being context-free here, any document with that prefix whose remainder
    parses as one value closed by ``}`` is that schema and that payload). Later records with the same prefix are
    checked with one byte comparison and only their payload is parsed; they all share one (read-only) schema
    dict. Anything else (no schema, other key order, whitespace, trailing bytes) is not split: callers parse the
    whole document as before.
    """

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, bool], list[tuple[bytes, dict[str, Any]]]] = {}

    def split(self, topic: str, is_key: bool, data: bytes) -> tuple[dict[str, Any], int] | None:
        """(schema, where the payload starts) for ``data``, whose payload is ``data[start:-1]``; or None."""
        entries = self._prefixes.get((topic, is_key))
        if entries is not None:
            for index, (prefix, schema) in enumerate(entries):
                if data.startswith(prefix):
                    if index:
                        entries.insert(0, entries.pop(index))
                    start = len(prefix)
                    if data[-1:] != b"}" or _maybe_deep(data, start):
                        return None
                    return schema, start
        if not data.startswith(_SCHEMA_OPEN) or data.startswith(_NO_SCHEMA):
            return None
        return self._learn(topic, is_key, data)

    def _learn(self, topic: str, is_key: bool, data: bytes) -> tuple[dict[str, Any], int] | None:
        if data[-1:] != b"}":
            return None
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(document, dict) or document.keys() != {"schema", "payload"}:
            return None
        schema = document["schema"]
        if not isinstance(schema, dict):
            return None
        position = data.find(_PAYLOAD_KEY, len(_SCHEMA_OPEN))
        for _ in range(_SEPARATORS_TRIED):
            if position < 0:
                return None
            start = position + len(_PAYLOAD_KEY)
            try:
                fits = (
                    orjson.loads(data[len(_SCHEMA_OPEN) : position]) == schema
                    and orjson.loads(data[start:-1]) == document["payload"]
                )
            except orjson.JSONDecodeError:
                fits = False
            if fits and not _maybe_deep(data, start):
                entries = self._prefixes.setdefault((topic, is_key), [])
                entries.insert(0, (data[:start], schema))
                del entries[_PREFIXES_PER_SLOT:]
                return schema, start
            position = data.find(_PAYLOAD_KEY, position + 1)
        return None


def _maybe_deep(data: bytes, start: int) -> bool:
    return len(data) - start > _DEEP_PAYLOAD and data.count(b"[", start) + data.count(b"{", start) > 1000


class Decoder:
    """:func:`decode` with each distinct Connect schema parsed once (see :class:`SchemaSplitter`)."""

    def __init__(self) -> None:
        self.splitter = SchemaSplitter()

    def decode(self, record: RawRecord) -> Envelope:
        topic = record.topic
        splitter = self.splitter

        def parse(data: bytes, part: str) -> tuple[Any, dict[str, Any] | None]:
            found = splitter.split(topic, part == "key", data)
            if found is not None:
                schema, start = found
                try:
                    return orjson.loads(memoryview(data)[start:-1]), schema
                except orjson.JSONDecodeError:
                    pass  # the full parse names the problem exactly as the reference does
            return _parse(data, part)

        return _decode(record, parse)
