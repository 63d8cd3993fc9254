"""Real Debezium output all the way to silver: the recorded PostgreSQL streams (`tests/fixtures/debezium/postgres`,
`make fixtures`) landed by the ingest pipeline, models written by `cdclake scaffold`, `dbt build` (with the
scaffolded data tests), and silver compared with what PostgreSQL itself held after the last change.

The streams hold a snapshot, inserts, updates with and without a `before`, a delete and its tombstone, a primary-key
change, several changes of one key in one transaction, one transaction over two tables, every common column type,
and updates that left TOASTed values (text, bytea, text[], integer[], uuid[] and hstore) out, which Debezium replaces
by its placeholder; TRUNCATE alone and inside a transaction, each in a unit of work of its own; and PostgreSQL's
infinite dates and timestamps.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from decimal import Decimal
from typing import Any

import orjson
import pytest

from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.tables import BronzeTables
from ingest.dbt_runner import run_dbt
from ingest.lakehouse import load_catalog
from ingest.replay import replay_dead_letters
from ingest.scaffold import scaffold
from tests.conftest import FIXTURES
from tests.silver_harness import SilverHarness, without_schema

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

RECORDED = FIXTURES / "debezium" / "postgres"
PLACEHOLDER = "__debezium_unavailable_value"
# How Debezium writes it in JSON, per column type: text, bytes (base64), text[], integer[] (its bytes), uuid[]
# (Java's UUID.nameUUIDFromBytes of its bytes) and hstore (a map of it to itself: its JSON text with the default
# hstore.handling.mode=json, the map with mode map).
PLACEHOLDER_FORMS = (
    PLACEHOLDER,
    base64.b64encode(PLACEHOLDER.encode()).decode(),
    [PLACEHOLDER],
    list(PLACEHOLDER.encode()),
    ["b68a35a7-17ad-35b3-af2a-ae46edb4545a"],
    orjson.dumps({PLACEHOLDER: PLACEHOLDER}).decode(),
    {PLACEHOLDER: PLACEHOLDER},
)
# This module's topic prefix (each landing of a recording gets its own topics: its offsets start at 0) -> the
# recorded final state it must give.
STATES = {
    "pgreal_main": "expected_final_state.json",
    "pgreal_toast": "toast_expected_final_state.json",
    "pgreal_toastjson": "toast_expected_final_state.json",
    "pgreal_toastmap": "toast_expected_final_state.json",  # toast_hstore_map.jsonl: the same statements
    "pgreal_trunc": "truncate_expected_final_state.json",
    "pgreal_unbounded": "infinity_expected_final_state.json",
}


def iso_interval_micros(text: str) -> int:
    """PostgreSQL's ISO 8601 interval as Debezium's MicroDuration: a year is 365.25 days, a month 30.4375."""
    match = re.fullmatch(
        r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)D)?(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?[\d.]+)S)?)?", text
    )
    assert match, text
    years, months, days, hours, minutes = (int(part or 0) for part in match.groups()[:5])
    seconds = Decimal(match.group(6) or 0)
    total_days = Decimal(years) * Decimal("365.25") + Decimal(months) * Decimal("30.4375") + days
    return int((total_days * 86400 + hours * 3600 + minutes * 60 + seconds) * 1_000_000)


def as_recorded(column: str, value: Any) -> Any:
    """A silver value in the encoding of the recorded final state (see the fixtures' README)."""
    if value is None:
        return None
    if isinstance(value, Decimal):
        return value  # compared as numbers: `42.000` and scale 3
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.datetime):
        # timestamptz columns come back as UTC wall time (the session's time zone), timestamp columns as they were
        return value.replace(tzinfo=dt.UTC).isoformat() if column == "c_timestamptz" else value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if column == "c_time":  # Spark cannot read Iceberg time: microseconds since midnight
        return (dt.datetime.min + dt.timedelta(microseconds=value)).time().isoformat()
    if column == "c_interval":
        return value  # MicroDuration, compared with the recorded text converted
    if column == "attrs" and isinstance(value, str):
        return orjson.loads(value)  # hstore (hstore.handling.mode=json): JSON text, recorded as hstore_to_json
    if isinstance(value, list):
        return [as_recorded(column, item) for item in value]
    return value


