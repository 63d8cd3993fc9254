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


HEARTBEAT_KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "string", "optional": False, "field": "serverName"}],
    "optional": False,
    "name": "io.debezium.connector.common.ServerNameKey",
}
HEARTBEAT_VALUE_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
    "optional": False,
    "name": "io.debezium.connector.common.Heartbeat",
}


@pytest.mark.parametrize("schemas", [False, True], ids=["schemaless", "schemas"])
def test_heartbeats_on_a_custom_topic_prefix_are_heartbeats(schemas: bool) -> None:
    """``topic.heartbeat.prefix`` (``heartbeat.topics.prefix`` before 2.0) is configurable: a heartbeat on
    ``hb.server1`` is known by its content (the Heartbeat schema, or schemaless a ``ts_ms``-only value keyed by
    ``serverName``), not turned into a dead letter."""
    key: object = {"serverName": "server1"}
    value: object = {"ts_ms": 1705312800000}
    if schemas:
        key = {"schema": HEARTBEAT_KEY_SCHEMA, "payload": key}
        value = {"schema": HEARTBEAT_VALUE_SCHEMA, "payload": value}
    assert decode(record(value, key=key, topic="hb.server1")).kind is RecordKind.HEARTBEAT


def test_change_events_are_never_taken_for_heartbeats() -> None:
    """A change event carries ``op``: whatever its key, and even with ts_ms as its only other field, it is no
    heartbeat; nor is a schemaless ``{"ts_ms": ...}`` value without the heartbeat's key."""
    key = {"serverName": "server1"}
    change = {"op": "c", "after": {"serverName": "server1"}, "source": SOURCE, "ts_ms": 1}
    assert decode(record(change, key=key, topic="hb.server1")).kind is RecordKind.CHANGE
    with pytest.raises(DecodeError, match="unknown op"):
        decode(record({"op": None, "ts_ms": 1}, key=key, topic="hb.server1"))
    with pytest.raises(DecodeError, match="no 'op' field"):
        decode(record({"ts_ms": 1}, key={"id": 1}, topic="p.s.t"))
    with pytest.raises(DecodeError, match="no 'op' field"):
        decode(record({"ts_ms": 1}, topic="p.s.t"))
    with pytest.raises(DecodeError, match="no 'op' field"):
        decode(record({"ts_ms": 1, "other": 2}, key=key, topic="hb.server1"))
    named_change = {"schema": {**HEARTBEAT_VALUE_SCHEMA, "fields": []}, "payload": change}
    assert decode(record(named_change, key=key, topic="hb.server1")).kind is RecordKind.CHANGE
