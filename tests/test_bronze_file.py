"""Bronze from topic dumps (kcat -J): real Debezium output lands exactly once, typed, with its offsets."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pyarrow as pa
import pytest
from pyiceberg.table.snapshots import Operation

from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.order_watermark import ORDER_MAX_PROPERTY, ORDER_REGRESSIONS_PROPERTY, order_bounds, order_summary
from ingest.bronze.rows import HEADERS_TYPE
from ingest.bronze.tables import (
    KIND_PROPERTY,
    LAYOUT_PROPERTY,
    LAYOUT_PROVISIONAL_PROPERTY,
    OFFSETS_PROPERTY,
    TRUNCATES_PROPERTY,
    UNAVAILABLE_PROPERTY,
    UNAVAILABLE_UUID,
    UNAVAILABLE_VALUE,
    BronzeTables,
    count_unavailable,
    decode_offsets,
    truncates_total,
)
from ingest.config import Settings
from ingest.debezium.envelope import RawRecord
from ingest.errors import ConfigError
from ingest.lakehouse import load_catalog
from tests.conftest import FIXTURES, file_pipeline, ingest_file, make_settings, topic_counts
from tests.kafka_fixtures import bronze_coordinates

PG_DUMP = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
PG_MESSAGES_DUMP = FIXTURES / "debezium" / "postgres" / "messages.jsonl"
PG_INFINITY_DUMP = FIXTURES / "debezium" / "postgres" / "infinity.jsonl"


def rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    return list(load_catalog(settings).load_table(f"bronze.{table}").scan().to_arrow().to_pylist())


def test_real_postgres_stream_lands_once(lakehouse: Path) -> None:
    settings = make_settings(lakehouse)
    first = ingest_file(settings, PG_DUMP, max_records=7)  # several flushes
    assert first.stats.flushes > 1
    again = ingest_file(settings, PG_DUMP)  # a restart: everything is already in bronze
    assert again.stats.written == 0

    customers = rows(settings, "dbserver1_inventory_customers")
    expected = topic_counts(PG_DUMP)["dbserver1.inventory.customers"]
    assert len(customers) == expected
    assert sorted(r["_cdc_offset"] for r in customers) == list(range(expected))
    ops = [r["op"] for r in sorted(customers, key=lambda r: r["_cdc_offset"])]
    assert ops[:3] == ["r", "r", "r"]
    assert None in ops  # tombstones are kept raw
    update = next(r for r in customers if r["op"] == "u")
    assert update["before"] is not None
    assert update["after"]["id"] == update["key"]["id"]
    assert update["source"]["connector"] == "postgresql"
    assert len(update["_cdc_order"]) == 2

    transactions = rows(settings, "dbserver1_transaction")
    assert {r["status"] for r in transactions} == {"BEGIN", "END"}
    table = load_catalog(settings).load_table("bronze.dbserver1_inventory_customers")
    assert decode_offsets(table.properties[OFFSETS_PROPERTY]) == {("dbserver1.inventory.customers", 0): expected}
    # Offsets are also in the summary of the snapshot that wrote the data.
    assert OFFSETS_PROPERTY in table.current_snapshot().summary.additional_properties


def test_logical_decoding_messages_land_in_a_table_of_their_own(lakehouse: Path) -> None:
    """Debezium's PostgreSQL connector sends pg_logical_emit_message's messages (op m: a prefix and bytes, no
    images) to `<topic.prefix>.message`, which a topic_pattern for the server's topics takes in. Each was a dead
    letter (unknown op 'm'); they land now, typed, in a table whose kind says they are not changes (silver's
    scaffold leaves it out). Real Debezium 3.6 output."""
    settings = make_settings(lakehouse)
    ingest_file(settings, PG_MESSAGES_DUMP, max_records=2)
    assert not load_catalog(settings).table_exists(f"bronze.{DEAD_LETTER_TABLE}")
    table = load_catalog(settings).load_table("bronze.dbserver1_message")
    assert table.properties[KIND_PROPERTY] == "message"
    messages = sorted(rows(settings, "dbserver1_message"), key=lambda r: r["_cdc_offset"])
    assert [(m["key"]["prefix"], m["op"], m["message"]) for m in messages] == [
        ("outbox", "m", {"prefix": "outbox", "content": b"order 2 placed"}),
        ("audit", "m", {"prefix": "audit", "content": b"\x00\xff"}),
    ]
    assert messages[0]["transaction"]["total_order"] == 2
    assert messages[1]["transaction"] is None
    assert "_cdc_order" not in table.schema().column_names  # not a change: no position to order by
    orders = rows(settings, "dbserver1_inventory_orders")
    assert sorted((r["op"], r["after"]["id"]) for r in orders) == [("c", 2), ("r", 1)]
    assert ingest_file(settings, PG_MESSAGES_DUMP).stats.written == 0  # a restart lands nothing twice


def _postgres_text(value: str, date: bool) -> Any:
    """A date or timestamp as PostgreSQL prints it, as bronze lands it with ``infinite_timestamps: clamp``."""
    if value in ("infinity", "-infinity"):
        last = value == "infinity"
        if date:
            return dt.date(9999, 12, 31) if last else dt.date(1, 1, 1)
        return dt.datetime(9999, 12, 31, 23, 59, 59, 999999) if last else dt.datetime(1, 1, 1)
    return dt.date.fromisoformat(value) if date else dt.datetime.fromisoformat(value)


@pytest.mark.parametrize("copies", [1, 3], ids=["per-record", "fast-path"])
def test_postgres_infinity_is_dead_lettered_or_clamped_as_configured(
    lakehouse: Path, tmp_path: Path, copies: int
) -> None:
    """PostgreSQL's 'infinity' and '-infinity' (an open-ended `valid_to`), as Debezium 3.6 sends them from a
    snapshot and from the stream: by default the record is a dead letter whose error names the setting; with
    ``infinite_timestamps: clamp`` every record lands, infinity as the last instant years 1-9999 hold and
    '-infinity' as the first. ``copies`` repeats the table's records so a poll takes the fast path."""
    records = [orjson.loads(line) for line in PG_INFINITY_DUMP.read_bytes().splitlines()]
    changes = [r for r in records if r["topic"].endswith(".validity")]
    dump = write_dump(
        tmp_path / "infinity.jsonl",
        [(r["topic"], offset, r["key"], r["payload"]) for offset, r in enumerate(changes * copies)],
    )
    infinite = {0, 1, 2, 3}  # the snapshot's rows 1 and 4, the stream's 2 and 5; then finite values only
    assert all(("infinity" in r["payload"]) == (i in infinite) for i, r in enumerate(changes))

    settings = make_settings(lakehouse)
    ingest_file(settings, dump)
    dead = rows(settings, DEAD_LETTER_TABLE)
    assert sorted(r["_cdc_offset"] for r in dead) == sorted(
        offset for offset in range(len(changes) * copies) if offset % len(changes) in infinite
    )
    assert all("infinite_timestamps: clamp" in r["_cdc_error"] for r in dead), [r["_cdc_error"] for r in dead]

    clamped = make_settings(tmp_path / "clamped", ingest={"infinite_timestamps": "clamp"})
    ingest_file(clamped, dump)
    assert not load_catalog(clamped).table_exists(f"bronze.{DEAD_LETTER_TABLE}")
    landed = sorted(rows(clamped, "dbserver1_inventory_validity"), key=lambda r: r["_cdc_offset"])
    assert len(landed) == len(changes) * copies
    latest = {r["after"]["id"]: r["after"] for r in landed}
    source = orjson.loads(PG_INFINITY_DUMP.with_name("infinity_expected_final_state.json").read_bytes())["validity"]
    for key, row in source.items():
        expected = {
            "id": row["id"],
            "valid_from": _postgres_text(row["valid_from"], date=True),
            "valid_to": _postgres_text(row["valid_to"], date=True),
            "starts": _postgres_text(row["starts"], date=False),
            "ends": _postgres_text(row["ends"], date=False),
            "ends_ms": _postgres_text(row["ends_ms"], date=False),
            "ends_tz": _postgres_text(row["ends_tz"], date=False),
        }
        if expected["ends_tz"].tzinfo is None:  # an infinity: clamped in UTC
            expected["ends_tz"] = expected["ends_tz"].replace(tzinfo=dt.UTC)
        assert latest[int(key)] == expected, key
    first = landed[0]["after"]  # the snapshot's infinity, which the stream's update replaced
    assert (first["valid_to"], first["ends"], first["ends_tz"]) == (
        dt.date(9999, 12, 31),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    )


def test_a_warehouse_on_s3_lands_with_the_storage_settings(tmp_path: Path) -> None:
    """A warehouse on S3 (a local SeaweedFS): `lakehouse.storage` gives pyiceberg the endpoint and keys, which it
    had no way to get (cdclake passed it the catalog URI and the warehouse only). A restart lands nothing twice,
    and the secret key never shows in a redacted message."""
    from ingest.config import redact
    from ingest.testing.seaweed import ACCESS_KEY, REGION, SECRET_KEY, SeaweedS3

    with SeaweedS3(tmp_path / "seaweed", bucket="lakehouse") as s3:
        storage = {
            "s3.endpoint": s3.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }
        settings = make_settings(
            tmp_path / "lake",
            lakehouse={
                "warehouse": "s3a://lakehouse/warehouse",
                "catalog_uri": f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}",
                "storage": storage,
            },
        )
        ingest_file(settings, PG_DUMP)
        table = load_catalog(settings).load_table("bronze.dbserver1_inventory_customers")
        assert table.metadata_location.startswith("s3a://lakehouse/warehouse/bronze/")
        expected = topic_counts(PG_DUMP)["dbserver1.inventory.customers"]
        assert len(rows(settings, "dbserver1_inventory_customers")) == expected
        assert ingest_file(settings, PG_DUMP).stats.written == 0
        assert SECRET_KEY not in redact(f"failed with {SECRET_KEY}", settings)
    assert not (tmp_path / "lake" / "warehouse").exists()  # nothing went to a local folder of that name


