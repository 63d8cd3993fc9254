"""Schema changes at the source with real dbt on real Spark and Iceberg: `cdclake ingest` adds a column the source
added to bronze's images (and widens types); silver follows per the model's `on_schema_change`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ingest import status
from ingest.lakehouse import load_catalog
from tests.silver_harness import Change, SilverHarness, Topic

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

C, U, D = "c", "u", "d"


EMAIL = {"type": "string", "optional": True, "field": "email"}


def land_evolved(
    harness: SilverHarness,
    topic: Topic,
    changes: list[Change],
    dumps: Path,
    column: dict[str, Any] | None = None,
    value: Callable[[dict[str, Any]], Any] = lambda after: None,
    id_type: str = "int32",
) -> None:
    """Land ``changes`` as Debezium emits them after `ALTER TABLE ... ADD COLUMN` and/or after the key column's type
    became ``id_type``: ``column`` is the added column's Connect schema (an optional field of the row schema, in
    `before` and `after`), ``value`` gives its value in an `after` image (`before` images hold NULL)."""
    lines = topic.records(changes)
    for line in lines:
        for part in ("key", "payload"):
            if line[part] is None:
                continue
            record = orjson.loads(line[part])
            schema, payload = record["schema"], record["payload"]
            rows = [schema] if part == "key" else [f for f in schema["fields"] if f["field"] in ("before", "after")]
            for row in rows:
                row["fields"] = [{**f, "type": id_type} if f["field"] == "id" else f for f in row["fields"]]
                if part == "payload" and column is not None:
                    row["fields"] = [*row["fields"], column]
            if part == "payload" and column is not None:
                for image in ("before", "after"):
                    if payload[image] is not None:
                        payload[image][column["field"]] = value(payload[image]) if image == "after" else None
            line[part] = orjson.dumps(record).decode()
    harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, dumps)


def land_with_email(
    harness: SilverHarness, topic: Topic, changes: list[Change], dumps: Path, values: dict[int, str]
) -> None:
    """``changes`` after the source added a string column `email`, its value per key in ``values``."""
    land_evolved(harness, topic, changes, dumps, EMAIL, lambda after: values.get(after["id"]))


def emails(harness: SilverHarness, topic: Topic, where: str = "true") -> dict[int, tuple[str | None, str | None]]:
    rows = harness.spark.sql(f"select id, v, email from silver.{topic.table} where {where}").collect()
    return {row["id"]: (row["v"], row["email"]) for row in rows}


CONFIGS = {"hard": "", "soft": "delete_mode='soft'", "partial": "ignore_null_updates=true"}


# `make test` runs the hard-delete case; soft deletes and partial images read silver's columns too: `make test-slow`.
@pytest.mark.parametrize(
    "mode", ["hard", *(pytest.param(mode, marks=pytest.mark.slow) for mode in ("soft", "partial"))]
)
def test_a_column_added_at_the_source_is_added_to_silver(harness: SilverHarness, tmp_path: Path, mode: str) -> None:
    """The run after the source added a column adds it to silver (on_schema_change='append_new_columns', the
    default): the rows of the unit carry its value, the others hold NULL until they change (what --full-refresh
    gives too: their images never had it). Before, every later run failed until a --full-refresh. Soft deletes
    keep a deleted row's values; partial images fold onto silver's row, new column included."""
    topic = harness.topic(f"added_{mode}")
    config = CONFIGS[mode]
    harness.write_tests(topic)  # silver equals a recomputation: the rows from before the column hold NULL in it
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], tmp_path, config)
    land_with_email(
        harness, topic, [Change(U, 1, 4, "a2"), Change(C, 4, 5, "d"), Change(D, 3, 6)], tmp_path, {1: "x1", 4: "x4"}
    )
    assert harness.build(topic)
    live = "not _cdc_deleted" if mode == "soft" else "true"
    assert emails(harness, topic, live) == {1: ("a2", "x1"), 2: ("b", None), 4: ("d", "x4")}
    second = [Change(U, 2, 7, "b2"), Change(D, 4, 8)]
    if mode == "partial":  # an update that carries only its key: the other columns keep silver's values
        second.append(Change(U, 1, 9, None, n=None))
    land_with_email(harness, topic, second, tmp_path, {2: "x2"})
    assert harness.build(topic)
    assert emails(harness, topic, live) == {1: ("a2", "x1"), 2: ("b2", "x2")}
    assert harness.build(topic, "--full-refresh")
    assert emails(harness, topic, live) == {1: ("a2", "x1"), 2: ("b2", "x2")}


# A struct column whose field names need quoting in DDL (MongoDB keys and SQL Server columns may hold spaces and
# dashes; quoted identifiers anything, `:,<>()` and backquotes too), a struct and an array among them.
ODD_NAME = "unit: (a,b) <`c`>"
ADDRESS = {
    "type": "struct",
    "optional": True,
    "field": "address",
    "fields": [
        {"type": "string", "optional": True, "field": "street name"},
        {"type": "string", "optional": True, "field": "zip-code"},
        {
            "type": "struct",
            "optional": True,
            "field": "geo point",
            "fields": [{"type": "double", "field": "lat"}, {"type": "double", "field": "lon"}],
        },
        {"type": "array", "items": {"type": "string"}, "optional": True, "field": "door codes"},
        {
            "type": "struct",
            "optional": True,
            "field": "wing",
            "fields": [{"type": "int32", "optional": True, "field": ODD_NAME}],
        },
    ],
}


def address(after: dict[str, Any]) -> dict[str, Any]:
    return {
        "street name": f"{after['v']} st",
        "zip-code": str(after["id"]),
        "geo point": {"lat": 1.5, "lon": float(after["id"])},
        "door codes": ["1#"],
        "wing": {ODD_NAME: after["id"]},
    }


def test_a_struct_column_whose_field_names_need_quoting_is_added(harness: SilverHarness, tmp_path: Path) -> None:
    """The struct column's type goes into `alter table ... add columns` with its field names quoted (typeof()
    spells them bare, which Spark's DDL parser rejected: the run failed until a --full-refresh; then one of
    `:,<>()` in a name still did)."""
    topic = harness.topic("added_struct")
    harness.write_tests(topic)
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path)
    land_evolved(harness, topic, [Change(U, 1, 3, "a2"), Change(C, 3, 4, "c")], tmp_path, ADDRESS, address)
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "id, v, to_json(address) as address", "id")
    assert [(r["id"], r["v"], r["address"] and orjson.loads(r["address"])) for r in rows] == [
        (1, "a2", address({"id": 1, "v": "a2"})),
        (2, "b", None),
        (3, "c", address({"id": 3, "v": "c"})),
    ]
    typed = harness.spark.sql(f"select typeof(address) as t from silver.{topic.table} limit 1").first()
    assert typed["t"] == (
        "struct<street name:string,zip-code:string,geo point:struct<lat:double,lon:double>,door codes:array<string>,"
        f"wing:struct<{ODD_NAME}:int>>"
    )
    # A nested column the model adds, whose expression is never null: nullable in silver (its rows so far hold NULL).
    model = harness.project / "models" / "silver" / f"{topic.table}.sql"
    model.write_text(model.read_text().replace("select *", "select *, named_struct('a b', array(1)) as extra"))
    harness.land(topic, [Change(U, 2, 5, "b2")], tmp_path)
    assert harness.build(topic)
    extra = harness.rows(f"silver.{topic.table}", "id, to_json(extra) as extra", "id")
    assert [(r["id"], r["extra"]) for r in extra] == [(1, None), (2, '{"a b":[1]}'), (3, None)]


def test_a_column_added_at_the_source_is_added_to_a_history(harness: SilverHarness, tmp_path: Path) -> None:
    """history='scd2': versions from before the column hold NULL in it, versions after it its value."""
    topic = harness.topic("added_scd2")
    config = "history='scd2'"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, config)
    land_with_email(
        harness, topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4), Change(C, 3, 5, "c")], tmp_path, {1: "x1", 3: "x3"}
    )
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "id, v, email, _cdc_valid_from[0] as at, _cdc_is_current", "id, at")
    assert [(r["id"], r["at"], r["v"], r["email"], r["_cdc_is_current"]) for r in rows] == [
        (1, 1, "a", None, False),
        (1, 3, "a2", "x1", True),
        (2, 2, "b", None, False),  # ended by the delete
        (3, 5, "c", "x3", True),
    ]
    assert harness.history(topic) == topic.expected_history()


def test_on_schema_change_fail_and_ignore(harness: SilverHarness, tmp_path: Path) -> None:
    """on_schema_change='fail' stops the run with an error naming the model, silver and the new column, and changes
    nothing; 'ignore' applies the changes to silver's columns only; back to the default, the next run adds it."""
    topic = harness.topic("fail_ignore")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, "on_schema_change='fail'")
    before = harness.silver_snapshot(topic)
    land_with_email(harness, topic, [Change(U, 1, 3, "a2")], tmp_path, {1: "x1"})
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    assert not harness.build(topic)
    message = log.read_bytes()[start:].decode()
    assert f"cdc_silver model '{topic.table}': on_schema_change is 'fail'" in message
    assert f"silver.{topic.table}: new column(s) email" in message
    assert harness.silver_snapshot(topic) == before
    assert "email" not in harness.rows(f"silver.{topic.table}", order="id")[0]

    harness.write_model(topic, "on_schema_change='ignore'")
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a2", 2: "b"}
    assert "email" not in harness.rows(f"silver.{topic.table}", order="id")[0]

    harness.write_model(topic)
    land_with_email(harness, topic, [Change(U, 2, 4, "b2")], tmp_path, {2: "x2"})
    assert harness.build(topic)
    assert emails(harness, topic) == {1: ("a2", None), 2: ("b2", "x2")}


