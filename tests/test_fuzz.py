"""Fuzzing the envelope decoder and row builder: any input either decodes or raises DecodeError (a dead letter)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
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
