"""Reliability: crashes, broker faults, bad input and concurrency (docs/reliability.md has the figures).

Every fault is injected into real processes: `cdclake dbt build` and `cdclake ingest` run as subprocesses (their own
JVM / librdkafka), are SIGKILLed or have the broker or the catalog taken away, and the lakehouse is then checked with
pyiceberg against a plain-Python reference. Each subprocess gets a runtime directory of its own
(``CDCLAKE_RUNTIME_DIR``), so generated dbt profiles never collide with another test's.
"""

from __future__ import annotations

import copy
import itertools
import random
import re
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import yaml

from ingest.broker import Record, TansuBroker, free_port
from ingest.bronze.naming import DEAD_LETTER_TABLE, bronze_table_name
from ingest.bronze.tables import OFFSETS_PROPERTY, BronzeTables, decode_offsets, merge_offsets
from ingest.config import Settings, load_settings
from ingest.debezium.envelope import RawRecord
from ingest.demo import source_mismatches
from ingest.fakes import build_stream, continue_stream
from ingest.lakehouse import load_catalog
from ingest.pipeline import Pipeline
from ingest.sources.file import FileSource
from tests.conftest import FIXTURES, file_pipeline, ingest_file, make_settings
from tests.kafka_fixtures import (
    FAST_GROUP_JOIN,
    Coordinate,
    broker,  # noqa: F401 - the session fixture
    bronze_coordinates,
    bronze_rows,
    kafka_settings,
    lost_and_duplicated,
    publish,
    retopic,
    run_kafka,
    unique,
)
from tests.missing import missing_runtime
from tests.processes import CHILD_SPARK, Cdclake, run_cdclake, wait_until
from tests.silver_harness import Change, SilverHarness, Topic

if TYPE_CHECKING:
    from ingest.testing.seaweed import SeaweedS3


# -- subprocesses -----------------------------------------------------------------------------------------------------
def write_config(root: Path, raw: Mapping[str, Any], name: str = "cdclake.yml") -> tuple[Path, Settings]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    path.write_text(yaml.safe_dump(dict(raw), sort_keys=False))
    return path, load_settings(path, environ={})


def history_rows(settings: Settings, table: str) -> list[dict[str, Any]] | None:
    """A history='scd2' silver table's versions, without apply timestamps, sorted (None if it does not exist);
    each key has at most one current version and no version twice."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        loaded = load_catalog(settings).load_table(f"{settings.lakehouse.silver_namespace}.{table}")
    except NoSuchTableError:
        return None
    columns = ("id", "v", "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_op", "_cdc_offset")
    rows = sorted(loaded.scan(selected_fields=columns).to_arrow().to_pylist(), key=repr)
    current = [row["id"] for row in rows if row["_cdc_is_current"]]
    assert len(current) == len(set(current)), f"keys with two current versions in silver.{table}: {sorted(current)}"
    versions = [repr((row["id"], row["_cdc_valid_from"], row["_cdc_offset"])) for row in rows]  # positions are lists
    assert len(versions) == len(set(versions)), f"a version twice in silver.{table}"
    return rows


def silver_state(settings: Settings, table: str) -> dict[int, str | None] | None:
    """``{id: v}`` of a silver table as pyiceberg reads it (None if the table does not exist); keys must be unique."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        loaded = load_catalog(settings).load_table(f"{settings.lakehouse.silver_namespace}.{table}")
    except NoSuchTableError:
        return None
    rows = loaded.scan(selected_fields=("id", "v")).to_arrow().to_pylist()
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), f"duplicate keys in silver.{table}: {sorted(ids)}"
    return {row["id"]: row["v"] for row in rows}


# -- 1. dbt killed in the middle of an apply --------------------------------------------------------------------------
@dataclass
class SilverLake:
    """A SQLite-catalog lakehouse with one Informix-shaped topic, its cdc_silver model and a plain-Python reference
    (with ``history``, also a history='scd2' model of the same bronze table, built by the same builds)."""

    root: Path
    config: Path
    settings: Settings
    topic: Topic
    dumps: Path
    rng: random.Random
    next_lsn: int = 100
    waves: int = 0

    history: bool = False

    @property
    def history_model(self) -> str:
        return f"{self.topic.table}_history"

    @classmethod
    def create(cls, root: Path, seed: int, history: bool = False) -> SilverLake:
        raw = {
            "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
            "spark": copy.deepcopy(CHILD_SPARK),
        }
        _, settings = write_config(root, raw)
        load_catalog(settings).list_namespaces()  # pyiceberg creates the catalog tables (Spark must not)
        harness = SilverHarness.create(settings, root)
        topic = Topic(f"ifx.kill{seed}.t")
        harness.write_model(topic)
        if history:
            harness.write_model(topic, "history='scd2'", name=f"{topic.table}_history")
        config, settings = write_config(root, {**raw, "dbt": {"project_dir": str(harness.project)}})
        dumps = root / "dumps"
        dumps.mkdir()
        return cls(root, config, settings, topic, dumps, random.Random(seed), history=history)

    def land_wave(self, n_changes: int = 24, n_keys: int = 10) -> dict[int, str | None]:
        """Random creates, updates and deletes (some late, i.e. older than what silver holds); returns the
        reference state over everything landed."""
        changes = []
        for _ in range(n_changes):
            self.next_lsn += self.rng.randint(1, 3)
            late = self.rng.random() < 0.15
            lsn = self.next_lsn - self.rng.randint(5, 30) if late else self.next_lsn
            key = self.rng.randrange(n_keys)
            op = self.rng.choices("cud", weights=[3, 5, 2])[0]
            changes.append(Change(op, key, lsn, None if op == "d" else f"{op}{lsn}"))
        self.waves += 1
        path = self.dumps / f"wave{self.waves}.jsonl"
        path.write_bytes(b"\n".join(orjson.dumps(line) for line in self.topic.records(changes)) + b"\n")
        tables = BronzeTables(load_catalog(self.settings), self.settings.lakehouse.bronze_namespace)
        Pipeline(self.settings.ingest, tables, FileSource(path)).run(once=True)
        return self.topic.expected()

    @property
    def models(self) -> list[str]:
        return [self.topic.table, self.history_model] if self.history else [self.topic.table]

    def build(self) -> Cdclake:
        return Cdclake(self.config, "dbt", "build", "--select", *self.models, root=self.root, log_format="text")

    def build_to_end(self, *extra: str) -> str:
        return run_cdclake(self.config, "dbt", "build", "--select", *self.models, *extra, root=self.root)

    def silver(self) -> dict[int, str | None] | None:
        """``{id: v}`` now."""
        return silver_state(self.settings, self.topic.table)

    def history_state(self) -> dict[int, str | None] | None:
        """``{id: v}`` of the history model's current versions."""
        rows = history_rows(self.settings, self.history_model)
        return None if rows is None else {row["id"]: row["v"] for row in rows if row["_cdc_is_current"]}


