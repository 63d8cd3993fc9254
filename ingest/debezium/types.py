"""Kafka Connect schemas (as the JSON converter writes them) to Arrow/Iceberg types, and value converters.

One place for the Debezium type mapping. A converter either returns a value that fits its column exactly or
raises :class:`DecodeError` naming the field path: nothing is coerced silently (no string becomes a zero).
Nanosecond types are stored at microsecond precision, the finest Iceberg v2 offers; that is the only rounding.
"""

from __future__ import annotations

import binascii
import datetime as dt
import decimal
import math
import re
from collections.abc import Callable
from typing import Any

import orjson
import pyarrow as pa

from ingest.config import InfiniteTimestamps
from ingest.errors import DecodeError

Converter = Callable[[Any, str], Any]

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_DATE = {"org.apache.kafka.connect.data.Date", "io.debezium.time.Date"}
_TIME_MS = {"org.apache.kafka.connect.data.Time", "io.debezium.time.Time"}
_TIME_US = {"io.debezium.time.MicroTime"}
_TIME_NS = {"io.debezium.time.NanoTime"}
_TS_MS = {"org.apache.kafka.connect.data.Timestamp", "io.debezium.time.Timestamp"}
_TS_US = {"io.debezium.time.MicroTimestamp"}
_TS_NS = {"io.debezium.time.NanoTimestamp"}
_TS_ZONED = {"io.debezium.time.ZonedTimestamp", "io.debezium.time.IsoTimestamp"}
# `source.snapshot` is a boolean in the seeds and early connectors, the io.debezium.data.Enum text ("true", "last",
# "false", ...) since. Bronze keeps the text for both, so a connector upgrade does not make every later record of a
# table a dead letter (a boolean column cannot widen to string). The name marks such a boolean in a value schema.
SNAPSHOT_FLAG = "cdclake.SnapshotFlag"

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NAIVE_EPOCH = _EPOCH.replace(tzinfo=None)
_EPOCH_DATE = dt.date(1970, 1, 1)
_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
# Spark cannot read Iceberg's `time` type, so times are kept as microseconds since midnight (long), named
# in the docs; an Iceberg `time` column would make the whole table unreadable from Spark SQL.
TIME_TYPE = pa.int64()
MAX_DECIMAL_PRECISION = 38
# Enough digits for any decimal(38, s) and its range check: the default context (28 digits) would round.
_EXACT = decimal.Context(prec=80)


# PostgreSQL's 'infinity' and '-infinity' as Debezium's PostgreSQL connector sends them (recorded from 3.6.3:
# tests/fixtures/debezium/postgres/infinity.jsonl): the JDBC driver's sentinels in the unit of the column's type,
# the text for a timestamp with zone, and for a date whatever its conversion made of the sentinel (one value from a
# snapshot, another from the stream). Each lies outside years 1-9999, so no real date or instant is taken for one.
# +1: infinity, -1: -infinity.
_INFINITE_MILLIS = {9223372036825200: 1, -9223372036832400: -1}
_INFINITE_MICROS = {millis * 1000: sign for millis, sign in _INFINITE_MILLIS.items()}
_INFINITE_DAYS = {-622191234: 1, -2147472692: 1, -625821272: -1, -2147472691: -1}
_INFINITE_TEXT = {"infinity": 1, "-infinity": -1}
# What `clamp` lands them as: the last and first of what Iceberg's Spark runtime reads (years 1-9999).
_LAST_DATE, _FIRST_DATE = dt.date(9999, 12, 31), dt.date(1, 1, 1)
_LAST_INSTANT, _FIRST_INSTANT = dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1)


def _fail(path: str, expected: str, value: Any) -> DecodeError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return DecodeError(f"{path}: expected {expected}, got {type(value).__name__} {shown}")


def _wire_scale(schema: dict[str, Any]) -> int:
    """The scale of a Connect Decimal's unscaled value (negative for e.g. Oracle NUMBER(5,-2))."""
    scale = (schema.get("parameters") or {}).get("scale", 0)
    try:
        return int(scale)
    except (TypeError, ValueError):
        raise DecodeError(f"decimal scale {scale!r} is not an integer") from None


