"""Debezium logical types become real Arrow/Iceberg types; values that do not fit are errors, never zeros."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any

import orjson
import pyarrow as pa
import pytest

from ingest.debezium.types import TIME_TYPE, arrow_type, converter
from ingest.errors import DecodeError


def dec_bytes(unscaled: int) -> str:
    length = (unscaled.bit_length() + 8) // 8
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


CASES: list[tuple[dict[str, Any], Any, pa.DataType, Any]] = [
    (
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        dec_bytes(-12345),
        pa.decimal128(10, 2),
        decimal.Decimal("-123.45"),
    ),
    (
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
        {"scale": 3, "value": dec_bytes(1500)},
        pa.decimal128(38, 10),
        decimal.Decimal("1.5000000000"),
    ),
    ({"type": "int32", "name": "io.debezium.time.Date"}, 19000, pa.date32(), dt.date(2022, 1, 8)),
    ({"type": "int32", "name": "org.apache.kafka.connect.data.Time"}, 1500, TIME_TYPE, 1_500_000),
    ({"type": "int64", "name": "io.debezium.time.MicroTime"}, 1_500_001, TIME_TYPE, 1_500_001),
    ({"type": "int64", "name": "io.debezium.time.NanoTime"}, 1_500_001_000, TIME_TYPE, 1_500_001),
    (
        {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
        1559729468470,
        pa.timestamp("us"),
        dt.datetime(2019, 6, 5, 10, 11, 8, 470000),
    ),
    (
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        1559729468470123,
        pa.timestamp("us"),
        dt.datetime(2019, 6, 5, 10, 11, 8, 470123),
    ),
    (
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        1559729468470123456,
        pa.timestamp("us"),
        dt.datetime(2019, 6, 5, 10, 11, 8, 470123),
    ),
    (
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        "2019-06-05T12:11:08.47+02:00",
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2019, 6, 5, 10, 11, 8, 470000, tzinfo=dt.UTC),
    ),
    ({"type": "string", "name": "io.debezium.data.Json"}, '{"a": 1}', pa.string(), '{"a": 1}'),
    (
        {"type": "string", "name": "io.debezium.data.Uuid"},
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        pa.string(),
        "0f8fad5b-d9cb-469f-a165-70867728950e",
    ),
    ({"type": "string", "name": "io.debezium.data.Enum", "parameters": {"allowed": "a,b"}}, "a", pa.string(), "a"),
    ({"type": "bytes"}, base64.b64encode(b"\x00\xff").decode(), pa.binary(), b"\x00\xff"),
    ({"type": "int16"}, -3, pa.int32(), -3),
    ({"type": "int64"}, 2**40, pa.int64(), 2**40),
    ({"type": "float"}, 1.5, pa.float32(), 1.5),
    ({"type": "double"}, "NaN", pa.float64(), None),  # checked separately below
    ({"type": "boolean"}, True, pa.bool_(), True),
    ({"type": "array", "items": {"type": "string"}}, ["x", None], pa.list_(pa.string()), ["x", None]),
    (
        {"type": "map", "keys": {"type": "string"}, "values": {"type": "int32"}},
        {"k": 1},
        pa.map_(pa.string(), pa.int32()),
        [("k", 1)],
    ),
]


@pytest.mark.parametrize(("schema", "raw", "expected_type", "expected"), CASES)
def test_logical_types(schema: dict[str, Any], raw: Any, expected_type: pa.DataType, expected: Any) -> None:
    assert arrow_type(schema) == expected_type
    value = converter(schema)(raw, "after.col")
    if expected is None:
        assert value != value  # NaN
    else:
        assert value == expected
    # The value builds an Arrow array of its column type (what bronze writes).
    pa.array([value], type=expected_type)


@pytest.mark.parametrize(
    ("schema", "raw", "message"),
    [
        ({"type": "int32"}, "abc", "after.col: expected int32, got str 'abc'"),
        ({"type": "int32"}, 2**31, "expected int32"),
        ({"type": "int64"}, 1.5, "expected int64"),
        ({"type": "int32"}, True, "expected int32"),
        ({"type": "boolean"}, 1, "expected boolean"),
        ({"type": "string"}, 5, "expected string"),
        ({"type": "bytes"}, "not base64!", "expected base64"),
        ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "yesterday", "ISO-8601"),
        (
            {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "0", "connect.decimal.precision": "3"},
            },
            dec_bytes(12345),
            "out of range",
        ),
        (
            {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
            {"scale": 12, "value": dec_bytes(1)},
            "without rounding",
        ),
        (
            {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]},
            {},
            "after.col.id: required field is missing",
        ),
        (
            {"type": "struct", "fields": [{"type": "int32", "optional": True, "field": "id"}]},
            {"id": 1, "x": 2},
            "not in the record's schema",
        ),
    ],
)
def test_values_that_do_not_fit_are_rejected(schema: dict[str, Any], raw: Any, message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        converter(schema)(raw, "after.col")


DECIMAL_20_2 = {
    "type": "bytes",
    "name": "org.apache.kafka.connect.data.Decimal",
    "parameters": {"scale": "2", "connect.decimal.precision": "20"},
}


@pytest.mark.parametrize(
    ("schema", "raw", "message"),
    [
        # decimal.format=NUMERIC: orjson reads a fraction as a double, whose digits may be rounded already; the
        # record is read again exactly (test_numeric_decimal_format_is_read_exactly)
        (DECIMAL_20_2, 12.5, "a decimal written as a JSON number with a fraction"),
        (DECIMAL_20_2, decimal.Decimal("1E+100"), "out of range"),  # used to raise InvalidOperation: ingest stopped
        (DECIMAL_20_2, decimal.Decimal("NaN"), "expected decimal(20,2)"),
        # VariableScaleDecimal (Oracle's NUMBER reaches 1E+125): used to raise InvalidOperation, stopping ingest
        (
            {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
            {"scale": -100, "value": "AQ=="},
            "out of range",
        ),
        (
            {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
            {"scale": 2**40, "value": "AQ=="},
            "out of range",
        ),
        # a float32 beyond its range used to be stored as inf
        ({"type": "float"}, 1e300, "a float32 (below 3.4028236e38 in magnitude)"),
        ({"type": "float32"}, -3.5e38, "a float32"),
        ({"type": "float32"}, 2.0**128 - 2.0**103, "a float32"),  # halfway past the greatest: rounds to inf
        # and one too small for it used to be stored as 0.0
        ({"type": "float"}, 1e-50, "a float32 (zero or above 7.0064923e-46 in magnitude)"),
        ({"type": "float"}, -(2.0**-150), "a float32"),  # halfway to the smallest subnormal: rounds to 0.0
        # a Connect Decimal with a huge negative scale: decimal.Overflow used to stop the ingester
        (
            {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "-1000000"}},
            "AQ==",
            "scale -1000000 out of range",
        ),
        (DECIMAL_20_2, "", "base64 of at least one byte"),  # zero bytes used to read as 0.00
        (
            {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
            {"scale": 2, "value": ""},
            "base64 of at least one byte",
        ),
        # Oracle TIMESTAMP WITH TIME ZONE "end of time" in UTC is year 10000: used to raise OverflowError
        ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "9999-12-31T23:00:00-05:00", "years 1-9999"),
        ({"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "0001-01-01T00:00:00+01:00", "years 1-9999"),
        # a map with keys that are not strings, as [[key, value], ...]: malformed pairs used to raise TypeError
        ({"type": "map", "keys": {"type": "int32"}, "values": {"type": "string"}}, [[1]], "[[key, value], ...]"),
        ({"type": "map", "keys": {"type": "int32"}, "values": {"type": "string"}}, [1, 2], "[[key, value], ...]"),
    ],
)
def test_values_that_used_to_stop_the_ingester_or_round_are_dead_letters(
    schema: dict[str, Any], raw: Any, message: str
) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        converter(schema)(raw, "after.col")


DATE = {"type": "int32", "name": "io.debezium.time.Date"}
CONNECT_DATE = {"type": "int32", "name": "org.apache.kafka.connect.data.Date"}
MILLIS = {"type": "int64", "name": "io.debezium.time.Timestamp"}
CONNECT_MILLIS = {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}
MICROS = {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}
ZONED = {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
LAST, FIRST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1)

# PostgreSQL's 'infinity' (+1) and '-infinity' (-1) as Debezium 3.6.3 sends them (tests/fixtures/debezium/postgres/
# infinity.jsonl: dates from a snapshot and from the stream differ), and what `clamp` lands them as.
INFINITIES = [
    (DATE, -622191234, dt.date(9999, 12, 31)),
    (DATE, -2147472692, dt.date(9999, 12, 31)),
    (CONNECT_DATE, -625821272, dt.date(1, 1, 1)),
    (DATE, -2147472691, dt.date(1, 1, 1)),
    (MILLIS, 9223372036825200, LAST),
    (CONNECT_MILLIS, -9223372036832400, FIRST),
    (MICROS, 9223372036825200000, LAST),
    (MICROS, -9223372036832400000, FIRST),
    (ZONED, "infinity", LAST.replace(tzinfo=dt.UTC)),
    (ZONED, "-infinity", FIRST.replace(tzinfo=dt.UTC)),
]


@pytest.mark.parametrize(("schema", "raw", "clamped"), INFINITIES)
def test_postgres_infinity_is_a_dead_letter_naming_the_setting_or_clamped(
    schema: dict[str, Any], raw: Any, clamped: Any
) -> None:
    with pytest.raises(DecodeError, match=r"after\.col: .*PostgreSQL's '-?infinity'.*infinite_timestamps: clamp"):
        converter(schema)(raw, "after.col")
    assert converter(schema, infinite="clamp")(raw, "after.col") == clamped
    inside = {"type": "struct", "fields": [{**schema, "field": "col", "optional": True}]}
    assert converter({"type": "array", "items": inside}, infinite="clamp")([{"col": raw}], "a") == [{"col": clamped}]


@pytest.mark.parametrize(
    ("schema", "raw"),
    [
        (DATE, -622191233),  # next to a sentinel
        (DATE, 2932897),  # 10000-01-01
        (MICROS, 9223372036825199999),
        (MICROS, 9223372036825200001),
        (MILLIS, 9223372036825200000 // 1000 + 1),
        (ZONED, "+infinity"),
        (ZONED, "10000-01-01T00:00:00Z"),
    ],
)
def test_other_values_outside_years_1_to_9999_stay_dead_letters_when_clamping(schema: dict[str, Any], raw: Any) -> None:
    with pytest.raises(DecodeError, match=r"after\.col: expected") as raised:
        converter(schema, infinite="clamp")(raw, "after.col")
    assert "infinity" not in str(raised.value).replace("'+infinity'", "")


def test_float32_extremes_as_java_prints_them_land() -> None:
    """Java prints Float.MAX_VALUE as 3.4028235E38, a little above the exact maximum: it rounds to it, finite."""
    for printed in (3.4028235e38, -3.4028235e38, 1.4e-45):
        value = converter({"type": "float"})(printed, "c")
        assert pa.array([value], pa.float32())[0].as_py() == pa.array([printed], pa.float32())[0].as_py()
        assert abs(pa.array([value], pa.float32())[0].as_py()) < float("inf")


def test_a_negative_scale_decimal_is_an_integer_column() -> None:
    """Oracle NUMBER(20,-2): Parquet and Iceberg have no negative scale (the commit failed on such a column, and
    the ingester stopped); the values are integers with two more digits, exactly."""
    schema = {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "-2", "connect.decimal.precision": "20"},
    }
    assert arrow_type(schema) == pa.decimal128(22, 0)
    assert converter(schema)(dec_bytes(5), "c") == decimal.Decimal(500)
    assert converter(schema)(dec_bytes(-123), "c") == decimal.Decimal(-12300)
    pa.array([converter(schema)(dec_bytes(5), "c")], type=arrow_type(schema))


def decimal_field(name: str, precision: int, scale: int) -> dict[str, Any]:
    parameters = {"scale": str(scale), "connect.decimal.precision": str(precision)}
    return {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": parameters, "field": name}


def test_numeric_decimal_format_is_read_exactly() -> None:
    """decimal.format=NUMERIC writes decimals as JSON numbers: each digit lands (1.000000000000000001 used to read
    as the double 1.0 and land as 1.000000000000000000); one that does not fit the scale is a dead letter; a
    double column of the same record still reads as a double; float32 and double keep their ranges."""
    from ingest.bronze.rows import RowBuilder
    from ingest.debezium.envelope import RawRecord, decode

    lsn = {"type": "int64", "field": "lsn"}
    row_schema = {
        "type": "struct",
        "optional": True,
        "fields": [decimal_field("exact", 20, 18), decimal_field("money", 24, 2), {"type": "double", "field": "ratio"}],
    }
    schema = {
        "type": "struct",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}, lsn]},
            {"type": "string", "field": "op"},
        ],
    }

    def build(after: str) -> dict[str, Any]:
        source = '{"connector": "postgresql", "lsn": 1}'
        value = f'{{"schema": {json.dumps(schema)}, "payload": {{"after": {after}, "source": {source}, "op": "c"}}}}'
        record = RawRecord("t", 0, 0, None, None, value.encode())
        return RowBuilder().build(record, decode(record), dt.datetime.now(dt.UTC)).row

    row = build('{"exact": 1.000000000000000001, "money": 100000000000000000001, "ratio": 0.30000000000000001}')
    assert row["after"] == {
        "exact": decimal.Decimal("1.000000000000000001"),
        "money": decimal.Decimal("100000000000000000001.00"),
        "ratio": 0.3,
    }
    assert build('{"exact": 12.5, "money": 7, "ratio": 1}')["after"]["exact"] == decimal.Decimal("12.5")
    with pytest.raises(DecodeError, match=r"value\.after\.money: expected decimal\(24,2\)"):
        build('{"exact": 1, "money": 12.555, "ratio": 1}')


def test_wide_decimals_are_exact_not_rounded() -> None:
    schema = {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "0", "connect.decimal.precision": "38"},
    }
    assert converter(schema)(dec_bytes(10**29 + 3), "c") == decimal.Decimal(10**29 + 3)


def test_a_decimal_declared_wider_than_iceberg_holds_is_named_once_when_its_table_is_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MySQL's DECIMAL(65,30) becomes decimal(38,30): bronze keeps every place but only 8 integer digits, so
    123456789.5 is a dead letter. Said once per schema, naming the column, before the first such dead letter."""
    from ingest.bronze.rows import RowBuilder
    from ingest.debezium.envelope import RawRecord, decode
    from ingest.debezium.types import narrowed_decimals

    row_schema = {
        "type": "struct",
        "optional": True,
        "fields": [
            decimal_field("wide", 65, 30),
            decimal_field("fits", 38, 30),
            decimal_field("negative_scale", 38, -2),  # decimal(40,0): named too
            {"type": "array", "field": "list", "items": decimal_field("", 40, 0)},
        ],
    }
    schema = {
        "type": "struct",
        "name": "mysql1.shop.prices.Envelope",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]},
            {"type": "string", "field": "op"},
        ],
    }
    warnings = narrowed_decimals(schema, "value")
    # Once per column: `before` and `after` hold the same columns.
    assert [warning.split(":")[0] for warning in warnings] == [
        "value.after.wide",
        "value.after.negative_scale",
        "value.after.list[]",
    ]
    assert warnings[0] == (
        "value.after.wide: decimal(65,30) at the source is decimal(38,30) in bronze, Iceberg's widest: a value of "
        "1E+8 or more in magnitude will be a dead letter (set the connector's decimal.handling.mode to string for "
        "this column)"
    )

    builder = RowBuilder()
    for big in (1, 12345678, 123456789):
        after = {"wide": dec_bytes(big * 10**30), "fits": None, "negative_scale": None, "list": None}
        value = orjson.dumps(
            {"schema": schema, "payload": {"after": after, "source": {"connector": "mysql"}, "op": "c"}}
        )
        record = RawRecord("mysql1.shop.prices", 0, big, None, None, value)
        with caplog.at_level("WARNING", logger="ingest.bronze.rows"):
            if big < 10**8:
                assert builder.build(record, decode(record), dt.datetime.now(dt.UTC)).row["after"]["wide"] == big
            else:
                with pytest.raises(DecodeError, match=r"value\.after\.wide: expected decimal\(38,30\)"):
                    builder.build(record, decode(record), dt.datetime.now(dt.UTC))
    named = [r.getMessage() for r in caplog.records if "value.after.wide" in r.getMessage()]
    assert named == [f"mysql1.shop.prices.Envelope: {warnings[0]}"]
    assert not [r for r in caplog.records if "value.before" in r.getMessage()]
