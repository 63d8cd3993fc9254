"""Crash test: `cdclake ingest` SIGKILLed at random moments never loses or duplicates, and silver built afterwards
equals the source's state.

A long stream is published once; the ingester runs as a real process with a small flush size, so it commits
often, and is killed without warning several times (seeded, reproducible), in turn: right after a commit, inside a
commit (between the debug lines ``committing`` and ``committed``: data files written, catalog not yet updated), and
at a random moment from start-up on. Then `cdclake ingest --once` drains the rest, bronze must hold every
(topic, partition, offset) exactly once, and `cdclake dbt build` must give silver tables equal to the generators'
final state.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import yaml

from ingest.broker import Record, TansuBroker
from ingest.bronze.naming import bronze_table_name
from ingest.bronze.tables import BronzeTables
from ingest.demo import source_mismatches
from ingest.fakes import build_stream
from ingest.fakes.scenario import FakeStream
from ingest.lakehouse import load_catalog
from ingest.scaffold import scaffold
from tests.kafka_fixtures import (
    broker,  # noqa: F401 - the session fixture
    bronze_coordinates,
    kafka_settings,
    lost_and_duplicated,
    publish,
    retopic,
    unique,
)
from tests.processes import CHILD_SPARK, ingester, run_cdclake
from tests.test_scaleout import dbt_project_copy, silver_rows

pytestmark = pytest.mark.kafka
PARTITIONS = 3
COMMITTING, COMMITTED = '"msg":"committing ', '"msg":"committed '


def long_stream(prefix: str, n_records: int) -> tuple[list[Record], list[FakeStream]]:
    """About ``n_records`` over 3 topics: Db2 changes + its transaction topic, and Oracle changes."""
    db2 = build_stream("db2", seed=11, n_keys=200, n_changes=n_records // 5, partitions=PARTITIONS)
    oracle = build_stream("oracle", seed=12, n_keys=200, n_changes=int(n_records / 2.5), partitions=PARTITIONS)
    oracle_changes = [r for r in oracle.records if r.topic == oracle.data_topic]
    return retopic(db2.records, prefix) + retopic(oracle_changes, prefix), [db2, oracle]


def crash_loop(broker: TansuBroker, root: Path, trials: int, n_records: int, seed: int) -> None:  # noqa: F811
    prefix = unique("crash") + "."
    records, streams = long_stream(prefix, n_records)
    expected = publish(broker, records, PARTITIONS)
    topics = sorted({r.topic for r in records})
    assert len(topics) == 3
    settings = kafka_settings(root, broker, topics=topics, max_records=400, latency_threshold_s=0.3)
    config = root / "cdclake.yml"
    raw = yaml.safe_load(config.read_text())
    raw["dbt"] = {"project_dir": str(dbt_project_copy(root))}
    raw["spark"] = dict(CHILD_SPARK)
    config.write_text(yaml.safe_dump(raw))
    rng = random.Random(seed)
    started = time.monotonic()
    outstanding_kills = mid_commit_kills = 0
    for trial in range(1, trials + 1):
        process = ingester(config, root, log_level="DEBUG")
        if trial % 3 == 1:
            # Shortly after a commit: the next flush is then being prepared or committed.
            flushes, delay = rng.randint(1, 6), rng.uniform(0.0, 0.25)
            process.wait_for_flushes(flushes, timeout_s=60)
            time.sleep(delay)
            moment = f"{delay * 1000:.0f} ms after flush #{flushes}"
        elif trial % 3 == 2:
            # Inside a table's commit: as soon as it logs that it is committing.
            commit = rng.randint(1, 12)
            process.wait_for(COMMITTING, timeout_s=60, times=commit)
            moment = f"inside table commit #{commit}"
        else:
            delay = rng.uniform(0.5, 4.0)  # from start-up (imports, group join) to the middle of a commit
            time.sleep(delay)
            moment = f"{delay:.2f} s after start"
        exited = process.process.poll()
        process.kill()
        assert exited is None, f"trial {trial}: the ingester exited by itself ({exited}):\n{process.tail()}"
        in_commit = process.count(COMMITTING) > process.count(COMMITTED)
        mid_commit_kills += in_commit
        in_bronze = sum(bronze_coordinates(settings).values())
        outstanding_kills += in_bronze < len(expected)
        print(
            f"trial {trial}: SIGKILL {moment} ({process.flushes} flushes logged"
            f"{', inside a commit' if in_commit else ''}); {in_bronze} rows in bronze"
        )

    drain = ingester(config, root, "--once")
    code = drain.wait(timeout_s=300)
    assert code == 0, f"the draining run failed ({code}):\n{drain.tail()}"
    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(expected, counts)
    unexpected = set(counts) - expected
    assert outstanding_kills > 0, "every kill came after the stream was drained: the test proved nothing"
    assert mid_commit_kills > 0, "no kill landed inside a commit"
    group_log = "".join(line for line in drain.lines if "assigned" in line or "member of group" in line)
    assert not lost, f"lost {len(lost)}, e.g. {sorted(lost)[:5]}; the draining run's group log:\n{group_log}"
    assert not duplicated, f"duplicated {len(duplicated)}, e.g. {sorted(duplicated)[:5]}"
    assert not unexpected

    # Silver from what survived the crashes: equal to the source's final state, key by key, column by column.
    scaffold(BronzeTables(load_catalog(settings), settings.lakehouse.bronze_namespace), Path(raw["dbt"]["project_dir"]))
    run_cdclake(config, "dbt", "build", root=root)
    silver_keys = 0
    for stream in streams:
        table = bronze_table_name(prefix + stream.data_topic)
        rows = silver_rows(settings, settings.lakehouse.silver_namespace, table)
        problems = source_mismatches(rows, stream)
        assert not problems, f"{table}: {problems[:10]}"
        silver_keys += len(rows)
    print(
        f"crash test: {trials} trials ({outstanding_kills} killed mid-stream, {mid_commit_kills} inside a commit), "
        f"{len(expected)} records, {len(lost)} lost, {len(duplicated)} duplicated, {len(unexpected)} unexpected; "
        f"silver: {silver_keys} keys equal to the source; {time.monotonic() - started:.1f} s"
    )


def test_sigkill_never_loses_or_duplicates(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    crash_loop(broker, lakehouse, trials=6, n_records=20_000, seed=20240601)


@pytest.mark.slow
def test_sigkill_never_loses_or_duplicates_long(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    crash_loop(broker, lakehouse, trials=21, n_records=60_000, seed=7)
