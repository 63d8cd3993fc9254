"""The Debezium fakes emit well-formed, seed-shaped, correctly ordered streams whose replay gives ``expected``."""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import re
from collections import defaultdict
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from random import Random
from typing import Any, cast

import orjson
import pytest

from ingest.fakes import SOURCES, FakeStream, KafkaRecord, build_stream, continue_stream, to_kcat_json
from ingest.fakes.connect import unscaled_bytes
from ingest.fakes.partitioner import murmur2, partition_for
from ingest.fakes.records import write_kcat_jsonl

SEEDS = Path(__file__).parent / "fixtures" / "debezium" / "seeds"

# The source block per connector, field by field, in order (seeds §2.4, §3.4, §4.4 / schema-change, §5.4).
SOURCE_FIELDS = {
    "db2": ["version", "connector", "name", "ts_ms", "snapshot", "db", "schema", "table", "change_lsn", "commit_lsn"],
    "informix": [
        "version", "connector", "name", "ts_ms", "ts_us", "ts_ns", "snapshot", "db", "schema", "table",
        "commit_lsn", "change_lsn", "txId", "begin_lsn",
    ],
    "oracle": [
        "version", "connector", "name", "ts_ms", "snapshot", "db", "schema", "table",
        "txId", "scn", "commit_scn", "lcr_position",
    ],
    "mongodb": [
        "version", "connector", "name", "ts_ms", "snapshot", "db", "rs", "collection",
        "ord", "h", "tord", "stxnid", "lsid", "txnNumber",
    ],
}  # fmt: skip
SOURCE_SCHEMA = {
    "db2": "io.debezium.connector.db2.Source",
    "informix": "io.debezium.connector.informix.Source",
    "oracle": "io.debezium.connector.oracle.Source",
    "mongodb": "io.debezium.connector.mongo.Source",
}
KCAT_FIELDS = ["topic", "partition", "offset", "tstype", "ts", "broker", "key", "payload"]
DB2_LSN = re.compile(r"^[0-9a-f]{8}:[0-9a-f]{8}:[0-9a-f]{4}$")


# --- helpers -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=SOURCES)
def stream(request: pytest.FixtureRequest) -> FakeStream:
    return build_stream(request.param, seed=7)


def data_events(stream: FakeStream) -> Iterator[tuple[int, KafkaRecord, dict[str, Any] | None]]:
    """(index, record, value payload or None for a tombstone) of the data topic, in stream order."""
    for index, record in enumerate(stream.records):
        if record.topic == stream.data_topic:
            yield index, record, None if record.value is None else orjson.loads(record.value)["payload"]


def key_of(record: KafkaRecord) -> str:
    assert record.key is not None
    return orjson.dumps(orjson.loads(record.key)["payload"], option=orjson.OPT_SORT_KEYS).decode()


def _lsn(value: str | None) -> int:
    return -1 if value is None else int(value.replace(":", ""), 16)


def _dec(value: str | None) -> int:
    return -1 if value is None else int(value)


def position(source_name: str, payload: dict[str, Any]) -> tuple[int, ...]:
    """Independent 'which change is later' key (reference §7), tie-broken by ``transaction.total_order``."""
    src = payload["source"]
    tx = payload.get("transaction")
    order = 0 if tx is None else int(tx["total_order"])
    if source_name == "db2":
        return _lsn(src["commit_lsn"]), _lsn(src["change_lsn"]), order
    if source_name == "informix":
        return _dec(src["commit_lsn"]), _dec(src["change_lsn"]), order
    if source_name == "oracle":
        return _dec(src.get("commit_scn")), _dec(src["scn"]), order
    return int(src["ts_ms"]), int(src["ord"]), order


