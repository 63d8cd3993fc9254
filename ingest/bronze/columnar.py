"""The fast path of decode + row building: a poll's typed records (change events, tombstones, and Debezium's
transaction-metadata BEGIN/END records) become Arrow columns, group by group.

The per-record path (:class:`~ingest.debezium.envelope.Decoder` + :class:`~ingest.bronze.rows.RowBuilder`) is the
reference; this module produces exactly the rows it would, or hands a record back to it.

Records are grouped by (bronze table, key schema, value schema), with the schemas recognised by their bytes
(:class:`~ingest.debezium.envelope.SchemaSplitter`), so only the payloads are parsed: all payloads of a group at
once by ``pyarrow.json`` with an explicit schema of the raw JSON types the Connect schema allows (strict: a string
in an int column, a float in an int column or an unknown field fails the parse). A group that fails is bisected
so that only the failing records leave it. Then the envelope checks, the ordering, the key check and the type
conversions run column by column (for transaction metadata: the BEGIN/END check and the conversions). Whatever
the reference treats in a way the columns cannot tell apart (a null where a field could also be absent, a value it
rejects or converts specially, NaN, -0.0, a position in an unusual form) sends that record back to the per-record
path, which then decides, with the reference's exact reason if it is a dead letter. So this path only ever has to
be right about the records it keeps.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from ingest.bronze.rows import (
    HEADERS_TYPE,
    LAST_KAFKA_TS_MS,
    RESERVED_COLUMNS,
    UTC_US,
    RowBuilder,
    with_exact_numbers,
)
from ingest.debezium import types as connect
from ingest.debezium.envelope import HEARTBEAT_PREFIX, HEARTBEAT_SCHEMA, RawRecord, RecordKind, SchemaSplitter
from ingest.debezium.ordering import ORDERINGS, TRANSACTION_ORDERED, note_unplaced_change
from ingest.errors import DecodeError

log = logging.getLogger(__name__)
Mask = Any  # a pyarrow BooleanArray without nulls (True: back to the per-record path), or None: none is
_MIN_DAYS = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
_MAX_DAYS = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days
_EPOCH = dt.datetime(1970, 1, 1)
_MIN_US = (dt.datetime(1, 1, 1) - _EPOCH) // dt.timedelta(microseconds=1)
_MAX_US = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999) - _EPOCH) // dt.timedelta(microseconds=1)
# Below 10**28 a decimal's unscaled value converts exactly in the reference (decimal's default context has 28 digits).
_EXACT_DECIMAL_DIGITS = 28
_DIGITS = r"^[0-9]{1,18}$"  # an integer position that fits int64 without doubt
_PG_SEQUENCE = r'^\[(?:null|"(?P<commit>[0-9]{1,18})"),"(?P<lsn>[0-9]{1,18})"\]$'
# Positions read per connector by ingest.debezium.ordering (each function only .get()s these fields).
_POSITION_FIELDS = {
    "db2": ("commit_lsn", "change_lsn"),
    "sqlserver": ("commit_lsn", "change_lsn", "event_serial_no"),
    "informix": ("commit_lsn", "change_lsn"),
    "oracle": ("commit_scn", "scn"),
    "mongodb": ("ts_ms", "ord"),
    "postgresql": ("sequence", "lsn"),
    "mysql": ("file", "pos", "row"),
    "mariadb": ("file", "pos", "row"),
}
_INTEGER_PAIRS = {"informix", "oracle", "mongodb"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_DEPTH = 64
_OPEN, _CLOSE = ord("{"), ord("}")
# Long payloads might nest deeper than orjson allows (see SchemaSplitter): the splitter checks those.
_DEEP_PAYLOAD = 2000
_MEMO_SIZE = 4096
_DECIMAL_MEMOS: dict[int, dict[str, bytes]] = {}
# A plan whose groups keep failing (e.g. decimal.format=NUMERIC) is not tried for this many polls.
_BACKOFF_POLLS = 16
_BLOCK_LIMIT = 1 << 30  # a longer line fails the parse and takes the per-record path


class _IneligibleError(Exception):
    """The schema has a part the fast path does not handle; its records take the per-record path."""


def _or(left: Mask, right: Mask) -> Mask:
    if left is None:
        return right
    if right is None:
        return left
    return pc.or_(left, right)


def _flag(condition: Any) -> Mask:
    """Rows where ``condition`` is true (null counts as false), or None when there are none."""
    if condition is None or len(condition) == 0:
        return None
    condition = pc.fill_null(condition, False)
    return condition if pc.any(condition).as_py() else None


def _nulls_where(array: Any, mask: Mask) -> Any:
    return array if mask is None else pc.if_else(mask, pa.scalar(None, array.type), array)


# -- value nodes: one per Connect schema node; raw JSON type -> the value the reference's converter produces ------
class Node:
    """Converts a column of raw JSON values (as ``pyarrow.json`` read them) into bronze's values.

    ``storage`` is the type the reference's values take before the commit casts them to the table's type: the
    Connect type's Arrow type, except ``float`` kept as double (the reference keeps a Python float until then).
    """

    raw: Any
    storage: Any

    def convert(self, array: Any) -> tuple[Any, Mask]:
        raise NotImplementedError


class _Same(Node):
    def __init__(self, raw: Any, storage: Any) -> None:
        self.raw, self.storage = raw, storage

    def convert(self, array: Any) -> tuple[Any, Mask]:
        return (array if self.raw.equals(self.storage) else array.cast(self.storage)), None


class _Float(Node):
    raw = storage = pa.float64()

    def __init__(self, single: bool = False) -> None:
        # A float32 column: a double it would store as inf (or a nonzero one as 0.0) is the reference's to reject.
        self.single = single

    def convert(self, array: Any) -> tuple[Any, Mask]:
        if array.null_count == len(array):
            return array, None
        # NaN/Infinity literals parse here but not in orjson; "-0" is the int 0 for orjson but -0.0 here.
        bad = _flag(pc.invert(pc.is_finite(array)))
        if self.single:
            magnitude = pc.abs(array)
            bad = _or(bad, _flag(pc.greater_equal(magnitude, connect.FLOAT32_OVERFLOW)))
            tiny = pc.and_(pc.greater(magnitude, 0.0), pc.less_equal(magnitude, connect.FLOAT32_UNDERFLOW))
            bad = _or(bad, _flag(tiny))
        zero = pc.equal(array, 0.0)
        if pc.any(zero).as_py():
            bad = _or(bad, _flag(pc.and_(zero, pc.less(array.view(pa.int64()), 0))))
        return array, bad


class _SnapshotFlag(Node):
    """A boolean ``source.snapshot`` as the text later connectors send (see ``types.SNAPSHOT_FLAG``)."""

    raw = pa.bool_()
    storage = pa.string()

    def convert(self, array: Any) -> tuple[Any, Mask]:
        return pc.if_else(array, "true", "false"), None


class _PerValue(Node):
    """A conversion only Python does exactly (base64, ISO strings): the reference's own function, per value."""

    def __init__(self, raw: Any, storage: Any, convert: Callable[[Any], Any]) -> None:
        self.raw, self.storage, self._convert = raw, storage, convert

    def convert(self, array: Any) -> tuple[Any, Mask]:
        values = array.to_pylist()
        out: list[Any] = []
        bad_rows: list[int] = []
        for index, value in enumerate(values):
            if value is None:
                out.append(None)
                continue
            try:
                out.append(self._convert(value))
            except Exception:  # the reference decides (a dead letter, or the same exception)
                out.append(None)
                bad_rows.append(index)
        return self._array(out), _rows_mask(len(values), bad_rows)

    def _array(self, values: list[Any]) -> Any:
        return pa.array(values, type=self.storage)