def test_typed_values_become_real_types(lakehouse: Path) -> None:
    settings = make_settings(lakehouse)
    ingest_file(settings, PG_DUMP)
    schema = load_catalog(settings).load_table("bronze.dbserver1_inventory_typed_values").schema()
    after = {field.name: str(field.field_type) for field in schema.find_field("after").field_type.fields}
    assert after["c_numeric"] == "decimal(12, 3)"
    assert after["c_date"] == "date"
    assert after["c_timestamp"] == "timestamp"
    assert after["c_timestamptz"] == "timestamptz"
    assert after["c_bytea"] == "binary"
    assert after["c_bigint"] == "long"
    # The recorded row with a 40-digit unconstrained numeric cannot fit decimal(38, 10): dead letter, not rounding.
    dead = rows(settings, DEAD_LETTER_TABLE)
    assert dead, "expected the oversized numeric to be dead-lettered"
    assert all("c_numeric_any" in r["_cdc_error"] and "without rounding" in r["_cdc_error"] for r in dead)


def write_dump(path: Path, records: list[tuple[str, int, Any, Any]], partitions: list[int] | None = None) -> Path:
    """A kcat -J dump of ``records`` (topic, offset, key, value), all in partition 0 unless ``partitions`` says."""
    lines = []
    for index, (topic, offset, key, value) in enumerate(records):
        lines.append(
            orjson.dumps(
                {
                    "topic": topic,
                    "partition": 0 if partitions is None else partitions[index],
                    "offset": offset,
                    "ts": 1_700_000_000_000,
                    "key": None if key is None else (key if isinstance(key, str) else orjson.dumps(key).decode()),
                    "payload": None
                    if value is None
                    else (value if isinstance(value, str) else orjson.dumps(value).decode()),
                }
            )
        )
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def schema_record(
    fields: list[dict[str, Any]], after: dict[str, Any] | None, lsn: int, op: str = "c"
) -> dict[str, Any]:
    row_schema = {"type": "struct", "optional": True, "fields": fields, "name": "p.s.t.Value"}
    return {
        "schema": {
            "type": "struct",
            "name": "p.s.t.Envelope",
            "fields": [
                {**row_schema, "field": "before"},
                {**row_schema, "field": "after"},
                {
                    "type": "struct",
                    "field": "source",
                    "fields": [
                        {"type": "string", "field": "connector"},
                        {"type": "string", "field": "commit_lsn", "optional": True},
                        {"type": "string", "field": "change_lsn", "optional": True},
                    ],
                },
                {"type": "string", "field": "op"},
                {"type": "int64", "field": "ts_ms", "optional": True},
            ],
        },
        "payload": {
            "before": None,
            "after": after,
            "source": {"connector": "informix", "commit_lsn": str(lsn), "change_lsn": str(lsn)},
            "op": op,
            "ts_ms": 1,
        },
    }


ID = {"type": "int32", "field": "id"}
NAME = {"type": "string", "field": "name", "optional": True}


def key(i: int) -> dict[str, int]:
    return {"id": i}


def test_schema_evolution_and_type_conflicts(lakehouse: Path, tmp_path: Path) -> None:
    settings = make_settings(lakehouse)
    dump = write_dump(
        tmp_path / "evolve.jsonl",
        [
            ("p.s.t", 0, key(1), schema_record([ID], {"id": 1}, 10)),
            # A column added at the source: bronze gains it.
            ("p.s.t", 1, key(2), schema_record([ID, NAME], {"id": 2, "name": "x"}, 11)),
            # int32 -> int64 widens.
            ("p.s.t", 2, key(3), schema_record([{"type": "int64", "field": "id"}, NAME], {"id": 3, "name": "y"}, 12)),
            # name: string -> boolean cannot widen: dead letter naming table, column and both types.
            (
                "p.s.t",
                3,
                key(4),
                schema_record([ID, {"type": "boolean", "field": "name"}], {"id": 4, "name": True}, 13),
            ),
            ("p.s.t", 4, key(5), schema_record([ID, NAME], {"id": 5, "name": "z"}, 14)),
        ],
    )
    ingest_file(settings, dump, on_type_conflict="dead_letter")
    table = load_catalog(settings).load_table("bronze.p_s_t")
    after = table.schema().find_field("after").field_type
    assert {f.name: str(f.field_type) for f in after.fields} == {"id": "long", "name": "string"}
    data = table.scan().to_arrow()
    assert sorted(data.column("_cdc_offset").to_pylist()) == [0, 1, 2, 4]
    dead = rows(settings, DEAD_LETTER_TABLE)
    assert len(dead) == 1
    assert dead[0]["_cdc_offset"] == 3
    assert re.search(
        r"table bronze\.p_s_t: column (before|after)\.name changed type from string to bool", dead[0]["_cdc_error"]
    )