def test_a_computed_tinyint_column_does_not_block_a_later_column(harness: SilverHarness, tmp_path: Path) -> None:
    """A model column the SQL casts to tinyint or smallint, which Iceberg stores as int: the run after the source
    added a column adds it. Before, the types read `tinyint` against silver's `int` and every run after a layout
    change failed as a type change silver cannot follow, --full-refresh or not."""
    topic = harness.topic("tinyint")
    harness.land(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path)
    model = harness.project / "models" / "silver" / f"{topic.table}.sql"
    harness.write_model(topic)
    model.write_text(
        "{{ config(materialized='cdc_silver') }}\n"
        "select *, cast(after.id + 100 as tinyint) as code, cast(after.id * 1000 as smallint) as small\n"
        f"from {{{{ source('bronze', '{topic.table}') }}}}\n"
    )
    assert harness.build(topic)
    land_with_email(harness, topic, [Change(U, 1, 3, "a2"), Change(C, 3, 4, "c")], tmp_path, {1: "x1", 3: "x3"})
    assert harness.build(topic)
    rows = harness.spark.sql(f"select id, v, email, code, small from silver.{topic.table} order by id").collect()
    expected = [(1, "a2", "x1", 101, 1000), (2, "b", None, 102, 2000), (3, "c", "x3", 103, 3000)]
    assert [tuple(r) for r in rows] == expected