class _Decimal(_PerValue):
    """``Decimal``: base64 of the big-endian unscaled value -> decimal128 built from its 16-byte form."""

    def __init__(self, precision: int, scale: int) -> None:
        limit = 10 ** min(precision, _EXACT_DECIMAL_DIGITS)
        b64 = connect._b64
        # Before and after images mostly repeat their values: one memo per exact range, shared by all columns.
        memo = _DECIMAL_MEMOS.setdefault(limit, {})

        def convert(value: Any) -> bytes:
            known = memo.get(value)
            if known is not None:
                return known
            raw = b64(value, "")
            if not raw:
                raise ValueError("no bytes: the reference rejects it")
            unscaled = int.from_bytes(raw, "big", signed=True)
            if not -limit < unscaled < limit:
                raise ValueError("out of the exact range")
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            data = memo[value] = unscaled.to_bytes(16, "little", signed=True)
            return data

        super().__init__(pa.string(), pa.decimal128(precision, scale), convert)
        self._limit = min(limit, 2**62)

    def convert(self, array: Any) -> tuple[Any, Mask]:
        if array.null_count < len(array):
            unscaled = _short_base64(array)
            if unscaled is not None and pc.all(pc.less(pc.abs(unscaled), self._limit)).as_py():
                return unscaled.cast(pa.decimal128(38, 0)).view(self.storage), None
        return super().convert(array)

    def _array(self, values: list[Any]) -> Any:
        validity = pa.array([value is not None for value in values], type=pa.bool_())
        data = b"".join(bytes(16) if value is None else value for value in values)
        nulls = len(values) - pc.sum(validity).as_py() if values else 0
        return pa.Array.from_buffers(
            self.storage, len(values), [validity.buffers()[1] if nulls else None, pa.py_buffer(data)], null_count=nulls
        )