def test_kafka_headers_land_as_they_came_and_an_older_table_gains_their_column(lakehouse: Path, tmp_path: Path) -> None:
    """Bronze keeps each record's Kafka headers (kcat writes them as one flat array of names and values), in order,
    null for none. A null stays null at rest: pyiceberg 0.12 wrote an empty list (apache/iceberg-python#3833). A
    table written before bronze kept headers gains the column, null on its rows."""
    import pyarrow.parquet as pq

    settings = make_settings(lakehouse)
    ingest_file(settings, write_dump(tmp_path / "one.jsonl", [("p.s.t", 0, key(1), schema_record([ID], {"id": 1}, 9))]))
    with load_catalog(settings).load_table("bronze.p_s_t").update_schema() as update:
        update.delete_column("_cdc_headers")  # as a table written before bronze kept headers
    kcat_headers = {1: ["__debezium.oldkey", '{"id":1}', "x", None, "x", "2"], 2: None, 3: []}
    lines = []
    for offset, headers in kcat_headers.items():
        record = schema_record([ID], {"id": offset + 1}, 9 + offset)
        item = {
            "topic": "p.s.t",
            "partition": 0,
            "offset": offset,
            "ts": 1,
            "key": orjson.dumps(key(offset + 1)).decode(),
        }
        lines.append(orjson.dumps({**item, "payload": orjson.dumps(record).decode(), "headers": headers}))
    (tmp_path / "two.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ingest_file(settings, tmp_path / "two.jsonl")

    table = load_catalog(settings).load_table("bronze.p_s_t")
    landed = {row["_cdc_offset"]: row["_cdc_headers"] for row in table.scan().to_arrow().to_pylist()}
    oldkey = {"key": "__debezium.oldkey", "value": b'{"id":1}'}
    assert landed == {0: None, 1: [oldkey, {"key": "x", "value": None}, {"key": "x", "value": b"2"}], 2: None, 3: None}
    newest = max(table.scan().plan_files(), key=lambda task: task.file.record_count).file.file_path
    assert pq.read_table(newest.removeprefix("file://"), columns=["_cdc_headers"])["_cdc_headers"].null_count == 2


def test_changes_iceberg_cannot_evolve_to_are_dead_letters(lakehouse: Path, tmp_path: Path) -> None:
    """Found by a review of bronze's schema evolution: a map's key type widening (Iceberg never changes one: the
    commit raised pyiceberg's ValueError, on every restart) and a column named again in another case only (two
    columns Spark cannot tell apart) are dead letters naming the column, each in a flush of its own."""
    settings = make_settings(lakehouse)
    int_map = {"type": "map", "keys": {"type": "int32"}, "values": {"type": "string"}, "field": "m", "optional": True}
    long_map = {**int_map, "keys": {"type": "int64"}}
    dump = write_dump(
        tmp_path / "evolve.jsonl",
        [
            ("p.s.t", 0, key(1), schema_record([ID, int_map, NAME], {"id": 1, "m": [[1, "a"]], "name": "x"}, 10)),
            ("p.s.t", 1, key(2), schema_record([ID, long_map, NAME], {"id": 2, "m": [[2, "b"]], "name": "y"}, 11)),
            ("p.s.t", 2, key(3), schema_record([ID, {**NAME, "field": "Name"}], {"id": 3, "Name": "z"}, 12)),
            ("p.s.t", 3, key(4), schema_record([ID, int_map, NAME], {"id": 4, "m": [[4, "d"]], "name": "w"}, 13)),
        ],
    )
    ingest_file(settings, dump, max_records=1, on_type_conflict="dead_letter")
    data = load_catalog(settings).load_table("bronze.p_s_t").scan().to_arrow()
    assert sorted(data.column("_cdc_offset").to_pylist()) == [0, 3]
    errors = {letter["_cdc_offset"]: letter["_cdc_error"] for letter in rows(settings, DEAD_LETTER_TABLE)}
    assert sorted(errors) == [1, 2]
    assert re.search(
        r"column (before|after)\.m\.key changed type from int32 to int64; Iceberg never changes", errors[1]
    )
    assert re.search(r"column (before|after)\.Name differs from column (before|after)\.name only in case", errors[2])


def test_a_value_field_named_like_a_cdclake_column_is_a_dead_letter(lakehouse: Path, tmp_path: Path) -> None:
    """A top-level value field `_cdc_offset` (no Debezium envelope has one; another producer's may) replaced the
    record's Kafka offset: the commit then took the records for ones landed before and dropped them, silently."""
    settings = make_settings(lakehouse)
    records: list[tuple[str, int, Any, Any]] = [("p.s.t", 0, key(1), schema_record([ID], {"id": 1}, 10))]
    odd = schema_record([ID], {"id": 2}, 11)
    odd["schema"]["fields"].append({"type": "int64", "field": "_cdc_offset", "optional": True})
    odd["payload"]["_cdc_offset"] = 0
    records += [("p.s.t", 1, key(2), odd), ("p.s.t", 2, key(3), schema_record([ID], {"id": 3}, 12))]
    records.append(
        (
            "j.s.t",
            3,
            {"id": 4},
            {"after": {"id": 4}, "source": {"connector": "informix"}, "op": "c", "_cdc_topic": "other"},
        )
    )
    ingest_file(settings, write_dump(tmp_path / "reserved.jsonl", records))
    assert bronze_coordinates(settings) == Counter(
        {("p.s.t", 0, 0): 1, ("p.s.t", 0, 1): 1, ("p.s.t", 0, 2): 1, ("j.s.t", 0, 3): 1}
    )
    errors = {letter["_cdc_offset"]: letter["_cdc_error"] for letter in rows(settings, DEAD_LETTER_TABLE)}
    assert errors == {
        1: "value field _cdc_offset has the name of one of cdclake's own columns",
        3: "value field _cdc_topic has the name of one of cdclake's own columns",
    }


def test_type_conflict_can_stop_the_service(lakehouse: Path, tmp_path: Path) -> None:
    from ingest.errors import TypeConflictError

    settings = make_settings(lakehouse)
    dump = write_dump(
        tmp_path / "flip.jsonl",
        [
            ("p.s.t", 0, {"id": 1}, schema_record([ID, NAME], {"id": 1, "name": "a"}, 1)),
            (
                "p.s.t",
                1,
                {"id": 2},
                schema_record([ID, {"type": "boolean", "field": "name"}], {"id": 2, "name": True}, 2),
            ),
        ],
    )
    # The record and the setting named (the message named only the table and the column).
    with pytest.raises(
        TypeConflictError,
        match=r"^p\.s\.t\[0\]@1: table bronze\.p_s_t: column (before|after)\.name .*ingest\.on_type_conflict is 'fail'",
    ):
        ingest_file(settings, dump, on_type_conflict="fail")


def test_a_dump_appended_twice_lands_each_record_once(
    lakehouse: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets must increase within a partition, as Kafka delivers them: a dump appended to itself (``>>``) or a
    range repeated out of order lands each record once, and the skipped records are reported."""
    settings = make_settings(lakehouse)
    dump = tmp_path / "twice.jsonl"
    lines = PG_DUMP.read_bytes().splitlines(keepends=True)
    dump.write_bytes(b"".join([*lines, *lines[5:9], *lines]))
    with caplog.at_level("WARNING", logger="ingest.sources.file"):
        pipeline = ingest_file(settings, dump, max_records=7)
    assert pipeline.source.repeated == len(lines) + 4  # type: ignore[attr-defined]
    assert "offsets must increase within a partition" in caplog.text
    expected = Counter((topic, 0, offset) for topic, count in topic_counts(PG_DUMP).items() for offset in range(count))
    assert bronze_coordinates(settings) == expected  # every record once, dead letters included


def every_pg_record() -> Counter[tuple[str, int, int]]:
    return Counter((topic, 0, offset) for topic, count in topic_counts(PG_DUMP).items() for offset in range(count))


def test_an_unfinished_last_line_is_read_once_it_is_whole(
    lakehouse: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kcat writes its output in blocks: a dump it is still writing ends inside a line. That line stopped ingest
    ("not a kcat -J JSON line"), and the complete records before it, in the same poll, never landed."""
    settings = make_settings(lakehouse)
    dump = tmp_path / "growing.jsonl"
    data = PG_DUMP.read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 40  # 40 bytes into a line
    dump.write_bytes(data[:cut])
    with caplog.at_level("WARNING", logger="ingest.sources.file"):
        ingest_file(settings, dump)
    complete = data[:cut].count(b"\n")
    assert sum(bronze_coordinates(settings).values()) == complete
    assert f"growing.jsonl:{complete + 1}: the last line is unfinished" in caplog.text
    dump.write_bytes(data)  # kcat wrote the rest
    ingest_file(settings, dump)
    assert bronze_coordinates(settings) == every_pg_record()


def test_a_dump_followed_as_kcat_writes_it_names_its_lines_right(tmp_path: Path) -> None:
    """The service follows a dump kcat is writing: a line that arrives in pieces is one line (the pieces counted as
    lines moved every later line number in messages), and a last line that is JSON but fails a check is refused for
    its reason, not waited for as unfinished."""
    from ingest.sources.file import FileSource

    lines = PG_DUMP.read_bytes().splitlines(keepends=True)
    dump = tmp_path / "followed.jsonl"
    dump.write_bytes(b"".join(lines[:2]))
    source = FileSource(dump)
    source.start(lambda topic, partition: None)
    assert len(source.poll(100, 0)) == 2
    polled = []
    for piece in (lines[2][:30], lines[2][30:60], lines[2][60:]):
        with dump.open("ab") as handle:
            handle.write(piece)
        polled.append(source.poll(100, 0))
    assert [len(batch) for batch in polled] == [0, 0, 1]  # the line once whole, and its record
    assert polled[-1][0].offset == orjson.loads(lines[2])["offset"]
    with dump.open("ab") as handle:
        handle.write(lines[3].rstrip(b"\n"))  # a whole line, its newline to come
    assert len(source.poll(100, 0)) == 1
    with dump.open("ab") as handle:
        handle.write(b'\n{"topic":"t","partition":0,"offset":1,"key":null,"payload":null,"payload_error":"x"}')
    with pytest.raises(ConfigError, match=r"followed\.jsonl:5: kcat could not deserialize the record"):
        source.poll(100, 0)
    source.close()
    gzipped = tmp_path / "dump.jsonl.gz"
    gzipped.write_bytes(b"\x1f\x8b\x08\x00")  # no newline: not a line kcat is still writing
    source = FileSource(gzipped)
    source.start(lambda topic, partition: None)
    with pytest.raises(ConfigError, match=r"decompress it first"):
        source.poll(100, 0)
    source.close()


@pytest.mark.parametrize("order", ["later_range_first", "middle_range_last"])
def test_a_dump_out_of_order_stops_instead_of_losing_records(lakehouse: Path, tmp_path: Path, order: str) -> None:
    """Two dumps of a partition concatenated the wrong way round (`cat later.jsonl earlier.jsonl`), or a middle
    range put last: the records came after offsets read already and were skipped as repeats, while bronze's offset
    moved past them, so they were lost for good, with only a warning (the middle range even when the first check
    came: it stopped only on offsets below every offset read)."""
    settings = make_settings(lakehouse)
    lines = [line for line in PG_DUMP.read_bytes().splitlines(keepends=True) if b'"partition":0' in line]
    customers = [line for line in lines if orjson.loads(line)["topic"] == "dbserver1.inventory.customers"]
    dump = tmp_path / "reordered.jsonl"
    if order == "later_range_first":
        dump.write_bytes(b"".join([*customers[4:], *customers[:4]]))
        first_unread = 0
    else:
        dump.write_bytes(b"".join([*customers[:2], *customers[5:], *customers[2:5]]))
        first_unread = 2
    with pytest.raises(
        ConfigError,
        match=rf"reordered\.jsonl:\d+: dbserver1\.inventory\.customers\[0\] offset {first_unread} "
        r"comes after offset \d+, and this dump has not had it before: the dump is out of order",
    ):
        ingest_file(settings, dump)
    assert not bronze_coordinates(settings)
    dump.write_bytes(b"".join(customers))
    ingest_file(settings, dump)
    assert set(bronze_coordinates(settings)) == {("dbserver1.inventory.customers", 0, o) for o in range(len(customers))}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            b'{"topic":"t","partition":0,"offset":3,"key":null,"payload":null,"payload_error":"schema id 42 gone"}',
            r"kcat could not deserialize the record \(payload_error: schema id 42 gone\)",
        ),
        (
            b'{"topic":"t","partition":0,"offset":3,"key":null,"value":"{}"}',
            r"missing 'payload' \(null for a tombstone\)",
        ),
        (
            b'{"topic":"t","partition":0,"offset":3,"key":null,"payload":{"op":"c"}}',
            r"'payload' must be a string or null, not a JSON object \(kcat deserializes with -s",
        ),
        (
            b'{"topic":"t","partition":0,"offset":3,"key":"\xff","payl',
            r"not a kcat -J JSON line \((?!str is not valid UTF-8)",
        ),
        (b"\x1f\x8b\x08\x00", r"not a kcat -J JSON line .* \(a gzip-compressed dump: decompress it first\)$"),
        # beyond Kafka's int32 partitions: used to fail the commit of every flush with Arrow's error, naming nothing
        (
            b'{"topic":"t","partition":2147483648,"offset":3,"key":null,"payload":null}',
            r"partition 2147483648 or offset 3 out of Kafka's range",
        ),
        (b'{"topic":"t","partition":0,"offset":-1,"key":null,"payload":null}', r"partition 0 or offset -1 out of"),
        (
            b'{"topic":"t","partition":0,"offset":3,"key":null,"payload":null,"headers":["a","1","b"]}',
            r"'headers' must be kcat's flat array of names and values$",
        ),
        (
            b'{"topic":"t","partition":0,"offset":3,"key":null,"payload":null,"headers":["a","1",2,"x"]}',
            r"header name 1 must be a string, not a JSON int$",
        ),
    ],
    ids=[
        "payload-error",
        "no-payload",
        "deserialized",
        "cut-short",
        "gzip",
        "partition-range",
        "negative-offset",
        "odd-headers",
        "header-name",
    ],
)
def test_lines_without_the_records_bytes_stop_ingest_naming_why(line: bytes, reason: str) -> None:
    """A record kcat could not deserialize (-s) has a null payload and a payload_error: it landed as a tombstone,
    silently dropping a change (as did a line without a payload). A broken line with bytes that are not UTF-8 was
    blamed on UTF-8. Coordinates beyond Kafka's types failed at the commit."""
    from ingest.sources.file import parse_line

    with pytest.raises(ConfigError, match=r"^dump\.jsonl:7: " + reason):
        parse_line(line + b"\n", "dump.jsonl:7")


