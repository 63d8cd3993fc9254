"""complete_transactions: silver applies a source transaction's changes only once all of them have landed in bronze
(reference §9 item 13), on real Debezium output (`tests/fixtures/debezium/postgres/dbserver1.jsonl`, recorded with
`provide.transaction.metadata=true`), with and without schemas, landed a piece of a transaction at a time."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from ingest.bronze.naming import bronze_table_name
from ingest.bronze.tables import BronzeTables
from ingest.dbt_runner import run_dbt
from ingest.fakes import SOURCES, build_stream
from ingest.fakes.records import KafkaRecord, kcat_line
from ingest.lakehouse import load_catalog
from ingest.maintenance import sql_string
from ingest.scaffold import model_sql, model_yaml, scaffold
from tests.conftest import FIXTURES
from tests.silver_harness import Change, Connector, SilverHarness, Topic, TransactedTopic, without_schema

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

RECORDED = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
HELD = "cdclake.held_transactions"


def recording(prefix: str, schemas: bool) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in RECORDED.read_bytes().splitlines()]
    for line in lines:
        line["topic"] = line["topic"].replace("dbserver1.", prefix + ".", 1)
        if not schemas:
            line["key"], line["payload"] = without_schema(line["key"]), without_schema(line["payload"])
    return lines


def payload(line: dict[str, Any]) -> dict[str, Any]:
    value = orjson.loads(line["payload"])
    return dict(value.get("payload", value)) if "schema" in value else dict(value)


def find(lines: list[dict[str, Any]], transaction: str, what: str, nth: int = 0) -> int:
    """The index of the ``nth`` line of PostgreSQL transaction ``transaction`` (its number) that is its BEGIN, END,
    or a change of table ``what``."""
    found = []
    for at, line in enumerate(lines):
        if line["payload"] is None:
            continue
        value = payload(line)
        if value.get("status") in ("BEGIN", "END"):
            hit = value["status"] == what and value["id"].split(":")[0] == transaction
        else:
            block = value.get("transaction") or {}
            hit = str(block.get("id", "")).split(":")[0] == transaction and line["topic"].endswith("." + what)
        if hit:
            found.append(at)
    return found[nth]


def customers_state(lines: list[dict[str, Any]]) -> dict[int, str]:
    """id -> email after the customers changes among ``lines``, applied in order."""
    state: dict[int, str] = {}
    for line in lines:
        if line["payload"] is None or not line["topic"].endswith(".customers"):
            continue
        value = payload(line)
        if value["op"] == "d":
            state.pop(value["before"]["id"], None)
        else:
            state[value["after"]["id"]] = value["after"]["email"]
    return state


def earlier_end(line: dict[str, Any], schemas: bool) -> dict[str, Any]:
    """A copy of END record ``line`` for a transaction of the same number long before: log position 1, another
    table's data collection, partition 1 of its topic."""
    value = orjson.loads(line["payload"])
    body = value["payload"] if schemas else value
    body["id"] = body["id"].split(":")[0] + ":1"
    body["data_collections"] = [{"data_collection": "inventory.other", "event_count": 5}]
    return {**line, "partition": 1, "offset": 0, "payload": orjson.dumps(value).decode()}


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    return tmp_path


