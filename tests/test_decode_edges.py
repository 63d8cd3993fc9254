"""Edge values found by reviewing the decoders (2026-11-26): each is decoded alike by both paths (``assert_same``)
and ends as a bronze value that keeps what was written, or as a dead letter naming the field; never as an error
that stops the ingester, nor as a row its commit cannot write."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.debezium.envelope import RawRecord
from tests.test_fast_path import assert_same, b64, run

ROW_FIELDS = [{"type": "int32", "optional": False, "field": "id"}]


def typed_record(
    offset: int, row: dict[str, Any], fields: list[dict[str, Any]], timestamp: int | None = 1_700_000_000_000
) -> RawRecord:
    """A create of ``row`` on topic t.s.orders, with schemas; the key is ``row['id']`` typed as ``fields[0]``."""
    row_schema = {"type": "struct", "optional": True, "name": "t.s.orders.Value", "fields": fields}
    value_schema = {
        "type": "struct",
        "name": "t.s.orders.Envelope",
        "fields": [
            {**row_schema, "field": "before"},
            {**row_schema, "field": "after"},
            {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]},
            {"type": "string", "field": "op"},
        ],
    }
    key_schema = {"type": "struct", "fields": [fields[0]]}
    payload = {"before": None, "after": row, "source": {"connector": "informix"}, "op": "c"}
    key = b'{"schema":%s,"payload":{"id":%s}}' % (orjson.dumps(key_schema), orjson.dumps(row["id"]))
    value = b'{"schema":%s,"payload":%s}' % (orjson.dumps(value_schema), orjson.dumps(payload))
    return RawRecord("t.s.orders", 0, offset, timestamp, key, value)


def dead_letter_errors(records: list[RawRecord]) -> dict[int, str]:
    """Offset -> error of each dead letter, once both paths agree on every table."""
    tables = assert_same(records)
    letters = tables[DEAD_LETTER_TABLE][0].to_pylist() if DEAD_LETTER_TABLE in tables else []
    return {letter["_cdc_offset"]: letter["_cdc_error"] for letter in letters}


def test_a_decimal_scale_no_iceberg_decimal_holds_is_a_dead_letter_naming_the_column() -> None:
    """PostgreSQL numeric(50,40), Oracle NUMBER(p,127): a scale above 38 stopped the ingester (pyarrow's
    ValueError from compiling the schema), on every restart."""
    fields = [
        *ROW_FIELDS,
        {
            "type": "bytes",
            "optional": True,
            "field": "ratio",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "40", "connect.decimal.precision": "50"},
        },
    ]
    records = [typed_record(offset, {"id": offset, "ratio": b64(offset)}, fields) for offset in range(3)]
    errors = dead_letter_errors(records)
    assert sorted(errors) == [0, 1, 2]
    assert all(error.startswith("before: ratio: decimal scale 40 is beyond the 38 digits") for error in errors.values())


def test_kafka_timestamps_are_exact_and_those_no_column_holds_are_null() -> None:
    """A record's CreateTime is whatever its producer set: past year 9999 it stopped the ingester (a dead letter's
    row has the same column); after 2106 a float division put it some microseconds off."""
    stamps = [0, 9_000_000_000_001, 253402300799999, 253402300800000, 2**62, 2**63 - 1, -1, None]
    records = [typed_record(offset, {"id": offset}, ROW_FIELDS, stamp) for offset, stamp in enumerate(stamps)]
    tables = assert_same(records)
    assert DEAD_LETTER_TABLE not in tables
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    expected: list[dt.datetime | None] = [epoch, epoch + dt.timedelta(milliseconds=9_000_000_000_001)]
    expected += [dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)] + [None] * 5
    assert tables["t_s_orders"][0].column("_cdc_kafka_ts").to_pylist() == expected


LONG_KEYS = [b"12345678901234567890123", b"12345678901234567890124"]


def test_numbers_a_double_cannot_hold_keep_their_digits_on_schemaless_topics() -> None:
    """decimal.format=NUMERIC writes decimals as JSON numbers. orjson reads one of more than 17 digits (or an
    integer of 2**64 and more) as a double: kept as JSON text, two keys became one (silver reads a schemaless key
    with get_json_object) and amounts were rounded."""
    amounts = [b"1234567890.123456789", b"1234567890.123456788"]
    records = [
        RawRecord(
            "j.s.orders",
            0,
            offset,
            1,
            b'{"id":%s}' % key,
            b'{"before":null,"after":{"id":%s,"amount":%s,"small":0.1,"big":1e5},"source":{"connector":"informix"},'
            b'"op":"c","ts_ms":1}' % (key, amount),
        )
        for offset, (key, amount) in enumerate(zip(LONG_KEYS, amounts, strict=True))
    ]
    table = assert_same(records)["j_s_orders"][0].to_pylist()
    assert [row["key"] for row in table] == ['{"id":12345678901234567890123}', '{"id":12345678901234567890124}']
    assert [row["_cdc_key_json"] for row in table] == [row["key"] for row in table]
    # The numbers a double holds read as before (orjson's own text); the others as written.
    assert [orjson.loads(row["after"]) for row in table] == [
        {"amount": 1234567890.1234567, "big": 100000.0, "id": 1.2345678901234568e22, "small": 0.1}
    ] * 2
    assert [row["after"] for row in table] == [
        '{"amount":1234567890.123456789,"big":100000.0,"id":12345678901234567890123,"small":0.1}',
        '{"amount":1234567890.123456788,"big":100000.0,"id":12345678901234567890124,"small":0.1}',
    ]


@pytest.mark.parametrize("poll", [1, 5000])
def test_the_key_json_of_a_numeric_decimal_key_keeps_its_digits(poll: int) -> None:
    """A typed decimal key written as a JSON number: the key column was exact, ``_cdc_key_json`` a rounded double
    (the same for both keys)."""
    decimal_id = {
        "type": "bytes",
        "optional": False,
        "field": "id",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "0", "connect.decimal.precision": "38"},
    }
    records = []
    for offset, key in enumerate(LONG_KEYS):
        record = typed_record(offset, {"id": 0}, [decimal_id])
        value, key_bytes = record.value, record.key
        assert value is not None
        assert key_bytes is not None
        records.append(
            record._replace(
                key=key_bytes.replace(b'"payload":{"id":0}', b'"payload":{"id":%s}' % key),
                value=value.replace(b'"after":{"id":0}', b'"after":{"id":%s}' % key),
            )
        )
    table = assert_same(records, poll=poll)["t_s_orders"][0]
    assert table.column("_cdc_key_json").to_pylist() == ['{"id":' + key.decode() + "}" for key in LONG_KEYS]
    assert [str(row["id"]) for row in table.column("key").to_pylist()] == [key.decode() for key in LONG_KEYS]


def test_values_a_commit_cannot_write_are_dead_letters() -> None:
    """Each of these passed the decoder, then failed the commit (pyarrow's OverflowError, or Parquet's 'struct
    with no child field'): the service stopped, and a restart read the same record again."""
    empty_after = [{"type": "struct", "optional": True, "field": "after", "fields": []}]
    source = {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]}
    empty_schema = {"type": "struct", "fields": [*empty_after, source, {"type": "string", "field": "op"}]}
    tags = {"type": "array", "optional": True, "field": "tags", "items": {"type": "struct", "fields": []}}
    tags_after = [{"type": "struct", "optional": True, "field": "after", "fields": [tags]}]
    tags_schema = {"type": "struct", "fields": [*tags_after, source, {"type": "string", "field": "op"}]}
    records = [
        RawRecord(  # schemaless: ts_ms beyond a long
            "j.s.orders",
            0,
            0,
            1,
            b'{"id":1}',
            b'{"after":{"id":1},"source":{"connector":"informix"},"op":"c","ts_ms":9223372036854775808}',
        ),
        RawRecord(  # a PostgreSQL LSN beyond a position
            "p.s.orders",
            0,
            1,
            1,
            b'{"id":1}',
            b'{"after":{"id":1},"source":{"connector":"postgresql","lsn":9223372036854775808},"op":"c"}',
        ),
        RawRecord(
            "p.s.orders",
            0,
            2,
            1,
            b'{"id":1}',
            b'{"after":{"id":1},"source":{"connector":"postgresql","sequence":"[null,\\"FFFFFFFF/FFFFFFFF\\"]"},'
            b'"op":"c"}',
        ),
        RawRecord(  # a table without columns
            "e.s.orders",
            0,
            3,
            1,
            None,
            b'{"schema":%s,"payload":{"after":{},"source":{"connector":"postgresql"},"op":"c"}}'
            % orjson.dumps(empty_schema),
        ),
        RawRecord(
            "p.s.orders", 0, 4, 1, b'{"id":2}', b'{"after":{"id":2},"source":{"connector":"postgresql"},"op":"c"}'
        ),
        RawRecord(  # an array of such structs
            "e.s.orders",
            0,
            5,
            1,
            None,
            b'{"schema":%s,"payload":{"after":{"tags":[{}]},"source":{"connector":"postgresql"},"op":"c"}}'
            % orjson.dumps(tags_schema),
        ),
    ]
    assert dead_letter_errors(records) == {
        0: "value.ts_ms: expected int64, got 9223372036854775808",
        1: "source.lsn=9223372036854775808 is not a valid postgresql LSN (beyond a 63-bit position)",
        2: "source.sequence[1]='FFFFFFFF/FFFFFFFF' is not a valid postgresql LSN (beyond a 63-bit position)",
        3: "after: a struct with no fields cannot be stored",
        5: "after: tags: a struct with no fields cannot be stored",
    }
    assert run(records, True, 5000).stats.records_in == len(records)