def test_a_named_pipe_is_a_dump(lakehouse: Path, tmp_path: Path) -> None:
    """`kcat -C -J ... > fifo` feeding ingest: a named pipe was refused as "file not found"."""
    import os
    import threading

    settings = make_settings(lakehouse)
    fifo = tmp_path / "dump.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(PG_DUMP.read_bytes(),), daemon=True)
    writer.start()
    ingest_file(settings, fifo)
    writer.join(10)
    assert bronze_coordinates(settings) == every_pg_record()


def test_a_crash_after_the_dead_letter_commit_keeps_each_record_in_one_table(lakehouse: Path, tmp_path: Path) -> None:
    """Dead letters commit before the data tables. The process dies in between: on restart the records after the
    data table's offsets are read again, and one that decoded the first time (its schema elided, typed with the
    topic's remembered schema) fails now that nothing is remembered. It becomes a dead letter, although it lies
    below the dead-letter table's offsets; the record already there is not written again, in either table."""
    from ingest.errors import CommitError

    settings = make_settings(lakehouse)
    elided = schema_record([ID, NAME], {"id": 4, "name": "d"}, 4)["payload"]  # its Connect schema left out
    dump = write_dump(
        tmp_path / "crash.jsonl",
        [
            ("p.s.t", 0, key(1), schema_record([ID, NAME], {"id": 1, "name": "a"}, 1)),
            ("p.s.t", 1, key(2), schema_record([ID, NAME], {"id": 2, "name": "b"}, 2)),
            ("p.s.t", 2, key(3), schema_record([ID, NAME], {"id": 3, "name": "c"}, 3)),
            ("p.s.t", 3, key(4), elided),
            ("p.s.t", 4, key(5), '{"schema": {"type": "struct"'),  # truncated: a dead letter either way
        ],
    )
    pipeline = file_pipeline(settings, dump, max_records=3)  # flushes: offsets 0-2, then 3 and 4
    commit = pipeline.tables.commit
    data_commits: list[int] = []

    def dies_after_dead_letters(batch: Any, on_retry: Any = None) -> int:
        if batch.name != DEAD_LETTER_TABLE:
            data_commits.append(1)
            if len(data_commits) == 2:
                raise CommitError("killed between the dead-letter commit and the data table's")
        return commit(batch, on_retry)

    pipeline.tables.commit = dies_after_dead_letters  # type: ignore[method-assign]
    with pytest.raises(CommitError, match="killed"):
        pipeline.run(once=True)
    assert [r["_cdc_offset"] for r in rows(settings, "p_s_t")] == [0, 1, 2]
    assert [r["_cdc_offset"] for r in rows(settings, DEAD_LETTER_TABLE)] == [4]
    # Offset 4 decodes on the restart (here: repaired in the dump): it is a dead letter already, and stays one only.
    lines = dump.read_bytes().splitlines(keepends=True)
    repaired = write_dump(tmp_path / "repaired.jsonl", [("p.s.t", 4, key(5), schema_record([ID, NAME], {"id": 5}, 5))])
    dump.write_bytes(b"".join([*lines[:4], repaired.read_bytes()]))
    ingest_file(settings, dump)  # the restart: the topic's schema is not remembered for offset 3 now
    data = sorted(r["_cdc_offset"] for r in rows(settings, "p_s_t"))
    dead = sorted(r["_cdc_offset"] for r in rows(settings, DEAD_LETTER_TABLE))
    assert data == [0, 1, 2]
    assert dead == [3, 4]


def test_a_type_conflict_with_a_buffered_record_is_a_dead_letter_after_a_reload(
    lakehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record typing a new column is buffered; then the table's state is reloaded from the catalog (here: a new
    partition shows up, as after a rebalance or a commit). A later record giving that column a type it cannot widen
    to is a dead letter, as it is without the reload: the reload keeps what the buffer holds."""
    import ingest.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "POLL_BATCH", 1)  # each record is booked before the next is read
    settings = make_settings(lakehouse)
    boolean_name = {"type": "boolean", "field": "name", "optional": True}
    dump = write_dump(
        tmp_path / "two_partitions.jsonl",
        [
            ("p.s.t", 0, key(1), schema_record([ID, NAME], {"id": 1, "name": "a"}, 1)),
            ("p.s.t", 0, key(2), schema_record([ID, boolean_name], {"id": 2, "name": True}, 2)),
        ],
        partitions=[0, 1],
    )
    ingest_file(settings, dump, on_type_conflict="dead_letter")
    data = load_catalog(settings).load_table("bronze.p_s_t").scan().to_arrow()
    assert data.select(["_cdc_partition", "_cdc_offset"]).to_pylist() == [{"_cdc_partition": 0, "_cdc_offset": 0}]
    dead = rows(settings, DEAD_LETTER_TABLE)
    assert [(r["_cdc_partition"], r["_cdc_offset"]) for r in dead] == [(1, 0)]
    assert re.search(r"column (before|after)\.name changed type from string to bool", dead[0]["_cdc_error"])


def test_a_negative_scale_decimal_lands(lakehouse: Path, tmp_path: Path) -> None:
    """Oracle NUMBER(20,-2) (a Connect Decimal of scale -2) lands as decimal(22, 0) with the values it stands for;
    the Parquet write used to fail on the negative scale at commit, which stopped the ingester."""
    import base64
    import decimal

    settings = make_settings(lakehouse)
    amount = {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "-2", "connect.decimal.precision": "20"},
        "field": "amount",
        "optional": True,
    }
    five = base64.b64encode((5).to_bytes(1, "big", signed=True)).decode()
    dump = write_dump(
        tmp_path / "negative.jsonl", [("p.s.t", 0, key(1), schema_record([ID, amount], {"id": 1, "amount": five}, 1))]
    )
    ingest_file(settings, dump)
    assert [row["after"]["amount"] for row in rows(settings, "p_s_t")] == [decimal.Decimal(500)]
    assert not load_catalog(settings).table_exists(f"bronze.{DEAD_LETTER_TABLE}")


def test_bad_input_goes_to_dead_letters_and_the_rest_lands(lakehouse: Path, tmp_path: Path) -> None:
    settings = make_settings(lakehouse)
    source = {"connector": "informix", "commit_lsn": "1", "change_lsn": "1"}
    good = {"op": "c", "after": {"id": 1}, "source": source}
    hostile_topic = "x`; DROP TABLE bronze.p_s_t; --"
    dump = write_dump(
        tmp_path / "bad.jsonl",
        [
            ("p.s.t", 0, {"id": 1}, good),
            ("p.s.t", 1, {"id": 1}, '{"op": "c", "after": {"id"'),  # truncated JSON
            ("p.s.t", 2, {"id": 1}, {"after": {"id": 1}, "source": source}),  # no op
            ("p.s.t", 3, {"id": 1}, {**good, "op": "z"}),  # unknown op
            ("p.s.t", 4, {"id": 1}, {**good, "source": {"connector": "nope"}}),  # lands, by Kafka offset
            ("p.s.t", 5, {"id": 9}, good),  # key does not match value
            ("p.s.t", 6, {"id": 1}, {**good, "source": {**source, "commit_lsn": "0x1F"}}),  # malformed position
            ("p.s.t", 7, {"id": 2}, {**good, "after": {"id": 2}}),
            (hostile_topic, 0, {"id": 1}, good),
        ],
    )
    pipeline = ingest_file(settings, dump)
    assert pipeline.stats.records_in == 9
    assert pipeline.stats.written + pipeline.stats.dead_letters == 9
    dead = {r["_cdc_offset"]: r["_cdc_error"] for r in rows(settings, DEAD_LETTER_TABLE) if r["_cdc_topic"] == "p.s.t"}
    assert set(dead) == {1, 2, 3, 5, 6}
    assert "not valid JSON" in dead[1]
    assert "no 'op' field" in dead[2]
    assert "unknown op 'z'" in dead[3]
    assert "does not match" in dead[5]
    assert "commit_lsn='0x1F'" in dead[6]
    raw = next(r for r in rows(settings, DEAD_LETTER_TABLE) if r["_cdc_offset"] == 1)
    assert raw["_cdc_raw_value"] == b'{"op": "c", "after": {"id"'
    # The hostile topic became a harmless identifier; the targeted table still holds its rows.
    tables = BronzeTables(load_catalog(settings), "bronze").list_tables()
    assert "x___drop_table_bronze_p_s_t____" in tables
    landed = {row["_cdc_offset"]: row["_cdc_order"] for row in rows(settings, "p_s_t")}
    # Informix ends with transaction.total_order (-1: none); a connector it knows no position of: its Kafka offset
    assert landed == {0: [1, 1, -1], 4: [4], 7: [1, 1, -1]}
    # A restart re-reads nothing into either table.
    again = ingest_file(settings, dump)
    assert again.stats.written == 0
    assert again.stats.dead_letters == 0


def test_schemaless_records_keep_json_text(lakehouse: Path, tmp_path: Path) -> None:
    settings = make_settings(lakehouse)
    source = {"connector": "oracle", "scn": "5", "commit_scn": "6"}
    dump = write_dump(
        tmp_path / "plain.jsonl",
        [("o.s.t", 0, {"ID": 1}, {"op": "c", "after": {"ID": 1, "N": 1.5}, "source": source, "ts_ms": 3})],
    )
    ingest_file(settings, dump)
    row = rows(settings, "o_s_t")[0]
    assert row["after"] == '{"ID":1,"N":1.5}'
    assert row["op"] == "c"
    assert row["ts_ms"] == 3
    assert row["_cdc_order"] == [6, 5, -1]  # no transaction block: -1


@pytest.mark.parametrize("source", ["db2", "informix", "oracle", "mongodb"])
def test_seed_examples_land_typed(lakehouse: Path, source: str) -> None:
    """The connector docs' own events: the create has a schema, updates/deletes have it elided and are read with
    the topic's last schema. MongoDB's carry fields the create's schema lacks: dead letters naming them."""
    settings = make_settings(lakehouse)
    dump = FIXTURES / "debezium" / "seeds" / f"{source}.jsonl"
    pipeline = ingest_file(settings, dump)
    lines = len(dump.read_bytes().splitlines())
    assert pipeline.stats.written + pipeline.stats.dead_letters == lines
    if source == "mongodb":
        reasons = [r["_cdc_error"] for r in rows(settings, DEAD_LETTER_TABLE)]
        assert len(reasons) == 3
        assert all("not in the record's schema" in reason for reason in reasons)
    else:
        assert pipeline.stats.dead_letters == 0
    topic = orjson.loads(dump.read_bytes().splitlines()[0])["topic"]
    landed = sorted(rows(settings, topic.lower().replace(".", "_")), key=lambda r: r["_cdc_offset"])
    ops = [r["op"] for r in landed]
    assert ops[0] == "c"
    assert ops[-1] is None  # the tombstone after the delete
    assert source == "mongodb" or "d" in ops
    orders = [r["_cdc_order"] for r in landed if r["op"] is not None]
    assert orders == sorted(orders), f"{source}: positions must increase in stream order"
    # The seeds' boolean source.snapshot is kept as the text later connectors send (test_fast_path.py: an upgrade).
    table = load_catalog(settings).load_table(f"bronze.{topic.lower().replace('.', '_')}")
    assert str(table.schema().find_field("source.snapshot").field_type) == "string"
    assert {r["source"]["snapshot"] for r in landed if r["source"] is not None} == {"false"}