def test_changes_of_an_incomplete_transaction_wait_for_the_rest(harness: SilverHarness, dumps: Path) -> None:
    """Transaction 734 changes one customer three times; 735 changes a customer once and typed_values twice. Each
    is landed a piece at a time. Silver holds a transaction's changes until bronze holds as many of them as its END
    says (a run that finds only the transaction table grown applies them), keeps applying the other transactions
    meanwhile, and its shipped tests hold at every step; `transaction_timeout_minutes` applies a held transaction
    once its first change is that old, with a warning."""
    typed, schemaless = recording("pgtx", True), recording("pgtxjson", False)
    ingest = harness.settings.ingest.model_copy(update={"variable_scale_decimal_scale": 20})
    cut = find(typed, "734", "customers", 1) + 1  # 734's BEGIN, create and first update, not its second update
    end_734, end_735 = find(typed, "734", "END"), find(typed, "735", "END")
    units = [
        list(range(cut)),
        [end_734],  # only 734's END: 2 of its 3 changes have landed
        # 734's last update; 735's customers update and first typed_values change, not its END
        [at for at in range(cut, find(typed, "735", "typed_values") + 1) if at != end_734],
        [end_735],  # only 735's END: the customers model applies 735 though its own bronze did not grow
        [at for at in range(find(typed, "735", "typed_values", 1), len(typed)) if at != end_735],
    ]
    assert sorted(at for unit in units for at in unit) == list(range(len(typed)))  # each line lands once

    models = {
        "pgtx_inventory_customers": ("pgtx_inventory_customers", "complete_transactions='pgtx_transaction'"),
        "pgtx_inventory_typed_values": ("pgtx_inventory_typed_values", "complete_transactions='pgtx_transaction'"),
        "pgtxjson_inventory_customers": (
            "pgtxjson_inventory_customers",
            "keys=['id'], complete_transactions='bronze.pgtxjson_transaction'",
        ),
        "pgtx_customers_history": (
            "pgtx_inventory_customers",
            "history='scd2', complete_transactions='pgtx_transaction'",
        ),
        "pgtx_customers_timeout": (
            "pgtx_inventory_customers",
            "complete_transactions='pgtx_transaction', transaction_timeout_minutes=0",
        ),
    }
    silver_dir = harness.project / "models" / "silver"
    log = harness.project / "logs" / "dbt.log"
    # Silver of customers after each unit: the changes of the transactions complete by then.
    complete_after = [
        find(typed, "733", "END") + 1,
        find(typed, "733", "END") + 1,
        end_734 + 1,
        len(typed),
        len(typed),
    ]
    held_after = [["734"], ["734"], ["735"], [], []]
    typed_held_after = [[], [], ["735"], ["735"], []]
    applied: dict[str, str] = {}  # the bronze snapshot each model applied, after the unit before
    for unit, indices in enumerate(units):
        for name, lines in (("typed", typed), ("schemaless", schemaless)):
            landing = [lines[at] for at in indices]
            if unit == 0:
                # PostgreSQL's transaction numbers wrap: an END of an earlier transaction 734, at a log position
                # before this one's changes, listing another table, on another partition. It is not 734's END.
                landing.append(earlier_end(lines[end_734], schemas=name == "typed"))
            if unit == len(units) - 1:
                # At-least-once: one of 733's two customers changes again, at a later offset. The unit holds 1 of
                # its 2 changes, bronze both: 733 is complete (and its change, applied already, changes nothing).
                landing.append({**lines[find(typed, "733", "customers")], "offset": 1000})
            harness.land_lines(f"{name}-{unit}", landing, dumps, ingest)
        if unit == 0:
            tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
            scaffold(tables, harness.project, select="pgtx*")  # the sources, and the shipped tests of each model
            for name, (table, config) in models.items():
                (silver_dir / f"{name}.sql").write_text(
                    f"{{{{ config(materialized='cdc_silver', {config}) }}}}\n"
                    f"select * from {{{{ source('bronze', '{table}') }}}}\n"
                )
                described = model_yaml(table, ["id"], "bronze", None, "scd2" if "scd2" in config else "current")
                described["models"][0]["name"] = name
                (silver_dir / f"{name}.yml").write_text(yaml.safe_dump(described))
        start = log.stat().st_size if log.exists() else 0
        # The timeout model is checked after the first unit only (it has applied 734 by then): later builds of it
        # would only repeat the others' work.
        selected = [name for name in models if unit == 0 or name != "pgtx_customers_timeout"]
        assert run_dbt(harness.settings, ["build", "--select", *selected, "--threads", "2"]), f"unit {unit}"
        message = log.read_bytes()[start:].decode()
        # Each run of a model reads bronze's current snapshot once, from where its held changes began if it holds
        # any (not from its last snapshot first, and then again).
        readers = [name for name in selected if models[name][0] == "pgtx_inventory_customers"]
        assert message.count("show tblproperties bronze.pgtx_inventory_customers") == len(readers), unit
        expected = customers_state(typed[: complete_after[unit]])
        catalog = load_catalog(harness.settings)
        for model, email, where in (
            ("pgtx_inventory_customers", "email", "true"),
            ("pgtxjson_inventory_customers", "get_json_object(_cdc_document, '$.email') as email", "true"),
            ("pgtx_customers_history", "email", "_cdc_is_current and _cdc_op <> 'd'"),
        ):
            rows = harness.rows(f"silver.{model}", f"cast(id as int) as id, {email}", "id", where)
            assert {row["id"]: row["email"] for row in rows} == expected, (unit, model)
            properties = catalog.load_table(f"silver.{model}").properties
            held = orjson.loads(properties.get(HELD) or "null")
            assert (held or {}).get("ids", []) == held_after[unit], (unit, model)
            if held:
                # The next run reads again from where the run that first held the transaction began: all of bronze
                # for 734 (held by the first run), the snapshot applied by unit 1's run for 735, not from the start.
                assert held["from"] == (None if unit < 2 else applied[model]), (unit, model)
            applied[model] = properties["cdclake.bronze_snapshot_id"]
        held = orjson.loads(catalog.load_table("silver.pgtx_inventory_typed_values").properties.get(HELD) or "null")
        assert (held or {}).get("ids", []) == typed_held_after[unit], unit
        if unit == 0:
            assert "pgtx_inventory_customers: holding the changes of transaction 734 (its END has not landed in" in (
                message
            )
            # Past its timeout (0 minutes), 734 is applied as far as it has landed, with a warning naming it.
            assert "transaction 734 is incomplete (its END has not landed in" in message
            assert "over transaction_timeout_minutes=0 ago: applying what has landed" in message
            rows = harness.rows("silver.pgtx_customers_timeout", "id, email", "id")
            assert {row["id"]: row["email"] for row in rows} == customers_state(typed[:cut])
        if unit == 1:
            assert "holding the changes of transaction 734 (2 of its 3 changes of inventory.customers have landed" in (
                message
            )
    # In the end, all of it: silver equals what PostgreSQL held.
    final = orjson.loads((RECORDED.parent / "expected_final_state.json").read_bytes())
    rows = harness.rows("silver.pgtx_inventory_customers", "id, email", "id")
    assert {row["id"]: row["email"] for row in rows} == {int(k): v["email"] for k, v in final["customers"].items()}
    rows = harness.rows("silver.pgtx_inventory_typed_values", "id", "id")
    assert [row["id"] for row in rows] == sorted(int(k) for k in final["typed_values"])