def _part(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``items``/``keys``/``values`` schema of an array or map (a malformed schema is the record's fault)."""
    part = schema.get(name)
    if not isinstance(part, dict):
        raise DecodeError(f"Connect schema of type {schema.get('type')!r} has no {name!r} schema")
    return part


def _field_name(field: Any) -> str:
    name = field.get("field") if isinstance(field, dict) else None
    if not isinstance(name, str):
        raise DecodeError(f"a struct field without a 'field' name: {str(field)[:80]}")
    return name


def _declared_decimal(schema: dict[str, Any]) -> tuple[int, int]:
    """A Connect Decimal's (precision, scale) as declared (38 digits when undeclared), a negative scale made 0 with
    as many digits more: Parquet and Iceberg have no negative scale (Oracle NUMBER(5,-2))."""
    params = schema.get("parameters") or {}
    scale = _wire_scale(schema)
    precision = int(params.get("connect.decimal.precision", MAX_DECIMAL_PRECISION))
    return (precision - scale, 0) if scale < 0 else (precision, scale)


def _decimal_type(schema: dict[str, Any]) -> pa.Decimal128Type:
    precision, scale = _declared_decimal(schema)
    if scale > MAX_DECIMAL_PRECISION:
        # PostgreSQL numeric(50,40), Oracle NUMBER(p,127): no Iceberg decimal holds that many places.
        raise DecodeError(
            f"decimal scale {scale} is beyond the {MAX_DECIMAL_PRECISION} digits an Iceberg decimal holds"
            " (set the connector's decimal.handling.mode to string or double for this column)"
        )
    precision = max(min(precision, MAX_DECIMAL_PRECISION), scale if scale > 0 else 1)
    return pa.decimal128(precision, scale)


def narrowed_decimals(schema: Any, path: str) -> list[str]:
    """The Decimal fields of ``schema`` (``path``: where it sits) declared wider than Iceberg's 38 digits, each as a
    warning naming it: bronze keeps the scale, so such a column holds fewer integer digits than the source's, and a
    value beyond them is a dead letter (MySQL's ``DECIMAL(65,30)`` holding 1E+8)."""
    if not isinstance(schema, dict):
        return []
    if schema.get("name") == DECIMAL:
        try:
            precision, scale = _declared_decimal(schema)
        except (DecodeError, TypeError, ValueError):
            return []  # a schema the record's conversion names
        if precision <= MAX_DECIMAL_PRECISION or scale > MAX_DECIMAL_PRECISION:
            return []
        return [
            f"{path}: decimal({precision},{scale}) at the source is decimal({MAX_DECIMAL_PRECISION},{scale}) in "
            f"bronze, Iceberg's widest: a value of 1E+{MAX_DECIMAL_PRECISION - scale} or more in magnitude will be "
            "a dead letter (set the connector's decimal.handling.mode to string for this column)"
        ]
    found: list[str] = []
    kind = schema.get("type")
    if kind == "struct":
        fields = [field for field in schema.get("fields") or [] if isinstance(field, dict)]
        images = {field.get("field"): field for field in fields if field.get("field") in ("before", "after")}
        for field in fields:
            name = field.get("field")
            if name == "before" and _same_schema(field, images.get("after")):
                continue  # an envelope's two images: the column is named once, as `after`'s
            found += narrowed_decimals(field, f"{path}.{name}")
    elif kind == "array":
        found += narrowed_decimals(schema.get("items"), f"{path}[]")
    elif kind == "map":
        found += narrowed_decimals(schema.get("keys"), f"{path}.key")
        found += narrowed_decimals(schema.get("values"), f"{path}.value")
    return found


def _same_schema(field: dict[str, Any], other: dict[str, Any] | None) -> bool:
    """Whether two struct fields have the same schema, whatever their names."""
    return other is not None and {**field, "field": None} == {**other, "field": None}


def arrow_type(schema: dict[str, Any], *, variable_scale: int = 10) -> pa.DataType:
    """The Arrow type (which pyiceberg maps 1:1 to Iceberg) of one Connect schema node."""
    name = schema.get("name")
    kind = schema.get("type")
    if name == DECIMAL:
        return _decimal_type(schema)
    if name == VARIABLE_SCALE_DECIMAL:
        return pa.decimal128(MAX_DECIMAL_PRECISION, variable_scale)
    if name in _DATE:
        return pa.date32()
    if name in _TIME_MS or name in _TIME_US or name in _TIME_NS:
        return TIME_TYPE
    if name in _TS_MS or name in _TS_US or name in _TS_NS:
        return pa.timestamp("us")
    if name in _TS_ZONED:
        return pa.timestamp("us", tz="UTC")
    if name == SNAPSHOT_FLAG:
        return pa.string()
    if kind in ("int8", "int16", "int32"):
        return pa.int32()
    if kind == "int64":
        return pa.int64()
    # The JSON converter writes float32/float64 as "float"/"double".
    if kind in ("float", "float32"):
        return pa.float32()
    if kind in ("double", "float64"):
        return pa.float64()
    if kind == "boolean":
        return pa.bool_()
    if kind == "string":
        return pa.string()
    if kind == "bytes":
        return pa.binary()
    if kind == "array":
        return pa.list_(arrow_type(_part(schema, "items"), variable_scale=variable_scale))
    if kind == "map":
        key_type = arrow_type(_part(schema, "keys"), variable_scale=variable_scale)
        return pa.map_(key_type, arrow_type(_part(schema, "values"), variable_scale=variable_scale))
    if kind == "struct":
        fields = struct_fields(schema, variable_scale=variable_scale)
        if not fields:  # Parquet cannot write a struct without fields (a table with no columns): the commit would fail
            raise DecodeError("a struct with no fields cannot be stored")
        return pa.struct(fields)
    raise DecodeError(f"unsupported Connect schema type {kind!r} (name {name!r})")


def with_snapshot_as_text(value_schema: dict[str, Any]) -> dict[str, Any]:
    """The envelope's value schema as bronze types it: a boolean ``source.snapshot`` marked SNAPSHOT_FLAG (stored
    as "true"/"false"). The schema itself when there is none; never changed in place (schemas are shared)."""
    fields = value_schema.get("fields")
    if not isinstance(fields, list):
        return value_schema
    for index, item in enumerate(fields):
        if not (isinstance(item, dict) and item.get("field") == "source" and isinstance(item.get("fields"), list)):
            continue
        source_fields = item["fields"]
        for inner, flag in enumerate(source_fields):
            if isinstance(flag, dict) and flag.get("field") == "snapshot" and flag.get("type") == "boolean":
                marked = [*source_fields]
                marked[inner] = {**flag, "name": SNAPSHOT_FLAG}
                new_fields = [*fields]
                new_fields[index] = {**item, "fields": marked}
                return {**value_schema, "fields": new_fields}
    return value_schema


def struct_fields(schema: dict[str, Any], *, variable_scale: int = 10) -> list[pa.Field]:
    fields = schema.get("fields")
    if not isinstance(fields, list):
        raise DecodeError(f"struct schema {schema.get('name')!r} has no field list")
    typed: list[pa.Field] = []
    for field in fields:
        name = _field_name(field)
        try:
            field_type = arrow_type(field, variable_scale=variable_scale)
        except DecodeError as exc:
            raise DecodeError(f"{name}: {exc}") from None
        typed.append(pa.field(name, field_type, nullable=True))
    return typed


def _int(kind: str) -> Converter:
    low, high = _INT_RANGES[kind]

    def convert(value: Any, path: str) -> Any:
        if type(value) is not int or not low <= value <= high:
            raise _fail(path, kind, value)
        return value

    return convert


def _float(value: Any, path: str) -> Any:
    if type(value) is float or type(value) is int or type(value) is decimal.Decimal:  # Decimal: an exact re-read
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):  # how the JSON converter writes non-finite doubles
        return float(value)
    raise _fail(path, "a number", value)


# The magnitude from which a double rounds to float32 infinity (halfway past float32's greatest value, which Java
# prints as 3.4028235E38: that one, a little above the exact maximum, still rounds to it).
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
# The magnitude up to which a double rounds to float32 zero (half float32's smallest subnormal, 2**-149, which
# rounds to even): a value that small would be stored as 0.0.
FLOAT32_UNDERFLOW = 2.0**-150


def _float32(value: Any, path: str) -> Any:
    number = _float(value, path)
    if math.isfinite(number) and abs(number) >= FLOAT32_OVERFLOW:
        raise _fail(path, "a float32 (below 3.4028236e38 in magnitude)", value)  # Arrow would store inf
    if 0.0 < abs(number) <= FLOAT32_UNDERFLOW:
        raise _fail(path, "a float32 (zero or above 7.0064923e-46 in magnitude)", value)  # Arrow would store 0.0
    return number


class InexactNumberError(DecodeError):
    """A decimal column's value arrived as a JSON number with a fraction (decimal.format=NUMERIC), which the fast
    JSON parser reads as a double: the record must be read again keeping the number's digits."""


def _bool(value: Any, path: str) -> Any:
    if type(value) is not bool:
        raise _fail(path, "boolean", value)
    return value


def _snapshot_flag(value: Any, path: str) -> Any:
    if type(value) is not bool:
        raise _fail(path, "boolean", value)
    return "true" if value else "false"


def _string(value: Any, path: str) -> Any:
    if type(value) is not str:
        raise _fail(path, "string", value)
    return value


def _b64(value: Any, path: str) -> bytes:
    # base64.b64decode(value, validate=True) without its Python-level wrapper (a hot path for decimals), and
    # non-ASCII text is a decode error too (b64decode raises a plain ValueError for it).
    if type(value) is not str or not value.isascii():
        raise _fail(path, "base64 string", value)
    data = value.encode("ascii")
    if _BASE64.fullmatch(data) is None:
        raise _fail(path, "base64 string", value)
    try:
        return binascii.a2b_base64(data)
    except binascii.Error:
        raise _fail(path, "base64 string", value) from None


def _decimal(precision: int, scale: int, wire_scale: int | None = None) -> Converter:
    """A Connect Decimal as ``decimal(precision, scale)``: base64 bytes of the unscaled value at ``wire_scale``
    (default ``scale``), or a JSON number (decimal.format=NUMERIC)."""
    limit = 10**precision
    quantum = decimal.Decimal(1).scaleb(-scale)
    wire = scale if wire_scale is None else wire_scale

    def convert(value: Any, path: str) -> Any:
        if type(value) is str:
            raw = _b64(value, path)
            if not raw:  # Kafka Connect rejects zero bytes too: no value, not a zero
                raise _fail(path, f"decimal({precision},{scale}) (base64 of at least one byte)", value)
            try:
                result = decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-wire, context=_EXACT)
            except decimal.DecimalException:  # a scale far out of any decimal's range (Overflow)
                raise _fail(path, f"decimal({precision},{scale}) (scale {wire} out of range)", value) from None
        elif type(value) is int:  # decimal.format=NUMERIC
            result = decimal.Decimal(value)
        elif type(value) is decimal.Decimal:  # the number as written (RowBuilder's exact re-read)
            result = value
            if not result.is_finite():
                raise _fail(path, f"decimal({precision},{scale})", value)
        elif type(value) is float:
            # A JSON number with a fraction (or beyond 64 bits) reaches us as a double, its digits maybe lost
            # already (1.000000000000000001 reads as 1.0): the record is read again, exactly.
            raise InexactNumberError(f"{path}: a decimal written as a JSON number with a fraction")
        else:
            raise _fail(path, f"decimal({precision},{scale})", value)
        try:
            fitted = result.quantize(quantum, context=_EXACT)
        except decimal.DecimalException:  # e.g. 1e100: more digits than any decimal(38, s)
            raise _fail(path, f"decimal({precision},{scale}) (out of range)", value) from None
        if fitted != result:
            raise _fail(path, f"decimal({precision},{scale})", value)
        if abs(fitted.scaleb(scale, context=_EXACT)) >= limit:
            raise _fail(path, f"decimal({precision},{scale}) (out of range)", value)
        return fitted

    return convert