def expected_value(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in ("c_numeric", "c_numeric_any"):
        return Decimal(value)
    if column == "c_interval":
        return iso_interval_micros(value)
    return value


def recorded(name: str, prefix: str, schemas: bool = True) -> list[dict[str, Any]]:
    """A recording's lines on topics of ``prefix``; without ``schemas``, as the JSON converter writes them with
    `schemas.enable=false` (the envelope's payload alone, bytes still in base64)."""
    lines = [orjson.loads(line) for line in (RECORDED / name).read_bytes().splitlines()]
    for line in lines:
        line["topic"] = line["topic"].replace("dbserver1.", prefix + ".", 1)
        if not schemas:
            line["key"], line["payload"] = without_schema(line["key"]), without_schema(line["payload"])
    return lines


def op(line: dict[str, Any]) -> str | None:
    return None if line["payload"] is None else orjson.loads(line["payload"])["payload"].get("op")


def first_op(lines: list[dict[str, Any]], wanted: str) -> int:
    return next(at for at, line in enumerate(lines) if op(line) == wanted)


@pytest.fixture(scope="module")
def built(harness: SilverHarness, tmp_path_factory: pytest.TempPathFactory) -> SilverHarness:
    """Three units of work: everything but the TOAST stream's streamed changes, then those, so that its placeholders
    take their values from silver (document 1, snapshotted in the first) and from the same unit (document 3). The
    streamed changes land in two units, cut after the first primary-key change's delete: its create, in the next
    unit, takes the old key's values from bronze."""
    dumps = tmp_path_factory.mktemp("pg_dumps")
    # `c_numeric_any` (unconstrained numeric, VariableScaleDecimal) holds 3.14159265358979323846: at the default
    # scale of 10 that record would be a dead letter (no silent rounding), so this lakehouse keeps 20 digits.
    ingest = harness.settings.ingest.model_copy(update={"variable_scale_decimal_scale": 20})
    harness.land_lines("main", recorded("dbserver1.jsonl", "pgreal_main"), dumps, ingest)
    toast = recorded("toast.jsonl", "pgreal_toast")
    snapshot = [line for line in toast if op(line) == "r"]
    assert toast[: len(snapshot)] == snapshot
    harness.land_lines("toast-snapshot", snapshot, dumps, ingest)
    hstore_map = recorded("toast_hstore_map.jsonl", "pgreal_toastmap")
    harness.land_lines("toastmap-snapshot", hstore_map[: len(snapshot)], dumps, ingest)
    schemaless = recorded("toast.jsonl", "pgreal_toastjson", schemas=False)
    harness.land_lines("toastjson-snapshot", schemaless[: len(snapshot)], dumps, ingest)
    # TRUNCATE: the first unit ends before the first one, the second holds it, the third the one inside a
    # transaction. PostgreSQL's infinite dates and timestamps: dead letters at first (the default), landed by
    # `cdclake replay-dead-letters` with `infinite_timestamps: clamp` after the first build.
    truncated = recorded("truncate.jsonl", "pgreal_trunc")
    truncate_units = [
        truncated[: first_op(truncated, "t")],
        truncated[first_op(truncated, "t") : first_op(truncated, "u")],
    ]
    truncate_units.append(truncated[first_op(truncated, "u") :])
    harness.land_lines("truncate-0", truncate_units[0], dumps, ingest)
    harness.land_lines("infinity", recorded("infinity.jsonl", "pgreal_unbounded"), dumps, ingest)
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    report = scaffold(tables, harness.project, select="pgreal_*")
    models = sorted(path.stem for path in report.written if path.suffix == ".sql")
    assert models == [
        "pgreal_main_inventory_customers",
        "pgreal_main_inventory_typed_values",
        "pgreal_toast_inventory_documents",
        "pgreal_toastmap_inventory_documents",
        "pgreal_trunc_inventory_items",
        "pgreal_unbounded_inventory_validity",
    ]
    # Without schemas the key's fields are not known before a record is read: scaffold leaves that model to us.
    assert "pgreal_toastjson_inventory_documents" in report.skipped
    models.append("pgreal_toastjson_inventory_documents")
    silver_dir = harness.project / "models" / "silver"
    typed_yml = (silver_dir / f"{models[2]}.yml").read_text()  # its data tests, for the schemaless model
    (silver_dir / f"{models[-1]}.yml").write_text(typed_yml.replace(models[2], models[-1]))
    for name, history in ((models[-1], ""), (models[-1] + "_history", ", history='scd2'")):
        (silver_dir / f"{name}.sql").write_text(
            f"{{{{ config(materialized='cdc_silver', keys=['id']{history}) }}}}\n"
            f"select * from {{{{ source('bronze', '{models[-1]}') }}}}\n"
        )
    models.append(models[-1] + "_history")
    streamed_models = [model for model in models if not model.startswith("pgreal_main")]
    # The scaffolded data tests run too: keys unique, equals a recomputation, no key whose last change deletes it.
    # Two models at a time (`--threads`): their runs share one SparkSession and commit to one catalog.
    assert run_dbt(harness.settings, ["build", "--select", *models, "--threads", "2"]), "dbt build failed"
    clamped = harness.settings.model_copy(update={"ingest": ingest.model_copy(update={"infinite_timestamps": "clamp"})})
    replayed = replay_dead_letters(clamped, tables, ["pgreal_unbounded.inventory.validity"])
    assert replayed.topics["pgreal_unbounded.inventory.validity"].landed == 4  # silver applies them as late changes
    held = [["1,a", "2,b", "3,c"], ["1,a2", "4,d"]]  # silver of the truncated table after each unit but the last
    for part in (0, 1):
        assert [f"{r['id']},{r['name']}" for r in harness.rows("silver.pgreal_trunc_inventory_items")] == held[part]
        for name, lines in (("toast", toast), ("toastmap", hstore_map), ("toastjson", schemaless)):
            streamed = lines[len(snapshot) :]
            cut = next(at for at, line in enumerate(streamed) if "__debezium.newkey" in line.get("headers", [])) + 1
            harness.land_lines(f"{name}-streamed-{part}", [streamed[:cut], streamed[cut:]][part], dumps, ingest)
        harness.land_lines(f"truncate-{part + 1}", truncate_units[part + 1], dumps, ingest)
        assert run_dbt(harness.settings, ["build", "--select", *streamed_models, "--threads", "2"]), "dbt failed"
    dead_letters = f"{harness.settings.lakehouse.bronze_namespace}.{DEAD_LETTER_TABLE}"
    if load_catalog(harness.settings).table_exists(dead_letters):  # made by the first dead letter
        assert harness.rows(dead_letters, "_cdc_topic, _cdc_offset", "1, 2", "_cdc_topic like 'pgreal%'") == []
    return harness


@pytest.mark.parametrize(
    ("prefix", "table"),
    [
        ("pgreal_main", "customers"),
        ("pgreal_main", "typed_values"),
        ("pgreal_toast", "documents"),
        ("pgreal_toastmap", "documents"),
        ("pgreal_trunc", "items"),
    ],
)
def test_silver_equals_what_postgresql_held(built: SilverHarness, prefix: str, table: str) -> None:
    expected = orjson.loads((RECORDED / STATES[prefix]).read_bytes())[table]
    rows = built.rows(f"silver.{prefix}_inventory_{table}", order="id")
    assert [str(row["id"]) for row in rows] == sorted(expected, key=int)
    for row in rows:
        want = expected[str(row["id"])]
        got = {column: as_recorded(column, row[column]) for column in want}
        assert got == {column: expected_value(column, value) for column, value in want.items()}, row["id"]
        assert row["_cdc_op"] in ("r", "c", "u")


def test_postgres_infinity_clamped_in_bronze_reaches_silver(built: SilverHarness) -> None:
    """Dead letters first, then replayed (`cdclake replay-dead-letters`) with `infinite_timestamps: clamp` after
    silver had applied the other changes: PostgreSQL's infinity is the last instant Spark reads and -infinity the
    first, through dbt and Spark to silver (timestamptz as text: pyspark cannot make 0001-01-01T00:00:00Z a Python
    datetime)."""
    expected = orjson.loads((RECORDED / STATES["pgreal_unbounded"]).read_bytes())["validity"]
    last, first = (
        {"date": "9999-12-31", "ts": "9999-12-31 23:59:59.999999"},
        {"date": "0001-01-01", "ts": "0001-01-01 00:00:00"},
    )
    rows = built.rows(
        "silver.pgreal_unbounded_inventory_validity",
        "id, "
        + ", ".join(
            f"cast({column} as string) as {column}"
            for column in ("valid_from", "valid_to", "starts", "ends", "ends_ms", "ends_tz")
        ),
        "id",
    )
    assert [str(row["id"]) for row in rows] == sorted(expected, key=int)
    for row in rows:
        for column, value in expected[str(row["id"])].items():
            kind = "date" if column.startswith("valid") else "ts"
            want = {"infinity": last[kind], "-infinity": first[kind]}.get(str(value), value)
            if column == "ends_tz" and value not in ("infinity", "-infinity"):  # PostgreSQL's text: `+00` at the end
                want = str(value).removesuffix("+00")
            assert str(row[column]) == str(want), (row["id"], column)


def test_schemaless_silver_documents_equal_what_postgresql_held(built: SilverHarness) -> None:
    """`schemas.enable=false`: silver keeps each row's image as JSON text, and the placeholders in it (a JSON string,
    the base64 of its bytes, a one-element array) take the key's earlier values too."""
    expected = orjson.loads((RECORDED / STATES["pgreal_toastjson"]).read_bytes())["documents"]
    rows = built.rows("silver.pgreal_toastjson_inventory_documents", "id, _cdc_document", "id")
    documents = {str(row["id"]): orjson.loads(row["_cdc_document"]) for row in rows}
    for document in documents.values():
        document["attrs"] = orjson.loads(document["attrs"])  # an hstore's JSON text, recorded as hstore_to_json
    assert documents == expected


def test_schemaless_history_versions_fill_placeholders_from_the_version_before(built: SilverHarness) -> None:
    """The same stream as versions (`history='scd2'`): each update's version has, for each value it left alone,
    the value of the version before it, and so has a primary-key change's create, of its old key's last version
    (a plain-Python replay of the recorded images is the reference)."""
    expected: dict[str, list[dict[str, Any]]] = {}
    for line in recorded("toast.jsonl", "pgreal_toastjson", schemas=False):
        if not line["topic"].endswith(".documents") or line["payload"] is None:
            continue
        payload = orjson.loads(line["payload"])
        if payload["op"] == "d":
            continue
        headers = dict(zip(line.get("headers", [])[::2], line.get("headers", [])[1::2], strict=True))
        earlier = {}
        if payload["op"] == "u":
            earlier = expected[str(payload["after"]["id"])][-1]
        elif "__debezium.oldkey" in headers:  # JSON with its schema, as Debezium's JSON header converter writes it
            earlier = expected[str(orjson.loads(headers["__debezium.oldkey"])["payload"]["id"])][-1]
        version = {k: earlier.get(k) if v in PLACEHOLDER_FORMS else v for k, v in payload["after"].items()}
        expected.setdefault(str(payload["after"]["id"]), []).append(version)
    rows = built.rows("silver.pgreal_toastjson_inventory_documents_history", "id, _cdc_document", "id, _cdc_valid_from")
    got: dict[str, list[dict[str, Any]]] = {}
    for row in rows:  # keys of a schemaless table are JSON text: strings
        got.setdefault(row["id"], []).append(orjson.loads(row["_cdc_document"]))
    assert got == expected
    # the snapshot or insert, then each update; documents 5 and 6 are 3 and 1 after a primary-key change
    assert {key: len(versions) for key, versions in got.items()} == {"1": 4, "2": 2, "3": 2, "5": 1, "6": 2}
    assert got["5"][0]["body"] == got["3"][-1]["body"]
    assert got["6"][0]["body"] == got["1"][-1]["body"]


@pytest.mark.parametrize(
    ("dump", "hstore"), [("toast.jsonl", PLACEHOLDER_FORMS[-2]), ("toast_hstore_map.jsonl", PLACEHOLDER_FORMS[-1])]
)
def test_the_toast_stream_holds_the_placeholder_in_each_form(built: SilverHarness, dump: str, hstore: Any) -> None:
    """What makes the documents' comparisons above mean something: the recorded updates carry Debezium's placeholder
    for each large value they left alone, in each of its forms (text `body`, bytes `attachment`, text array `tags`,
    integer array `scores`, uuid array `refs`, hstore `attrs` as JSON text or as a map), for a document silver
    already held (1) and for one inserted earlier in the same unit of work (3); and so do the creates of the
    primary-key changes that moved them (to 6 and 5), which Debezium marks with the old key's header."""
    forms: dict[tuple[str, int], set[str]] = {}
    for line in recorded(dump, "pgreal_toast"):
        if op(line) not in ("u", "c") or (op(line) == "c" and "__debezium.oldkey" not in line.get("headers", [])):
            continue
        after = orjson.loads(line["payload"])["payload"]["after"]
        found = forms.setdefault((str(op(line)), after["id"]), set())
        found |= {column for column, value in after.items() if value in PLACEHOLDER_FORMS}
        assert after["attrs"] == hstore or after["id"] == 2
    large = {"body", "tags", "attachment", "scores", "refs", "attrs"}
    assert forms == {
        ("u", 1): large,
        ("u", 2): set(),
        ("u", 3): large,
        ("c", 5): large,
        ("c", 6): large - {"tags"},  # set to NULL on 1 before the move: a null an update carries is a value
        ("u", 6): large - {"tags"},
    }
    rows = {row["id"]: row for row in built.rows("silver.pgreal_toast_inventory_documents", order="id")}
    assert sorted(rows) == [2, 5, 6]
    assert rows[6]["tags"] is None
    assert rows[6]["body"].startswith("beta ")  # document 1's body, updated before it moved to 6
    assert rows[5]["body"].startswith("gamma ")


def test_source_freshness_reads_when_each_bronze_table_last_landed_a_record(built: SilverHarness) -> None:
    """`dbt source freshness`: the scaffolded sources name bronze's landing time (`_cdc_ingested_at`), so thresholds
    set for them in dbt_project.yml (silver.md, "Freshness") are checked against the last record landed. Without
    it dbt has nothing to measure on Spark and checks nothing."""
    project_file = built.project / "dbt_project.yml"
    original = project_file.read_text()
    table = "pgreal_main_inventory_customers"
    project_file.write_text(
        original + "\nsources:\n  cdclake_project:\n    +freshness:\n      error_after: {count: 1, period: day}\n"
    )
    try:
        assert run_dbt(built.settings, ["source", "freshness", "--select", f"source:bronze.{table}", "--write-json"])
    finally:
        project_file.write_text(original)
    results = orjson.loads((built.project / "target" / "sources.json").read_bytes())["results"]
    assert [(r["unique_id"], r["status"]) for r in results] == [(f"source.cdclake_project.bronze.{table}", "pass")]
    landed = built.rows(f"bronze.{table}", "max(_cdc_ingested_at) as at")[0]["at"]  # the session's zone is UTC
    assert dt.datetime.fromisoformat(results[0]["max_loaded_at"]) == landed.replace(tzinfo=dt.UTC)


def test_docs_generate_catalogs_bronze_and_silver(built: SilverHarness) -> None:
    """`dbt docs generate`: dbt docs' catalog holds each silver model's and bronze source's columns as Spark reads
    them, through the package's way of listing relations on an Iceberg catalog (relations.sql)."""
    model = "pgreal_main_inventory_customers"
    assert run_dbt(built.settings, ["docs", "generate", "--select", model, f"source:bronze.{model}", "--write-json"])
    catalog = orjson.loads((built.project / "target" / "catalog.json").read_bytes())
    assert catalog["errors"] is None

    def columns(table: str) -> dict[str, str]:
        held: dict[str, str] = {}
        for row in built.spark.sql(f"describe table {table}").collect():
            if not row["col_name"] or row["col_name"].startswith("#"):  # the partitioning section after them
                break
            held[row["col_name"]] = row["data_type"]
        return held

    for entry, table in (
        (catalog["nodes"][f"model.cdclake_project.{model}"], f"silver.{model}"),
        (catalog["sources"][f"source.cdclake_project.bronze.{model}"], f"bronze.{model}"),
    ):
        assert {name: column["type"] for name, column in entry["columns"].items()} == columns(table)
    assert "_cdc_order" in columns(f"silver.{model}")


def test_pyiceberg_reads_silver_as_spark_does(built: SilverHarness) -> None:
    """operations.md's query without a JVM: pyiceberg applies silver's position deletes (merge-on-read: the second
    unit of work left some on this table) and reads the rows Spark reads."""
    table = "silver.pgreal_toast_inventory_documents"
    assert built.rows(f"{table}.delete_files", "count(*) as n")[0]["n"] > 0  # what makes the comparison mean something
    scanned = load_catalog(built.settings).load_table(table).scan(selected_fields=("id", "body", "_cdc_order"))
    by_pyiceberg = sorted(scanned.to_arrow().to_pylist(), key=lambda row: row["id"])
    assert by_pyiceberg == built.rows(table, "id, body, _cdc_order", "id")


def test_a_truncated_partition_stops_a_model_of_several_topics(
    built: SilverHarness, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A PostgreSQL partitioned table, one topic per partition, mapped to one bronze table: a truncate ends every
    row of silver, so the TRUNCATE of partition 2023 emptied 2024's rows too. The run now stops naming the topics
    and the ways out, and both work: a model per topic, and a model that leaves truncates out (keeping the rows
    they truncated). Real Debezium output (`partitions.jsonl`)."""
    harness = built  # after the module's own models: this test adds models that fail by design
    lines = recorded("partitions.jsonl", "pgreal_parts")
    topics = [f"pgreal_parts.inventory.{table}" for table in ("orders", "orders_2023", "orders_2024")]
    mapped = harness.settings.ingest.model_copy(update={"table_mapping": dict.fromkeys(topics, "pgreal_parts_orders")})
    harness.land_lines("partitions", lines, tmp_path_factory.mktemp("partitions"), mapped)
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    scaffold(tables, harness.project, select="pgreal_parts_*")  # declares the source; the models are written below
    source = "{{ source('bronze', 'pgreal_parts_orders') }}"
    silver_dir = harness.project / "models" / "silver"
    models = {
        "pgreal_parts_orders": ("", ""),
        "pgreal_parts_orders_2024": ("", f" where _cdc_topic = '{topics[2]}'"),
        "pgreal_parts_orders_kept": (", exclude_changes=\"op = 't'\"", ""),
    }
    for name, (config, where) in models.items():
        (silver_dir / f"{name}.sql").write_text(
            f"{{{{ config(materialized='cdc_silver', keys=['id', 'year']{config}) }}}}\nselect * from {source}{where}\n"
        )
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert not run_dbt(harness.settings, ["run", "--select", "pgreal_parts_orders"])
    message = log.read_bytes()[start:].decode()
    assert (
        f"cdc_silver model 'pgreal_parts_orders': its changes come from 3 topics ({', '.join(topics)}), and a "
        f"truncate from {topics[1]} would end every row of silver.pgreal_parts_orders older than it" in message
    ), message[-3000:]
    assert not load_catalog(harness.settings).table_exists("silver.pgreal_parts_orders")
    # A model of the truncated topic that does not select _cdc_topic cannot be told from one of all: it is refused,
    # saying so.
    bronze = load_catalog(harness.settings).load_table("bronze.pgreal_parts_orders")
    columns = ", ".join(field.name for field in bronze.schema().fields if field.name != "_cdc_topic")
    (silver_dir / "pgreal_parts_orders_columns.sql").write_text(
        "{{ config(materialized='cdc_silver', keys=['id', 'year']) }}\n"
        f"select {columns} from {source} where _cdc_topic = '{topics[1]}'\n"  # the truncated partition
    )
    start = log.stat().st_size
    assert not run_dbt(harness.settings, ["run", "--select", "pgreal_parts_orders_columns"])
    message = log.read_bytes()[start:].decode()
    assert (
        f"its changes come from 3 topics ({', '.join(topics)}, those of all of bronze.pgreal_parts_orders: the "
        "model does not select _cdc_topic, which a model of one topic must)" in message
    ), message[-3000:]
    (silver_dir / "pgreal_parts_orders_columns.sql").unlink()

    assert run_dbt(harness.settings, ["run", "--select", *list(models)[1:]])
    held = orjson.loads((RECORDED / "partitions_expected_final_state.json").read_bytes())["orders"]
    assert sorted(held, key=int) == ["2", "3", "5"]
    rows = harness.rows("silver.pgreal_parts_orders_2024", "id, year, item", "id")
    assert rows == [{"id": row["id"], "year": row["year"], "item": row["item"]} for row in held.values()]
    rows = harness.rows("silver.pgreal_parts_orders_kept", "id, item", "id")
    assert [(row["id"], row["item"]) for row in rows] == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