@pytest.mark.filterwarnings("ignore:Merge on read is not yet supported")  # pyiceberg's delete of a whole file
def land_and_read_count(settings: Settings, topic: Any, changes: list[Any], directory: Path, key: str) -> str | None:
    """Land ``changes`` (silver_harness Changes of ``topic``) and read the running count ``key`` from the summary of
    bronze's newest snapshot."""
    path = directory / f"{topic.table}-{topic.next_offset}.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in topic.records(changes)) + b"\n")
    ingest_file(settings, path)
    table = load_catalog(settings).load_table(f"bronze.{topic.table}")
    total: str | None = table.current_snapshot().summary.get(key)
    return total


def test_snapshots_keep_a_running_count_of_unavailable_values(lakehouse: Path, tmp_path: Path) -> None:
    """`cdclake.unavailable-total` counts the updates whose image holds Debezium's placeholder for a value it did
    not read (an unchanged TOAST column): a text column only, and only in updates."""
    from tests.silver_harness import Change, Topic

    settings = make_settings(lakehouse)
    topic = Topic("ifx.counts.toast")

    def land(changes: list[Change]) -> str | None:
        count: str | None = land_and_read_count(settings, topic, changes, tmp_path, UNAVAILABLE_PROPERTY)
        return count

    assert land([Change("c", 1, 1, "a"), Change("c", 2, 2, UNAVAILABLE_VALUE)]) == "0"  # an insert's value is one
    assert land([Change("u", 1, 3, UNAVAILABLE_VALUE), Change("u", 2, 4, "b"), Change("u", 2, 5, None)]) == "1"
    assert land([Change("u", 1, 6, UNAVAILABLE_VALUE), Change("d", 2, 7)]) == "2"


def test_unavailable_values_are_counted_in_text_bytes_and_arrays() -> None:
    """Debezium writes the placeholder as the text, as its bytes, as a text array's only element, as an integer
    array of its bytes (DBZ-5936), as a uuid array holding its UUID (DBZ-6720) or as an hstore of it to itself
    (DBZ-7582; JSON text or a map); an empty or null array or map is no placeholder (and must not fail the count:
    it runs in every commit), nor is a slice's row before the slice."""
    placeholder = UNAVAILABLE_VALUE
    codes = list(placeholder.encode())
    fields = [
        ("s", pa.string()),
        ("b", pa.binary()),
        ("tags", pa.list_(pa.string())),
        ("scores", pa.list_(pa.int32())),
        ("attrs", pa.map_(pa.string(), pa.string())),
        ("n", pa.int64()),
    ]
    rows = [
        {"s": placeholder, "b": None, "tags": [], "scores": [], "attrs": [], "n": 1},  # an update: counted
        {"s": "x", "b": placeholder.encode(), "tags": None, "scores": None, "attrs": None, "n": 2},  # counted
        {"s": "x", "b": None, "tags": [placeholder], "scores": [1], "attrs": [("k", "v")], "n": 3},  # counted
        {"s": "x", "b": None, "tags": [placeholder, "y"], "scores": codes[:-1], "attrs": None, "n": 4},
        {"s": None, "b": None, "tags": ["a"], "scores": [*codes[:-1], 0], "attrs": [(placeholder, "v")], "n": 5},
        {"s": placeholder, "b": None, "tags": [], "scores": None, "attrs": None, "n": 6},  # an insert: its value
        {"s": "x", "b": None, "tags": None, "scores": codes, "attrs": None, "n": 7},  # counted
        {"s": "x", "b": None, "tags": [UNAVAILABLE_UUID], "scores": [], "attrs": None, "n": 8},  # counted (uuid[])
        {"s": "x", "b": None, "tags": None, "scores": None, "attrs": [(placeholder, placeholder)], "n": 9},  # counted
        {"s": "x", "b": None, "tags": None, "scores": None, "attrs": [(placeholder, None)], "n": 10},
        {"s": "x", "b": None, "tags": None, "scores": None, "attrs": [(placeholder, placeholder), ("k", "v")], "n": 11},
        {"s": f'{{"{placeholder}":"{placeholder}"}}', "b": None, "tags": None, "scores": None, "attrs": None, "n": 12},
    ]
    ops = ["u", "u", "u", "u", "u", "c", "u", "u", "u", "u", "u", "u"]
    data = pa.table({"op": ops, "after": pa.array(rows, pa.struct(fields))})
    assert count_unavailable(data) == 7  # the last one: an hstore as JSON text (hstore.handling.mode=json)
    assert [count_unavailable(data.slice(start)) for start in (1, 7, 8, 9)] == [6, 3, 2, 1]
    # A map with other keys than text is no hstore (and must not fail the commit either).
    int_keyed = pa.struct([("m", pa.map_(pa.int32(), pa.string()))])
    assert count_unavailable(pa.table({"op": ["u"], "after": pa.array([{"m": [(1, placeholder)]}], int_keyed)})) == 0
    assert UNAVAILABLE_UUID == "b68a35a7-17ad-35b3-af2a-ae46edb4545a"  # Debezium's, for the default placeholder
    # A primary-key change's create (its `__debezium.oldkey` header) counts as an update does; another create not.
    moved = [{"key": "x", "value": None}, {"key": "__debezium.oldkey", "value": b'{"id":1}'}]
    headers = pa.array([moved, [{"key": "x", "value": b"1"}], None, moved], HEADERS_TYPE)
    creates = pa.table(
        {"op": ["c", "c", "c", "u"], "after": pa.array([{"s": placeholder}] * 4), "_cdc_headers": headers}
    )
    assert count_unavailable(creates) == 2


# The test deletes rows with pyiceberg, which writes copy-on-write deletes where the table asks for merge-on-read.
@pytest.mark.filterwarnings("ignore:Merge on read is not yet supported:UserWarning")
def test_snapshots_keep_a_running_count_of_truncates(lakehouse: Path, tmp_path: Path) -> None:
    """Every bronze append records `cdclake.truncates-total` (the truncates of all appends so far) in its snapshot
    summary, which tells silver whether a unit of work holds one. After an append by another writer the count is
    unknown, and stays unknown (silver then reads its units for truncates)."""
    from tests.silver_harness import Change, Topic

    settings = make_settings(lakehouse)
    topic = Topic("ifx.counts.orders")

    def land(changes: list[Change]) -> str | None:
        count: str | None = land_and_read_count(settings, topic, changes, tmp_path, TRUNCATES_PROPERTY)
        return count

    assert land([Change("c", 1, 1, "a"), Change("c", 2, 2, "b")]) == "0"
    assert land([Change("t", 0, 3), Change("c", 3, 4, "c"), Change("t", 0, 5)]) == "2"
    assert land([Change("u", 3, 6, "c2")]) == "2"
    assert land([Change("t", 0, 7)]) == "3"
    table = load_catalog(settings).load_table(f"bronze.{topic.table}")
    table.delete("_cdc_offset < 2")  # the first append's whole file: a delete snapshot, which adds no row
    assert table.current_snapshot().summary.operation == Operation.DELETE
    assert truncates_total(table) == 3
    assert land([Change("t", 0, 8)]) == "4"
    table = load_catalog(settings).load_table(f"bronze.{topic.table}")
    table.append(table.scan(row_filter="op = 'c'", limit=1).to_arrow())  # another writer: no count
    assert truncates_total(load_catalog(settings).load_table(f"bronze.{topic.table}")) is None
    assert land([Change("u", 3, 8, "c3")]) is None