def test_long_integers_a_long_holds_are_not_read_again() -> None:
    """Debezium 2.6+ writes ts_us (16 digits) and ts_ns (19) in every record: read again with the standard library's
    parser, a schemaless record took twice as long to decode. orjson reads every 64-bit integer exactly."""
    from ingest.bronze.rows import with_exact_numbers

    raw = b'{"after":{"id":1},"ts_ms":1700000000000,"ts_us":1700000000000000,"ts_ns":1700000000000000000,"op":"c"}'
    value = orjson.loads(raw)
    assert with_exact_numbers(value, raw) is value
    for inexact in (
        b'{"amount":1234567890.123456789,"id":18446744073709551616}',
        b'{"id":-9223372036854775809}',  # a negative 19-digit integer beyond 64 bits
        b'{"tiny":1E-400}',  # below a double's range (orjson reads 0.0)
    ):
        assert orjson.dumps(with_exact_numbers(orjson.loads(inexact), inexact)) == inexact


def test_schemaless_records_of_one_shape_share_one_schema() -> None:
    """Each schemaless record got an Arrow schema of its own: every buffered record was a new schema to check,
    merge and compare with all the batch's others, so buffering slowed with the batch's size (quadratic: 680 µs
    per record with 16k buffered, found by review). Records of one shape now share one schema; another shape (a
    field more) is one more."""
    records = [
        RawRecord(
            "j.s.shapes",
            0,
            offset,
            1,
            b'{"id":%d}' % offset,
            b'{"before":null,"after":{"id":%d%s},"source":{"connector":"informix"},"op":"c","ts_ms":1}'
            % (offset, b',"extra":1' if offset >= 900 else b""),
        )
        for offset in range(1000)
    ]
    pipeline = run(records, True, 250)
    batch = pipeline._buffer["j_s_shapes"]
    assert len(batch.rows) == 1000
    assert len(batch.schemas) == 1  # both shapes hold the same columns: after is JSON text
    assert len(pipeline._seen_schemas["j_s_shapes"]) == 1
    wider = b'{"before":null,"after":{"id":2},"source":{"connector":"informix"},"op":"c","ts_ms":1,"x":1}'
    shapes = [*records[:2], RawRecord("j.s.shapes", 0, 2, 1, b'{"id":2}', wider)]
    assert len(run(shapes, True, 250)._buffer["j_s_shapes"].schemas) == 2