MODEL_START = "START sql cdc_silver model"
MODEL_ENDS = ("OK created sql cdc_silver model", "ERROR creating sql cdc_silver model")


def inside_a_model(build: Cdclake) -> bool:
    """Whether the build is running one of its models now (dbt has started one and not reported it)."""
    return build.count(MODEL_START) > sum(build.count(end) for end in MODEL_ENDS)


def model_seconds(output: str) -> float:
    match = re.search(r"OK created sql cdc_silver model \S+ \.+ \[\S+ in ([0-9.]+)s\]", output)
    return float(match.group(1)) if match else 8.0


def silver_snapshot(settings: Settings, table: str) -> int | None:
    """The silver table's current snapshot id (-1 when it has none, None when it does not exist)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        loaded = load_catalog(settings).load_table(f"{settings.lakehouse.silver_namespace}.{table}")
    except NoSuchTableError:
        return None
    snapshot = loaded.current_snapshot()
    return -1 if snapshot is None else int(snapshot.snapshot_id)


def kill_after_silver_commit(lake: SilverLake, build: Cdclake) -> bool:
    """SIGKILL as soon as the silver table changes (CREATE TABLE AS or the fast-forward of main committed): the
    statements after it (tombstones, the applied-position property) are cut off. False if the build ended before
    a commit was seen."""
    before = silver_snapshot(lake.settings, lake.topic.table)
    while build.process.poll() is None:
        if silver_snapshot(lake.settings, lake.topic.table) != before:
            build.kill()
            return True
        time.sleep(0.03)
    return False


def dbt_kill_loop(root: Path, trials: int, seed: int) -> dict[str, Any]:
    """Kill `cdclake dbt build` in the middle of applying a new bronze wave, alternately right after silver's commit
    and at a random moment of the model's run; silver must then hold the state before or after the wave (after
    it, when the kill followed silver's commit). A kill that came after the build ended proves nothing: the
    commit trials fail on one, the random ones count them."""
    lake = SilverLake.create(root, seed)
    rng = random.Random(seed)
    started = time.monotonic()
    outcomes: list[str] = []
    old: dict[int, str | None] | None = None  # trial 0 kills the very first build: before it, no silver table
    new = lake.land_wave()
    duration = 8.0
    killed_running = 0
    for trial in range(trials):
        build = lake.build()
        assert build.wait_for(MODEL_START, timeout_s=300), f"dbt never started the model:\n{build.tail(60)}"
        committed = trial % 2 == 0
        if committed:
            assert kill_after_silver_commit(lake, build), (
                f"trial {trial}: the build ended before silver's commit was seen:\n{build.tail(40)}"
            )
            moment = "right after silver's commit"
            killed_running += 1
        else:
            delay = rng.uniform(0.0, duration * 0.9)
            try:
                build.process.wait(timeout=delay)
                moment = f"after the build ended (within {delay:.2f}s of the model's start)"
            except subprocess.TimeoutExpired:
                moment = f"{delay:.2f}s after the model started"
                killed_running += 1
        build.kill()
        state = lake.silver()
        if state == new and new != old:
            outcome = "new"
        elif state == old and not committed:
            outcome = "old"
        else:
            raise AssertionError(
                f"trial {trial}: SIGKILL {moment} left silver {'unchanged' if state == old else 'in between'}:\n"
                f"silver:    {state}\nold state: {old}\nnew state: {new}\n{build.tail(40)}"
            )
        outcomes.append(outcome)
        print(f"trial {trial}: SIGKILL {moment} -> {outcome} state")
        if outcome == "new":
            old = new
        if trial == 0:
            # A normal build converges after the killed first one; it also measures the model's duration.
            output = lake.build_to_end()
            duration = model_seconds(output)
            assert lake.silver() == new, "a normal build after the killed first build did not converge"
            old = new
        new = lake.land_wave()
    output = lake.build_to_end()
    assert "Completed successfully" in output
    # dbt's lines, not Java's: no harmless warning with a stack trace (spark_conf/log4j2.properties).
    assert " WARN " not in output, output[-3000:]
    assert "Exception" not in output, output[-3000:]
    assert lake.silver() == new, "the final normal build did not converge to the reference state"
    summary = {
        "trials": trials,
        "killed_running": killed_running,
        "old": outcomes.count("old"),
        "new": outcomes.count("new"),
        "waves": lake.waves,
        "keys": len(new),
        "bronze_rows": lake.topic.next_offset,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"dbt kill test: {summary}")
    return summary


@pytest.mark.spark
@pytest.mark.dbt
def test_dbt_killed_mid_apply_leaves_old_or_new_state(tmp_path: Path) -> None:
    dbt_kill_loop(tmp_path / "lake", trials=2, seed=5)


@pytest.mark.spark
@pytest.mark.dbt
@pytest.mark.slow
def test_dbt_killed_mid_apply_leaves_old_or_new_state_long(tmp_path: Path) -> None:
    dbt_kill_loop(tmp_path / "lake", trials=10, seed=17)


def overlapping_builds_loop(root: Path, waves: int, seed: int) -> None:
    """Two `cdclake dbt build`s of the same models at once, for each of ``waves`` new bronze waves (a scheduler
    starting a run before the last one ended): while they run, silver holds the state before or after the wave,
    never a mix or a duplicate key; at least one of them succeeds (the other fails on Iceberg's optimistic commit
    check); the build after them converges to the reference state. The two must have been inside a model at the
    same moment at least once (else the wave proved nothing). Their duplicated tombstones are harmless
    (test_silver.py). The builds run a current-state model and a history model of the same bronze table (one pair
    of JVMs for both): the history's current versions follow the same rule, and the versions the overlapping runs
    left must equal what a --full-refresh rebuilds from bronze."""
    lake = SilverLake.create(root, seed, history=True)
    old = lake.land_wave()
    lake.build_to_end()
    assert lake.silver() == lake.history_state() == old
    for wave in range(waves):
        new = lake.land_wave()
        builds = [lake.build(), lake.build()]
        overlapped = False
        while any(build.process.poll() is None for build in builds):
            overlapped = overlapped or all(inside_a_model(build) for build in builds)
            for model, state in ((lake.topic.table, lake.silver()), (lake.history_model, lake.history_state())):
                assert state in (old, new), f"wave {wave}: {model} in between:\n{state}\nold: {old}\nnew: {new}"
            time.sleep(0.05)
        codes = [build.wait() for build in builds]
        assert overlapped, f"wave {wave}: the builds never ran a model at the same time:\n{builds[1].tail(30)}"
        for model in lake.models:  # each build may lose the race for one model and win it for the other
            applied = [f"OK created sql cdc_silver model silver.{model} " in build.output for build in builds]
            assert any(applied), f"wave {wave}: both builds failed {model}:\n{builds[0].tail(30)}\n{builds[1].tail(30)}"
        lake.build_to_end()
        assert lake.silver() == new, f"wave {wave}: the build after the overlapping ones did not converge"
        assert lake.history_state() == new, f"wave {wave}: the history did not converge"
        print(f"wave {wave}: overlapping builds exited {codes}")
        old = new
    versions = history_rows(lake.settings, lake.history_model)
    run_cdclake(lake.config, "dbt", "build", "--select", lake.history_model, "--full-refresh", root=lake.root)
    assert history_rows(lake.settings, lake.history_model) == versions, "the overlapping runs' history differs"


@pytest.mark.spark
@pytest.mark.dbt
@pytest.mark.parametrize("waves", [1, pytest.param(3, marks=pytest.mark.slow)], ids=["default", "long"])
def test_overlapping_runs_of_a_model_never_mix(tmp_path: Path, waves: int) -> None:
    overlapping_builds_loop(tmp_path / "lake", waves=waves, seed=23)


# -- 2. the broker stopped and restarted mid-stream (durable storage) --------------------------------------------------
def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


@contextmanager
def durable_broker(root: Path) -> Iterator[tuple[SeaweedS3, TansuBroker]]:
    from ingest.broker import tansu_binary
    from ingest.errors import SetupError
    from ingest.testing.seaweed import SeaweedS3, weed_binary

    try:
        tansu_binary()
        weed_binary()
    except SetupError as exc:
        missing_runtime(str(exc))
    with SeaweedS3(root / "seaweed") as s3:
        tansu = TansuBroker(storage_engine=s3.storage_engine, env=s3.tansu_env()).start()
        try:
            yield s3, tansu
        finally:
            tansu.stop()


def restart(tansu: TansuBroker) -> TansuBroker:
    """The same broker again: same port, same S3 storage."""
    return TansuBroker(port=tansu.port, storage_engine=tansu.storage_engine, env=tansu.env).start()


SESSION_TIMEOUT_S = 8.0


@pytest.mark.kafka
def test_broker_outage_is_survived_and_reported(tmp_path: Path) -> None:
    """Tansu on SeaweedFS is stopped twice under a running `cdclake ingest`: once mid-stream, once while the
    ingester is idle and caught up. It must keep retrying, report unhealthy on /healthz after unhealthy_after_s
    while the broker is down, become healthy again, and land every record exactly once."""
    unhealthy_after_s = 3.0
    with durable_broker(tmp_path) as (_s3, tansu):
        prefix = unique("outage") + "."
        first = build_stream("db2", seed=51, n_keys=80, n_changes=900, partitions=2)
        second = continue_stream(first, 300)
        third = continue_stream(second, 300)
        waves = [retopic(stream.new_records, prefix) for stream in (first, second, third)]
        delivered = publish(tansu, waves[0], partitions=2)
        topics = sorted({r.topic for r in waves[0]})
        port = free_port()
        settings = kafka_settings(
            tmp_path / "lake",
            tansu,
            topics=topics,
            # Longer than unhealthy_after_s: the group's loss of the partitions must not be what trips /healthz.
            consumer={"session.timeout.ms": str(int(SESSION_TIMEOUT_S * 1000)), "heartbeat.interval.ms": "1000"},
            max_records=250,
            latency_threshold_s=0.3,
            metrics_port=port,
            unhealthy_after_s=unhealthy_after_s,
        )
        root = tmp_path / "lake"
        ingester = Cdclake(root / "cdclake.yml", "ingest", "--no-progress", root=root)
        try:
            # (a) Mid-stream: down right after the first commit; what the client already fetched is still committed.
            assert ingester.wait_for('"msg":"flushed ', timeout_s=120), f"no flush:\n{ingester.tail()}"
            tansu.stop()
            in_bronze_at_stop = sum(bronze_coordinates(settings).values())

            # Under load the stall (no progress for unhealthy_after_s) can fail /healthz before librdkafka reports
            # every broker down (a CI-like run with three dbt workers beside it): the reason must come all the same.
            def unhealthy_naming_the_broker() -> bool:
                status, body = healthz(port)
                return status == 503 and "no broker reachable" in body

            wait_until(unhealthy_naming_the_broker, 60, "/healthz to fail, naming the broker, while it is down")
            down_s = 2.0
            time.sleep(down_s)
            assert ingester.process.poll() is None, f"the ingester gave up:\n{ingester.tail()}"
            tansu = restart(tansu)
            delivered |= set(tansu.produce(waves[1]))
            recovered_a = wait_until(
                lambda: delivered <= set(bronze_coordinates(settings)), 120, "every record to land after the restart"
            )
            wait_until(lambda: healthz(port)[0] == 200, 60, "/healthz to recover")

            # (b) Idle and caught up: the broker goes away; /healthz must fail within unhealthy_after_s (+ a margin).
            time.sleep(1.0)
            assert healthz(port)[0] == 200
            tansu.stop()
            stopped = time.monotonic()
            wait_until(lambda: healthz(port)[0] == 503, 30, "/healthz to fail for an idle ingester with no broker")
            detected_s = time.monotonic() - stopped
            # The clock runs from the last progress, which an idle ingester reports once per poll (1 s).
            assert detected_s >= unhealthy_after_s - 1.5, f"unhealthy after only {detected_s:.1f}s"
            assert detected_s < SESSION_TIMEOUT_S - 1, f"unhealthy only after {detected_s:.1f}s (group session expiry)"
            # The stall can be reported before librdkafka has found every broker down (as in (a)): the reason must
            # come all the same, while the broker is down.
            wait_until(unhealthy_naming_the_broker, 60, "/healthz to name the broker while it is down (idle)")
            tansu = restart(tansu)
            delivered |= set(tansu.produce(waves[2]))
            recovered_b = wait_until(
                lambda: delivered <= set(bronze_coordinates(settings)), 120, "every record to land after the restart"
            )
            wait_until(lambda: healthz(port)[0] == 200, 60, "/healthz to recover")

            ingester.terminate()
            assert ingester.wait(60) == 0, f"the ingester did not stop cleanly:\n{ingester.tail()}"
        finally:
            ingester.kill()
            tansu.stop()
    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(delivered, counts)
    assert len(delivered) == sum(len(wave) for wave in waves)
    assert not lost, f"lost {len(lost)}, e.g. {sorted(lost)[:5]}"
    assert not duplicated, f"duplicated {len(duplicated)}, e.g. {sorted(duplicated)[:5]}"
    assert set(counts) == delivered
    warnings = ingester.count("cannot reach the cluster")
    recoveries = ingester.count("reachable again")
    assert warnings >= 2, "each outage is logged"
    assert recoveries >= 2
    print(
        f"broker outage: {len(delivered)} records, 2 outages, {in_bronze_at_stop} in bronze at the first stop, "
        f"unhealthy {detected_s:.1f}s after the idle outage began (unhealthy_after_s={unhealthy_after_s}), "
        f"caught up {recovered_a:.1f}s / {recovered_b:.1f}s after the restarts; {len(lost)} lost, "
        f"{len(duplicated)} duplicated"
    )


@pytest.mark.kafka
def test_an_idle_topic_never_stalls_commits(broker: TansuBroker, tmp_path: Path) -> None:  # noqa: F811
    """Field notes §4.5 (apache/iceberg#17811, #13633): a batch far below max_records is committed once
    latency_threshold_s has passed, while another subscribed topic stays idle; then the roles swap."""
    prefix = unique("idle") + "."
    busy = retopic(build_stream("db2", seed=71, n_keys=5, n_changes=20).new_records, prefix)
    later = retopic(build_stream("oracle", seed=72, n_keys=5, n_changes=20).new_records, prefix)
    topics = sorted({r.topic for r in busy + later})
    broker.create_topics(topics, exist_ok=True)
    settings = kafka_settings(
        tmp_path / "lake", broker, topics=topics, max_records=100_000, max_bytes=1 << 30, latency_threshold_s=1.0
    )
    root = tmp_path / "lake"
    ingester = Cdclake(root / "cdclake.yml", "ingest", "--no-progress", root=root)
    try:
        assert ingester.wait_for("assigned ", timeout_s=60, times=len(topics)), f"no assignment:\n{ingester.tail()}"
        waits = []
        for wave in (busy, later):
            delivered = publish(broker, wave, partitions=1)
            landed = lambda wanted=delivered: wanted <= set(bronze_coordinates(settings))  # noqa: E731
            waits.append(wait_until(landed, 30, "a small batch to be committed"))
        assert ingester.process.poll() is None, ingester.tail()
        # latency_threshold_s is 1 s; measured ~2 s each (reliability.md): a commit held back by anything else fails
        assert max(waits) < 10, waits
        ingester.terminate()
        assert ingester.wait(60) == 0, ingester.tail()
    finally:
        ingester.kill()
    counts = bronze_coordinates(settings)
    assert sum(counts.values()) == len(busy) + len(later)
    assert max(counts.values()) == 1
    print(f"idle topic: {len(busy)} + {len(later)} records committed {waits[0]:.1f}s / {waits[1]:.1f}s after publish")


# -- 3. commit contention: two ingesters and dbt at once; a commit that keeps failing ----------------------------------
@pytest.fixture(scope="module")
def postgres_server() -> Iterator[Any]:

    from ingest.testing.postgres import PrivatePostgres, server_available

    if not server_available():
        missing_runtime("the PostgreSQL server (initdb, pg_ctl) is not installed")
    with PrivatePostgres(database="reliability") as server:
        yield server


def _produce_in_chunks(target: TansuBroker, records: list[Record], delivered: set[Coordinate], stop: Any) -> None:
    """About 120 records a second until ``stop`` (then the rest at once): commits go on during all of dbt's run."""
    for start in range(0, len(records), 60):
        delivered.update(target.produce(records[start : start + 60]))
        if stop.wait(0.5):
            delivered.update(target.produce(records[start + 60 :]))
            return


def contention(catalog: str, broker: TansuBroker, root: Path, postgres: Any) -> None:  # noqa: F811
    from ingest.scaffold import scaffold
    from tests.test_scaleout import dbt_project_copy, silver_rows

    prefix = unique("contend") + "."
    streams = {
        "a": build_stream("db2", seed=61, n_keys=60, n_changes=400, partitions=2),
        "b": build_stream("informix", seed=62, n_keys=60, n_changes=400, partitions=2),
    }
    more = {name: continue_stream(stream, 3000) for name, stream in streams.items()}
    first = {name: retopic(stream.new_records, prefix) for name, stream in streams.items()}
    second = [record for stream in more.values() for record in retopic(stream.new_records, prefix)]
    delivered = publish(broker, [r for records in first.values() for r in records], partitions=2)
    catalog_uri = postgres.create_database(unique("lake_contend_")) if postgres else f"sqlite:///{root / 'catalog.db'}"
    base: dict[str, Any] = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": catalog_uri},
        "spark": copy.deepcopy(CHILD_SPARK),
        "dbt": {"project_dir": str(dbt_project_copy(root))},
        "ingest": {"max_records": 100, "latency_threshold_s": 0.2},
    }
    configs: dict[str, Path] = {}
    for name, records in first.items():
        source = {
            "type": "kafka",
            "bootstrap_servers": broker.bootstrap_servers,
            "topics": sorted({r.topic for r in records}),
            "group_id": unique(f"contend-{name}-"),
            "consumer": dict(FAST_GROUP_JOIN),
        }
        configs[name], _ = write_config(root, {**base, "source": source}, f"cdclake-{name}.yml")
    config, settings = write_config(root, base)
    load_catalog(settings).list_namespaces()  # pyiceberg creates the catalog tables (Spark must not)

    ingesters = {name: Cdclake(path, "ingest", "--no-progress", root=root) for name, path in configs.items()}
    stop = threading.Event()
    producer = threading.Thread(target=_produce_in_chunks, args=(broker, second, delivered, stop), daemon=True)
    try:
        wait_until(lambda: delivered <= set(bronze_coordinates(settings)), 180, "the first wave to land", 0.5)
        scaffold(BronzeTables(load_catalog(settings), "bronze"), root / "dbt_project")
        flushes_before = sum(i.count('"msg":"flushed ') for i in ingesters.values())
        # All at once: both ingesters commit the second wave while dbt builds silver (and runs its tests).
        producer.start()
        build = Cdclake(config, "dbt", "build", root=root, log_format="text")
        build_code = build.wait()
        flushes_during = sum(i.count('"msg":"flushed ') for i in ingesters.values()) - flushes_before
        stop.set()
        producer.join(120)
        assert build_code == 0, f"dbt build beside two ingesters failed ({build_code}):\n{build.tail(60)}"
        assert flushes_during > 0, "no bronze commit landed while dbt built: nothing contended"
        wait_until(lambda: delivered <= set(bronze_coordinates(settings)), 180, "the second wave to land", 0.5)
        for ingester in ingesters.values():
            ingester.terminate()
        for name, ingester in ingesters.items():
            assert ingester.wait(60) == 0, f"ingester {name} failed:\n{ingester.tail()}"
    finally:
        stop.set()
        for ingester in ingesters.values():
            ingester.kill()
    retried = sum(i.count("commit conflict on") for i in ingesters.values())
    failed = sum(i.count("commit failed") for i in ingesters.values())
    assert failed == 0

    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(delivered, counts)
    assert not lost, f"lost {len(lost)}, e.g. {sorted(lost)[:5]}"
    assert not duplicated, f"duplicated {len(duplicated)}, e.g. {sorted(duplicated)[:5]}"
    assert len(delivered) == sum(len(r) for r in first.values()) + len(second)
    output = run_cdclake(config, "dbt", "build", root=root)  # silver catches up with everything
    assert "Spark started beside dbt's parse" in output  # dbt's first statement found it running
    for name, stream in more.items():
        table = bronze_table_name(prefix + stream.data_topic)
        rows = silver_rows(settings, "silver", table)
        assert len(rows) == len(stream.expected), name
        problems = source_mismatches(rows, stream)
        assert not problems, f"{name}: {problems[:10]}"
    print(
        f"contention ({catalog}): {len(delivered)} records by 2 ingesters, {flushes_during} bronze flushes during a "
        f"concurrent dbt build, {retried} commit retries, 0 failures; 0 lost, 0 duplicated; silver equals the source"
    )


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.dbt
def test_two_ingesters_and_dbt_at_once_sqlite(broker: TansuBroker, tmp_path: Path) -> None:  # noqa: F811
    contention("sqlite", broker, tmp_path / "lake", None)


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.dbt
@pytest.mark.slow  # the same race against the server catalog (scale-out tests cover PostgreSQL in `make test`)
def test_two_ingesters_and_dbt_at_once_postgres(
    broker: TansuBroker,  # noqa: F811
    postgres_server: Any,
    tmp_path: Path,
) -> None:
    contention("postgres", broker, tmp_path / "lake", postgres_server)


