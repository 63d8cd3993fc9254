"""The Debezium envelope: kinds, schemas on/off, and the reasons bad records are rejected with."""

from __future__ import annotations

import orjson
import pytest

from ingest.debezium.envelope import RawRecord, RecordKind, decode
from ingest.errors import DecodeError

SOURCE = {"connector": "informix", "commit_lsn": "10", "change_lsn": "9", "db": "d", "schema": "s", "table": "t"}


def record(value: object, key: object = None, topic: str = "p.s.t", raw: bytes | None = None) -> RawRecord:
    key_bytes = None if key is None else orjson.dumps(key)
    value_bytes = raw if raw is not None else (None if value is None else orjson.dumps(value))
    return RawRecord(topic, 0, 7, 1000, key_bytes, value_bytes)


def test_change_without_schema() -> None:
    env = decode(record({"op": "c", "after": {"id": 1}, "source": SOURCE}, key={"id": 1}))
    assert env.kind is RecordKind.CHANGE
    assert env.value_schema is None
    assert env.ordering == [10, 9, -1]  # Informix ends with transaction.total_order (none here)


def test_change_with_schema() -> None:
    value = {"schema": {"type": "struct", "fields": []}, "payload": {"op": "r", "after": {"id": 1}, "source": SOURCE}}
    key = {"schema": {"type": "struct", "fields": [{"type": "int32", "field": "id"}]}, "payload": {"id": 1}}
    env = decode(record(value, key=key))
    assert env.kind is RecordKind.CHANGE
    assert env.value_schema == {"type": "struct", "fields": []}
    assert env.key == {"id": 1}


def test_tombstones_both_forms() -> None:
    assert decode(record(None, key={"id": 1})).kind is RecordKind.TOMBSTONE
    assert decode(record({"schema": None, "payload": None}, key={"id": 1})).kind is RecordKind.TOMBSTONE


def test_transaction_schema_change_and_heartbeat() -> None:
    assert (
        decode(record({"status": "BEGIN", "id": "571:53195829"}, topic="p.transaction")).kind is RecordKind.TRANSACTION
    )
    assert decode(record({"ddl": "ALTER TABLE ...", "source": {}}, topic="p")).kind is RecordKind.SCHEMA_CHANGE
    assert decode(record({"ts_ms": 1}, topic="__debezium-heartbeat.p")).kind is RecordKind.HEARTBEAT


@pytest.mark.parametrize(
    "image",
    [
        "******",  # column.mask.with.6.chars
        "ABC",  # column.truncate.to.3.chars
        "6d2b5a1c0f3e",  # column.mask.hash.SHA-256.with.salt.x, shortened to the column's length
    ],
)
def test_a_key_column_masked_in_the_value_is_no_mismatch(image: str) -> None:
    """Debezium's masking and truncation options change a character column in the value only, never in the key:
    a masked key column made every change of its table a dead letter (key field CODE does not match after.CODE)."""
    source = {"connector": "db2", "commit_lsn": "00000025:00000d98:0000000000000004", "change_lsn": None}
    env = decode(record({"op": "u", "after": {"CODE": image, "N": 1}, "source": source}, key={"CODE": "ABC123"}))
    assert env.kind is RecordKind.CHANGE
    assert env.key == {"CODE": "ABC123"}
    # A key field that is not text is still compared, and so is a null one.
    with pytest.raises(DecodeError, match=r"key field N=2 does not match after\.N=1"):
        decode(record({"op": "u", "after": {"CODE": image, "N": 1}, "source": source}, key={"CODE": "ABC123", "N": 2}))
    with pytest.raises(DecodeError, match="key field CODE=None does not match"):
        decode(record({"op": "u", "after": {"CODE": image, "N": 1}, "source": source}, key={"CODE": None}))


def test_mongodb_update_with_update_description_only() -> None:
    source = {"connector": "mongodb", "ts_ms": 1000, "ord": 1}
    value = {"op": "u", "after": None, "updateDescription": {"updatedFields": "{}"}, "source": source}
    assert decode(record(value, key={"id": '{"$oid": "x"}'})).kind is RecordKind.CHANGE


@pytest.mark.parametrize(
    ("value", "raw", "key", "message"),
    [
        (None, b'{"op": "c", "after": {"id"', None, "value: not valid JSON"),
        (None, b'{"op": "c", "after": "\xff\xfe"}', None, "not valid UTF-8"),
        (None, b"\x00\x00\x00\x00\x07\x02\x06abc", None, "schema registry's wire format .*value.converter=org"),
        ({"after": {"id": 1}, "source": SOURCE}, None, None, "no 'op' field .*its fields: after, source"),
        (
            {"id": 1, "name": "x", "__op": "c", "__deleted": "false"},
            None,
            None,
            "flattened by Debezium's ExtractNewRecordState SMT .* __deleted, __op",
        ),
        ({"op": "x", "after": {"id": 1}, "source": SOURCE}, None, None, "unknown op 'x'"),
        ({"op": "c", "after": None, "source": SOURCE}, None, None, "op 'c' without an 'after' image"),
        ({"op": "c", "after": {"id": 1}, "source": {**SOURCE, "commit_lsn": "1e5"}}, None, None, "commit_lsn"),
        (
            {"op": "c", "after": {"id": 2}, "source": SOURCE},
            None,
            {"id": 1},
            "key field id=1 does not match after.id=2",
        ),
        ({"op": "d", "before": {"ID": 3}, "source": SOURCE}, None, {"id": 1}, "does not match before.id=3"),
        ([1, 2], None, None, "expected a JSON object"),
    ],
)
def test_bad_records_name_the_problem(value: object, raw: bytes | None, key: object, message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(")):
        decode(record(value, key=key, raw=raw))