def _variable_scale_decimal(scale: int) -> Converter:
    quantum = decimal.Decimal(1).scaleb(-scale)
    context = decimal.Context(prec=80)

    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, dict) or type(value.get("scale")) is not int:
            raise _fail(path, "VariableScaleDecimal {scale, value}", value)
        raw = _b64(value.get("value"), path + ".value")
        if not raw:
            raise _fail(path, "VariableScaleDecimal value (base64 of at least one byte)", value)
        try:
            result = decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-value["scale"], context=context)
            fitted = result.quantize(quantum, context=context)
        except decimal.DecimalException:  # e.g. 1E+100 (Oracle's NUMBER reaches 1E+125), or a huge scale
            raise _fail(path, f"decimal(38,{scale}) (out of range)", value) from None
        if fitted != result or abs(fitted.scaleb(scale, context=context)) >= 10**MAX_DECIMAL_PRECISION:
            raise _fail(path, f"decimal(38,{scale}) without rounding", value)
        return fitted

    return convert


def _scaled_int(kind: str, factor: int, divisor: int = 1) -> Converter:
    check = _int(kind)

    def convert(value: Any, path: str) -> Any:
        number = check(value, path)
        return number * factor // divisor

    return convert


_check_int32 = _int("int32")


def _beyond_years(
    path: str, expected: str, value: Any, sign: int | None, infinite: InfiniteTimestamps, last: Any, first: Any
) -> Any:
    """What a value outside years 1-9999 becomes: PostgreSQL's infinity (``sign``: 1, or -1 for -infinity) is
    ``last`` or ``first`` with ``infinite_timestamps: clamp``; anything else is a dead letter (raised)."""
    if sign is None:
        raise _fail(path, expected, value) from None
    clamped = last if sign > 0 else first
    if infinite == "clamp":
        return clamped
    raise DecodeError(
        f"{_fail(path, expected, value)} (PostgreSQL's '{'infinity' if sign > 0 else '-infinity'}' as Debezium "
        f"sends it; ingest.infinite_timestamps: clamp lands it as {clamped.isoformat()})"
    ) from None