def test_a_widened_key_type_widens_silver_and_its_tombstones(harness: SilverHarness, tmp_path: Path) -> None:
    """The key column became BIGINT at the source (bronze widens int to bigint): silver's key column and the
    tombstones' are widened, and a key beyond int's range lands."""
    topic = harness.topic("widened")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(D, 2, 3)], tmp_path)
    big = 3_000_000_000
    land_evolved(
        harness, topic, [Change(U, 1, 4, "a2"), Change(C, big, 5, "big"), Change(D, 1, 6)], tmp_path, id_type="int64"
    )
    assert harness.build(topic)
    assert harness.silver(topic) == {big: "big"} == topic.expected()
    for table in (topic.table, f"{topic.table}__cdc_tombstones"):
        types = {r["col_name"]: r["data_type"] for r in harness.spark.sql(f"describe table silver.{table}").collect()}
        assert types["id"] == "bigint", table
    assert harness.rows(f"silver.{topic.table}__cdc_tombstones", "id", "id") == [{"id": 1}, {"id": 2}]


WIDE = 30  # DESCRIBE shows a struct's first 24 fields only (spark.sql.debug.maxToStringFields, 25 by default)


def land_wide(
    harness: SilverHarness, topic: Topic, changes: list[Change], dumps: Path, last_type: str, wide: int = WIDE
) -> None:
    """Land ``changes`` with ``wide`` more int columns f0.. in the row (f<i> = key * 10 + i), the last one of type
    ``last_type``; the key 7's last column holds 3,000,000,000 (beyond int) when it is int64."""
    last = f"f{wide - 1}"
    lines = topic.records(changes)
    for line in lines:
        if line["payload"] is None:
            continue
        record = orjson.loads(line["payload"])
        for field in record["schema"]["fields"]:
            if field["field"] in ("before", "after"):
                extra = [{"type": "int32", "optional": True, "field": f"f{i}"} for i in range(wide)]
                extra[-1]["type"] = last_type
                field["fields"] = [*field["fields"], *extra]
        for image in ("before", "after"):
            row = record["payload"][image]
            if row is not None:
                row.update({f"f{i}": row["id"] * 10 + i for i in range(wide)})
                if row["id"] == 7 and last_type == "int64":
                    row[last] = 3_000_000_000
        line["payload"] = orjson.dumps(record).decode()
    harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, dumps)