_BASE64_ALPHABET = pa.array(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"))
# Up to 8 characters (6 bytes): the unscaled value fits int64 while decoding.
_SHORT_BASE64 = r"^[A-Za-z0-9+/]+={0,2}$"
_SHORT_BASE64_CHARS = 8


def _short_base64(array: Any) -> Any:
    """The big-endian two's complement integers of a column of short base64 strings, decoded as the reference's
    ``_b64`` + ``int.from_bytes`` would; None unless every non-null value is padded, valid and short."""
    lengths = pc.utf8_length(array)
    if pc.max(lengths).as_py() > _SHORT_BASE64_CHARS:
        return None
    if not pc.all(
        pc.and_(pc.match_substring_regex(array, _SHORT_BASE64), pc.equal(pc.bit_wise_and(lengths, 3), 0))
    ).as_py():
        return None
    pads = pc.count_substring(array, "=").cast(pa.int64())
    lengths = lengths.cast(pa.int64())
    data = pc.subtract(lengths, pads)
    value = pa.array([0] * len(array), pa.int64())
    for index in range(_SHORT_BASE64_CHARS):
        sextet = pc.index_in(pc.utf8_slice_codeunits(array, index, index + 1), value_set=_BASE64_ALPHABET)
        value = pc.if_else(pc.less(index, data), pc.add(pc.multiply(value, 64), sextet.cast(pa.int64())), value)
    size = pc.subtract(pc.multiply(pc.divide(lengths, 4), 3), pads)  # decoded bytes
    value = pc.shift_right(value, pc.subtract(pc.multiply(data, 6), pc.multiply(size, 8)))  # bits past the bytes
    bits = pc.multiply(size, 8)
    negative = pc.and_(pc.greater(size, 0), pc.greater_equal(value, pc.shift_left(1, pc.subtract(bits, 1))))
    return pc.if_else(negative, pc.subtract(value, pc.shift_left(1, bits)), value)


def _rows_mask(length: int, rows: list[int]) -> Mask:
    if not rows:
        return None
    flags = [False] * length
    for row in rows:
        flags[row] = True
    return pa.array(flags, type=pa.bool_())


class _Date(Node):
    raw, storage = pa.int32(), pa.date32()

    def convert(self, array: Any) -> tuple[Any, Mask]:
        bad = _flag(pc.or_(pc.less(array, _MIN_DAYS), pc.greater(array, _MAX_DAYS)))
        return _nulls_where(array, bad).cast(pa.int32()).view(pa.date32()), bad


class _Scaled(Node):
    """Times (and ``MicroTime``) as long microseconds: value * factor // divisor, flooring like Python."""

    def __init__(self, raw: Any, factor: int, divisor: int) -> None:
        self.raw, self.storage, self._factor, self._divisor = raw, pa.int64(), factor, divisor

    def _scale(self, array: Any) -> Any:
        array = array.cast(pa.int64())
        if self._factor != 1:
            array = pc.multiply(array, self._factor)
        if self._divisor != 1:
            quotient = pc.divide(array, self._divisor)  # truncates toward zero; Python floors
            remainder = pc.subtract(array, pc.multiply(quotient, self._divisor))
            array = pc.if_else(pc.less(remainder, 0), pc.subtract(quotient, 1), quotient)
        return array

    def convert(self, array: Any) -> tuple[Any, Mask]:
        return self._scale(array), None


class _Timestamp(_Scaled):
    """Timestamps (no zone) from ms/us/ns since the epoch; outside years 1-9999 the reference rejects them."""

    def __init__(self, factor: int, divisor: int) -> None:
        super().__init__(pa.int64(), factor, divisor)
        self.storage = pa.timestamp("us")

    def convert(self, array: Any) -> tuple[Any, Mask]:
        bad = None
        # Milliseconds: checked before multiplying (no overflow). Nanoseconds always fit years 1-9999.
        low, high = -(-_MIN_US // self._factor), _MAX_US // self._factor
        if self._divisor == 1 and array.null_count < len(array):
            low_high = pc.min_max(array)
            if low_high["min"].as_py() < low or low_high["max"].as_py() > high:
                bad = _flag(pc.or_(pc.less(array, low), pc.greater(array, high)))
                array = _nulls_where(array, bad)
        return self._scale(array).cast(self.storage), bad


class _Struct(Node):
    def __init__(self, fields: list[tuple[str, Node, bool]]) -> None:
        self.fields = fields
        self.raw = pa.struct([pa.field(name, node.raw) for name, node, _ in fields])
        self.storage = pa.struct([pa.field(name, node.storage) for name, node, _ in fields])

    def convert_children(self, children: list[Any], valid: Any) -> tuple[list[Any], Mask]:
        bad: Mask = None
        out = []
        for (_name, node, optional), child in zip(self.fields, children, strict=True):
            if not optional and child.null_count:
                # A required field that is null: absent (the reference rejects it) or null (it keeps it).
                missing = pc.is_null(child) if valid is None else pc.and_(valid, pc.is_null(child))
                bad = _or(bad, _flag(missing))
            converted, child_bad = node.convert(child)
            bad = _or(bad, child_bad)
            out.append(converted)
        return out, bad

    def convert(self, array: Any) -> tuple[Any, Mask]:
        children, bad = self.convert_children(array.flatten(), pc.is_valid(array) if array.null_count else None)
        mask = pc.is_null(array) if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(self.storage), mask=mask), bad


class _List(Node):
    def __init__(self, item: Node) -> None:
        self.item = item
        self.raw, self.storage = pa.list_(item.raw), pa.list_(item.storage)

    def convert(self, array: Any) -> tuple[Any, Mask]:
        offsets = array.offsets
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        values, item_bad = self.item.convert(array.values.slice(first, last - first))
        offsets = pc.subtract(offsets, first) if first else offsets
        bad = None
        if item_bad is not None:
            bounds = offsets.to_pylist()
            rows = sorted({bisect_right(bounds, index) - 1 for index in pc.indices_nonzero(item_bad).to_pylist()})
            bad = _rows_mask(len(array), rows)
        mask = pc.is_null(array) if array.null_count else None
        return pa.ListArray.from_arrays(offsets, values, type=self.storage, mask=mask), bad


def _variable_scale_decimal(scale: int) -> Callable[[Any], Any]:
    reference = connect._variable_scale_decimal(scale)
    return lambda value: reference(value, "")


class _VariableScaleDecimal(_PerValue):
    def __init__(self, scale: int) -> None:
        super().__init__(
            pa.struct([pa.field("scale", pa.int64()), pa.field("value", pa.string())]),
            pa.decimal128(connect.MAX_DECIMAL_PRECISION, scale),
            _variable_scale_decimal(scale),
        )


# (PostgreSQL's infinity fails here whatever ingest.infinite_timestamps says: the per-record path applies it.)
_zoned_reference = connect._zoned_timestamp("dead_letter")


def _zoned(value: Any) -> Any:
    return _zoned_reference(value, "")


# ISO-8601 with a zone in the strict form Debezium writes, fields in range (day-of-month aside, which Arrow checks):
# Arrow's cast and the reference's fromisoformat + astimezone agree on every such string, and years 1000-8999 keep
# astimezone clear of its limits.
_ISO_ZONED = (
    r"^[1-8][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)


class _Zoned(_PerValue):
    """``ZonedTimestamp``: cast by Arrow when every value has the strict form, else the reference per value."""

    def __init__(self) -> None:
        super().__init__(pa.string(), pa.timestamp("us", tz="UTC"), _zoned)

    def convert(self, array: Any) -> tuple[Any, Mask]:
        if array.null_count < len(array):
            strict = pc.match_substring_regex(array, _ISO_ZONED)
            if pc.all(strict).as_py():
                try:
                    return array.cast(self.storage), None
                except pa.ArrowInvalid:
                    pass  # e.g. February 30th: the reference names it
        return super().convert(array)


def _base64(value: Any) -> Any:
    return connect._b64(value, "")


_INT_STORAGE = {"int8": pa.int32(), "int16": pa.int32(), "int32": pa.int32(), "int64": pa.int64()}
_INT_RAW = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64()}


def node_for(schema: Any, variable_scale: int, depth: int = 0) -> Node:
    """The node of one Connect schema node, mirroring ``types.converter`` and ``types.arrow_type`` case by case."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        raise _IneligibleError
    name = schema.get("name")
    kind = schema.get("type")
    if name == connect.DECIMAL:
        decimal_type = connect._decimal_type(schema)
        if connect._wire_scale(schema) < 0:
            raise _IneligibleError  # the reference rescales it
        return _Decimal(decimal_type.precision, decimal_type.scale)
    if name == connect.VARIABLE_SCALE_DECIMAL:
        return _VariableScaleDecimal(variable_scale)
    if name in connect._DATE:
        return _Date()
    if name in connect._TIME_MS:
        return _Scaled(pa.int32(), 1000, 1)
    if name in connect._TIME_US:
        return _Same(pa.int64(), pa.int64())
    if name in connect._TIME_NS:
        return _Scaled(pa.int64(), 1, 1000)
    if name in connect._TS_MS:
        return _Timestamp(1000, 1)
    if name in connect._TS_US:
        return _Timestamp(1, 1)
    if name in connect._TS_NS:
        return _Timestamp(1, 1000)
    if name in connect._TS_ZONED:
        return _Zoned()
    if name == connect.SNAPSHOT_FLAG:
        return _SnapshotFlag()
    if kind in _INT_RAW:
        return _Same(_INT_RAW[kind], _INT_STORAGE[kind])
    if kind in ("float", "float32"):
        return _Float(single=True)
    if kind in ("double", "float64"):
        return _Float()
    if kind == "boolean":
        return _Same(pa.bool_(), pa.bool_())
    if kind == "string":
        return _Same(pa.string(), pa.string())
    if kind == "bytes":
        return _PerValue(pa.string(), pa.binary(), _base64)
    if kind == "array":
        return _List(node_for(schema.get("items"), variable_scale, depth + 1))
    if kind == "struct":
        return _Struct(_struct_fields(schema, variable_scale, depth))
    raise _IneligibleError  # map (and anything the reference rejects at compile time)


def _struct_fields(schema: dict[str, Any], variable_scale: int, depth: int) -> list[tuple[str, Node, bool]]:
    fields = schema.get("fields")
    if not isinstance(fields, list) or not fields:
        raise _IneligibleError
    out = []
    for item in fields:
        if not isinstance(item, dict) or not isinstance(item.get("field"), str):
            raise _IneligibleError
        out.append((item["field"], node_for(item, variable_scale, depth + 1), bool(item.get("optional", False))))
    if len({name for name, _, _ in out}) != len(out):
        raise _IneligibleError
    return out


# -- plans: per (key schema, value schema) --------------------------------------------------------------------------
@dataclass
class _KeyCheck:
    """One key field and the image fields the reference compares it with (None: not in that image's schema)."""

    name: str
    raw: Any
    after: str | None
    before: str | None


@dataclass
class Plan:
    schema: pa.Schema  # the reference's compiled schema (the same object)
    key: _Struct | None
    value: _Struct | None  # None: tombstones (no value)
    key_checks: list[_KeyCheck]
    image_structs: frozenset[str]  # which of before/after are structs (the key check needs dicts)
    value_fields: dict[str, int]
    kind: RecordKind = RecordKind.CHANGE  # CHANGE (change events, tombstones) or TRANSACTION (BEGIN/END records)
    backoff: int = 0

    def __post_init__(self) -> None:
        self.key_raw = None if self.key is None else pa.schema(list(self.key.raw))
        self.value_raw = None if self.value is None else pa.schema(list(self.value.raw))


def _image_field(image: _Struct | None, name: str) -> str | None:
    if image is None:
        return None
    names = [field_name for field_name, _, _ in image.fields]
    if name in names:
        return name
    folded = [field_name for field_name in names if field_name.lower() == name.lower()]
    if len(folded) > 1:
        raise _IneligibleError  # which one the reference compares depends on the JSON's key order
    return folded[0] if folded else None


def _int_family(data_type: Any) -> Any:
    return pa.int64() if pa.types.is_integer(data_type) else data_type


def plan_kind(value_schema: dict[str, Any] | None) -> RecordKind:
    """TRANSACTION for the value schema of Debezium's transaction-metadata records (``status`` and ``id``, no
    ``op``), else CHANGE. Each record is still classified by its payload as ``envelope.decode`` does."""
    if value_schema is not None and value_schema.get("type") == "struct":
        fields = value_schema.get("fields")
        names = {item.get("field") for item in fields if isinstance(item, dict)} if isinstance(fields, list) else set()
        if {"status", "id"} <= names and "op" not in names:
            return RecordKind.TRANSACTION
    return RecordKind.CHANGE


def _transaction_plan(
    schema: pa.Schema, key: _Struct | None, value_schema: dict[str, Any], variable_scale: int
) -> Plan:
    value = _Struct(_struct_fields(value_schema, variable_scale, 0))
    value_fields = {name: index for index, (name, _, _) in enumerate(value.fields)}
    if RESERVED_COLUMNS & value_fields.keys():
        raise _IneligibleError
    for name in ("status", "id"):
        node = value.fields[value_fields[name]][1]
        if not (isinstance(node, _Same) and node.raw.equals(pa.string())):
            raise _IneligibleError
    return Plan(schema, key, value, [], frozenset(), value_fields, RecordKind.TRANSACTION)


def make_plan(
    schema: pa.Schema,
    key_schema: dict[str, Any] | None,
    value_schema: dict[str, Any] | None,
    variable_scale: int,
    kind: RecordKind = RecordKind.CHANGE,
) -> Plan | None:
    try:
        key = None
        if key_schema is not None:
            key_node = node_for(key_schema, variable_scale)
            if not isinstance(key_node, _Struct):
                raise _IneligibleError
            key = key_node
        if kind is RecordKind.TRANSACTION:
            assert value_schema is not None
            return _transaction_plan(schema, key, value_schema, variable_scale)
        value = None
        images: dict[str, _Struct] = {}
        value_fields: dict[str, int] = {}
        if value_schema is not None:
            if value_schema.get("type") != "struct":
                raise _IneligibleError
            value = _Struct(_struct_fields(connect.with_snapshot_as_text(value_schema), variable_scale, 0))
            value_fields = {name: index for index, (name, _, _) in enumerate(value.fields)}
            if RESERVED_COLUMNS & value_fields.keys() or "op" not in value_fields or "source" not in value_fields:
                raise _IneligibleError
            if "message" in value_fields and not {"before", "after"} & value_fields.keys():
                raise _IneligibleError  # logical decoding messages (op m) are few: the reference path stores them
            op_node = value.fields[value_fields["op"]][1]
            source_node = value.fields[value_fields["source"]][1]
            if not (isinstance(op_node, _Same) and op_node.raw.equals(pa.string())):
                raise _IneligibleError
            if not isinstance(source_node, _Struct) or "connector" not in [n for n, _, _ in source_node.fields]:
                raise _IneligibleError
            for image in ("before", "after"):
                node = value.fields[value_fields[image]][1] if image in value_fields else None
                if isinstance(node, _Struct):
                    images[image] = node
        checks = []
        if key is not None and value is not None:
            for name, node, _ in key.fields:
                if isinstance(node, (_Struct, _List)):
                    raise _IneligibleError  # dict/list equality sees absent vs null
                after, before = _image_field(images.get("after"), name), _image_field(images.get("before"), name)
                checks.append(_KeyCheck(name, node.raw, after, before))
        return Plan(schema, key, value, checks, frozenset(images), value_fields)
    except _IneligibleError:
        return None


# -- reading raw JSON lines -------------------------------------------------------------------------------------
def _read(lines: list[bytes], schema: pa.Schema) -> tuple[Any, list[bool]]:
    """Parse ``lines`` (one JSON object each) with ``schema``; bisect failures down to the failing lines."""
    ok = [True] * len(lines)
    whole = b"\n".join(lines)
    if not whole.isascii():
        for index, line in enumerate(lines):
            if not line.isascii():
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:  # pyarrow.json does not check UTF-8; the reference rejects it
                    ok[index] = False
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    tables: list[Any] = []

    def attempt(low: int, high: int) -> None:
        if low == 0 and high == len(lines) and all(ok):
            chunk, data = lines, whole
        else:
            chunk = [line for line, good in zip(lines[low:high], ok[low:high], strict=True) if good]
            if not chunk:
                return
            data = b"\n".join(chunk)
        try:
            table = pj.read_json(
                pa.BufferReader(data),
                read_options=pj.ReadOptions(use_threads=False, block_size=min(len(data) + 1, _BLOCK_LIMIT)),
                parse_options=parse,
            )
        except pa.ArrowException:
            table = None
        if table is not None and table.num_rows == len(chunk):
            tables.append(table)
            return
        if high - low == 1:
            ok[low] = False
            return
        middle = (low + high) // 2
        attempt(low, middle)
        attempt(middle, high)

    attempt(0, len(lines))
    if not tables:
        return None, ok
    return (tables[0] if len(tables) == 1 else pa.concat_tables(tables)), ok


def _columns(table: Any) -> dict[str, Any]:
    return {name: column.combine_chunks() for name, column in zip(table.column_names, table.columns, strict=True)}


# -- ordering -------------------------------------------------------------------------------------------------------
def _integer_position(array: Any) -> tuple[Any, Mask]:
    """``ordering._integer``: null -> -1, a non-negative int, or a digit string."""
    if pa.types.is_integer(array.type):
        bad = _flag(pc.less(array, 0))
        return pc.fill_null(array.cast(pa.int64()), -1), bad
    if pa.types.is_string(array.type):
        digits = pc.match_substring_regex(array, _DIGITS)
        bad = _flag(pc.and_(pc.is_valid(array), pc.invert(pc.fill_null(digits, False))))
        return pc.fill_null(_nulls_where(array, bad).cast(pa.int64()), -1), bad
    return pa.array([-1] * len(array), pa.int64()), _flag(pc.is_valid(array))


def _postgres_position(sequence: Any, lsn: Any) -> tuple[list[Any], Mask]:
    """``ordering._postgresql`` for the forms Debezium writes; anything else goes back to the reference."""
    length = len(sequence) if sequence is not None else len(lsn)
    minus_one = pa.array([-1] * length, pa.int64())
    if lsn is None:
        lsn_value, bad = minus_one, None
    elif pa.types.is_integer(lsn.type):
        lsn_value, bad = pc.fill_null(lsn.cast(pa.int64()), -1), _flag(pc.less(lsn, 0))
    else:
        lsn_value, bad = minus_one, _flag(pc.is_valid(lsn))
    if sequence is None:
        return [minus_one, lsn_value], bad
    if not pa.types.is_string(sequence.type):
        return [minus_one, lsn_value], _flag(pc.is_valid(sequence))
    has_sequence = pc.is_valid(sequence)
    if bad is not None:  # the lsn only counts where there is no sequence
        bad = _flag(pc.and_(pc.invert(has_sequence), bad))
    parts = pc.extract_regex(sequence, _PG_SEQUENCE)
    unmatched = pc.and_(has_sequence, pc.is_null(parts))
    bad = _or(bad, _flag(unmatched))
    commit = pc.struct_field(parts, "commit")
    commit = pc.if_else(pc.equal(commit, ""), pa.scalar(None, pa.string()), commit)
    commit = pc.fill_null(commit.cast(pa.int64()), -1)
    change = pc.fill_null(pc.struct_field(parts, "lsn").cast(pa.int64()), -1)
    commit = pc.if_else(pc.equal(commit, -1), change, commit)  # no last commit LSN: as ordering._postgresql
    first = pc.if_else(has_sequence, commit, minus_one)
    second = pc.if_else(has_sequence, change, lsn_value)
    return [first, second], bad


def _total_order(transaction: Any, transaction_node: Node | None, length: int) -> tuple[Any, Mask]:
    """``ordering.total_order`` of each row, from the raw ``transaction`` column (None: the schema has none)."""
    if transaction is None or transaction_node is None:
        return pa.array([-1] * length, pa.int64()), None
    if not isinstance(transaction_node, _Struct):
        return pa.array([-1] * length, pa.int64()), _flag(pc.is_valid(transaction))  # the reference decides
    names = [name for name, _, _ in transaction_node.fields]
    if "total_order" not in names:
        return pa.array([-1] * length, pa.int64()), None
    # flatten() gives null children under a null block: -1, as the reference has for ``transaction: null``.
    return _integer_position(transaction.flatten()[names.index("total_order")])


def _unplaced(connector: str, transaction: Any, source: dict[str, Any], length: int) -> bool:
    """Whether a row of ``connector`` belongs to a transaction but has no transaction block
    (``ordering.in_transaction``; ``source``: the source block's columns by name)."""
    unplaced = pc.is_null(transaction) if transaction is not None else pa.array([True] * length)
    if connector == "mongodb":  # change-streams mode marks a transaction's changes by txnNumber, oplog by stxnid
        marks = [pc.is_valid(source[name]) for name in ("txnNumber", "stxnid") if name in source]
        if not marks:
            return False
        marked = marks[0] if len(marks) == 1 else pc.or_(marks[0], marks[1])
        return bool(pc.any(pc.and_(unplaced, marked)).as_py())
    snapshot = source.get("snapshot")
    if snapshot is not None:
        if pa.types.is_boolean(snapshot.type):
            streamed = pc.invert(pc.fill_null(snapshot, False))
        else:
            streamed = pc.fill_null(pc.equal(snapshot.cast(pa.string()), "false"), True)
        unplaced = pc.and_(unplaced, streamed)
    return bool(pc.any(unplaced).as_py())


def _ordering(
    source: Any, source_node: _Struct, transaction: Any = None, transaction_node: Node | None = None
) -> tuple[Any, Mask]:
    """The ``_cdc_order`` column (list<int64>) of change events, from the raw ``source`` struct column (and the
    ``transaction`` column, for the connectors in ``TRANSACTION_ORDERED``)."""
    length = len(source)
    names = [name for name, _, _ in source_node.fields]
    children = dict(zip(names, source.flatten(), strict=True))
    bad = _flag(pc.is_null(source)) if source.null_count else None
    connector = children["connector"]
    if connector.null_count:
        bad = _or(bad, _flag(pc.is_null(connector)))
    distinct = [value for value in pc.unique(connector).to_pylist() if value is not None]
    if len(distinct) == 1 and distinct[0] in ("postgresql", *_INTEGER_PAIRS):
        fields = _POSITION_FIELDS[distinct[0]]
        if distinct[0] == "postgresql":
            components, position_bad = _postgres_position(children.get(fields[0]), children.get(fields[1]))
        else:
            components, position_bad = [], None
            for name in fields:
                if name not in children:
                    components.append(pa.array([-1] * length, pa.int64()))
                    continue
                component, component_bad = _integer_position(children[name])
                components.append(component)
                position_bad = _or(position_bad, component_bad)
            if distinct[0] == "oracle":  # no commit_scn (a snapshot read): its scn, as ordering._oracle
                components[0] = pc.if_else(pc.equal(components[0], -1), components[1], components[0])
            if distinct[0] in TRANSACTION_ORDERED:
                component, component_bad = _total_order(transaction, transaction_node, length)
                components.append(component)
                position_bad = _or(position_bad, component_bad)
                if _unplaced(distinct[0], transaction, children, length):
                    note_unplaced_change(distinct[0])
        return _list_column(components, length), _or(bad, position_bad)
    # Other connectors (hex LSNs, binlog names) or a mix: the reference's functions, per row.
    wanted = {name for connector_fields in _POSITION_FIELDS.values() for name in connector_fields}
    columns: dict[str, list[Any]] = {}
    for name in wanted & children.keys():
        child = children[name]
        if not (pa.types.is_integer(child.type) or pa.types.is_string(child.type)):
            bad = _or(bad, _flag(pc.is_valid(child)))  # a float or bool position: the reference decides
        columns[name] = child.to_pylist()
    connectors = connector.to_pylist()
    places, places_bad = _total_order(transaction, transaction_node, length)
    bad = _or(bad, places_bad)
    place = places.to_pylist()
    for name in TRANSACTION_ORDERED & set(distinct):  # a mix of connectors in one group: rare, checked alike
        rows = pc.fill_null(pc.equal(connector, name), False)
        picked = {field: child.filter(rows) for field, child in children.items()}
        if _unplaced(name, None if transaction is None else transaction.filter(rows), picked, len(picked["connector"])):
            note_unplaced_change(name)
    orders: list[list[int] | None] = []
    bad_rows: list[int] = []
    for row in range(length):
        connector_name = connectors[row]
        compute = ORDERINGS.get(connector_name) if connector_name is not None else None
        if compute is None:
            bad_rows.append(row)
            orders.append(None)
            continue
        try:
            order = compute({name: values[row] for name, values in columns.items()})
            if connector_name in TRANSACTION_ORDERED:
                order = [*order, place[row]]
        except Exception:  # DecodeError: a dead letter; anything else: the reference raises it too
            order = None
        if order is None or not all(_INT64_MIN <= component <= _INT64_MAX for component in order):
            bad_rows.append(row)  # beyond int64 the reference's row cannot be written either: it decides
            order = None
        orders.append(order)
    return pa.array(orders, pa.list_(pa.int64())), _or(bad, _rows_mask(length, bad_rows))


_RANGE = [pa.array([], pa.int64())]  # 0, 1, 2, ... (grown on demand; arrays are immutable, so shared safely)


def _range(length: int) -> Any:
    known = _RANGE[0]
    if len(known) < length:
        known = _RANGE[0] = pa.array(range(max(length, 2 * len(known))), pa.int64())
    return known.slice(0, length)


def _list_column(components: list[Any], length: int) -> Any:
    """A list<int64> column whose row i is [components[0][i], components[1][i], ...] (no nulls)."""
    width = len(components)
    values = pa.concat_arrays([component.cast(pa.int64()) for component in components])
    if width > 1:
        # Row-major: element k of the list values is component k % width of row k // width.
        index = _range(length * width)
        row = pc.divide(index, width)
        component = pc.subtract(index, pc.multiply(row, width))
        values = values.take(pc.add(pc.multiply(component, length), row))
    offsets = pc.multiply(_range(length + 1), width).cast(pa.int32())
    return pa.ListArray.from_arrays(offsets, values, type=pa.list_(pa.int64()))


# -- the key check ---------------------------------------------------------------------------------------------------
def _key_check(plan: Plan, keys: dict[str, Any], values: dict[str, Any], op: Any) -> Mask:
    """``envelope._check_key_matches``: rows where a key field and its image field differ, or might."""
    bad: Mask = None
    is_delete = pc.fill_null(pc.equal(op, "d"), False)
    for image, selected in (("after", pc.invert(is_delete)), ("before", is_delete)):
        if image not in plan.image_structs:
            continue
        column = values[image]
        names = [field.name for field in column.type]
        children = dict(zip(names, column.flatten(), strict=True))
        in_image = pc.and_(selected, pc.is_valid(column))
        for check in plan.key_checks:
            image_name = check.after if image == "after" else check.before
            if image_name is None:
                continue
            key_value, image_value = keys[check.name], children[image_name]
            comparable = _int_family(key_value.type).equals(_int_family(image_value.type)) and (
                pa.types.is_integer(key_value.type) or pa.types.is_boolean(key_value.type)
            )
            one_null = pc.xor(pc.is_null(key_value), pc.is_null(image_value))
            if pa.types.is_string(key_value.type):
                # Text is not compared, as in the reference (Debezium masks a key column in the value only); a
                # null key field is, with the image's value.
                differ = pc.and_(pc.is_null(key_value), pc.is_valid(image_value))
            elif comparable:
                differ = pc.or_(one_null, pc.fill_null(pc.not_equal(key_value, image_value), False))
            else:
                differ = pc.or_(one_null, pc.and_(pc.is_valid(key_value), pc.is_valid(image_value)))
            bad = _or(bad, _flag(pc.and_(in_image, differ)))
    return bad


# -- groups -----------------------------------------------------------------------------------------------------------
@dataclass
class Group:
    """The records of one poll for one (table, key schema, value schema)."""

    name: str
    plan: Plan
    key_schema: dict[str, Any] | None
    value_schema: dict[str, Any] | None
    members: list[int] = field(default_factory=list)  # positions in the poll
    keys: list[bytes] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    table: Any = None  # the rows kept, in member order
    positions: list[int] = field(default_factory=list)  # the poll position of each row of ``table`` (ascending)
    dropped: list[int] = field(default_factory=list)  # rows of ``table`` that became dead letters after all

    @property
    def rows(self) -> dict[int, int]:
        """Poll position -> row of ``table``."""
        return {position: row for row, position in enumerate(self.positions)}

    def kept(self, before: int) -> Any:
        """The rows buffered: those of members at poll positions below ``before``, less the dropped ones."""
        table = self.table
        if table is None:
            return None
        limit = bisect_left(self.positions, before)
        if limit < table.num_rows:
            table = table.slice(0, limit)
        if not self.dropped:
            return table
        drop = set(self.dropped)
        return table.filter(pa.array([row not in drop for row in range(table.num_rows)], pa.bool_()))


class BatchDecoder:
    """Decodes and types the records of one poll into Arrow tables, one per group (see module docstring)."""

    def __init__(self, splitter: SchemaSplitter, builder: RowBuilder, variable_scale: int = 10) -> None:
        self.splitter = splitter
        self.builder = builder
        self.variable_scale = variable_scale
        self.strict = False
        self._plans: dict[tuple[int, int], tuple[object, object, Plan | None]] = {}

    def plan(self, key_schema: dict[str, Any] | None, value_schema: dict[str, Any] | None) -> Plan | None:
        identity = (id(key_schema), id(value_schema))
        known = self._plans.get(identity)
        if known is not None and known[0] is key_schema and known[1] is value_schema:
            return known[2]
        kind = plan_kind(value_schema)
        plan: Plan | None = None
        if value_schema is None or value_schema.get("name") != HEARTBEAT_SCHEMA:
            # (a heartbeat on a topic of another prefix, envelope.is_heartbeat: the reference path skips it)
            try:
                schema = self.builder.schema_for(kind, key_schema, value_schema)
            except DecodeError:
                pass
            else:
                plan = make_plan(schema, key_schema, value_schema, self.variable_scale, kind)
        if len(self._plans) >= 256:
            self._plans.clear()
        self._plans[identity] = (key_schema, value_schema, plan)
        return plan

    def group(self, records: list[RawRecord], names: list[str | None]) -> list[Group | None]:
        """Phase 1: the group of each record (None: the per-record path, also for ``names[i] is None``)."""
        split = self.splitter.split
        groups: dict[tuple[str, int, int], Group] = {}
        out: list[Group | None] = []
        # Per topic: the key and value schema prefixes of its last record, checked before asking the splitter.
        last: dict[bool, dict[str, tuple[bytes, dict[str, Any], int]]] = {True: {}, False: {}}
        last_key, last_value = last[True], last[False]

        def payload_of(topic: str, is_key: bool, data: bytes) -> tuple[dict[str, Any] | None, bytes]:
            known = last[is_key].get(topic)
            if known is not None and data.startswith(known[0]) and len(data) - known[2] <= _DEEP_PAYLOAD:
                _prefix, schema, start = known
                if data[-1] != _CLOSE:
                    return None, b""
            else:
                found = split(topic, is_key, data)
                if found is None:
                    return None, b""
                schema, start = found
                last[is_key][topic] = (data[:start], schema, start)
            if data[start] != _OPEN:
                return None, b""
            return schema, data[start:-1]

        # The loop below runs once per record. The usual case (the same topic as the record before, a document
        # that starts with the prefix of that topic's last one) is written out inline, with that topic's prefixes
        # in local variables; anything else takes payload_of and the dicts.
        append = out.append
        current_topic: str | None = None
        heartbeat = False
        key_prefix = value_prefix = b""
        key_known: tuple[bytes, dict[str, Any], int] | None = None
        value_known: tuple[bytes, dict[str, Any], int] | None = None
        key_start = value_start = 0
        group: Group | None = None
        for position, (topic, _partition, _offset, _timestamp, key, value, _headers) in enumerate(records):
            name = names[position]
            if name is None:
                append(None)
                continue
            if topic != current_topic:
                current_topic, heartbeat = topic, topic.startswith(HEARTBEAT_PREFIX)
                key_known, value_known = last_key.get(topic), last_value.get(topic)
                key_prefix, key_start = (key_known[0], key_known[2]) if key_known else (b"", 0)
                value_prefix, value_start = (value_known[0], value_known[2]) if value_known else (b"", 0)
            if heartbeat:
                append(None)
                continue
            key_schema = value_schema = None
            key_payload = payload = b""
            if key is not None:
                if (
                    key_known is not None
                    and key.startswith(key_prefix)
                    and key[-1] == _CLOSE
                    and len(key) - key_start <= _DEEP_PAYLOAD
                    and key[key_start] == _OPEN
                ):
                    key_schema, key_payload = key_known[1], key[key_start:-1]
                else:
                    key_schema, key_payload = payload_of(topic, True, key)
                    key_known = last_key.get(topic)  # payload_of may have learned another prefix
                    key_prefix, key_start = (key_known[0], key_known[2]) if key_known else (b"", 0)
                    if key_schema is None:
                        append(None)
                        continue
            if value is not None:
                if (
                    value_known is not None
                    and value.startswith(value_prefix)
                    and value[-1] == _CLOSE
                    and len(value) - value_start <= _DEEP_PAYLOAD
                    and value[value_start] == _OPEN
                ):
                    value_schema, payload = value_known[1], value[value_start:-1]
                else:
                    value_schema, payload = payload_of(topic, False, value)
                    value_known = last_value.get(topic)
                    value_prefix, value_start = (value_known[0], value_known[2]) if value_known else (b"", 0)
                    if value_schema is None:
                        append(None)
                        continue
            elif key_schema is None:  # a tombstone without a key schema: JSON layout
                append(None)
                continue
            if (
                group is None
                or group.name != name
                or group.key_schema is not key_schema
                or group.value_schema is not value_schema
            ):
                identity = (name, id(key_schema), id(value_schema))
                found = groups.get(identity)
                if found is None:
                    plan = self.plan(key_schema, value_schema)
                    if plan is None:
                        append(None)
                        continue
                    found = groups[identity] = Group(name, plan, key_schema, value_schema)
                group = found
            group.members.append(position)
            group.keys.append(key_payload)
            group.payloads.append(payload)
            append(group)
        for group in groups.values():
            if group.plan.backoff:
                group.plan.backoff -= 1
                for position in group.members:
                    out[position] = None
        return out

    def build(self, group: Group, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        """Phase 2: the group's Arrow table, and which members it holds (the others take the per-record path).

        Should this path fail unexpectedly, the group's records all take the per-record path (``strict``: raise).
        """
        try:
            self._build(group, records, ingested_at)
        except Exception:
            if self.strict:
                raise
            log.exception(
                "fast path failed for %d records of %s; decoding them one by one", len(group.members), group.name
            )
            group.table, group.positions = None, []

    def _build(self, group: Group, records: list[RawRecord], ingested_at: dt.datetime) -> None:
        plan = group.plan
        count = len(group.members)
        ok = [True] * count
        values: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        value_table = key_table = None
        value_ok = key_ok = ok
        if plan.value is not None:
            value_table, value_ok = _read(group.payloads, plan.value_raw)
        if plan.key is not None:
            key_table, key_ok = _read(group.keys, plan.key_raw)
        ok = [a and b for a, b in zip(value_ok, key_ok, strict=True)]
        if sum(ok) * 2 < count:
            plan.backoff = _BACKOFF_POLLS
        if not any(ok):
            return
        if value_table is not None:
            values = _columns(_aligned(value_table, value_ok, ok))
        if key_table is not None:
            keys = _columns(_aligned(key_table, key_ok, ok))
        if all(ok):
            members, key_payloads = group.members, group.keys
        else:
            members = [member for member, good in zip(group.members, ok, strict=True) if good]
            key_payloads = [payload for payload, good in zip(group.keys, ok, strict=True) if good]
        length = len(members)
        arrays: dict[str, Any] = {}
        bad: Mask = None

        # The members' coordinates, column by column (a RawRecord is a tuple: zip transposes them in one go).
        topics, partitions, offsets, stamps, _, _, headers = zip(*[records[member] for member in members], strict=True)
        kafka_us = _kafka_timestamps(stamps)
        odd_rows: list[int] = []
        is_change = plan.kind is RecordKind.CHANGE
        key_json = None
        if plan.key is not None and is_change:
            key_json, odd_json = _key_json(plan.key, keys, key_payloads)
            odd_rows += odd_json
        elif is_change:
            key_json = pa.nulls(length, pa.string())
        bad = _rows_mask(length, odd_rows)
        if topics.count(topics[0]) == length:  # one topic (the usual case): no string per row to convert
            arrays["_cdc_topic"] = pa.repeat(pa.scalar(topics[0], pa.string()), length)
        else:
            arrays["_cdc_topic"] = pa.array(topics, pa.string())
        arrays["_cdc_partition"] = pa.array(partitions, pa.int32())
        arrays["_cdc_offset"] = pa.array(offsets, pa.int64())
        arrays["_cdc_kafka_ts"] = kafka_us.cast(UTC_US)
        arrays["_cdc_ingested_at"] = pa.repeat(pa.scalar(ingested_at, UTC_US), length)
        if headers.count(None) == length:  # no headers (the usual case): no list per row
            arrays["_cdc_headers"] = pa.nulls(length, HEADERS_TYPE)
        else:
            arrays["_cdc_headers"] = pa.array(headers, HEADERS_TYPE)

        if not is_change:
            bad = _or(bad, _validate_transaction(values))
        elif plan.value is not None:
            op = values["op"]
            bad = _or(bad, _validate_change(plan, values, op))
            source_node = plan.value.fields[plan.value_fields["source"]][1]
            assert isinstance(source_node, _Struct)
            transaction_node = (
                plan.value.fields[plan.value_fields["transaction"]][1] if "transaction" in plan.value_fields else None
            )
            order, order_bad = _ordering(values["source"], source_node, values.get("transaction"), transaction_node)
            bad = _or(bad, order_bad)
            if plan.key is not None and plan.key_checks:
                bad = _or(bad, _key_check(plan, keys, values, op))
            arrays["_cdc_order"] = order
        else:
            arrays["_cdc_order"] = pa.nulls(length, pa.list_(pa.int64()))
        if key_json is not None:
            arrays["_cdc_key_json"] = key_json
        if plan.key is not None:
            key_children, key_bad = plan.key.convert_children([keys[name] for name, _, _ in plan.key.fields], None)
            arrays["key"] = pa.StructArray.from_arrays(key_children, fields=list(plan.key.storage))
            bad = _or(bad, key_bad)
        if plan.value is not None:
            children, value_bad = plan.value.convert_children([values[name] for name, _, _ in plan.value.fields], None)
            bad = _or(bad, value_bad)
            for (name, _, _), child in zip(plan.value.fields, children, strict=True):
                arrays[name] = child
        table = pa.Table.from_arrays([arrays[f.name] for f in plan.schema], names=plan.schema.names)
        if bad is not None:
            table = table.filter(pc.invert(bad))
            flags = bad.to_pylist()
            members = [member for member, flagged in zip(members, flags, strict=True) if not flagged]
        group.table = table
        group.positions = members


# Field names orjson writes unescaped (and sorts as Python does).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_$. -]*")
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'


def _key_json(key: _Struct, keys: dict[str, Any], payloads: list[bytes]) -> tuple[Any, list[int]]:
    """``_cdc_key_json``, the key as canonical JSON (``rows.canonical_json``): rendered from the columns where that
    is exact (int, bool and plain string fields, none null), else by orjson from the key's own bytes."""
    length = len(payloads)
    names = sorted(name for name, _, _ in key.fields)
    parts: list[Any] = []
    per_row: Mask = None
    if all(_PLAIN_NAME.fullmatch(name) for name in names):
        for index, name in enumerate(names):
            column = keys[name]
            parts.append(("{" if index == 0 else ",") + f'"{name}":')
            if column.null_count:
                per_row = _or(per_row, _flag(pc.is_null(column)))  # absent or null: only the bytes tell
            if pa.types.is_integer(column.type):
                parts.append(column.cast(pa.string()))
            elif pa.types.is_boolean(column.type):
                parts.append(pc.if_else(column, "true", "false"))
            elif pa.types.is_string(column.type):
                per_row = _or(per_row, _flag(pc.match_substring_regex(column, _NEEDS_ESCAPE)))
                parts.append(pc.binary_join_element_wise('"', column, '"', ""))
            else:
                parts = []
                break
    if not parts:
        rendered: list[Any] = [None] * length
        per_row_rows = list(range(length))
    else:
        parts.append("}")
        joined = pc.binary_join_element_wise(*parts, "")
        if per_row is None:
            return joined, []
        rendered = joined.to_pylist()
        per_row_rows = pc.indices_nonzero(per_row).to_pylist()
    odd: list[int] = []
    for row in per_row_rows:
        try:
            payload = payloads[row]
            key_value = with_exact_numbers(orjson.loads(payload), payload, enveloped=False)
            rendered[row] = connect.canonical_json(key_value)
        except (orjson.JSONDecodeError, DecodeError):  # e.g. NaN, which pyarrow.json reads: the reference decides
            rendered[row] = None
            odd.append(row)
    return pa.array(rendered, pa.string()), odd


def _aligned(table: Any, parsed: list[bool], wanted: list[bool]) -> Any:
    """Rows of ``table`` (one per ``parsed`` member) for the ``wanted`` members (a subset of ``parsed``)."""
    if parsed == wanted:
        return table
    indices = []
    row = 0
    for was_parsed, want in zip(parsed, wanted, strict=True):
        if was_parsed:
            if want:
                indices.append(row)
            row += 1
    return table.take(pa.array(indices, pa.int64()))


def _kafka_timestamps(stamps: Sequence[int | None]) -> Any:
    """``_cdc_kafka_ts`` in microseconds (int64) as ``rows.kafka_timestamp`` gives it: null for a missing timestamp
    or one outside what a timestamp column holds."""
    column = pa.array(stamps, pa.int64())
    outside = pc.or_(pc.less(column, 0), pc.greater(column, LAST_KAFKA_TS_MS))
    return pc.multiply(pc.if_else(outside, pa.scalar(None, pa.int64()), column), 1000)


def _validate_transaction(values: dict[str, Any]) -> Mask:
    """``envelope._decode``'s test for a transaction-metadata record (``status`` BEGIN or END, an ``id``): rows that
    fail it, or whose ``id`` is null (absent or null: only the bytes tell), go back to the reference."""
    status = pc.fill_null(pc.is_in(values["status"], value_set=pa.array(["BEGIN", "END"])), False)
    return _flag(pc.or_(pc.invert(status), pc.is_null(values["id"])))


def _validate_change(plan: Plan, values: dict[str, Any], op: Any) -> Mask:
    """``envelope._validate_change``: rows with an unknown op or a missing image go back to the reference."""
    bad = _flag(pc.invert(pc.fill_null(pc.is_in(op, value_set=pa.array(list("cudrt"))), False)))
    after = values.get("after")
    after_null = pc.is_null(after) if after is not None else pa.array([True] * len(op))
    bad = _or(bad, _flag(pc.and_(pc.is_in(op, value_set=pa.array(["c", "r"])), after_null)))
    update_empty = pc.and_(pc.equal(op, "u"), after_null)
    for name in ("patch", "updateDescription"):
        if name in values:
            update_empty = pc.and_(update_empty, pc.is_null(values[name]))
    return _or(bad, _flag(update_empty))


# -- commit: the fast path's tables in the table's schema --------------------------------------------------------
def conform_array(array: Any, target: Any) -> Any:
    """``array`` as ``target`` (the table's type, which only ever widens the array's): fields by name, missing ones
    null, numbers widened; what ``pa.Table.from_pylist`` makes of the reference's Python values."""
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([conform_array(chunk, target) for chunk in array.chunks], type=target)
    if array.type.equals(target):
        return array
    mask = pc.is_null(array) if array.null_count else None
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        present = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        children = [
            conform_array(array.field(present[f.name]), f.type) if f.name in present else pa.nulls(len(array), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if (pa.types.is_list(target) or pa.types.is_large_list(target)) and pa.types.is_list(array.type):
        offsets = array.offsets
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        values = conform_array(array.values.slice(first, last - first), target.value_type)
        offsets = pc.subtract(offsets, first) if first else offsets
        return pa.ListArray.from_arrays(offsets, values, type=pa.list_(target.value_field), mask=mask).cast(target)
    return array.cast(target)


def conform_table(table: Any, target: pa.Schema) -> Any:
    names = set(table.column_names)
    columns = [
        conform_array(table.column(f.name), f.type) if f.name in names else pa.nulls(table.num_rows, f.type)
        for f in target
    ]
    return pa.Table.from_arrays(columns, schema=target)


def drop_committed(table: Any, stored: dict[tuple[str, int], int], partitions: list[tuple[str, int]]) -> Any:
    """Rows at or above each partition's stored offset (the others were committed by another writer meanwhile)."""
    drop = None
    for topic, partition in partitions:
        offset = stored.get((topic, partition))
        if offset is None:
            continue
        below = pc.and_(
            pc.and_(pc.equal(table["_cdc_topic"], topic), pc.equal(table["_cdc_partition"], partition)),
            pc.less(table["_cdc_offset"], offset),
        )
        drop = below if drop is None else pc.or_(drop, below)
    if drop is None or not pc.any(drop).as_py():
        return table
    return table.filter(pc.invert(drop))