def after_image(source_name: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    after = payload.get("after")
    if source_name == "mongodb" and after is not None:
        parsed = orjson.loads(after)
        assert isinstance(parsed, dict)
        return parsed
    assert after is None or isinstance(after, dict)
    return after


def replay(source_name: str, events: Sequence[tuple[str, dict[str, Any] | None]]) -> dict[str, dict[str, Any]]:
    """Tiny last-write-wins reducer: c/r/u upsert the after image, d deletes, tombstones are no-ops."""
    state: dict[str, dict[str, Any]] = {}
    for key, payload in events:
        if payload is None:
            continue
        if payload["op"] == "d":
            state.pop(key, None)
            continue
        image = after_image(source_name, payload)
        if image is not None:  # a MongoDB update whose looked-up document was already deleted
            state[key] = image
    return state


def conforms(spec: dict[str, Any], value: Any, path: str) -> None:
    """Check a JSON value against a Connect schema as the JsonConverter writes it."""
    if value is None:
        assert spec["optional"], f"{path}: null in a required field"
        return
    kind = spec["type"]
    if kind == "struct":
        assert isinstance(value, dict), path
        names = [f["field"] for f in spec["fields"]]
        assert list(value) == names, f"{path}: fields {list(value)} != schema {names}"
        for sub in spec["fields"]:
            conforms(sub, value[sub["field"]], f"{path}.{sub['field']}")
    elif kind == "array":
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            conforms(spec["items"], item, f"{path}[{i}]")
    elif kind in ("int8", "int16", "int32", "int64"):
        bits = int(kind[3:])
        assert type(value) is int, path
        assert -(2 ** (bits - 1)) <= value < 2 ** (bits - 1), path
    elif kind in ("float", "double"):
        assert type(value) in (int, float), path
    elif kind == "boolean":
        assert type(value) is bool, path
    elif kind == "string":
        assert isinstance(value, str), path
    elif kind == "bytes":
        assert isinstance(value, str), path
        base64.b64decode(value, validate=True)
    else:
        pytest.fail(f"{path}: unknown Connect type {kind}")


# --- records and wire format -----------------------------------------------------------------------------------


def test_every_record_is_json_with_schema_and_payload(stream: FakeStream) -> None:
    assert {r.topic for r in stream.records} == {stream.data_topic, stream.transaction_topic}
    for record in stream.records:
        assert record.key is not None
        key = orjson.loads(record.key)
        assert list(key) == ["schema", "payload"]
        conforms(key["schema"], key["payload"], "key")
        if record.value is not None:
            value = orjson.loads(record.value)
            assert list(value) == ["schema", "payload"]
            conforms(value["schema"], value["payload"], "value")


def test_kcat_lines(stream: FakeStream, tmp_path: Path) -> None:
    path = tmp_path / "stream.jsonl"
    write_kcat_jsonl(stream.records, path)
    lines = path.read_bytes().splitlines()
    assert len(lines) == len(stream.records)
    for line, record in zip(lines, stream.records, strict=True):
        item = orjson.loads(line)
        assert list(item) == (KCAT_FIELDS if not record.headers else [*KCAT_FIELDS[:6], "headers", *KCAT_FIELDS[6:]])
        assert item == to_kcat_json(record)
        assert item["tstype"] == "create"
        assert item["broker"] == -1
        assert (item["payload"] is None) == (record.value is None)


def test_topics_and_schema_names(stream: FakeStream) -> None:
    prefix = {"db2": "db2server", "informix": "ifxserver", "oracle": "server1", "mongodb": "fulfillment"}
    assert stream.transaction_topic == f"{prefix[stream.source]}.transaction"
    assert stream.data_topic.startswith(prefix[stream.source] + ".")
    assert stream.data_topic.count(".") == 2
    record = next(r for r in stream.records if r.topic == stream.data_topic and r.value is not None)
    assert record.key is not None
    assert record.value is not None
    assert orjson.loads(record.key)["schema"]["name"] == f"{stream.data_topic}.Key"
    assert orjson.loads(record.value)["schema"]["name"] == f"{stream.data_topic}.Envelope"


def test_source_block_has_the_seed_fields(stream: FakeStream) -> None:
    name = stream.source
    for _, record, payload in data_events(stream):
        if payload is None:
            continue
        assert list(payload["source"]) == SOURCE_FIELDS[name]
        assert record.value is not None
        source_schema = next(f for f in orjson.loads(record.value)["schema"]["fields"] if f["field"] == "source")
        assert source_schema["name"] == SOURCE_SCHEMA[name]
        assert [f["field"] for f in source_schema["fields"]] == SOURCE_FIELDS[name]
        src = payload["source"]
        assert src["connector"] == name
        if name == "db2":
            assert src["commit_lsn"] is not None
            assert DB2_LSN.match(src["commit_lsn"])
            assert src["change_lsn"] is None or DB2_LSN.match(src["change_lsn"])
        elif name == "informix":
            assert all(src[f] is None or src[f].isdigit() for f in ("commit_lsn", "change_lsn", "begin_lsn", "txId"))
            assert src["ts_us"] == src["ts_ms"] * 1000
            assert src["ts_ns"] == src["ts_ms"] * 1_000_000
            assert payload["ts_us"] // 1000 == payload["ts_ms"]
            assert payload["ts_ns"] // 1000 == payload["ts_us"]
        elif name == "oracle":
            assert src["scn"].isdigit()
            assert src["txId"] is None or re.fullmatch(r"\d+\.\d+\.\d+", src["txId"])
        else:
            assert src["ts_ms"] % 1000 == 0
            assert type(src["ord"]) is int
            assert "before" not in payload
            assert payload["patch"] is None
            assert payload["filter"] is None


def test_typed_columns_use_logical_types(stream: FakeStream) -> None:
    record = next(r for r in stream.records if r.topic == stream.data_topic and r.value is not None)
    assert record.value is not None
    value_schema = orjson.loads(record.value)["schema"]
    after = next(f for f in value_schema["fields"] if f["field"] == "after")
    if stream.source == "mongodb":
        assert after["name"] == "io.debezium.data.Json"
        return
    names = {f["field"]: f.get("name") for f in after["fields"]}
    assert "org.apache.kafka.connect.data.Decimal" in names.values()
    decimal = next(f for f in after["fields"] if f.get("name") == "org.apache.kafka.connect.data.Decimal")
    assert decimal["type"] == "bytes"
    assert set(decimal["parameters"]) == {"scale", "connect.decimal.precision"}
    assert {"io.debezium.time.Date", "io.debezium.time.Timestamp", "io.debezium.time.MicroTimestamp"} & set(
        names.values()
    )


# --- snapshot, deletes, transactions ----------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("style", ["seed", "enum"])
def test_snapshot_markers(source: str, style: str) -> None:
    stream = build_stream(source, n_keys=5, n_changes=10, snapshot_style=style)  # type: ignore[arg-type]
    payloads = [p for _, _, p in data_events(stream) if p is not None]
    reads = [p for p in payloads if p["op"] == "r"]
    assert len(reads) == 5
    assert payloads[:5] == reads
    markers = [p["source"]["snapshot"] for p in reads]
    streamed = {str(p["source"]["snapshot"]) for p in payloads[5:]}
    if style == "seed":
        assert markers == [True] * 5
        assert streamed == {"False"}
    else:
        assert markers[-1] == "last"
        assert set(markers[1:-1]) == {"true"}
        assert markers[0] == ("first" if source == "informix" else "true")
        assert streamed == {"false"}
    assert all(p["transaction"] is None for p in reads)
    assert len({position(source, p)[:2] for p in reads}) == 1, "snapshot reads share one position"


def test_every_delete_is_followed_by_a_tombstone(stream: FakeStream) -> None:
    records = stream.records
    for index, record, payload in data_events(stream):
        if payload is not None and payload["op"] == "d":
            nxt = records[index + 1]
            assert nxt.value is None
            assert (nxt.topic, nxt.partition, nxt.key) == (record.topic, record.partition, record.key)
        if payload is None:
            previous = orjson.loads(records[index - 1].value or b"null")
            assert previous["payload"]["op"] == "d", "a tombstone only ever follows a delete"


def test_delete_images(stream: FakeStream) -> None:
    for _, _, payload in data_events(stream):
        if payload is None or payload["op"] != "d":
            continue
        assert payload["after"] is None
        if stream.source == "mongodb":
            assert payload["updateDescription"] is None
        else:
            assert payload["before"] is not None


def tx_group(source: str, tx_id: str) -> str:
    """Informix BEGIN and END ids differ after the ':' (``txID:LSN``); group by the txID part."""
    return tx_id.split(":")[0] if source == "informix" else tx_id


def test_transaction_metadata(stream: FakeStream) -> None:
    begins: dict[str, int] = {}
    ends: dict[str, tuple[int, dict[str, Any]]] = {}
    for index, record in enumerate(stream.records):
        if record.topic != stream.transaction_topic:
            continue
        assert record.value is not None
        payload = orjson.loads(record.value)["payload"]
        group = tx_group(stream.source, payload["id"])
        if payload["status"] == "BEGIN":
            assert payload["event_count"] is None
            begins[group] = index
        else:
            assert payload["status"] == "END"
            ends[group] = (index, payload)
    assert begins
    assert set(begins) == set(ends)
    events: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for index, _, payload in data_events(stream):
        if payload is not None and payload["transaction"] is not None:
            events[payload["transaction"]["id"]].append((index, payload))
    assert {tx_group(stream.source, tx_id) for tx_id in events} == set(ends)
    for tx_id, members in events.items():
        group = tx_group(stream.source, tx_id)
        end_index, end = ends[group]
        assert end["id"] == tx_id, "data events carry the END id"
        assert end["event_count"] == len(members)
        assert end["data_collections"][0]["event_count"] == len(members)
        assert [p["transaction"]["total_order"] for _, p in members] == list(range(1, len(members) + 1))
        assert begins[group] < members[0][0]
        assert members[-1][0] < end_index


def test_stream_has_every_change_shape(stream: FakeStream) -> None:
    ops: dict[str, int] = defaultdict(int)
    by_tx: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for _, record, payload in data_events(stream):
        if payload is None:
            ops["tombstone"] += 1
            continue
        ops[payload["op"]] += 1
        if payload["transaction"] is not None:
            by_tx[payload["transaction"]["id"]].append((key_of(record), payload))
    assert all(ops[op] > 0 for op in ("r", "c", "u", "d", "tombstone"))
    multi_key = [m for m in by_tx.values() if len({k for k, _ in m}) >= 2]
    same_key = [m for m in by_tx.values() if any(n >= 2 for n in _counts(k for k, _ in m).values())]
    assert multi_key, "a multi-row transaction"
    assert same_key, "several changes of one key in one transaction"
    assert any(_is_pk_change(stream.source, members) for members in by_tx.values()), "a primary-key change"


def test_a_primary_key_change_names_the_other_key_in_its_headers(stream: FakeStream) -> None:
    """As Debezium's relational connectors write it (RelationalChangeRecordEmitter; the recorded PostgreSQL output
    shows it): the delete and its tombstone carry `__debezium.newkey`, the create `__debezium.oldkey`, each the
    other half's key as the key converter writes it. MongoDB's `_id` cannot change: no such pair, no headers."""
    records = [r for r in stream.records if r.topic == stream.data_topic]
    headed = [r for r in records if r.headers]
    if stream.source == "mongodb":
        assert not headed
        return
    assert headed, "a primary-key change"
    for index, record in enumerate(records):
        if not record.headers:
            continue
        ((name, other),) = record.headers
        if name == "__debezium.oldkey":
            delete, tombstone = records[index - 2], records[index - 1]
            assert tombstone.value is None
            assert delete.key == other
            assert delete.headers == tombstone.headers == [("__debezium.newkey", record.key)]
        else:
            assert name == "__debezium.newkey"
            assert record.value is None or orjson.loads(record.value)["payload"]["op"] == "d"


def test_db2_pairs_a_delete_and_the_insert_after_it_in_one_commit() -> None:
    """Debezium's Db2 connector takes a delete directly followed by an insert in one commit for the two halves of
    an update (reference.md 2.1): of two keys, a primary-key change (its headers, one position); of one key, an
    update. Other connectors send the two as they came."""
    from ingest.fakes.base import RowOp
    from ingest.fakes.scenario import make_connector

    for source, paired in (("db2", True), ("informix", False)):
        connector = make_connector(source)
        old, new = connector.new_row(Random(1), 1), connector.new_row(Random(2), 2)
        events = connector.transaction(Random(0), [(RowOp("d", old, None),), (RowOp("c", None, new),)])
        data = [e for e in events if e.topic == connector.data_topic and e.value is not None]
        assert [orjson.loads(e.value)["payload"]["op"] for e in data] == ["d", "c"]  # type: ignore[arg-type]
        assert bool(data[1].headers) is paired, source
        sources = {orjson.dumps(orjson.loads(e.value)["payload"]["source"]) for e in data}  # type: ignore[arg-type]
        assert (len(sources) == 1) is paired, source
    connector = make_connector("db2")
    row = connector.new_row(Random(1), 1)
    again = {**row, "EMAIL": "again@example.com"}
    events = connector.transaction(Random(0), [(RowOp("d", row, None),), (RowOp("c", None, again),)])
    payloads = [orjson.loads(e.value)["payload"] for e in events if e.topic == connector.data_topic and e.value]
    assert [(p["op"], p["before"]["EMAIL"], p["after"]["EMAIL"]) for p in payloads] == [
        ("u", row["EMAIL"], "again@example.com")
    ]


def _counts(keys: Iterator[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for key in keys:
        out[key] += 1
    return out


def _is_pk_change(source: str, members: list[tuple[str, dict[str, Any]]]) -> bool:
    """A delete of key A directly followed by a create of key B with the same non-key content."""
    for (key_a, first), (key_b, second) in itertools.pairwise(members):
        if first["op"] == "d" and second["op"] == "c" and key_a != key_b:
            if source == "mongodb":
                return True
            strip = {k: v for k, v in first["before"].items() if k.lower() != "id"}
            if strip == {k: v for k, v in second["after"].items() if k.lower() != "id"}:
                return True
    return False


# --- ordering and replay ----------------------------------------------------------------------------------------


def test_positions_strictly_increase_per_key(stream: FakeStream) -> None:
    last: dict[str, tuple[int, ...]] = {}
    for _, record, payload in data_events(stream):
        if payload is None:
            continue
        key = key_of(record)
        pos = position(stream.source, payload)
        if key in last:
            assert pos > last[key], f"{key}: {pos} is not after {last[key]}"
        last[key] = pos


def test_commit_positions_never_go_back(stream: FakeStream) -> None:
    """Topic order is commit order: the (commit, change) key never decreases across the data topic."""
    positions = [position(stream.source, p) for _, _, p in data_events(stream) if p is not None]
    assert positions == sorted(positions)


def test_replay_gives_expected(stream: FakeStream) -> None:
    events = [(key_of(r), p) for _, r, p in data_events(stream)]
    assert replay(stream.source, events) == stream.expected
    # Positions alone (not arrival order) must also reproduce it.
    ordered = sorted(((k, p) for k, p in events if p is not None), key=lambda item: position(stream.source, item[1]))
    assert replay(stream.source, ordered) == stream.expected


def test_expected_is_nonempty_and_keyed_canonically(stream: FakeStream) -> None:
    assert stream.expected
    for key in stream.expected:
        assert key == orjson.dumps(orjson.loads(key), option=orjson.OPT_SORT_KEYS).decode()


# --- determinism, partitions, continuation ----------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_same_seed_same_bytes(source: str, tmp_path: Path) -> None:
    first, second, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_kcat_jsonl(build_stream(source, seed=3).records, first)
    write_kcat_jsonl(build_stream(source, seed=3).records, second)
    write_kcat_jsonl(build_stream(source, seed=4).records, other)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() != other.read_bytes()


@pytest.mark.parametrize("source", SOURCES)
def test_partitions_follow_the_key_hash(source: str) -> None:
    stream = build_stream(source, partitions=4, n_changes=60)
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    for record in stream.records:
        assert record.key is not None
        assert record.partition == partition_for(record.key, 4)
        assert record.offset == next_offset[record.topic, record.partition]
        next_offset[record.topic, record.partition] += 1
    assert len({p for t, p in next_offset if t == stream.data_topic}) > 1


@pytest.mark.parametrize("source", SOURCES)
def test_continue_stream(source: str) -> None:
    first = build_stream(source, seed=5, n_changes=40, partitions=2)
    frozen = list(first.records)
    more = continue_stream(first, 30)
    again = continue_stream(first, 30)
    assert first.records == frozen, "the previous stream is not modified"
    assert more.records == again.records, "continuation is deterministic"
    assert more.records[: len(frozen)] == frozen
    assert more.appended_from == len(frozen)
    assert more.new_records == more.records[len(frozen) :]
    assert sum(1 for r in more.new_records if r.topic == more.data_topic) >= 30
    seen = {(r.topic, r.partition, r.offset) for r in frozen}
    assert not seen & {(r.topic, r.partition, r.offset) for r in more.new_records}
    high = max(
        position(source, orjson.loads(r.value)["payload"]) for r in frozen if r.topic == first.data_topic and r.value
    )
    for record in more.new_records:
        if record.topic == more.data_topic and record.value is not None:
            assert position(source, orjson.loads(record.value)["payload"]) > high
    events = [
        (key_of(r), None if r.value is None else orjson.loads(r.value)["payload"])
        for r in more.records
        if r.topic == more.data_topic
    ]
    assert replay(source, events) == more.expected


def test_unknown_source_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown source"):
        build_stream("sybase")


# --- primitives -------------------------------------------------------------------------------------------------


def test_murmur2_matches_kafka() -> None:
    # Vectors from Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


@pytest.mark.parametrize(
    ("unscaled", "expected"),
    [(0, b"\x00"), (-1, b"\xff"), (127, b"\x7f"), (128, b"\x00\x80"), (-128, b"\x80"), (-129, b"\xff\x7f")],
)
def test_decimal_bytes_match_java_biginteger(unscaled: int, expected: bytes) -> None:
    assert unscaled_bytes(unscaled) == expected


# --- seed fixtures ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_seed_fixture(source: str) -> None:
    lines = [orjson.loads(line) for line in (SEEDS / f"{source}.jsonl").read_bytes().splitlines()]
    assert all(list(item) == KCAT_FIELDS for item in lines)
    assert [item["offset"] for item in lines] == list(range(len(lines)))
    values = [None if item["payload"] is None else orjson.loads(item["payload"]) for item in lines]
    payloads = [None if v is None else v["payload"] if "schema" in v else v for v in values]
    ops = [None if p is None else p["op"] for p in payloads]
    expected_ops = ["c", "u", "u", "d", None] if source == "mongodb" else ["c", "u", "d", None]
    assert ops == expected_ops
    assert values[0] is not None
    assert "schema" in values[0], "the create event keeps the seed's schema"
    assert lines[-1]["key"] == lines[-2]["key"]
    keys = {item["key"] for item in lines}
    assert len(keys) == 1
    positions = [position(source, p) for p in payloads if p is not None]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)


@pytest.mark.parametrize("source", [s for s in SOURCES if s != "mongodb"])
def test_the_silver_check_compares_with_the_drawn_values(source: str) -> None:
    """`source_mismatches` (the demo's and the end-to-end tests' check of silver) compares with the values the
    generator drew, not with cdclake's decoding of the connector's encoding: silver rows equal to the source rows
    pass, and a value decoded wrongly (a decimal off by its scale, a timestamp off by an hour), a lost key or a
    duplicated one are each reported."""
    from ingest.demo import source_mismatches

    stream = build_stream(source, seed=5, n_keys=6, n_changes=20)
    silver = [dict(row) for row in stream.rows.values()]
    assert len(silver) == len(stream.expected)
    assert source_mismatches(silver, stream) == []
    key = next(iter(stream.rows))
    decimal_column = next(c for c, v in stream.rows[key].items() if type(v).__name__ == "Decimal")
    off_by_scale = [dict(row) for row in silver]
    off_by_scale[0][decimal_column] = cast(Decimal, off_by_scale[0][decimal_column]) * 100
    assert source_mismatches(off_by_scale, stream) == [
        f"{key}.{decimal_column}: silver {off_by_scale[0][decimal_column]!r} != source {silver[0][decimal_column]!r}"
    ]
    time_column = next(c for c, v in stream.rows[key].items() if type(v).__name__ == "datetime")
    shifted = [dict(row) for row in silver]
    shifted[0][time_column] = cast(dt.datetime, shifted[0][time_column]) + dt.timedelta(hours=1)
    (problem,) = source_mismatches(shifted, stream)
    assert problem.startswith(f"{key}.{time_column}: silver ")
    assert source_mismatches(silver[1:], stream) == [f"missing from silver: {key}"]
    assert source_mismatches([*silver, silver[0]], stream) == ["1 duplicate key(s) in silver"]