def test_a_widened_type_beyond_describes_field_limit_widens_silver(harness: SilverHarness, tmp_path: Path) -> None:
    """A column past the 24th of the row widened at the source (int -> bigint): silver follows, as for any column.
    Spark's DESCRIBE cut the row's type short there, so the run saw no change and silver kept int: the next
    value beyond int's range failed the run (a float widened to double would have been rounded silently)."""
    topic = harness.topic("wide")
    last = f"f{WIDE - 1}"
    # The run raises Spark's setting only when DESCRIBE cuts a type (bronze.sql): not raised before, by another test.
    harness.spark.conf.unset("spark.sql.debug.maxToStringFields")
    land_wide(harness, topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, "int32")
    harness.write_model(topic)
    assert harness.build(topic)
    land_wide(harness, topic, [Change(U, 1, 3, "a2"), Change(C, 7, 4, "g")], tmp_path, "int64")
    assert harness.build(topic)
    types = {r["col_name"]: r["data_type"] for r in harness.spark.sql(f"describe table silver.{topic.table}").collect()}
    assert types[last] == "bigint"
    assert types["f0"] == "int"
    rows = harness.rows(f"silver.{topic.table}", f"id, v, f0, {last}", "id")
    assert [(r["id"], r["v"], r["f0"], r[last]) for r in rows] == [
        (1, "a2", 10, 10 + WIDE - 1),
        (2, "b", 20, 20 + WIDE - 1),
        (7, "g", 70, 3_000_000_000),
    ]


def test_the_status_of_a_wide_silver_table_reads_metadata_only(
    harness: SilverHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iceberg keeps column bounds for a table's first 100 columns only, and `_cdc_applied_at` comes last: without
    its own metrics setting, `cdclake status` read that column of the whole silver table for its freshness."""
    topic = harness.topic("wide_status")
    land_wide(harness, topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, "int32", wide=110)
    harness.write_model(topic)
    assert harness.build(topic)
    silver = load_catalog(harness.settings).load_table(f"silver.{topic.table}")
    assert len(silver.schema().fields) > 110

    def scan(table: Any, column: str) -> None:
        raise AssertionError(f"status read column {column} of {table.name()}")

    monkeypatch.setattr(status, "_scan_max_timestamp", scan)
    applied = status.column_max_timestamp(silver, status.APPLIED_AT_COLUMN)
    newest = harness.spark.sql(f"select max(_cdc_applied_at) from silver.{topic.table}").collect()[0][0]
    assert applied is not None
    assert applied.replace(tzinfo=None) == newest