def _date(infinite: InfiniteTimestamps) -> Converter:
    def convert(value: Any, path: str) -> Any:
        days = _check_int32(value, path)
        try:
            return _EPOCH_DATE + dt.timedelta(days=days)
        except OverflowError:  # outside years 1-9999: a dead letter, not a crash
            sign = _INFINITE_DAYS.get(days)
            return _beyond_years(path, "a date within years 1-9999", value, sign, infinite, _LAST_DATE, _FIRST_DATE)

    return convert


def _zoned_timestamp(infinite: InfiniteTimestamps) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if type(value) is not str:
            raise _fail(path, "ISO-8601 timestamp with zone", value)
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            last, first = _LAST_INSTANT.replace(tzinfo=dt.UTC), _FIRST_INSTANT.replace(tzinfo=dt.UTC)
            sign = _INFINITE_TEXT.get(value)
            return _beyond_years(path, "ISO-8601 timestamp with zone", value, sign, infinite, last, first)
        if parsed.tzinfo is None:
            raise _fail(path, "ISO-8601 timestamp with zone", value)
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError:  # 9999-12-31T23:00-05:00 is in year 10000 in UTC: a dead letter, not a crash
            raise _fail(path, "a timestamp within years 1-9999 in UTC", value) from None

    return convert