def test_an_end_that_names_no_collection_of_the_table_stops_the_run(harness: SilverHarness, dumps: Path) -> None:
    """Counting needs the END's count for this table: an END naming its data collections otherwise fails the run,
    naming the transaction and what the END lists, instead of holding its changes for good."""
    lines = recording("pgtxname", True)
    for line in lines:
        if line["payload"] is not None and b'"status":"END"' in line["payload"].encode():
            line["payload"] = line["payload"].replace('"inventory.customers"', '"inventory.clients"')
    harness.land_lines("renamed", lines, dumps)
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    scaffold(tables, harness.project, select="pgtxname_inventory_customers")
    (harness.project / "models" / "silver" / "pgtxname_inventory_customers.sql").write_text(
        "{{ config(materialized='cdc_silver', complete_transactions='pgtxname_transaction') }}\n"
        "select * from {{ source('bronze', 'pgtxname_inventory_customers') }}\n"
    )
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert not run_dbt(harness.settings, ["run", "--select", "pgtxname_inventory_customers"])
    message = log.read_bytes()[start:].decode()
    assert "transaction 728 has an END record in " in message, message[-3000:]
    assert (
        "but it lists no data collection named inventory.customers or ending in .inventory.customers (it lists"
        " inventory.clients)" in message
    ), message[-3000:]
    assert not load_catalog(harness.settings).table_exists("silver.pgtxname_inventory_customers")


def test_the_four_sources_transactions_are_counted_by_their_own_formats(harness: SilverHarness, dumps: Path) -> None:
    """The fakes of Db2, Informix, Oracle and MongoDB write their transaction ids and data collections as the
    seeds show (Db2's LSN-shaped id, Informix's `txID:LSN`, Oracle's `5.6.641`, MongoDB's `rs0.<db>.<collection>`):
    each model holds its stream's last transaction of several changes while one of them is missing, and applies it
    once it lands, ending equal to the source table."""
    streams = {source: build_stream(source, seed=3, n_keys=6, n_changes=30) for source in SOURCES}
    held_ids: dict[str, str] = {}
    missing: dict[str, Any] = {}
    for source, stream in streams.items():
        # The last transaction with several changes: its last change lands only in the second unit.
        changes = [
            (record, payload({"payload": record.value.decode()}))
            for record in stream.records
            if record.topic == stream.data_topic and record.value
        ]
        last, value = max(
            (
                (record, value)
                for record, value in changes
                if int((value.get("transaction") or {}).get("data_collection_order") or 0) > 1
            ),
            key=lambda change: stream.records.index(change[0]),
        )
        tx_id = value["transaction"]["id"]
        held_ids[source] = tx_id  # Informix's changes carry their END's id (its BEGIN's differs)
        missing[source] = last
    # The data topic's records from that change on land in the second unit (a record below an offset bronze holds
    # would be taken for one landed already); the transaction topic's, its END included, in the first.
    first: list[dict[str, Any]] = []
    second: list[dict[str, Any]] = []
    for source, stream in streams.items():
        cut = stream.records.index(missing[source])
        for at, record in enumerate(stream.records):
            later = at >= cut and record.topic == stream.data_topic
            (second if later else first).append(orjson.loads(kcat_line(record)))
    harness.land_lines("sources-0", first, dumps)
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    names = [bronze_table_name(stream.data_topic) for stream in streams.values()]
    for name in names:
        scaffold(tables, harness.project, select=name)
    silver_dir = harness.project / "models" / "silver"
    for stream, name in zip(streams.values(), names, strict=True):
        model = silver_dir / f"{name}.sql"
        transactions = bronze_table_name(stream.transaction_topic)
        model.write_text(model.read_text().replace(") }}", f", complete_transactions='{transactions}') }}}}", 1))
    assert run_dbt(harness.settings, ["build", "--select", *names, "--threads", "2"])
    catalog = load_catalog(harness.settings)
    for source, name in zip(streams, names, strict=True):
        held = orjson.loads(catalog.load_table(f"silver.{name}").properties.get(HELD) or "null")
        assert held["ids"] == [held_ids[source]], source
    harness.land_lines("sources-1", second, dumps)
    assert run_dbt(harness.settings, ["build", "--select", *names, "--threads", "2"])
    for (source, stream), name in zip(streams.items(), names, strict=True):
        assert not catalog.load_table(f"silver.{name}").properties.get(HELD), source
        rows = harness.spark.sql(f"select count(*) as n from silver.{name}").collect()[0]["n"]
        assert rows == len(stream.expected), source