def test_snapshots_record_whether_changes_land_in_order(lakehouse: Path, tmp_path: Path) -> None:
    """Every bronze append records the greatest `_cdc_order` so far (`cdclake.order-max`) and counts the appends
    holding a change not newer than it (`cdclake.order-regressions-total`), which tells silver whether a unit of
    work can hold a change older than one it applied. Truncates and tombstones carry no order that counts. After
    an append by another writer both are unknown, and stay unknown."""
    from tests.silver_harness import Change, Topic

    settings = make_settings(lakehouse)
    topic = Topic("ifx.counts.ordered")

    def land(changes: list[Change]) -> tuple[str | None, str | None]:
        regressions = land_and_read_count(settings, topic, changes, tmp_path, ORDER_REGRESSIONS_PROPERTY)
        table = load_catalog(settings).load_table(f"bronze.{topic.table}")
        return table.current_snapshot().summary.get(ORDER_MAX_PROPERTY), regressions

    assert land([Change("c", 1, 5, "a"), Change("c", 2, 3, "b")]) == ("[5,5,-1]", "0")  # out of order within one
    assert land([Change("u", 1, 6, "a2"), Change("d", 2, 7)]) == ("[7,7,-1]", "0")  # its tombstone: no order
    assert land([Change("t", 0, 2)]) == ("[7,7,-1]", "0")  # a truncate is not looked up by key
    assert land([Change("u", 1, 9, "a3"), Change("c", 3, 7, "c")]) == ("[9,9,-1]", "1")  # 7 again: not newer
    assert land([Change("u", 3, 8, "c2")]) == ("[9,9,-1]", "2")  # a late change
    assert land([Change("u", 3, 10, "c3")]) == ("[10,10,-1]", "2")
    table = load_catalog(settings).load_table(f"bronze.{topic.table}")
    table.append(table.scan(row_filter="op = 'c'", limit=1).to_arrow())  # another writer: unknown from now on
    assert land([Change("u", 3, 11, "c4")]) == (None, None)


def test_order_bounds_compare_as_spark_compares_arrays() -> None:
    """The least and greatest order of a batch's changes: element by element, a null element first, then the
    shorter array first (Spark's ordering, which silver's position comparison uses); changes without an order are
    reported, and an append holding one counts as a regression (silver ranks it below every position)."""
    evens = pa.table(
        {"op": ["c", "u", "t", "d", None, "r"], "_cdc_order": [[5, 1], [5, 3], None, [2, 9], None, [7, 0]]}
    )
    assert order_bounds(evens) == (((2, 9), (7, 0)), False)
    uneven = pa.table({"op": ["c", "u", "u"], "_cdc_order": [[5, None], [5], [4, 8, 1]]})
    assert order_bounds(uneven) == (((4, 8, 1), (5, None)), False)
    with_null = pa.table({"op": ["u", "u"], "_cdc_order": [None, [3, 0]]})
    assert order_bounds(with_null) == (((3, 0), (3, 0)), True)
    assert order_bounds(pa.table({"op": ["t"], "_cdc_order": [[1, 1]]})) == (None, False)
    assert order_bounds(pa.table({"id": [1]})) == (None, False)
    assert order_summary(evens, "null", 0) == {ORDER_MAX_PROPERTY: "[7,0]", ORDER_REGRESSIONS_PROPERTY: "0"}
    assert order_summary(evens, "[2,9]", 4) == {ORDER_MAX_PROPERTY: "[7,0]", ORDER_REGRESSIONS_PROPERTY: "5"}
    assert order_summary(evens, "[2,8]", 4) == {ORDER_MAX_PROPERTY: "[7,0]", ORDER_REGRESSIONS_PROPERTY: "4"}
    assert order_summary(evens, "[8]", 4) == {ORDER_MAX_PROPERTY: "[8]", ORDER_REGRESSIONS_PROPERTY: "5"}
    assert order_summary(with_null, "[1,0]", 0) == {ORDER_MAX_PROPERTY: "[3,0]", ORDER_REGRESSIONS_PROPERTY: "1"}
    assert order_summary(evens, None, 0) == {}
    assert order_summary(evens, "[1]", None) == {}


@pytest.mark.parametrize(
    ("source", "followed"),
    [
        ({}, {"dbserver1.transaction", "dbserver1.inventory.customers", "dbserver1.inventory.typed_values"}),
        ({"topics": ["dbserver1.inventory.customers"]}, {"dbserver1.inventory.customers"}),
        (
            {"topic_pattern": r"dbserver1\.inventory\..*"},
            {"dbserver1.inventory.customers", "dbserver1.inventory.typed_values"},
        ),
        ({"topic_pattern": r"inventory"}, set()),  # anchored at the name's start, as the Kafka source subscribes
    ],
)
def test_a_file_source_reads_the_topics_the_configuration_follows(
    lakehouse: Path, source: dict[str, Any], followed: set[str]
) -> None:
    """source.topics / source.topic_pattern select from a dump as from a cluster (they used to be ignored)."""
    from ingest.cli.ingest_cmd import build_pipeline

    settings = make_settings(lakehouse, source={"type": "file", "path": str(PG_DUMP), **source})
    pipeline = build_pipeline(settings)
    pipeline.source.start(lambda topic, partition: None)
    read: Counter[str] = Counter()
    while batch := pipeline.source.poll(10, 0.0):
        read.update(record.topic for record in batch)
    pipeline.source.close()
    expected = {topic: count for topic, count in topic_counts(PG_DUMP).items() if topic in followed}
    assert dict(read) == expected


@pytest.mark.parametrize(("configured", "once", "waited"), [(2.5, False, 2.5), (0.05, False, 0.05), (2.5, True, 0.2)])
def test_source_poll_timeout_is_the_wait_of_each_poll(
    lakehouse: Path, configured: float, once: bool, waited: float
) -> None:
    """source.poll_timeout_s is how long one poll waits for records (it was accepted and ignored: always 1 s);
    --once waits at most 0.2 s, since it exits once every partition is read to its end."""
    from ingest.cli.ingest_cmd import build_pipeline

    settings = make_settings(lakehouse, source={"type": "file", "path": str(PG_DUMP), "poll_timeout_s": configured})
    pipeline = build_pipeline(settings)
    timeouts: list[float] = []

    def poll(max_records: int, timeout_s: float) -> list[Any]:
        timeouts.append(timeout_s)
        return []

    pipeline.source.poll = poll  # type: ignore[method-assign]
    assert pipeline._read(once) == []
    assert timeouts == [waited]


@pytest.mark.parametrize("lines", [3, None], ids=["a-few-records", "whole-dump"])
def test_a_drained_dump_waits_from_its_second_empty_poll(
    lakehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: int | None
) -> None:
    """The poll that finds a dump's end returns at once, so `--once` stops there (a dump of fewer records than the
    fast path takes waited the 0.2 s of a `--once` poll first, each run); a service following the dump waits its
    timeout from the next empty poll on instead of spinning a core."""
    import ingest.sources.file as file_source
    from ingest.cli.ingest_cmd import build_pipeline

    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(b"".join(PG_DUMP.read_bytes().splitlines(keepends=True)[:lines]))
    slept: list[float] = []
    # The file source's clock only (the module uses `time.sleep` alone), not every thread's.
    monkeypatch.setattr(file_source, "time", SimpleNamespace(sleep=slept.append))
    settings = make_settings(lakehouse, source={"type": "file", "path": str(dump)})
    stats = build_pipeline(settings).run(once=True)
    assert stats.records_in == len(dump.read_bytes().splitlines())
    assert slept == []
    # Following a dump as kcat writes it: a poll that returns records (a full one too) starts the count again.
    pg_lines = PG_DUMP.read_bytes().splitlines(keepends=True)
    followed = tmp_path / "followed.jsonl"
    followed.write_bytes(b"".join(pg_lines[:2]))
    source = file_source.FileSource(followed)
    source.start(lambda topic, partition: None)
    assert [len(source.poll(100_000, 1.5)) for _ in range(3)] == [2, 0, 0]
    assert slept == [1.5]  # the third poll's only
    with followed.open("ab") as handle:
        handle.write(b"".join(pg_lines[2:4]))
    assert [len(source.poll(1, 1.5)) for _ in range(4)] == [1, 1, 0, 0]
    assert slept == [1.5, 1.5]
    source.close()


def mixed_converters(typed_values: bool) -> tuple[Any, Callable[[dict[str, Any] | None, int, str], Any]]:
    """The key of id 1 and a function making values (after image, lsn, op) of a topic whose keys and values are
    converted differently: typed values and schemaless keys, or the reverse."""

    def value(after: dict[str, Any] | None, lsn: int, op: str) -> dict[str, Any]:
        record = schema_record([ID, NAME], after, lsn, op)
        return record if typed_values else record["payload"]

    typed_key: dict[str, Any] = {"schema": {"type": "struct", "fields": [ID]}, "payload": key(1)}
    return (key(1) if typed_values else typed_key), value


@pytest.mark.parametrize("typed_values", [True, False], ids=["schemaless-keys", "schemaless-values"])
# A commit per record (the per-record path); one poll of all (the fast path, which keeps typed tombstones).
@pytest.mark.parametrize("max_records", [1, 100])
def test_a_tombstone_takes_its_tables_layout(
    lakehouse: Path, tmp_path: Path, typed_values: bool, max_records: int
) -> None:
    """Keys and values converted differently (key.converter.schemas.enable=false with the value converter's true,
    or the reverse): a delete's tombstone, which has a key only, lands in its table's layout instead of becoming a
    dead letter (its own layout would follow its key)."""
    settings = make_settings(lakehouse)
    record_key, value = mixed_converters(typed_values)
    records = []
    for n in range(6):
        records += [
            ("p.s.t", 3 * n, record_key, value({"id": 1, "name": "a"}, 10 + n, "c")),
            ("p.s.t", 3 * n + 1, record_key, value(None, 10 + n, "d")),
            ("p.s.t", 3 * n + 2, record_key, None),
        ]
    pipeline = ingest_file(settings, write_dump(tmp_path / "tombstone.jsonl", records), max_records=max_records)
    assert pipeline.stats.dead_letters == 0
    landed = sorted(rows(settings, "p_s_t"), key=lambda row: row["_cdc_offset"])
    assert [(row["_cdc_offset"], row["op"], row["_cdc_key_json"]) for row in landed] == [
        (offset, ["c", "d", None][offset % 3], '{"id":1}') for offset in range(18)
    ]