def _micros_timestamp(factor: int, divisor: int, infinite: InfiniteTimestamps) -> Converter:
    check = _int("int64")
    # (Nanoseconds: PostgreSQL sends none, and its sentinels would not fit an int64 in them.)
    sentinels = _INFINITE_MILLIS if factor == 1000 else _INFINITE_MICROS if (factor, divisor) == (1, 1) else {}

    def convert(value: Any, path: str) -> Any:
        micros = check(value, path) * factor // divisor
        try:
            return _NAIVE_EPOCH + dt.timedelta(microseconds=micros)
        except OverflowError:  # outside years 1-9999: a dead letter, not a crash
            sign = sentinels.get(value)
            expected = "a timestamp within years 1-9999"
            return _beyond_years(path, expected, value, sign, infinite, _LAST_INSTANT, _FIRST_INSTANT)

    return convert


def converter(
    schema: dict[str, Any], *, variable_scale: int = 10, infinite: InfiniteTimestamps = "dead_letter"
) -> Converter:
    """A function turning one JSON-level value of this schema into the Python value of its Arrow type
    (``infinite``: what becomes of PostgreSQL's infinite dates and timestamps, ``ingest.infinite_timestamps``)."""
    name = schema.get("name")
    kind = schema.get("type")
    inner: Converter
    if name == DECIMAL:
        decimal_type = _decimal_type(schema)
        inner = _decimal(decimal_type.precision, decimal_type.scale, _wire_scale(schema))
    elif name == VARIABLE_SCALE_DECIMAL:
        inner = _variable_scale_decimal(variable_scale)
    elif name in _DATE:
        inner = _date(infinite)
    elif name in _TIME_MS:
        inner = _scaled_int("int32", 1000)
    elif name in _TIME_US:
        inner = _int("int64")
    elif name in _TIME_NS:
        inner = _scaled_int("int64", 1, 1000)
    elif name in _TS_MS:
        inner = _micros_timestamp(1000, 1, infinite)
    elif name in _TS_US:
        inner = _micros_timestamp(1, 1, infinite)
    elif name in _TS_NS:
        inner = _micros_timestamp(1, 1000, infinite)
    elif name in _TS_ZONED:
        inner = _zoned_timestamp(infinite)
    elif name == SNAPSHOT_FLAG:
        inner = _snapshot_flag
    elif kind in _INT_RANGES:
        inner = _int(kind)
    elif kind in ("float", "float32"):
        inner = _float32
    elif kind in ("double", "float64"):
        inner = _float
    elif kind == "boolean":
        inner = _bool
    elif kind == "string":
        inner = _string
    elif kind == "bytes":
        inner = _b64
    elif kind == "array":
        item = converter(_part(schema, "items"), variable_scale=variable_scale, infinite=infinite)

        def inner(value: Any, path: str) -> Any:
            if not isinstance(value, list):
                raise _fail(path, "array", value)
            return [None if v is None else item(v, f"{path}[{i}]") for i, v in enumerate(value)]

    elif kind == "map":
        key_conv = converter(_part(schema, "keys"), variable_scale=variable_scale, infinite=infinite)
        value_conv = converter(_part(schema, "values"), variable_scale=variable_scale, infinite=infinite)

        def inner(value: Any, path: str) -> Any:
            # The JSON converter writes string-keyed maps as objects, others as [[k, v], ...].
            pairs = value.items() if isinstance(value, dict) else value
            if not isinstance(pairs, (list, type({}.items()))):
                raise _fail(path, "map", value)
            entries: list[tuple[Any, Any]] = []
            pair: Any
            for pair in pairs:
                if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                    raise _fail(path, "map as an object or [[key, value], ...]", value)
                k, v = pair
                entries.append((key_conv(k, f"{path}.key"), None if v is None else value_conv(v, f"{path}[{k!r}]")))
            return entries

    elif kind == "struct":
        inner = struct_converter(schema, variable_scale=variable_scale, infinite=infinite)
    else:
        raise DecodeError(f"unsupported Connect schema type {kind!r} (name {name!r})")
    return inner