def schemaless_record(offset: int, value: bytes) -> RawRecord:
    return RawRecord("t.s.orders", 0, offset, 1_700_000_000_000, None, value)


def test_malformed_records_are_dead_letters_not_errors_that_stop_ingest() -> None:
    """A record whose content made the decoder raise something other than its own DecodeError (an `op` that is a
    list, a position of thousands of digits, nesting deeper than the JSON writer takes, a Connect schema missing a
    part) stopped the ingester, and again at each restart, since the record is read again. Each is a dead letter
    naming what is wrong, and the records around it land."""
    good = b'{"op":"c","after":{"id":%d},"source":{"connector":"informix","commit_lsn":"1","change_lsn":"%d"}}'
    deep = b"[" * 300 + b"1" + b"]" * 300
    bad_values = [
        b'{"op":["c"],"after":{"id":1},"source":{"connector":"informix"}}',
        b'{"op":"c","after":{"id":1,"x":%s},"source":{"connector":"informix"}}' % deep,
        b'{"op":"c","after":{"id":1},"source":{"connector":"informix","commit_lsn":"%s"}}' % (b"1" * 5000),
        b'{"op":"c","after":{"id":1},"source":{"connector":"mysql","file":"bin.%s","pos":4}}' % (b"9" * 5000),
    ]
    records: list[RawRecord] = []
    for value in bad_values:
        records.append(schemaless_record(len(records), value))
        records.append(schemaless_record(len(records), good % (len(records), len(records))))
    errors = dead_letter_errors(records)
    assert sorted(errors) == [0, 2, 4, 6]
    assert "op" in errors[0]
    assert "nested" in errors[2]
    assert "commit_lsn" in errors[4]
    assert "source.file" in errors[6]
    typed = [
        [*ROW_FIELDS, {"type": "array", "optional": True, "field": "tags"}],  # no "items"
        [*ROW_FIELDS, {"type": "int32", "optional": True}],  # no "field"
        [
            *ROW_FIELDS,
            {
                "type": "bytes",
                "optional": True,
                "field": "ratio",
                "name": "org.apache.kafka.connect.data.Decimal",
                "parameters": {"scale": "x"},
            },
        ],
    ]
    records = []
    for fields in typed:
        records.append(typed_record(len(records), {"id": len(records)}, fields))
        records.append(typed_record(len(records), {"id": len(records)}, ROW_FIELDS))
    errors = dead_letter_errors(records)
    assert sorted(errors) == [0, 2, 4], errors
    assert "items" in errors[0]
    assert "field" in errors[2]
    assert "scale" in errors[4]


def test_an_unforeseen_error_decoding_a_record_makes_it_a_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever else a record makes the decoder raise (ValueError, TypeError, ...) is a dead letter naming the
    error, in both paths, and the records after it land."""
    from ingest.debezium import envelope

    real = envelope._validate_change

    def failing(payload: dict[str, Any]) -> None:
        if payload.get("after", {}).get("id") == 1:
            raise TypeError("a case no check foresaw")
        real(payload)

    monkeypatch.setattr(envelope, "_validate_change", failing)
    records = [typed_record(offset, {"id": offset}, ROW_FIELDS) for offset in range(3)]
    assert dead_letter_errors(records) == {1: "could not be decoded: TypeError: a case no check foresaw"}