def test_changes_landed_before_the_transaction_topic_are_not_held(harness: SilverHarness, dumps: Path) -> None:
    """A transaction topic that cdclake began to ingest after the data topics (or whose older records were deleted
    first): the transactions before its first record have no END in bronze. Held, each would wait for good (every
    transaction of a table's history, on a first build); they are applied as they landed, and said so, while
    later ones are held as usual."""
    lines = [line for line in recording("pgtxlate", True) if not line["topic"].endswith(".typed_values")]
    first_734 = find(lines, "734", "BEGIN")
    data_before = [line for line in lines[:first_734] if line["topic"].endswith(".customers")]
    harness.land_lines("late-0", data_before, dumps)  # transactions 728-733, without the transaction topic
    later = [
        lines[first_734],
        *lines[first_734 + 1 : find(lines, "734", "customers", 2)],
        lines[find(lines, "734", "END")],
    ]
    harness.land_lines("late-1", later, dumps)  # 734's BEGIN, END and 2 of its 3 changes
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    scaffold(tables, harness.project, select="pgtxlate_inventory_customers")
    model = harness.project / "models" / "silver" / "pgtxlate_inventory_customers.sql"
    model.write_text(model.read_text().replace(") }}", ", complete_transactions='pgtxlate_transaction') }}", 1))
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert run_dbt(harness.settings, ["build", "--select", "pgtxlate_inventory_customers"])
    message = log.read_bytes()[start:].decode()
    assert "transaction(s) whose changes landed before the first record of bronze.pgtxlate_transaction" in message
    assert "holding the changes of transaction 734 (2 of its 3 changes of inventory.customers have landed" in message
    rows = harness.rows("silver.pgtxlate_inventory_customers", "id, email", "id")
    assert {row["id"]: row["email"] for row in rows} == customers_state(data_before)
    held = orjson.loads(
        load_catalog(harness.settings).load_table("silver.pgtxlate_inventory_customers").properties[HELD]
    )
    assert held["ids"] == ["734"]


