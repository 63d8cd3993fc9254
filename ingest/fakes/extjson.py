"""The MongoDB extended JSON (strict mode) that Debezium 1.9 puts in ``after``, ``updatedFields`` and keys.

Two spellings are copied from the seed (S004): document strings (``after``, ``updatedFields``) use ``": "``
after names and ``","`` between members; key ids use the older ``" : "`` / ``", "`` layout of the seed's key
table. Both are valid JSON, so consumers can parse either; the bytes differ, as they do in the seed.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from decimal import Decimal

import orjson


@dataclass(frozen=True, slots=True)
class Int64:
    """BSON int64 (``NumberLong``): ``{"$numberLong": "n"}`` in strict mode."""

    value: int


@dataclass(frozen=True, slots=True)
class Decimal128:
    """BSON decimal128: ``{"$numberDecimal": "text"}``."""

    value: Decimal


@dataclass(frozen=True, slots=True)
class DateTime:
    """BSON date: ``{"$date": millis}`` in strict mode."""

    millis: int


@dataclass(frozen=True, slots=True)
class ObjectId:
    """BSON ObjectId: ``{"$oid": "24 hex digits"}``."""

    hex: str


@dataclass(frozen=True, slots=True)
class Binary:
    """BSON binary: ``{"$binary": base64, "$type": "hh"}``."""

    data: bytes
    subtype: int


@dataclass(frozen=True, slots=True)
class _Raw:
    """Already-rendered JSON text (the ``$date`` millis, which are int64)."""

    text: str


@dataclass(frozen=True, slots=True)
class Layout:
    colon: str
    comma: str


DOCUMENT = Layout(colon=": ", comma=",")
KEY = Layout(colon=" : ", comma=", ")


def _wrapper(value: object) -> dict[str, object] | None:
    if isinstance(value, Int64):
        return {"$numberLong": str(value.value)}
    if isinstance(value, Decimal128):
        return {"$numberDecimal": str(value.value)}
    if isinstance(value, DateTime):
        return {"$date": _Raw(str(value.millis))}
    if isinstance(value, ObjectId):
        return {"$oid": value.hex}
    if isinstance(value, Binary):
        return {"$binary": base64.b64encode(value.data).decode("ascii"), "$type": f"{value.subtype:02x}"}
    return None


def dumps(value: object, layout: Layout = DOCUMENT) -> str:
    """Strict-mode extended JSON text of a BSON-like value (dict, list, str, int32, bool, None, wrappers)."""
    if isinstance(value, _Raw):
        return value.text
    wrapped = _wrapper(value)
    if wrapped is not None:
        return dumps(wrapped, layout)
    if isinstance(value, dict):
        members = (f"{orjson.dumps(str(k)).decode()}{layout.colon}{dumps(v, layout)}" for k, v in value.items())
        return "{" + layout.comma.join(members) + "}"
    if isinstance(value, list | tuple):
        return "[" + layout.comma.join(dumps(item, layout) for item in value) + "]"
    if value is None or isinstance(value, bool | str):
        return orjson.dumps(value).decode()
    if isinstance(value, int):
        if not -(2**31) <= value < 2**31:
            raise ValueError("plain ints are int32; wrap wider values in Int64")
        return str(value)
    raise TypeError(f"no extended JSON for {type(value).__name__}")


def key_id(document_id: object) -> str:
    """The Kafka key's ``id``: the ``_id`` alone in strict extended JSON (seed key table layout)."""
    return dumps(document_id, KEY)