_ABSENT = object()
# (field name, converter, optional, pass-through type, field path for errors)
_Step = tuple[str, Converter, bool, type[Any] | None, str]


def struct_converter(
    schema: dict[str, Any], *, variable_scale: int = 10, infinite: InfiniteTimestamps = "dead_letter"
) -> Converter:
    fields = [
        (
            _field_name(field),
            converter(field, variable_scale=variable_scale, infinite=infinite),
            bool(field.get("optional", False)),
        )
        for field in schema.get("fields") or []
    ]
    known = {name for name, _, _ in fields}
    # Per parent path: (name, converter, optional, pass-through type, field path), built once instead of once per
    # value. A plain string or boolean field's converter only checks the type, so values of exactly that type are
    # taken as they are without the call (the converter still produces the error for anything else).
    plans: dict[str, list[_Step]] = {}

    def plan(path: str) -> list[_Step]:
        steps: list[_Step] = [
            (name, conv, optional, str if conv is _string else bool if conv is _bool else None, f"{path}.{name}")
            for name, conv, optional in fields
        ]
        if len(plans) < 256:  # array elements have one path per index: keep the cache bounded
            plans[path] = steps
        return steps

    def convert(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _fail(path, "struct", value)
        out: dict[str, Any] = {}
        present = 0
        for name, field_conv, optional, exact, field_path in plans.get(path) or plan(path):
            item = value.get(name, _ABSENT)
            if item is _ABSENT:
                if not optional:
                    raise DecodeError(f"{field_path}: required field is missing")
                out[name] = None
                continue
            present += 1
            if item is None or type(item) is exact:
                out[name] = item
            else:
                out[name] = field_conv(item, field_path)
        if len(value) != present:
            extra = value.keys() - known
            if extra:
                raise DecodeError(f"{path}: fields {sorted(extra)} are not in the record's schema")
        return out

    return convert


def json_text(value: Any) -> str | None:
    """Schemaless values are kept as JSON text (keys sorted, so equal values compare equal)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return canonical_json(value)


def canonical_json(value: Any) -> str | None:
    """JSON text with sorted keys (equal values compare equal). Raises DecodeError for what orjson cannot write:
    nesting deeper than 254 levels (orjson reads up to 1,024), which only a malformed record holds."""
    if value is None:
        return None
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as exc:
        raise DecodeError(f"the value cannot be written as JSON text: {exc} (nested too deep)") from None