def test_later_changes_of_a_held_changes_key_wait_with_it(harness: SilverHarness, dumps: Path) -> None:
    """MongoDB in change_streams mode: an update carries only its patch, folded onto the document's previous
    image. A transaction that inserts a document is held (one of its changes, on another partition, has not
    landed) while a later, complete transaction updates the document: the update waits with the insert, since
    applied alone it would patch a document silver does not hold. Once the missing change lands, both are applied
    and silver equals the source."""
    from ingest.demo import check_source

    stream = build_stream("mongodb", seed=0, n_keys=4, n_changes=40, partitions=2, capture_mode="change_streams")
    prefix = stream.data_topic.split(".")[0]  # topics of their own: the harness's catalog is shared

    def line(record: KafkaRecord) -> dict[str, Any]:
        renamed = dataclasses.replace(record, topic=record.topic.replace(prefix, "heldkey", 1))
        return dict(orjson.loads(kcat_line(renamed)))

    data = [
        (at, record, payload({"payload": record.value.decode()}))
        for at, record in enumerate(stream.records)
        if record.topic == stream.data_topic and record.value
    ]

    def tx_of(change: dict[str, Any]) -> str | None:
        return (change.get("transaction") or {}).get("id")

    # An insert, a change of its transaction after it on the other partition, and a later patch of its document.
    insert_at, missing_at, patch_at = next(
        (at, other_at, patch)
        for at, record, change in data
        if change["op"] == "c" and tx_of(change)
        for other_at, other, other_change in data
        if other_at > at and other.partition != record.partition and tx_of(other_change) == tx_of(change)
        for patch, later, later_change in data
        if patch > at and later.key == record.key and later_change["op"] == "u" and tx_of(later_change) != tx_of(change)
    )
    held_tx = next(str(tx_of(change)) for at, _, change in data if at == insert_at)
    patch_tx = next(str(tx_of(change)) for at, _, change in data if at == patch_at)
    missing_partition = stream.records[missing_at].partition
    later = [
        at >= missing_at and record.topic == stream.data_topic and record.partition == missing_partition
        for at, record in enumerate(stream.records)
    ]
    assert not later[patch_at]
    harness.land_lines("held-key-0", [line(r) for r, x in zip(stream.records, later, strict=True) if not x], dumps)
    tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
    name = bronze_table_name(stream.data_topic.replace(prefix, "heldkey", 1))
    scaffold(tables, harness.project, select=name)
    model = harness.project / "models" / "silver" / f"{name}.sql"
    transactions = bronze_table_name(stream.transaction_topic.replace(prefix, "heldkey", 1))
    model.write_text(model.read_text().replace(") }}", f", complete_transactions='{transactions}') }}}}", 1))
    assert run_dbt(harness.settings, ["build", "--select", name])
    held = orjson.loads(load_catalog(harness.settings).load_table(f"silver.{name}").properties[HELD])
    assert held_tx in held["ids"]  # with others whose changes on that partition have not landed
    assert patch_tx not in held["ids"]  # the patch waits for its key, not for its own transaction
    document = orjson.loads(stream.records[insert_at].key or b"{}")["payload"]["id"]
    rows = harness.spark.sql(f"select id from silver.{name}").collect()
    assert document not in [row["id"] for row in rows]
    assert len(rows) > 0
    harness.land_lines("held-key-1", [line(r) for r, x in zip(stream.records, later, strict=True) if x], dumps)
    assert run_dbt(harness.settings, ["build", "--select", name])
    assert not load_catalog(harness.settings).load_table(f"silver.{name}").properties.get(HELD)
    check = check_source(harness.spark, stream, name, "silver")
    assert check.mismatches == []
    assert check.silver_rows == check.expected_rows


@pytest.mark.parametrize("mode", ["hard", pytest.param("soft", marks=pytest.mark.slow)])
def test_tombstones_stay_while_a_transaction_is_held(harness: SilverHarness, dumps: Path, mode: str) -> None:
    """Each run reads bronze again from where its oldest held transaction began, changes applied already included.
    Key 1 is created and deleted; a replay of its create lands beside a held transaction's change and is ignored, as
    older than key 1's tombstone (with soft deletes, its soft-deleted row). Were that purged past
    `tombstone_horizon_days` while the transaction is still held, the next re-read would bring key 1 back: purges
    wait until nothing is held."""
    source = TransactedTopic(harness.topic(f"held_horizon_{mode}"))
    topic = source.topic

    def deleted() -> list[int]:  # the tombstones, or silver's soft-deleted rows
        if mode == "hard":
            return tombstone_keys(harness, topic)
        rows = harness.spark.sql(f"select id from silver.{topic.table} where _cdc_deleted order by id").collect()
        return [row["id"] for row in rows]

    def live() -> dict[int, str | None]:
        return harness.silver(topic, "true" if mode == "hard" else "not _cdc_deleted")

    harness.land_lines(
        "horizon-0",
        [*source.changes([Change("c", 1, 10, "a"), Change("d", 1, 20)], [("a", 1), ("b", 1)]), source.end("a")],
        dumps,
    )
    harness.land_lines("horizon-0-ends", [source.end("b")], dumps)
    source.scaffold(harness, f"tombstone_horizon_days=3, delete_mode='{mode}'")
    assert harness.build(topic)
    assert live() == {}
    assert deleted() == [1]
    # Transaction h has no END yet; key 1's create lands again (at-least-once), in its complete transaction a.
    replayed = source.changes([Change("c", 2, 30, "h"), Change("c", 1, 10, "a")], [("h", 1), ("a", 1)])
    harness.land_lines("horizon-1", replayed, dumps)
    assert harness.build(topic)
    assert live() == {}
    harness.spark.sql(
        f"update silver.{topic.table}{'__cdc_tombstones' if mode == 'hard' else ''}"
        " set _cdc_deleted_at = current_timestamp() - interval 4 days where _cdc_deleted_at is not null"
    ).collect()
    for _ in range(2):  # each run reads key 1's create again: its tombstone must still be there the second time
        assert harness.build(topic)
        assert live() == {}
        assert deleted() == [1]
    # h completes: applied, nothing is held any more, and the purge goes ahead.
    harness.land_lines("horizon-2", [source.end("h")], dumps)
    assert harness.build(topic)
    assert live() == {2: "h"}
    assert deleted() == []
    assert harness.build(topic)
    assert live() == {2: "h"}


