"""Scale-out: a PostgreSQL-backed catalog, a Spark standalone cluster and several ingest processes.

Every part runs as its own process, as deployed: `cdclake ingest` and `cdclake dbt build` are subprocesses with their
own JVM (the test session's shared SparkSession is bound to a SQLite catalog and cannot change), the catalog is a
private PostgreSQL server, the cluster is a standalone master with two workers (1 core, 1g each) plus a Spark Thrift
Server, and the broker is the session's Tansu. Silver is read back with pyiceberg (no JVM in this process).

Each subprocess gets a runtime directory of its own (``CDCLAKE_RUNTIME_DIR``: the project's jars and binaries linked
in), so the generated dbt profile never collides with another test's or a developer's.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from ingest.broker import Record, TansuBroker
from ingest.bronze.naming import bronze_table_name
from ingest.bronze.rows import Layout
from ingest.bronze.tables import OFFSETS_PROPERTY, BronzeTables, TableBatch, decode_offsets
from ingest.config import Settings, load_settings
from ingest.demo import source_mismatches
from ingest.fakes import build_stream, continue_stream
from ingest.fakes.scenario import FakeStream
from ingest.lakehouse import PROJECT_ROOT, RUNTIME_DIR_ENV, jdbc_catalog_conf, load_catalog, spark_conf
from ingest.testing.postgres import PrivatePostgres, server_available
from ingest.testing.spark_cluster import SparkCluster, ThriftServer
from tests.conftest import TEST_JAVA_OPTIONS
from tests.kafka_fixtures import (
    FAST_GROUP_JOIN,
    Coordinate,
    broker,  # noqa: F401 - the session fixture
    bronze_coordinates,
    lost_and_duplicated,
    publish,
    retopic,
    unique,
)
from tests.missing import missing_runtime
from tests.processes import CHILD_SPARK, Cdclake, cdclake_command, ingester, isolated_runtime

# Columns whose value is the time of the apply, different on every build.
VOLATILE_COLUMNS = {"_cdc_applied_at", "_cdc_deleted_at"}
HISTORY_SUFFIX = "_history"  # the SCD2 model of the typed table in the PostgreSQL-catalog lakehouse
SUBPROCESS_TIMEOUT_S = 600.0


# -- infrastructure (module scope: each starts once) -----------------------------------------------------------------
@pytest.fixture(scope="module")
def postgres() -> Iterator[PrivatePostgres]:
    if not server_available():
        missing_runtime("the PostgreSQL server (initdb, pg_ctl) is not installed")
    with PrivatePostgres(database="scaleout") as server:
        yield server


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    # The master, workers and executors compile with C1 alone, as the tests' drivers do (TEST_JAVA_OPTIONS): with
    # C2 the executors spent 45 of their 82 CPU-seconds in the JIT here.
    with SparkCluster(workers=2, cores=1, memory="1g", daemon_java_options=TEST_JAVA_OPTIONS) as running:
        yield running


def dbt_project_copy(root: Path) -> Path:
    """The project docker-compose.yml's dbt job builds, deploy/dbt_project: no models (scaffold writes ours)."""
    project = root / "dbt_project"
    ignore = shutil.ignore_patterns("target", "dbt_packages", "logs", "package-lock.yml")
    shutil.copytree(PROJECT_ROOT / "deploy" / "dbt_project", project, ignore=ignore)
    (project / "packages.yml").write_text(f"packages:\n  - local: {PROJECT_ROOT / 'dbt_cdclake'}\n")
    return project