@pytest.mark.parametrize("typed_values", [True, False], ids=["schemaless-keys", "schemaless-values"])
@pytest.mark.parametrize("changes", [2, 12], ids=["per-record", "fast-path"])
def test_a_tombstone_first_leaves_its_tables_layout_to_the_changes(
    lakehouse: Path, tmp_path: Path, typed_values: bool, changes: int
) -> None:
    """Keys and values converted differently, and a compacted topic whose first record left is a tombstone: the
    tombstone's own layout (its key's) became the new table's, stored in its properties, and every change after it
    was a dead letter, for good. A tombstone of a table whose layout is not decided waits for the first change of
    the flush to decide it (alone in a flush, provisionally: the next test)."""
    settings = make_settings(lakehouse)
    record_key, value = mixed_converters(typed_values)
    other_key = mixed_converters(not typed_values)[0]  # a tombstone whose key was converted like the values
    records = [("p.s.t", 5, record_key, None), ("p.s.t", 6, other_key, None)]
    records += [("p.s.t", 7 + n, record_key, value({"id": 1, "name": f"a{n}"}, 20 + n, "u")) for n in range(changes)]
    pipeline = ingest_file(settings, write_dump(tmp_path / "compacted.jsonl", records), max_records=100)
    assert pipeline.stats.dead_letters == 0
    landed = sorted(rows(settings, "p_s_t"), key=lambda row: row["_cdc_offset"])
    assert [(row["_cdc_offset"], row["op"]) for row in landed] == [(5, None), (6, None)] + [
        (7 + n, "u") for n in range(changes)
    ]


@pytest.mark.parametrize("typed_values", [True, False], ids=["schemaless-keys", "schemaless-values"])
@pytest.mark.parametrize("changes", [2, 12], ids=["per-record", "fast-path"])
@pytest.mark.parametrize("runs", ["one-run", "two-runs"])
def test_a_flush_of_tombstones_alone_lays_its_table_out_until_a_change_comes(
    lakehouse: Path, tmp_path: Path, typed_values: bool, changes: int, runs: str
) -> None:
    """Keys and values converted differently, and a compacted topic whose first records are tombstones, alone in a
    flush (a quiet table, or `--once` on a topic that holds nothing else yet): the table is created in the layout
    of their keys, provisionally. Its first change record lays it out again, in its own layout (the value
    converter's), instead of becoming a dead letter, as every change after it did, for good. Tombstones that come
    between wait for that change too. In one ingest run (the state in memory), or in two (the state read from the
    table's properties)."""
    settings = make_settings(lakehouse)
    record_key, value = mixed_converters(typed_values)
    first = [("p.s.t", 5, record_key, None), ("p.s.t", 6, record_key, None)]
    rest = [("p.s.t", 7, record_key, None)]
    rest += [("p.s.t", 8 + n, record_key, value({"id": 1, "name": f"a{n}"}, 20 + n, "u")) for n in range(changes)]
    catalog = load_catalog(settings)
    if runs == "two-runs":
        ingest_file(settings, write_dump(tmp_path / "tombstones.jsonl", first), max_records=100)
        properties = catalog.load_table("bronze.p_s_t").properties
        assert properties[LAYOUT_PROPERTY] == ("json" if typed_values else "typed")  # the keys' layout
        assert properties[LAYOUT_PROVISIONAL_PROPERTY] == "true"
        pipeline = ingest_file(settings, write_dump(tmp_path / "changes.jsonl", rest), max_records=100)
    else:  # the first flush holds the two tombstones alone
        pipeline = ingest_file(settings, write_dump(tmp_path / "all.jsonl", first + rest), max_records=2)
    assert pipeline.stats.dead_letters == 0
    properties = catalog.load_table("bronze.p_s_t").properties
    assert properties[LAYOUT_PROPERTY] == ("typed" if typed_values else "json")  # the values'
    assert LAYOUT_PROVISIONAL_PROPERTY not in properties
    landed = sorted(rows(settings, "p_s_t"), key=lambda row: row["_cdc_offset"])
    assert [(row["_cdc_offset"], row["op"], row["_cdc_key_json"]) for row in landed] == [
        (offset, None, '{"id":1}') for offset in (5, 6, 7)
    ] + [(8 + n, "u", '{"id":1}') for n in range(changes)]
    assert [row["after"] for row in landed[3:]] == [
        {"id": 1, "name": f"a{n}"} if typed_values else orjson.dumps({"id": 1, "name": f"a{n}"}).decode()
        for n in range(changes)
    ]