def test_a_held_delete_whose_run_was_killed_after_silvers_commit(harness: SilverHarness, dumps: Path) -> None:
    """A run killed right after silver's commit (the fast-forward of main) leaves its branch, and neither its
    tombstones nor its properties: the next run reads its unit again, from where the oldest transaction held
    before it began. Here the killed run applied held transaction d, which deletes key 1: the run after it must
    still give key 1 its tombstone, so that a late replay of key 1's create cannot bring it back, and must move
    the held state on."""
    source = TransactedTopic(harness.topic("held_killed"))
    topic = source.topic
    table, tombstones = f"silver.{topic.table}", f"silver.{topic.table}__cdc_tombstones"
    complete = source.changes(
        [Change("c", 1, 10, "a"), Change("c", 2, 11, "a"), Change("c", 3, 12, "a"), Change("d", 3, 13)],
        [("a", 1), ("a", 2), ("a", 3), ("a", 4)],
    )
    held = source.changes([Change("d", 1, 20)], [("d", 1)])  # d's other change and END are to come
    harness.land_lines("killed-0", [*complete, source.end("a", 4), *held], dumps)
    source.scaffold(harness, "stale_run_hours=0")  # the run killed below began seconds before the next one
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a", 2: "a"}
    assert tombstone_keys(harness, topic) == [3]
    catalog = load_catalog(harness.settings)
    before = catalog.load_table(table).properties
    assert orjson.loads(before[HELD])["ids"] == ["d"]
    tombstones_before = catalog.load_table(tombstones).current_snapshot()
    assert tombstones_before is not None

    harness.land_lines("killed-1", [*source.changes([Change("u", 2, 21, "d")], [("d", 2)]), source.end("d", 2)], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {2: "d"}
    # What a SIGKILL right after the fast-forward leaves: main moved, the run's branch still there, the tombstones
    # and silver's properties as before the run.
    after = catalog.load_table(table).properties
    killed = f"cdclake_apply_{after['cdclake.run_id']}"  # the run's own branch: it left its batch table too
    harness.spark.sql(f"alter table {table} create branch {killed}").collect()
    harness.spark.sql(f"call system.rollback_to_snapshot('{tombstones}', {tombstones_before.snapshot_id})").collect()
    cdclake_keys = {key for key in {*before, *after} if key.startswith("cdclake.")}
    assert {key: after.get(key) for key in cdclake_keys} != {key: before.get(key) for key in cdclake_keys}
    restored = ", ".join(f"'{key}' = {sql_string(before[key])}" for key in sorted(cdclake_keys) if key in before)
    harness.spark.sql(f"alter table {table} set tblproperties ({restored})").collect()
    added = [f"'{key}'" for key in sorted(cdclake_keys) if key not in before]
    if added:
        harness.spark.sql(f"alter table {table} unset tblproperties ({', '.join(added)})").collect()
    now = load_catalog(harness.settings).load_table(table).properties
    assert {key: now.get(key) for key in cdclake_keys} == {key: before.get(key) for key in cdclake_keys}
    assert tombstone_keys(harness, topic) == [3]

    assert harness.build(topic)  # reads all of bronze again, where the run that first held d began
    assert harness.silver(topic) == {2: "d"}
    assert tombstone_keys(harness, topic) == [1, 3]
    properties = load_catalog(harness.settings).load_table(table).properties
    assert not properties.get(HELD)
    assert not harness.spark.sql(f"select * from {table}.refs where name = '{killed}'").collect()
    harness.land_lines("killed-2", source.changes([Change("c", 1, 10, "a")], [("a", 1)]), dumps)  # a late replay
    assert harness.build(topic)
    assert harness.silver(topic) == {2: "d"}


def test_a_change_waiting_for_its_key_is_read_again_whichever_transaction_holds_it(
    harness: SilverHarness, dumps: Path
) -> None:
    """A key's changes can land out of their source order (across partitions: a keyless table's keys read from the
    images). Key 1's update x (position 10) waits behind held t1's create (5); then t2's update of key 1 (7) lands,
    held too. When t1 completes, x still waits, now behind t2, though it landed before t2's first change: the next
    runs must read it again, so that once t2 completes key 1 ends at x's value, not t2's."""
    source = TransactedTopic(harness.topic("held_out_of_order"))
    topic = source.topic
    first = source.changes([Change("c", 1, 5, "t1"), Change("u", 1, 10, "x")], [("t1", 1), ("x", 1)])
    harness.land_lines("order-0", [*first, source.end("x")], dumps)  # t1's other change and END are to come
    source.scaffold(harness, "")
    assert harness.build(topic)
    assert harness.silver(topic) == {}
    harness.land_lines("order-1", source.changes([Change("u", 1, 7, "t2")], [("t2", 1)]), dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {}
    harness.land_lines("order-2", [*source.changes([Change("c", 2, 6, "t1")], [("t1", 2)]), source.end("t1", 2)], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "t1", 2: "t1"}  # t1 whole; x waits, now behind t2
    held = orjson.loads(load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties[HELD])
    assert held["ids"] == ["t2"]
    harness.land_lines("order-3", [*source.changes([Change("c", 3, 8, "t2")], [("t2", 2)]), source.end("t2", 2)], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "x", 2: "t1", 3: "t2"}
    assert not load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties.get(HELD)


def test_the_shipped_tests_leave_out_what_waits_before_the_models_where(harness: SilverHarness, dumps: Path) -> None:
    """A model of some rows (`where`): a held change its `where` leaves out still holds its key's later changes, as
    the model reads bronze's rows before its SQL does. The shipped tests recompute likewise: held changes first,
    `bronze_where` after (the other way round they expected key 1's update x, which silver rightly holds), whether
    they list the held changes in their query or read them through the query that finds them."""
    source = TransactedTopic(harness.topic("held_where"))
    topic = source.topic
    first = source.changes(
        [Change("c", 1, 1, "c"), Change("u", 1, 5, "skip"), Change("u", 1, 10, "x")], [("c", 1), ("t1", 1), ("x", 1)]
    )
    harness.land_lines("where-0", [*first, source.end("c"), source.end("x")], dumps)  # t1's END is to come
    source.scaffold(harness, "", where="op in ('d', 't') or after.v <> 'skip'")
    assert harness.build(topic)  # the shipped tests pass
    assert harness.silver(topic) == {1: "c"}
    # Held changes past the number the tests list in their query (here: any) are read through the query that finds
    # them, to the same result.
    listed_none = orjson.dumps({"cdclake_tests_listed_held_changes": 0}).decode()
    assert run_dbt(harness.settings, ["test", "--select", topic.table, "--vars", listed_none])
    harness.land_lines("where-1", [source.end("t1")], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "x"}


def tombstone_keys(harness: SilverHarness, topic: Topic) -> list[int]:
    rows = harness.spark.sql(f"select id from silver.{topic.table}__cdc_tombstones order by id").collect()
    return [row["id"] for row in rows]


@pytest.mark.parametrize("connector", ["informix", "postgresql"])
def test_a_primary_key_change_waits_behind_a_held_change_of_either_key(
    harness: SilverHarness, dumps: Path, connector: Connector
) -> None:
    """Debezium sends a primary-key change as a delete of the old key and a create of the new one, at one position
    and in one transaction. Held t1 updates key 1 and deletes key 8. Complete t2 moves key 1 to 2, t3 then updates
    key 2, and complete t5 moves key 7 to 8: each half waits behind t1 with the other, and so do later changes of
    the new key. Applied apart, silver showed key 2 before key 1's move was (two rows for one), and lost key 7
    before key 8 came. Complete t6's move of key 9, which touches no held key, is applied at once. The halves are
    paired by position: Informix's delete comes one place before its create in their transaction, PostgreSQL's
    shares the create's position (moved_delete_order_sql)."""
    source = TransactedTopic(harness.topic(f"held_key_move_{connector}", connector))
    topic = source.topic
    created = source.changes(
        [Change("c", 1, 1, "a"), Change("c", 7, 2, "g"), Change("c", 8, 3, "h"), Change("c", 9, 4, "i")],
        [("c0", i) for i in (1, 2, 3, 4)],
    )
    harness.land_lines("move-0", [*created, source.end("c0", 4)], dumps)
    source.scaffold(harness, "")
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a", 7: "g", 8: "h", 9: "i"}
    moves = source.changes(
        [
            Change("u", 1, 5, "t1"),
            Change("d", 8, 7),
            Change("d", 1, 10, new_key=2),
            Change("c", 2, 10, "moved", old_key=1),
            Change("u", 2, 15, "later"),
            Change("d", 7, 12, new_key=8),
            Change("c", 8, 12, "moved8", old_key=7),
            Change("d", 9, 13, new_key=10),
            Change("c", 10, 13, "moved10", old_key=9),
        ],
        [("t1", 1), ("t1", 2), ("t2", 1), ("t2", 2), ("t3", 1), ("t5", 1), ("t5", 2), ("t6", 1), ("t6", 2)],
    )
    ends = [source.end("t2", 2), source.end("t3"), source.end("t5", 2), source.end("t6", 2)]
    harness.land_lines("move-1", [*moves, *ends], dumps)
    assert harness.build(topic)  # the shipped tests leave out what waits, the same way
    assert harness.silver(topic) == {1: "a", 7: "g", 8: "h", 10: "moved10"}
    held = orjson.loads(load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties[HELD])
    assert held["ids"] == ["t1"]
    # The run kept the moves, each round of held keys and the coordinates of the changes it held in tables of its
    # own (`_held_moves`, `_held_keys<N>`, `_held`), and dropped them when done.
    tables = [row["tableName"] for row in harness.spark.sql("show tables in cdclake_scratch.silver").collect()]
    assert not [name for name in tables if re.fullmatch(f"{topic.table}__cdc_batch_[0-9a-f]+_held.*", name)]
    # t1's last change lands: everything is applied, in order.
    harness.land_lines("move-2", [*source.changes([Change("c", 3, 6, "t1")], [("t1", 3)]), source.end("t1", 3)], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {2: "later", 3: "t1", 8: "moved8", 10: "moved10"} == topic.expected()
    assert not load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties.get(HELD)


def test_an_update_that_moves_its_row_waits_behind_a_held_change_of_its_old_key(
    harness: SilverHarness, dumps: Path
) -> None:
    """A table without a primary key, its keys read from the images: an update whose images hold different keys
    moves its row (1 to 5, then 5 to 6). Behind held t1's update of key 1 both moves wait, as the later changes of
    key 1 do: applied, the first took key 1's row away before t1 was complete."""
    source = TransactedTopic(harness.topic("held_image_move"))
    topic = source.topic

    def keyless(lines: list[dict[str, Any]], moved: dict[int, int]) -> list[dict[str, Any]]:
        """``lines`` without a Kafka key; the update at offset o gets ``moved[o]`` as its new key."""
        for line in lines:
            line["key"] = None
            if line["payload"] is not None and line["offset"] in moved:
                value = orjson.loads(line["payload"])
                value["payload"]["after"]["id"] = moved[line["offset"]]
                line["payload"] = orjson.dumps(value).decode()
        return lines

    created = keyless(source.changes([Change("c", 1, 1, "a"), Change("c", 2, 2, "b")], [("c0", 1), ("c0", 2)]), {})
    harness.land_lines("image-0", [*created, source.end("c0", 2)], dumps)
    # scaffold declares the source (and writes no model: the table has no key); the model names its key.
    scaffold(BronzeTables(load_catalog(harness.settings), "bronze"), harness.project, select=topic.table)
    models = harness.project / "models" / "silver"
    sql = model_sql(topic.table, ["id"], "bronze")
    (models / f"{topic.table}.sql").write_text(sql.replace(") }}", f", {source.options('')}) }}}}", 1))
    (models / f"{topic.table}.yml").write_text(yaml.safe_dump(model_yaml(topic.table, ["id"], "bronze", None)))
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a", 2: "b"}
    first = topic.next_offset
    lines = source.changes(
        [Change("u", 1, 5, "t1"), Change("u", 1, 10, "x"), Change("u", 5, 12, "y"), Change("u", 2, 13, "b2")],
        [("t1", 1), ("t2", 1), ("t3", 1), ("t4", 1)],
    )
    harness.land_lines(
        "image-1",
        [*keyless(lines, {first + 1: 5, first + 2: 6}), source.end("t2"), source.end("t3"), source.end("t4")],
        dumps,
    )
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a", 2: "b2"}  # t4, of another key, does not wait
    last = keyless(source.changes([Change("c", 3, 6, "t1")], [("t1", 2)]), {})
    harness.land_lines("image-2", [*last, source.end("t1", 2)], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {2: "b2", 3: "t1", 6: "y"}