@dataclass
class Lakehouse:
    """One lakehouse (catalog + warehouse + dbt project) driven through the `cdclake` command."""

    root: Path
    raw: dict[str, Any]

    @classmethod
    def create(cls, root: Path, catalog_uri: str, source: dict[str, Any], **ingest: Any) -> Lakehouse:
        root.mkdir(parents=True, exist_ok=True)
        isolated_runtime(root)
        raw = {
            "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": catalog_uri},
            "source": source,
            "ingest": ingest,
            "spark": copy.deepcopy(CHILD_SPARK),
            "dbt": {"project_dir": str(dbt_project_copy(root))},
        }
        lakehouse = cls(root, raw)
        lakehouse.config()
        return lakehouse

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            RUNTIME_DIR_ENV: str(self.root / "runtime"),
            "TZ": "UTC",
            "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
        }

    def config(self, name: str = "cdclake.yml", **sections: dict[str, Any]) -> Path:
        """Write a cdclake.yml for this lakehouse; ``sections`` are merged key by key into the base settings."""
        raw = copy.deepcopy(self.raw)
        for section, values in sections.items():
            raw.setdefault(section, {}).update(values)
        path = self.root / name
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    def settings(self, name: str = "cdclake.yml") -> Settings:
        return load_settings(self.root / name, environ={})

    def cdclake(self, config: Path, *args: str) -> tuple[str, float]:
        """Run `cdclake --config CONFIG ARGS` in its own process; fails the test with its output on error."""
        started = time.monotonic()
        process = subprocess.run(
            [cdclake_command(), "--config", str(config), "--log-format", "text", *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
            check=False,
        )
        elapsed = time.monotonic() - started
        output = process.stdout + process.stderr
        assert process.returncode == 0, f"cdclake {' '.join(args)} failed ({process.returncode}):\n{output[-6000:]}"
        return output, elapsed


def silver_rows(settings: Settings, namespace: str, table: str) -> list[dict[str, Any]]:
    """A silver table's rows as pyiceberg reads them (position deletes of merge-on-read applied)."""
    rows = load_catalog(settings).load_table(f"{namespace}.{table}").scan().to_arrow().to_pylist()
    return [dict(row) for row in rows]


def comparable(rows: list[dict[str, Any]]) -> list[str]:
    """Rows without apply timestamps, in a canonical order, for comparing two builds of one silver table."""
    return sorted(repr(sorted((k, v) for k, v in row.items() if k not in VOLATILE_COLUMNS)) for row in rows)


# -- a PostgreSQL-catalog lakehouse, ingested and built locally once (shared by the first two tests) -------------------
@dataclass
class BuiltLakehouse:
    lakehouse: Lakehouse
    streams: list[FakeStream]
    prefix: str
    published: set[Coordinate]
    catalog_uri: str
    timings: dict[str, float]

    def table(self, stream: FakeStream) -> str:
        return bronze_table_name(self.prefix + stream.data_topic)


@pytest.fixture(scope="module")
def pg_lakehouse(
    postgres: PrivatePostgres,
    broker: TansuBroker,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> BuiltLakehouse:
    """Fake Db2 (typed columns) and MongoDB (document) streams -> Tansu -> `cdclake ingest --once` (pyiceberg, PG
    catalog) -> `cdclake scaffold` -> `cdclake dbt build` (local Spark, silver namespace ``silver``)."""
    prefix = unique("pgcat") + "."
    streams = [
        build_stream("db2", seed=31, n_keys=12, n_changes=60, partitions=2),
        build_stream("mongodb", seed=32, n_keys=12, n_changes=60, partitions=2),
    ]
    records = [record for stream in streams for record in retopic(stream.records, prefix)]
    published = publish(broker, records, partitions=2)
    catalog_uri = postgres.create_database(unique("lake_pg_"))
    source = {
        "type": "kafka",
        "bootstrap_servers": broker.bootstrap_servers,
        "topics": sorted({r.topic for r in records}),
        "group_id": unique("pg-e2e-"),
        "consumer": dict(FAST_GROUP_JOIN),
    }
    lakehouse = Lakehouse.create(tmp_path_factory.mktemp("pg_lakehouse"), catalog_uri, source, latency_threshold_s=1.0)
    config = lakehouse.root / "cdclake.yml"
    timings: dict[str, float] = {}
    _, timings["ingest"] = lakehouse.cdclake(config, "ingest", "--once", "--no-progress")
    lakehouse.cdclake(config, "scaffold")
    # Beside the scaffolded current-state models: the typed table's version history (its own SQL path, scd2.sql).
    typed = bronze_table_name(prefix + streams[0].data_topic)
    history_sql = (Path(lakehouse.raw["dbt"]["project_dir"]) / "models" / "silver" / f"{typed}.sql").read_text()
    assert "history=" not in history_sql
    (Path(lakehouse.raw["dbt"]["project_dir"]) / "models" / "silver" / f"{typed}{HISTORY_SUFFIX}.sql").write_text(
        history_sql.replace("materialized='cdc_silver',", "materialized='cdc_silver', history='scd2',")
    )
    _, timings["dbt build (local)"] = lakehouse.cdclake(config, "dbt", "build")
    return BuiltLakehouse(lakehouse, streams, prefix, published, catalog_uri, timings)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.dbt
def test_postgres_catalog_end_to_end(pg_lakehouse: BuiltLakehouse) -> None:
    built = pg_lakehouse
    settings = built.lakehouse.settings()
    # The catalog really is the PostgreSQL server, on both sides.
    conf = jdbc_catalog_conf(settings)
    assert conf["spark.sql.catalog.lake.uri"].startswith("jdbc:postgresql://127.0.0.1:")
    assert conf["spark.sql.catalog.lake.jdbc.user"] == "postgres"
    from sqlalchemy import create_engine, text

    engine = create_engine(built.catalog_uri)
    try:
        with engine.connect() as connection:
            registered = {
                (row[0], row[1])
                for row in connection.execute(text("select table_namespace, table_name from iceberg_tables"))
            }
    finally:
        engine.dispose()
    for stream in built.streams:
        assert ("bronze", built.table(stream)) in registered
        assert ("silver", built.table(stream)) in registered
    # Bronze holds every published record exactly once.
    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(built.published, counts)
    assert not lost
    assert not duplicated
    assert set(counts) == built.published
    # Silver equals what the sources hold after the same changes.
    for stream in built.streams:
        rows = silver_rows(settings, "silver", built.table(stream))
        assert len(rows) == len(stream.expected)
        problems = source_mismatches(rows, stream)
        assert not problems, f"{stream.source}: {problems[:10]}"
    print(f"postgres catalog end to end: {built.timings}")


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.dbt
@pytest.mark.cluster
def test_silver_on_the_cluster_equals_local_silver(pg_lakehouse: BuiltLakehouse, cluster: SparkCluster) -> None:
    """The same `dbt build` via (a) local Spark, (b) a Thrift Server on the cluster, (c) a session on the cluster.

    To keep the module within a few minutes on 2 cores, the cluster builds select the typed (Db2) models with
    their data tests: current state and version history (SCD2) through the Thrift Server, current state in the
    session; the document-layout (MongoDB) model is built and checked locally by the end-to-end test.
    """
    built = pg_lakehouse
    lakehouse = built.lakehouse
    typed = built.streams[0]
    select = ("--select", built.table(typed), built.table(typed) + HISTORY_SUFFIX)
    timings = dict(built.timings)
    cluster_spark = {
        "master": cluster.master_url,
        "driver_memory": "1g",
        "conf": {
            "spark.executor.memory": "512m",
            "spark.dynamicAllocation.enabled": "false",
            # A non-local master leaves the driver's address to Spark (its host name); this cluster is on loopback.
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
            "spark.executor.extraJavaOptions": TEST_JAVA_OPTIONS,
        },
    }

    # (b) dbt-spark's thrift method against a Spark Thrift Server that runs on the cluster.
    thrift_config = lakehouse.config("cdclake-thrift.yml", lakehouse={"silver_namespace": "silver_thrift"})
    thrift_settings = load_settings(thrift_config, environ={})
    conf = {
        **spark_conf(thrift_settings),
        "spark.master": cluster.master_url,
        "spark.executor.memory": "512m",
        "spark.executor.extraJavaOptions": TEST_JAVA_OPTIONS,
        "spark.app.name": "cdclake-thrift-server",
        "spark.sql.warehouse.dir": str(lakehouse.root / "runtime" / "spark-warehouse"),
    }
    started = time.monotonic()
    with ThriftServer(conf) as thrift:
        timings["thrift server start"] = time.monotonic() - started
        config = lakehouse.config(
            "cdclake-thrift.yml",
            lakehouse={"silver_namespace": "silver_thrift"},
            dbt={"target": "cluster", "thrift_host": thrift.host, "thrift_port": thrift.port},
        )
        output, timings["dbt build (thrift, cluster)"] = lakehouse.cdclake(config, "dbt", "build", *select)
        assert "target='cluster'" in output
    # (c) dbt-spark's session method with spark.master pointing at the cluster (the thrift server has stopped, so
    # this application gets both workers). The current-state model only: the history's SQL ran on the cluster in (b).
    config = lakehouse.config(
        "cdclake-cluster.yml", lakehouse={"silver_namespace": "silver_cluster"}, spark=cluster_spark
    )
    _, timings["dbt build (session, cluster)"] = lakehouse.cdclake(config, "dbt", "build", *select[:2])

    applications = cluster.status().get("completedapps", [])
    assert isinstance(applications, list)
    assert len(applications) >= 2, f"the builds did not run on the cluster: {applications}"

    settings = lakehouse.settings()
    table = built.table(typed)
    local = silver_rows(settings, "silver", table)
    assert len(local) == len(typed.expected)
    history = silver_rows(settings, "silver", table + HISTORY_SUFFIX)
    assert len(history) > len(local), "the version history holds no more rows than the current state"
    for namespace in ("silver_thrift", "silver_cluster"):
        rows = silver_rows(settings, namespace, table)
        assert comparable(rows) == comparable(local), f"{namespace}.{table} differs from silver.{table}"
        problems = source_mismatches(rows, typed)
        assert not problems, f"{namespace}.{table}: {problems[:10]}"
    versions = silver_rows(settings, "silver_thrift", table + HISTORY_SUFFIX)
    assert comparable(versions) == comparable(history), f"silver_thrift.{table}{HISTORY_SUFFIX} differs from silver's"
    rounded = {name: round(seconds, 1) for name, seconds in timings.items()}
    print(f"silver on the cluster: {rounded}")


# -- several ingest processes in one consumer group -------------------------------------------------------------------
PARTITIONS = 6


def _produce_slowly(target: TansuBroker, records: list[Record], delivered: set[Coordinate], chunk: int) -> None:
    for start in range(0, len(records), chunk):
        delivered.update(target.produce(records[start : start + chunk]))
        time.sleep(0.2)


def _written(process: Cdclake) -> int:
    for line in reversed(process.lines):
        if "ingested " in line and " written to " in line:
            return int(line.split(" written to ")[0].rsplit(" ", 1)[-1])
    return -1


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.dbt
@pytest.mark.parametrize("catalog", ["postgres", pytest.param("sqlite", marks=pytest.mark.slow)])
def test_several_ingest_processes_in_one_group(
    catalog: str,
    postgres: PrivatePostgres,
    broker: TansuBroker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """3 `cdclake ingest` processes on a 6-partition topic; one is SIGKILLed and one added while records flow.

    Afterwards bronze holds every (topic, partition, offset) exactly once and silver equals the source's state.
    """
    prefix = unique("fleet") + "."
    first = build_stream("db2", seed=41, n_keys=300, n_changes=1500, partitions=PARTITIONS)
    second = continue_stream(first, 1500)
    final = continue_stream(second, 600)
    waves = [retopic(stream.new_records, prefix) for stream in (first, second, final)]
    delivered = publish(broker, waves[0], PARTITIONS)
    topics = sorted({r.topic for r in waves[0]})
    assert all(broker.topics()[topic] == PARTITIONS for topic in topics)

    catalog_uri = (
        postgres.create_database(unique("lake_fleet_")) if catalog == "postgres" else f"sqlite:///{tmp_path}/catalog.db"
    )
    source = {
        "type": "kafka",
        "bootstrap_servers": broker.bootstrap_servers,
        "topics": topics,
        "group_id": unique("fleet-"),
        "consumer": dict(FAST_GROUP_JOIN),
    }
    lakehouse = Lakehouse.create(tmp_path / "lakehouse", catalog_uri, source, max_records=250, latency_threshold_s=0.5)
    config = lakehouse.root / "cdclake.yml"
    settings = lakehouse.settings()
    started = time.monotonic()
    ingesters = [ingester(config, lakehouse.root) for _ in range(3)]
    try:
        victim = ingesters[1]
        assert victim.wait_for_flushes(1, timeout_s=90), f"no flush from the second process:\n{victim.tail()}"
        producer = threading.Thread(target=_produce_slowly, args=(broker, waves[1], delivered, 300), daemon=True)
        producer.start()
        time.sleep(1.0)
        assert victim.process.poll() is None, f"the second process exited by itself:\n{victim.tail()}"
        victim.kill()
        killed_at = sum(bronze_coordinates(settings).values())
        newcomer = ingester(config, lakehouse.root)
        ingesters.append(newcomer)
        deadline = time.monotonic() + 90
        while not any("assigned " in line for line in newcomer.lines):
            assert time.monotonic() < deadline, f"the added process got no partitions:\n{newcomer.tail()}"
            assert newcomer.process.poll() is None, f"the added process exited:\n{newcomer.tail()}"
            time.sleep(0.2)
        producer.join(120)
        assert not producer.is_alive()
        delivered.update(broker.produce(waves[2]))
        assert len(delivered) == sum(len(wave) for wave in waves)

        deadline = time.monotonic() + 180
        while True:
            counts = bronze_coordinates(settings)
            if delivered <= set(counts):
                break
            assert time.monotonic() < deadline, (
                f"bronze holds {len(set(counts) & delivered)} of {len(delivered)} records after 180 s"
            )
            time.sleep(1.0)
        landed_s = time.monotonic() - started
        for process in ingesters:
            if process is not victim:
                process.terminate()
        for process in ingesters:
            if process is not victim:
                code = process.wait(timeout_s=60)
                assert code == 0, f"an ingest process failed ({code}):\n{process.tail()}"
    finally:
        for process in ingesters:
            process.kill()

    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(delivered, counts)
    assert not lost, f"lost {len(lost)}, e.g. {sorted(lost)[:5]}"
    assert not duplicated, f"duplicated {len(duplicated)}, e.g. {sorted(duplicated)[:5]}"
    assert set(counts) == delivered
    assert killed_at < len(delivered), "the kill came after everything had landed: it proved nothing"
    assert _written(newcomer) > 0, f"the added process wrote nothing:\n{newcomer.tail()}"

    lakehouse.cdclake(config, "scaffold")
    _, build_s = lakehouse.cdclake(config, "dbt", "build")
    rows = silver_rows(settings, "silver", bronze_table_name(prefix + final.data_topic))
    assert len(rows) == len(final.expected)
    problems = source_mismatches(rows, final)
    assert not problems, problems[:10]
    print(
        f"{catalog}: {len(delivered)} records by 3 processes (+1, -1) in {landed_s:.1f} s; "
        f"{killed_at} in bronze at the kill; dbt build {build_s:.1f} s"
    )


# -- the commit race behind several writers, deterministically (no broker, no JVM) ------------------------------------
RACE_SCHEMA = pa.schema(
    [
        ("_cdc_topic", pa.string()),
        ("_cdc_partition", pa.int32()),
        ("_cdc_offset", pa.int64()),
        ("_cdc_ingested_at", pa.timestamp("us", tz="UTC")),
    ]
)


def race_batch(offsets: range) -> TableBatch:
    now = dt.datetime.now(dt.UTC)
    rows: list[dict[str, object]] = [
        {"_cdc_topic": "t", "_cdc_partition": 0, "_cdc_offset": offset, "_cdc_ingested_at": now} for offset in offsets
    ]
    return TableBatch("race", Layout.TYPED, "change", [RACE_SCHEMA], rows, offsets={("t", 0): offsets.stop})


def stale_once(monkeypatch: pytest.MonkeyPatch, writer: BronzeTables, stale: Any) -> None:
    """``writer``'s next load returns ``stale`` (metadata read before another writer's commit), later ones are fresh."""
    original = writer.load
    pending = [stale]
    monkeypatch.setattr(writer, "load", lambda name: pending.pop() if pending else original(name))


@pytest.mark.parametrize("catalog", ["sqlite", "postgres"])
def test_a_commit_on_stale_metadata_is_redone_from_fresh_offsets(
    catalog: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A computed its row filter and offsets from metadata that writer B has since committed on.

    pyiceberg's own commit retry would re-base A's append on B's metadata and keep A's stale offsets and rows
    (duplicates, offsets moved back); cdclake must redo the commit from the fresh metadata instead.
    """
    from pyiceberg.catalog.sql import SqlCatalog

    if catalog == "postgres":
        server: PrivatePostgres = request.getfixturevalue("postgres")
        uri = server.create_database(unique("race_"))
    else:
        uri = f"sqlite:///{tmp_path}/catalog.db"
    shared = SqlCatalog("lake", uri=uri, warehouse=tmp_path.as_uri())
    a, b = BronzeTables(shared, "bronze"), BronzeTables(shared, "bronze")
    a.commit(race_batch(range(0, 10)))

    # A re-read offsets 10..24 from an old position (the previous owner after a rebalance) while B, the new owner,
    # committed 10..19: A's commit must keep only 20..24.
    stale_once(monkeypatch, a, a.load("race"))
    b.commit(race_batch(range(10, 20)))
    assert a.commit(race_batch(range(10, 25))) == 5

    # A's batch that is entirely in the table already must not write its (stale) offsets back.
    stale_once(monkeypatch, a, a.load("race"))
    b.commit(race_batch(range(25, 30)))
    assert a.commit(race_batch(range(20, 25))) == 0

    table = shared.load_table("bronze.race")
    offsets = [row["_cdc_offset"] for row in table.scan(selected_fields=("_cdc_offset",)).to_arrow().to_pylist()]
    assert sorted(offsets) == list(range(30)), "rows lost or duplicated"
    assert decode_offsets(table.properties[OFFSETS_PROPERTY]) == {("t", 0): 30}