@pytest.mark.parametrize("typed_values", [True, False], ids=["schemaless-keys", "schemaless-values"])
def test_a_table_another_writer_created_meanwhile_is_laid_out_again(
    lakehouse: Path, tmp_path: Path, typed_values: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers of a new table at once: one creates it from tombstones (provisionally, in their keys' layout)
    while the other, which found no table, commits changes in the values' layout. Its create fails, and it went on
    with the other's table as if it were its own: the service stopped on "schemas.enable differs between records
    of one topic" (a restart recovered). It starts over on that table now, which lays it out again."""
    from ingest.bronze.tables import BronzeTables

    settings = make_settings(lakehouse)
    record_key, value = mixed_converters(typed_values)
    tombstones = [("p.s.t", 5, record_key, None), ("p.s.t", 6, record_key, None)]
    changes = [("p.s.t", 7 + n, record_key, value({"id": 1, "name": f"a{n}"}, 20 + n, "u")) for n in range(3)]
    ingest_file(settings, write_dump(tmp_path / "tombstones.jsonl", tombstones), max_records=100)
    catalog = load_catalog(settings)
    assert catalog.load_table("bronze.p_s_t").properties[LAYOUT_PROVISIONAL_PROPERTY] == "true"

    original = BronzeTables._commit_once
    raced: list[str] = []

    def commit_after_a_stale_look(self: BronzeTables, batch: Any) -> int:
        if batch.name != "p_s_t" or raced:
            return original(self, batch)
        raced.append(batch.name)  # this commit loads the table before the other writer's create landed
        real_load = self.load
        looks: list[str] = []

        def load(name: str) -> Any:
            if not looks:
                looks.append(name)
                return None
            return real_load(name)

        self.load = load  # type: ignore[method-assign]
        try:
            return original(self, batch)
        finally:
            del self.load

    monkeypatch.setattr(BronzeTables, "_commit_once", commit_after_a_stale_look)
    pipeline = ingest_file(settings, write_dump(tmp_path / "changes.jsonl", changes), max_records=100)
    assert raced == ["p_s_t"]
    assert pipeline.stats.written == 3
    properties = catalog.load_table("bronze.p_s_t").properties
    assert properties[LAYOUT_PROPERTY] == ("typed" if typed_values else "json")  # the values'
    assert LAYOUT_PROVISIONAL_PROPERTY not in properties
    landed = sorted(rows(settings, "p_s_t"), key=lambda row: row["_cdc_offset"])
    assert [(row["_cdc_offset"], row["op"]) for row in landed] == [(5, None), (6, None), (7, "u"), (8, "u"), (9, "u")]


@pytest.mark.parametrize("changes", [2, 12], ids=["per-record", "fast-path"])
def test_tombstones_that_waited_for_a_change_of_the_same_layout_never_move_the_offset_back(
    lakehouse: Path, tmp_path: Path, changes: int
) -> None:
    """A compacted topic whose first records are tombstones, alone in a flush, then a tombstone and changes, keys
    and values converted alike (the usual set-up): the waiting tombstone was buffered at the flush, after the
    changes, and the partition's stored offset went back to just past it. The next run read the changes again and
    landed them twice."""
    settings = make_settings(lakehouse)
    typed_key: dict[str, Any] = {"schema": {"type": "struct", "fields": [ID]}, "payload": key(1)}
    ingest_file(settings, write_dump(tmp_path / "tombstones.jsonl", [("p.s.t", n, typed_key, None) for n in (5, 6)]))
    rest: list[tuple[str, int, Any, Any]] = [("p.s.t", 7, typed_key, None)]
    rest += [
        ("p.s.t", 8 + n, typed_key, schema_record([ID, NAME], {"id": 1, "name": f"a{n}"}, 20 + n, "u"))
        for n in range(changes)
    ]
    dump = write_dump(tmp_path / "changes.jsonl", rest)
    ingest_file(settings, dump, max_records=100)
    table = load_catalog(settings).load_table("bronze.p_s_t")
    assert decode_offsets(table.properties[OFFSETS_PROPERTY]) == {("p.s.t", 0): 8 + changes}
    assert LAYOUT_PROVISIONAL_PROPERTY not in table.properties
    assert ingest_file(settings, dump).stats.written == 0  # a restart reads nothing again
    assert sorted(row["_cdc_offset"] for row in rows(settings, "p_s_t")) == list(range(5, 8 + changes))


@pytest.mark.parametrize("typed_values", [True, False], ids=["schemaless-keys", "schemaless-values"])
def test_tombstones_laid_out_before_another_writer_laid_their_table_out_again_still_land(
    lakehouse: Path, tmp_path: Path, typed_values: bool
) -> None:
    """Two ingesters: one holds tombstones for a table whose layout tombstones alone decided, while the other lands
    the table's first change, which lays it out again. The first one's tombstones then land in the new layout
    (their key in _cdc_key_json) instead of failing the commit."""
    settings = make_settings(lakehouse)
    record_key, value = mixed_converters(typed_values)
    ingest_file(settings, write_dump(tmp_path / "tombstones.jsonl", [("p.s.t", 5, record_key, None)]))
    holder = file_pipeline(settings, tmp_path / "tombstones.jsonl")
    holder.accept(RawRecord("p.s.t", 0, 30, None, orjson.dumps(record_key), None), dt.datetime.now(dt.UTC))
    change = [("p.s.t", 7, record_key, value({"id": 1, "name": "a"}, 20, "c"))]
    ingest_file(settings, write_dump(tmp_path / "change.jsonl", change))
    holder.flush()
    landed = sorted(rows(settings, "p_s_t"), key=lambda row: row["_cdc_offset"])
    assert [(row["_cdc_offset"], row["op"], row["_cdc_key_json"]) for row in landed] == [
        (5, None, '{"id":1}'),
        (7, "c", '{"id":1}'),
        (30, None, '{"id":1}'),
    ]
    assert load_catalog(settings).load_table("bronze.p_s_t").properties[LAYOUT_PROPERTY] == (
        "typed" if typed_values else "json"
    )


def test_topics_whose_default_names_collide_are_refused(lakehouse: Path, tmp_path: Path) -> None:
    """`db.s.Customers` and `db.s.customers` (two tables at the source) both take the default name
    `db_s_customers`: ingest stops naming both instead of mixing their rows and keys, also when the first topic
    landed in an earlier run; with ingest.table_mapping they land apart (or together, if the mapping says so)."""
    settings = make_settings(lakehouse)
    upper = [("db.s.Customers", 0, key(1), schema_record([ID], {"id": 1}, 10))]
    lower = [("db.s.customers", 0, key(2), schema_record([ID], {"id": 2}, 11))]
    with pytest.raises(ConfigError, match=r"topics 'db\.s\.customers' and 'db\.s\.Customers' both land in bronze"):
        ingest_file(settings, write_dump(tmp_path / "both.jsonl", upper + lower))
    ingest_file(settings, write_dump(tmp_path / "upper.jsonl", upper))
    with pytest.raises(ConfigError, match=r"'db\.s\.customers' and 'db\.s\.Customers'.*ingest\.table_mapping"):
        ingest_file(settings, write_dump(tmp_path / "lower.jsonl", lower))
    mapped = make_settings(lakehouse, ingest={"table_mapping": {"db.s.customers": "customers_lower"}})
    ingest_file(mapped, write_dump(tmp_path / "lower.jsonl", lower))
    assert [row["after"]["id"] for row in rows(settings, "db_s_customers")] == [1]
    assert [row["after"]["id"] for row in rows(settings, "customers_lower")] == [2]
    # Mapped into another topic's default table: together on purpose.
    joined = make_settings(lakehouse, ingest={"table_mapping": {"db.s.archive": "db_s_customers"}})
    archive = [("db.s.archive", 0, key(3), schema_record([ID], {"id": 3}, 12))]
    ingest_file(joined, write_dump(tmp_path / "joined.jsonl", archive + upper))
    assert sorted(row["after"]["id"] for row in rows(settings, "db_s_customers")) == [1, 3]


def test_a_column_in_a_commit_in_flight_still_guards_the_next_records(lakehouse: Path, tmp_path: Path) -> None:
    """A commit in the background (B1) adds column x as a string. Before it lands, the table's state is read again
    for the next record (the commit before it, B0, landed and dropped the cached state): that record's x as an int
    must be a dead letter, checked against what B1 brings too. It used to pass the check, fail B2's commit once
    B1 had landed, and stop the service."""
    settings = make_settings(lakehouse)
    with_x: list[dict[str, Any]] = [ID, NAME, {"type": "string", "field": "x", "optional": True}]
    int_x: list[dict[str, Any]] = [ID, NAME, {"type": "int32", "field": "x", "optional": True}]
    dump = write_dump(
        tmp_path / "inflight.jsonl",
        [
            ("p.s.t", 0, key(1), schema_record([ID, NAME], {"id": 1, "name": "a"}, 10)),
            ("p.s.t", 1, key(2), schema_record(with_x, {"id": 2, "name": "b", "x": "s"}, 11)),
            ("p.s.t", 2, key(3), schema_record(int_x, {"id": 3, "name": "c", "x": 7}, 12)),
        ],
    )
    pipeline = file_pipeline(settings, dump, max_records=1, background_commit=True, on_type_conflict="dead_letter")
    commit = pipeline.tables.commit

    def slow_commit(batch: Any, on_retry: Any = None) -> int:
        time.sleep(0.5)  # the next record is checked while this commit is in flight
        return commit(batch, on_retry)

    pipeline.tables.commit = slow_commit  # type: ignore[method-assign]
    pipeline.run(once=True)
    assert pipeline.stats.dead_letters == 1
    assert sorted(row["after"]["id"] for row in rows(settings, "p_s_t")) == [1, 2]
    [dead] = [row for row in rows(settings, DEAD_LETTER_TABLE) if row["_cdc_topic"] == "p.s.t"]
    assert dead["_cdc_offset"] == 2
    assert ".x changed type from string to int32" in dead["_cdc_error"]


def test_a_partition_resumes_after_the_dead_letters_that_end_it(lakehouse: Path, tmp_path: Path) -> None:
    """The data table's offset moves only with a record of its own: a partition whose latest records were dead
    letters resumed before them (re-read, they were skipped as landed). Once a topic's retention has deleted them,
    that offset is out of the log's range, and the Kafka source stops on it (records lost?). It resumes after the
    run of dead letters instead; not past a record that never landed."""
    settings = make_settings(lakehouse)
    source = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    good = [("i.s.t", n, {"id": n}, {"op": "c", "after": {"id": n}, "source": source}) for n in range(10)]
    bad = [("i.s.t", n, {"id": n}, "{not json") for n in (10, 11)]
    ingest_file(settings, write_dump(tmp_path / "good.jsonl", good))
    ingest_file(settings, write_dump(tmp_path / "bad.jsonl", bad))  # a flush of dead letters only
    assert load_catalog(settings).load_table("bronze.i_s_t").scan().to_arrow().num_rows == 10
    assert file_pipeline(settings, tmp_path / "bad.jsonl").resolve("i.s.t", 0) == 12
    # As after a data commit that failed once its flush's dead letters were in: 12-13 never landed, 14 is a dead
    # letter. The partition resumes at 12.
    ingest_file(settings, write_dump(tmp_path / "gap.jsonl", [("i.s.t", 14, {"id": 14}, "{not json")]))
    assert file_pipeline(settings, tmp_path / "gap.jsonl").resolve("i.s.t", 0) == 12


def test_dead_letters_past_a_few_per_flush_are_logged_in_one_line(
    lakehouse: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A topic whose every record fails (a converter switched to Avro: "not JSON") logged one warning per record,
    tens of thousands of lines a second in a backfill. Per topic and flush the first ten are logged one by one,
    the rest in one line; every one is in the dead-letter table."""
    from ingest.pipeline import DEAD_LETTERS_LOGGED_PER_FLUSH

    settings = make_settings(lakehouse)
    bad = [("a.s.t", n, {"id": n}, "{not json") for n in range(25)] + [("b.s.t", 0, {"id": 0}, "{not json")]
    with caplog.at_level("WARNING", logger="ingest.pipeline"):
        pipeline = ingest_file(settings, write_dump(tmp_path / "bad.jsonl", bad), max_records=1000)
    assert pipeline.stats.dead_letters == 26
    one_by_one = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dead letter ")]
    assert len([m for m in one_by_one if "a.s.t" in m]) == DEAD_LETTERS_LOGGED_PER_FLUSH
    assert len([m for m in one_by_one if "b.s.t" in m]) == 1
    summed = [r.getMessage() for r in caplog.records if "more dead letter(s)" in r.getMessage()]
    assert summed == [
        f"{25 - DEAD_LETTERS_LOGGED_PER_FLUSH} more dead letter(s) from a.s.t in this flush, not logged "
        "one by one (bronze._cdc_dead_letters holds each)"
    ]
    assert len(rows(settings, DEAD_LETTER_TABLE)) == 26


def test_a_recreated_topic_landed_in_a_new_table_is_not_skipped_at_its_old_dead_letters(
    lakehouse: Path, tmp_path: Path
) -> None:
    """operations.md: land a topic deleted and created again (offsets from 0) into a new table. Its records at the
    offsets of the old topic's dead letters were taken for those dead letters: skipped as landed, and after a
    restart not even read. Dead letters count for the table they were meant for only."""
    from tests.conftest import file_pipeline

    source = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}

    def good(offset: int) -> tuple[str, int, Any, Any]:
        return ("i.s.t", offset, {"id": offset}, {"op": "c", "after": {"id": offset}, "source": source})

    old = [good(n) for n in range(5)] + [("i.s.t", n, {"id": n}, "{not json") for n in (5, 6, 7)]
    ingest_file(make_settings(lakehouse), write_dump(tmp_path / "old.jsonl", [*old, good(8), good(9)]))
    new_topic = write_dump(tmp_path / "new.jsonl", [good(n) for n in range(12)])
    settings = make_settings(lakehouse, ingest={"table_mapping": {"i.s.t": "i_s_t_v2"}})
    assert file_pipeline(settings, new_topic).resolve("i.s.t", 0) is None  # nothing landed for the new table
    pipeline = ingest_file(settings, write_dump(tmp_path / "first.jsonl", [good(n) for n in range(5)]))
    assert pipeline.resolve("i.s.t", 0) == 5  # not 8: offsets 5-7 of this topic are not the old one's dead letters
    ingest_file(settings, new_topic)
    assert sorted(r["_cdc_offset"] for r in rows(settings, "i_s_t_v2")) == list(range(12))
    assert sorted(r["_cdc_offset"] for r in rows(settings, DEAD_LETTER_TABLE)) == [5, 6, 7]  # the old topic's
