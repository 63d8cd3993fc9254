"""Kafka Connect schemas and logical values exactly as the JsonConverter writes them (schemas.enable=true).

Key order inside a schema object follows ``JsonConverter.asJsonSchema``: type, fields/items, optional, name,
version, doc, parameters, default, then ``field`` (added by the parent struct). Matching it keeps fake bytes
identical in shape to what a real Connect worker produces, so byte-level tests stay meaningful.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson

JsonDict = dict[str, Any]

DECIMAL = "org.apache.kafka.connect.data.Decimal"
DATE = "io.debezium.time.Date"
TIMESTAMP = "io.debezium.time.Timestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
JSON = "io.debezium.data.Json"
ENUM = "io.debezium.data.Enum"

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)  # naive: Debezium reads TIMESTAMP without zone as UTC
_NO_DEFAULT = object()


def schema(
    type_: str,
    *,
    optional: bool,
    name: str | None = None,
    version: int | None = None,
    parameters: dict[str, str] | None = None,
    default: object = _NO_DEFAULT,
) -> JsonDict:
    """A primitive (or logical) Connect schema in JsonConverter key order."""
    out: JsonDict = {"type": type_, "optional": optional}
    if name is not None:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if parameters is not None:
        out["parameters"] = parameters
    if default is not _NO_DEFAULT:
        out["default"] = default
    return out


def struct(fields: list[JsonDict], *, optional: bool, name: str | None = None, version: int | None = None) -> JsonDict:
    """A struct schema; ``fields`` must already carry their ``field`` names (see :func:`field`)."""
    out: JsonDict = {"type": "struct", "fields": fields, "optional": optional}
    if name is not None:
        out["name"] = name
    if version is not None:
        out["version"] = version
    return out


def array(items: JsonDict, *, optional: bool) -> JsonDict:
    """An array schema (``items`` before ``optional``, as the converter writes it)."""
    return {"type": "array", "items": items, "optional": optional}


def field(name: str, spec: JsonDict) -> JsonDict:
    """Name a schema as a struct member: the converter appends ``field`` last."""
    return {**spec, "field": name}


def optional_string(name: str) -> JsonDict:
    return field(name, schema("string", optional=True))


def required(type_: str, name: str) -> JsonDict:
    return field(name, schema(type_, optional=False))


def serialize(spec: JsonDict, payload: object) -> bytes:
    """One JsonConverter record body: ``{"schema": ..., "payload": ...}``, compact like Jackson."""
    return orjson.dumps({"schema": spec, "payload": payload})


def unscaled_bytes(unscaled: int) -> bytes:
    """Big-endian two's complement, minimal length: Java ``BigInteger.toByteArray``."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def decimal_value(value: Decimal, scale: int) -> str:
    """``org.apache.kafka.connect.data.Decimal`` in JSON: base64 of the unscaled value at ``scale``."""
    unscaled = int(value.scaleb(scale).to_integral_exact())
    return base64.b64encode(unscaled_bytes(unscaled)).decode("ascii")


def date_value(value: date) -> int:
    """``io.debezium.time.Date``: days since the epoch."""
    return (value - _EPOCH_DATE).days


def milli_timestamp_value(value: datetime) -> int:
    """``io.debezium.time.Timestamp``: milliseconds since the epoch, no zone (read as UTC)."""
    return (value - _EPOCH) // timedelta(milliseconds=1)


def micro_timestamp_value(value: datetime) -> int:
    """``io.debezium.time.MicroTimestamp``: microseconds since the epoch, no zone (read as UTC)."""
    return (value - _EPOCH) // timedelta(microseconds=1)


def zoned_timestamp_value(value: datetime) -> str:
    """``io.debezium.time.ZonedTimestamp``: Java ``ISO_OFFSET_DATE_TIME`` (fraction trimmed, ``Z`` for UTC)."""
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += "." + f"{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    if offset is None:
        raise ValueError("a ZonedTimestamp needs an aware datetime")
    if offset == timedelta(0):
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"{text}{sign}{hours:02d}:{mins:02d}"


def utc_ms(value: datetime) -> int:
    """Milliseconds since the epoch of an aware datetime."""
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


# kind -> (Connect type, logical name)
_KINDS: dict[str, tuple[str, str | None]] = {
    "int8": ("int8", None),
    "int16": ("int16", None),
    "int32": ("int32", None),
    "int64": ("int64", None),
    "double": ("double", None),
    "boolean": ("boolean", None),
    "string": ("string", None),
    "decimal": ("bytes", DECIMAL),
    "date": ("int32", DATE),
    "timestamp": ("int64", TIMESTAMP),
    "micro_timestamp": ("int64", MICRO_TIMESTAMP),
    "zoned_timestamp": ("string", ZONED_TIMESTAMP),
}


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its Connect schema and how a logical Python value is written to JSON."""

    name: str
    kind: str
    optional: bool = False
    precision: int = 0
    scale: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}")

    def connect_schema(self) -> JsonDict:
        type_, logical = _KINDS[self.kind]
        if self.kind == "decimal":
            params = {"scale": str(self.scale), "connect.decimal.precision": str(self.precision)}
            return field(self.name, schema(type_, optional=self.optional, name=logical, version=1, parameters=params))
        if logical is not None:
            return field(self.name, schema(type_, optional=self.optional, name=logical, version=1))
        return field(self.name, schema(type_, optional=self.optional))

    def encode(self, value: object) -> object:
        """The JSON-level value the converter emits for ``value``."""
        if value is None:
            if not self.optional:
                raise ValueError(f"column {self.name} is not optional")
            return None
        if self.kind == "decimal":
            assert isinstance(value, Decimal)
            return decimal_value(value, self.scale)
        if self.kind == "date":
            assert isinstance(value, date)
            return date_value(value)
        if self.kind == "timestamp":
            assert isinstance(value, datetime)
            return milli_timestamp_value(value)
        if self.kind == "micro_timestamp":
            assert isinstance(value, datetime)
            return micro_timestamp_value(value)
        if self.kind == "zoned_timestamp":
            assert isinstance(value, datetime)
            return zoned_timestamp_value(value)
        return value