def test_a_commit_that_keeps_failing_stops_the_service(tmp_path: Path) -> None:
    """Another process holds the SQLite catalog's write lock: every commit fails; after commit_attempts tries the
    service stops with an error naming the table and the count. Once the lock is gone, a rerun lands it all once."""
    root = tmp_path / "lake"
    dump = root / "stream.jsonl"
    topic = Topic("ifx.locked.t")
    root.mkdir(parents=True)
    dump.write_bytes(
        b"\n".join(orjson.dumps(line) for line in topic.records([Change("c", i, i + 1, f"v{i}") for i in range(20)]))
        + b"\n"
    )
    database = root / "catalog.db"
    raw = {
        # A short busy timeout (SQLAlchemy passes it to sqlite3): each attempt fails after 0.3 s, not 5 s.
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{database}?timeout=0.3"},
        "source": {"type": "file", "path": str(dump)},
        "ingest": {"commit_attempts": 3, "latency_threshold_s": 0.2},
    }
    config, settings = write_config(root, raw)
    BronzeTables(load_catalog(settings), "bronze")  # catalog tables and namespace exist: the ingester only reads
    lock = sqlite3.connect(database, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the write lock; readers still read
        ingester = Cdclake(config, "ingest", "--no-progress", root=root)
        code = ingester.wait(120)
    finally:
        lock.close()
    output = ingester.output
    assert code != 0, output
    message = re.search(r"bronze table (\S+): commit failed (\d+) times, last: ([^\n\"]*)", output)
    assert message, output[-3000:]
    assert message.group(1) == "bronze.ifx_locked_t"
    assert message.group(2) == "3"
    assert "database is locked" in message.group(3)
    assert ingester.count("commit conflict on ifx_locked_t") == 2  # attempts 1 and 2 were retried
    # Nothing half-written; the stream lands once the catalog is free again.
    assert bronze_coordinates(settings) == {}
    again = Cdclake(config, "ingest", "--once", "--no-progress", root=root)
    assert again.wait(120) == 0, again.tail()
    counts = bronze_coordinates(settings)
    assert set(counts) == {(topic.name, 0, offset) for offset in range(20)}
    assert set(counts.values()) == {1}


# -- 4. offsets only move forward -----------------------------------------------------------------------------------
def test_merge_offsets_never_rewinds() -> None:
    stored = {("t", 0): 10, ("t", 1): 5}
    assert merge_offsets(stored, {("t", 0): 3}) == stored  # a stale writer's lower offset
    assert merge_offsets(stored, {}) == stored  # a writer of other partitions drops nothing
    assert merge_offsets(stored, {("t", 0): 12, ("u", 0): 1}) == {("t", 0): 12, ("t", 1): 5, ("u", 0): 1}
    rng = random.Random(3)
    for _ in range(200):
        merged: dict[tuple[str, int], int] = {}
        seen: dict[tuple[str, int], int] = {}
        for _ in range(rng.randint(1, 6)):
            batch = {("t", rng.randrange(3)): rng.randrange(100) for _ in range(rng.randint(0, 3))}
            merged = merge_offsets(merged, batch)
            for tp, offset in batch.items():
                seen[tp] = max(offset, seen.get(tp, offset))
        assert merged == seen


def _dump(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    return path


def test_a_stale_writer_never_rewinds_offsets_or_writes_twice(tmp_path: Path) -> None:
    """A zombie (it read before the live writer committed, and commits after it) with lower offsets on one partition
    and new records on another: its duplicates are dropped, the shared partition's offset does not move back, its
    new partition lands; every snapshot's recorded offsets only grow."""
    import datetime as dt

    settings = make_settings(tmp_path / "lake")
    topic = Topic("ifx.zombie.t")
    lines = topic.records([Change("c", i, i + 1, f"v{i}") for i in range(30)])
    full = _dump(tmp_path / "full.jsonl", lines)
    early = [*lines[:12], *({**line, "partition": 1} for line in lines[:5])]
    stale = _dump(tmp_path / "stale.jsonl", early)

    def bronze() -> Any:
        return load_catalog(settings).load_table("bronze.ifx_zombie_t")

    zombie = file_pipeline(settings, stale)
    zombie.source.start(zombie.resolve)  # positions resolved now: nothing in bronze yet
    zombie.accept_batch(zombie.source.poll(100, 0.01), dt.datetime.now(dt.UTC))
    live = file_pipeline(settings, full)
    live.run(once=True)
    assert decode_offsets(bronze().properties[OFFSETS_PROPERTY]) == {(topic.name, 0): 30}

    zombie.flush()  # the zombie's late commit
    table = bronze()
    assert decode_offsets(table.properties[OFFSETS_PROPERTY]) == {(topic.name, 0): 30, (topic.name, 1): 5}
    counts = bronze_coordinates(settings)
    assert set(counts.values()) == {1}
    assert set(counts) == {(topic.name, 0, o) for o in range(30)} | {(topic.name, 1, o) for o in range(5)}
    history: list[dict[tuple[str, int], int]] = []
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number):
        recorded = snapshot.summary.additional_properties.get(OFFSETS_PROPERTY) if snapshot.summary else None
        if recorded:
            history.append(decode_offsets(recorded))
    assert len(history) >= 2
    for before, after in itertools.pairwise(history):
        assert all(after.get(tp, -1) >= offset for tp, offset in before.items()), (before, after)

    # A zombie holding only records the table already has commits nothing at all (no stale offsets rewritten).
    snapshots = len(table.snapshots())
    again = file_pipeline(settings, stale)
    again.source.start(lambda _topic, _partition: None)  # as if it had resolved before everything landed
    again.accept_batch(again.source.poll(100, 0.01), dt.datetime.now(dt.UTC))
    again.flush()
    assert len(bronze().snapshots()) == snapshots
    assert decode_offsets(bronze().properties[OFFSETS_PROPERTY]) == {(topic.name, 0): 30, (topic.name, 1): 5}


def _cut_short(line: dict[str, Any]) -> None:
    """A record's value cut short (not JSON): a dead letter."""
    line["payload"] = str(line["payload"])[:40]


def _handover_dumps(tmp_path: Path, name: str) -> tuple[Topic, Path, Path]:
    """A partition's 20 records as its new owner reads them, and the old owner's copy of the first 12, in which
    offset 5 is cut short (in life, a record without its schema read by a process that no longer knows it)."""
    topic = Topic(name)
    lines = topic.records([Change("c", i, i + 1, f"v{i}") for i in range(20)])
    cut = [dict(line) for line in lines[:12]]
    _cut_short(cut[5])
    return topic, _dump(tmp_path / "stale.jsonl", cut), _dump(tmp_path / "full.jsonl", lines)


def test_a_stale_writer_does_not_dead_letter_a_record_its_successor_landed(tmp_path: Path) -> None:
    """The old owner of a partition still flushing after a rebalance decodes one record differently from the new
    owner (here: its copy of the record is cut short; in life, a record without its schema read by a process that
    no longer knows the topic's schema): the new owner landed it in the data table, and the old one's dead letter of
    it was committed too, so the record was in both tables. A dead letter below its data table's committed offsets
    is dropped now: every record stays in exactly one of the two."""
    import datetime as dt

    settings = make_settings(tmp_path / "lake")
    topic, stale, full = _handover_dumps(tmp_path, "ifx.handover.t")

    old_owner = file_pipeline(settings, stale)
    old_owner.source.start(old_owner.resolve)
    old_owner.accept_batch(old_owner.source.poll(100, 0.01), dt.datetime.now(dt.UTC))
    assert old_owner.stats.dead_letters == 1  # offset 5, buffered
    file_pipeline(settings, full).run(once=True)  # the new owner lands all 20
    old_owner.flush()  # the old owner's late commit

    counts = bronze_coordinates(settings)
    assert set(counts) == {(topic.name, 0, offset) for offset in range(20)}
    assert set(counts.values()) == {1}
    catalog = load_catalog(settings)
    dead = (
        catalog.load_table(f"bronze.{DEAD_LETTER_TABLE}").scan().to_arrow().num_rows
        if catalog.table_exists(f"bronze.{DEAD_LETTER_TABLE}")
        else 0
    )
    assert dead == 0, "offset 5 is in the data table: it must not be a dead letter too"


def test_a_record_another_writer_dead_lettered_first_is_not_landed_too(tmp_path: Path) -> None:
    """The reverse order: the old owner of a partition commits its dead letter of a record (its copy cut short) and
    dies before its data commit; the new owner, which started before that commit and decoded the record, commits
    it to the data table. The dead-letter table decides, as on a restart: the record is left out of the data
    table, and every record is in exactly one of the two tables. The new owner had checked the dead-letter table
    already (a first flush, after another table's dead letter): a dead-letter commit since then is read."""
    import datetime as dt

    from ingest.bronze.naming import DEAD_LETTER_TABLE

    settings = make_settings(tmp_path / "lake")
    other = Topic("ifx.handover.other").records([Change("c", 1, 1, "x")])
    _cut_short(other[0])
    file_pipeline(settings, _dump(tmp_path / "other.jsonl", other)).run(once=True)  # a dead letter of another table
    topic, stale, full = _handover_dumps(tmp_path, "ifx.handover.r")

    new_owner = file_pipeline(settings, full)
    new_owner.source.start(new_owner.resolve)
    new_owner.accept_batch(new_owner.source.poll(3, 0.01), dt.datetime.now(dt.UTC))
    new_owner.flush()  # offsets 0-2, checked against the dead-letter table as it is
    new_owner.accept_batch(new_owner.source.poll(100, 0.01), dt.datetime.now(dt.UTC))
    assert new_owner.stats.dead_letters == 0  # 3-19 buffered, offset 5 decoded

    old_owner = file_pipeline(settings, stale)
    old_owner.source.start(old_owner.resolve)
    old_owner.accept_batch(old_owner.source.poll(100, 0.01), dt.datetime.now(dt.UTC))
    assert old_owner.stats.dead_letters == 1
    commit = old_owner.tables.commit

    def dies_before_its_data_commit(batch: Any, on_retry: Any = None) -> int:
        if batch.name != DEAD_LETTER_TABLE:
            raise KeyboardInterrupt("killed between the two commits")
        return commit(batch, on_retry)

    old_owner.tables.commit = dies_before_its_data_commit  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        old_owner.flush()
    new_owner.flush()

    counts = bronze_coordinates(settings)
    assert set(counts) == {(topic.name, 0, offset) for offset in range(20)} | {("ifx.handover.other", 0, 0)}
    assert {c: n for c, n in counts.items() if n != 1} == {}
    dead = load_catalog(settings).load_table(f"bronze.{DEAD_LETTER_TABLE}").scan().to_arrow()
    assert sorted(zip(dead["_cdc_topic"].to_pylist(), dead["_cdc_offset"].to_pylist(), strict=True)) == [
        ("ifx.handover.other", 0),
        (topic.name, 5),
    ]


def test_a_writer_reads_the_dead_letter_table_for_another_writers_dead_letters_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above costs a scan of the dead-letter table. A writer whose flushes each hold a dead letter of its
    own reads it for its first data commit only: after that, each dead-letter snapshot is its own, next to one it
    checked."""
    import ingest.bronze.tables as bronze_tables
    from ingest.bronze.dead_letters import dead_lettered_offsets

    settings = make_settings(tmp_path / "lake")
    lines = Topic("ifx.steady.t").records([Change("c", i, i + 1, f"v{i}") for i in range(40)])
    for offset in (5, 15, 25, 35):
        _cut_short(lines[offset])
    scans: list[tuple[str, int]] = []
    scan = dead_lettered_offsets

    def counted(table: Any, topic: str, partition: int, *rest: Any) -> set[int]:
        scans.append((topic, partition))
        return scan(table, topic, partition, *rest)

    monkeypatch.setattr(bronze_tables, "dead_lettered_offsets", counted)
    pipeline = ingest_file(settings, _dump(tmp_path / "steady.jsonl", lines), max_records=10)
    assert pipeline.stats.dead_letters == 4
    assert pipeline.stats.flushes >= 4
    assert scans == [("ifx.steady.t", 0)]
    assert set(bronze_coordinates(settings).values()) == {1}


# -- 5. bad input: one corpus, through the file source and through the broker ------------------------------------------
BAD_INPUT = FIXTURES / "bad_input"


@dataclass
class BadCase:
    name: str
    about: str
    topic: str
    records: list[RawRecord]
    dead: dict[int, str]
    order: dict[int, list[int]] = field(default_factory=dict)
    table: str | None = None


def bad_input_corpus() -> list[BadCase]:
    """The corpus files with their expectations; each file is one topic, partition 0, offsets 0..n-1."""
    from ingest.sources.file import parse_line

    manifest = yaml.safe_load((BAD_INPUT / "expected.yml").read_text())
    files = {path.stem: path for path in BAD_INPUT.glob("*.jsonl")}
    assert set(files) == set(manifest), "every corpus file needs an entry in expected.yml, and the reverse"
    cases = []
    for name, spec in sorted(manifest.items()):
        path = files[name]
        records = [parse_line(line, f"{path}:{n}") for n, line in enumerate(path.read_bytes().splitlines(), 1)]
        pad = spec.get("pad")
        if pad:
            record = records[pad["offset"]]
            assert record.value is not None
            value = record.value.replace(pad["marker"].encode(), b"x" * pad["bytes"])
            records[pad["offset"]] = RawRecord(
                record.topic, record.partition, record.offset, record.timestamp_ms, record.key, value
            )
        topics = {r.topic for r in records}
        assert len(topics) == 1, f"{name}: one topic per case"
        assert [(r.partition, r.offset) for r in records] == [(0, i) for i in range(len(records))], name
        cases.append(
            BadCase(
                name,
                spec["about"],
                topics.pop(),
                records,
                {int(k): v for k, v in (spec.get("dead") or {}).items()},
                {int(k): v for k, v in (spec.get("order") or {}).items()},
                spec.get("table"),
            )
        )
    return cases


def check_bad_input(settings: Settings, cases: list[BadCase], prefix: str, pipeline: Pipeline) -> dict[str, int]:
    """Each bad record is a dead letter (raw bytes kept, reason as expected), every other one landed once in its
    table, and records in = written + dead letters."""
    columns = [
        "_cdc_topic",
        "_cdc_partition",
        "_cdc_offset",
        "_cdc_order",
        "_cdc_error",
        "_cdc_raw_key",
        "_cdc_raw_value",
        "after",
    ]
    tables = bronze_rows(settings, columns)
    dead_rows = tables.pop(DEAD_LETTER_TABLE, [])
    dead = {(r["_cdc_topic"], r["_cdc_offset"]): r for r in dead_rows}
    assert len(dead) == len(dead_rows), "a record is in the dead-letter table twice"
    total = expected_dead = 0
    for case in cases:
        topic = prefix + case.topic
        table = bronze_table_name(topic)
        assert re.fullmatch(r"[a-z0-9_]+", table), f"{case.name}: table name {table!r} is not a plain identifier"
        if case.table is not None and not prefix:
            assert table == case.table
        landed = {r["_cdc_offset"]: r for r in tables.get(table, []) if r["_cdc_topic"] == topic}
        assert len(landed) == len([r for r in tables.get(table, []) if r["_cdc_topic"] == topic]), case.name
        for record in case.records:
            total += 1
            if record.offset in case.dead:
                expected_dead += 1
                row = dead.get((topic, record.offset))
                assert row is not None, f"{case.name}@{record.offset}: not in the dead-letter table"
                assert re.search(case.dead[record.offset], row["_cdc_error"]), (
                    f"{case.name}@{record.offset}: reason {row['_cdc_error']!r} does not match "
                    f"{case.dead[record.offset]!r}"
                )
                assert (row["_cdc_raw_key"], row["_cdc_raw_value"]) == (record.key, record.value), case.name
                assert record.offset not in landed, f"{case.name}@{record.offset}: a dead letter also landed"
            else:
                assert record.offset in landed, f"{case.name}@{record.offset}: did not land in bronze.{table}"
                assert (topic, record.offset) not in dead, f"{case.name}@{record.offset}: dead-lettered"
                if record.offset in case.order:
                    assert landed[record.offset]["_cdc_order"] == case.order[record.offset], case.name
                if case.name == "ten_mb_record" and record.offset == 1:
                    assert len(landed[1]["after"]) > 10_000_000  # whole, not truncated
    assert len(dead) == expected_dead, "dead letters the corpus does not expect"
    # The table the hostile topic names is intact.
    truncated = [r for r in tables[bronze_table_name(prefix + "bad.truncated_json")]]
    assert sorted(r["_cdc_offset"] for r in truncated) == [0, 2]
    stats = pipeline.stats
    assert stats.records_in == total
    assert stats.skipped == 0
    assert stats.dead_letters == expected_dead
    assert stats.written + stats.dead_letters == stats.records_in
    return {"cases": len(cases), "records": total, "written": stats.written, "dead_letters": stats.dead_letters}


def test_bad_input_corpus_from_a_file(tmp_path: Path) -> None:
    """The corpus files themselves, one after the other, as one topic dump (the 10 MB record padded in place)."""
    cases = bad_input_corpus()
    manifest = yaml.safe_load((BAD_INPUT / "expected.yml").read_text())
    dump = tmp_path / "corpus.jsonl"
    with dump.open("wb") as out:
        for case in cases:
            data = (BAD_INPUT / f"{case.name}.jsonl").read_bytes()
            pad = manifest[case.name].get("pad")
            if pad:
                data = data.replace(pad["marker"].encode(), b"x" * pad["bytes"])
            out.write(data)
    # The corpus holds a type change that cannot widen, which it expects as a dead letter.
    settings = make_settings(tmp_path / "lake", ingest={"on_type_conflict": "dead_letter"})
    pipeline = ingest_file(settings, dump)
    summary = check_bad_input(settings, cases, "", pipeline)
    # A restart re-reads nothing into any table, dead letters included.
    again = ingest_file(settings, dump)
    assert (again.stats.written, again.stats.dead_letters) == (0, 0)
    print(f"bad input via the file source: {summary}")


@pytest.mark.kafka
def test_bad_input_corpus_through_the_broker(broker: TansuBroker, tmp_path: Path) -> None:  # noqa: F811
    """The same corpus as Kafka records (arbitrary bytes, a 10 MB value, a hostile topic name) via a real consumer."""
    cases = bad_input_corpus()
    prefix = unique("bad") + "."
    topics = sorted(prefix + case.topic for case in cases)
    broker.create_topics(topics, partitions=1)
    producer = broker.producer({"message.max.bytes": 16 * 1024 * 1024})
    failures: list[str] = []
    for case in cases:
        for record in case.records:
            producer.produce(
                prefix + case.topic,
                key=record.key,
                value=record.value,
                partition=0,
                timestamp=record.timestamp_ms or 0,
                on_delivery=lambda error, _message: failures.append(str(error)) if error else None,
            )
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    settings = kafka_settings(tmp_path / "lake", broker, topics=topics, on_type_conflict="dead_letter")
    pipeline = run_kafka(settings)
    summary = check_bad_input(settings, cases, prefix, pipeline)
    print(f"bad input via the broker: {summary}")
