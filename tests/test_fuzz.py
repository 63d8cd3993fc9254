"""Fuzzing the envelope decoder and row builder: any input either decodes or raises DecodeError (a dead letter)."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.bronze.rows import RowBuilder
from ingest.debezium.envelope import RawRecord, decode
from ingest.errors import DecodeError

int64 = st.integers(-(2**63), 2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | int64 | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
source_blocks = st.fixed_dictionaries(
    {},
    optional={
        "connector": st.sampled_from(["db2", "informix", "oracle", "mongodb", "postgresql", "mysql", "sqlserver", "x"]),
        "commit_lsn": st.one_of(st.text(max_size=24), int64, st.none()),
        "change_lsn": st.one_of(st.text(max_size=24), int64, st.none()),
        "scn": st.one_of(st.text(max_size=12), int64, st.none()),
        "ts_ms": int64,
        "ord": int64,
        "sequence": st.text(max_size=30),
        "file": st.text(max_size=12),
        "pos": int64,
    },
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "op": st.sampled_from(["c", "u", "d", "r", "t", "x"]),
        "before": json_values,
        "after": json_values,
        "source": source_blocks,
        "ts_ms": int64,
        "status": st.sampled_from(["BEGIN", "END"]),
        "id": st.text(max_size=5),
    },
)
schema_types = st.sampled_from(["int8", "int16", "int32", "int64", "float", "double", "boolean", "string", "bytes"])


@st.composite
def typed_documents(draw: st.DrawFn) -> dict[str, Any]:
    fields = [
        {"type": draw(schema_types), "field": name, "optional": draw(st.booleans())}
        for name in draw(st.lists(st.sampled_from(["a", "b", "id"]), unique=True, max_size=3))
    ]
    row = {"type": "struct", "fields": fields, "optional": True}
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "after"},
            {"type": "struct", "field": "source", "fields": [{"type": "string", "field": "connector"}]},
            {"type": "string", "field": "op"},
        ],
    }
    return {"schema": schema, "payload": draw(envelopes)}


# Values of each Connect type as the JSON converter writes them (bytes as base64), and the Python value bronze holds.
INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}


def typed_value(kind: str) -> st.SearchStrategy[tuple[Any, Any]]:
    if kind in INT_RANGES:
        bits = INT_RANGES[kind]
        return st.integers(-(2**bits), 2**bits - 1).map(lambda n: (n, n))
    if kind == "float":
        return st.floats(width=32, allow_nan=False, allow_infinity=False).map(lambda f: (f, f))
    if kind == "double":
        return st.floats(allow_nan=False, allow_infinity=False).map(lambda f: (f, f))
    if kind == "boolean":
        return st.booleans().map(lambda b: (b, b))
    if kind == "string":
        return st.text(max_size=20).map(lambda t: (t, t))
    return st.binary(max_size=12).map(lambda b: (base64.b64encode(b).decode(), b))


# A value of the wrong JSON type for each Connect type: the record must be a dead letter naming the field.
WRONG_VALUES: dict[str, list[Any]] = {
    **{kind: ["7", True, 1.5, [1], {"x": 1}] for kind in INT_RANGES},
    "float": ["1.5", True, [1.0]],
    "double": ["1.5", False, {"x": 1.0}],
    "boolean": [1, "true", [True]],
    "string": [1, True, [""], {"x": "y"}],
    "bytes": [1, True, ["AA=="]],
}


@st.composite
def typed_rows(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """A typed change event with values of its declared types: (document, the `after` bronze must hold, the field
    given a wrong-typed value instead, if any)."""
    names = draw(st.lists(st.sampled_from(["a", "b", "id"]), unique=True, min_size=1, max_size=3))
    fields: list[dict[str, Any]] = []
    payload_after: dict[str, Any] = {}
    expected: dict[str, Any] = {}
    for name in names:
        kind = draw(schema_types)
        optional = draw(st.booleans())
        fields.append({"type": kind, "field": name, "optional": optional})
        if optional and draw(st.booleans()):
            payload_after[name], expected[name] = None, None
        else:
            payload_after[name], expected[name] = draw(typed_value(kind))
    wrong = draw(st.one_of(st.none(), st.sampled_from(names)))
    if wrong is not None:
        wrong_kind = next(str(f["type"]) for f in fields if f["field"] == wrong)
        payload_after[wrong] = draw(st.sampled_from(WRONG_VALUES[wrong_kind]))
    op = draw(st.sampled_from(["c", "u", "r"]))
    lsn = str(draw(st.integers(0, 2**40)))
    payload = {
        "op": op,
        "before": None,
        "after": payload_after,
        "source": {"connector": "informix", "commit_lsn": lsn, "change_lsn": lsn},
    }
    return {"schema": typed_documents_schema(fields), "payload": payload}, expected, wrong


def check(key: bytes | None, value: bytes | None) -> None:
    record = RawRecord("fuzz.s.t", 0, 1, 0, key, value)
    try:
        envelope = decode(record)
        RowBuilder().build(record, envelope, dt.datetime.now(dt.UTC))
    except DecodeError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=200)))
def test_random_bytes(key: bytes, value: bytes | None) -> None:
    check(key, value)


@settings(max_examples=400, deadline=None)
@given(json_values, envelopes)
def test_random_envelopes(key: Any, envelope: dict[str, Any]) -> None:
    check(orjson.dumps(key), orjson.dumps(envelope))


@settings(max_examples=300, deadline=None)
@given(typed_documents())
def test_random_typed_envelopes(document: dict[str, Any]) -> None:
    check(None, orjson.dumps(document))


@settings(max_examples=300, deadline=None)
@given(typed_rows())
def test_random_typed_rows_keep_their_values_or_name_the_wrong_field(drawn: tuple[Any, Any, str | None]) -> None:
    """A typed change whose values match its schema is built into a row holding exactly those values (bytes
    decoded from base64, float32 as Arrow stores it); one value of the wrong JSON type makes the record a dead
    letter whose reason names that field."""
    document, expected, wrong = drawn
    record = RawRecord("fuzz.s.t", 0, 1, 0, None, orjson.dumps(document))
    if wrong is not None:
        with pytest.raises(DecodeError, match=rf"value\.after\.{wrong}\b"):
            RowBuilder().build(record, decode(record), dt.datetime.now(dt.UTC))
        return
    built = RowBuilder().build(record, decode(record), dt.datetime.now(dt.UTC))
    stored = pa.Table.from_pylist([built.row], built.schema).to_pylist()[0]
    assert stored["after"] == expected
    assert stored["op"] == document["payload"]["op"]


def test_integers_beyond_64_bits_keep_their_digits_or_are_dead_letters() -> None:
    """Without a schema a 30-digit integer is kept as written in bronze's JSON text (key and image); where the
    schema says int64 it is a dead letter naming the field."""
    big = 123456789012345678901234567890
    source = b'"source":{"connector":"informix","commit_lsn":"1","change_lsn":"1"}'
    record = RawRecord("fuzz.s.t", 0, 1, 0, b'{"id": %d}' % big, b'{"op":"c","after":{"id":%d},%s}' % (big, source))
    row = RowBuilder().build(record, decode(record), dt.datetime.now(dt.UTC)).row
    assert (row["key"], row["after"]) == (f'{{"id":{big}}}', f'{{"id":{big}}}')
    fields = [{"type": "int64", "field": "id", "optional": False}]
    document = typed_documents_schema(fields)
    typed = RawRecord(
        "fuzz.s.t",
        0,
        2,
        0,
        None,
        b'{"schema":%s,"payload":{"op":"c","after":{"id":%d},%s}}' % (orjson.dumps(document), big, source),
    )
    with pytest.raises(DecodeError, match=r"value\.after\.id: expected int64"):
        RowBuilder().build(typed, decode(typed), dt.datetime.now(dt.UTC))


def typed_documents_schema(fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The value schema of a change whose `after` has ``fields`` and whose source block is Informix's."""
    source = [{"type": "string", "field": name} for name in ("connector", "commit_lsn", "change_lsn")]
    return {
        "type": "struct",
        "fields": [
            {"type": "struct", "optional": True, "fields": fields, "field": "before"},
            {"type": "struct", "optional": True, "fields": fields, "field": "after"},
            {"type": "struct", "field": "source", "fields": source},
            {"type": "string", "field": "op"},
        ],
    }


def test_ten_megabyte_record_is_handled() -> None:
    big = {"op": "c", "after": {"id": 1, "blob": "x" * 10_000_000}, "source": {"connector": "informix"}}
    record = RawRecord("big.s.t", 0, 1, 0, b'{"id": 1}', orjson.dumps(big))
    envelope = decode(record)
    row = RowBuilder().build(record, envelope, dt.datetime.now(dt.UTC))
    assert len(row.row["after"]) > 10_000_000
