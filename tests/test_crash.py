"""Crash test: `cdclake ingest` SIGKILLed at random moments (some right after a commit) never loses or duplicates.

A long stream is published once; the ingester runs as a real process with a small flush size, so it commits
often, and is killed without warning several times (seeded, reproducible). Then `cdclake ingest --once` drains
the rest, and bronze must hold every (topic, partition, offset) exactly once.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ingest.broker import Record, TansuBroker
from ingest.fakes import build_stream
from tests.kafka_fixtures import (
    broker,  # noqa: F401 - the session fixture
    bronze_coordinates,
    kafka_settings,
    lost_and_duplicated,
    publish,
    retopic,
    unique,
)

pytestmark = pytest.mark.kafka
PARTITIONS = 3


def cdclake_command() -> str:
    beside = Path(sys.executable).parent / "cdclake"
    found = str(beside) if beside.is_file() else shutil.which("cdclake")
    assert found, "the cdclake script is not installed (make setup)"
    return found


class Ingester:
    """`cdclake ingest` as a child process, with its JSON log lines collected by a reader thread."""

    def __init__(self, config: Path, once: bool = False) -> None:
        command = [cdclake_command(), "--config", str(config), "--log-format", "json", "ingest", "--no-progress"]
        if once:
            command.append("--once")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.flushes = 0
        self.done = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace")
            with self._changed:
                self.lines.append(line)
                if '"msg":"flushed ' in line:
                    self.flushes += 1
                self._changed.notify_all()
        with self._changed:
            self.done = True
            self._changed.notify_all()

    def wait_for_flushes(self, count: int, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.flushes >= count or self.done, timeout_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self._reader.join(10)

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(10)
        return code

    def tail(self, lines: int = 15) -> str:
        return "".join(self.lines[-lines:])


def long_stream(prefix: str, n_records: int) -> list[Record]:
    """About ``n_records`` over 3 topics: Db2 changes + its transaction topic, and Oracle changes."""
    db2 = build_stream("db2", seed=11, n_keys=200, n_changes=n_records // 5, partitions=PARTITIONS)
    oracle = build_stream("oracle", seed=12, n_keys=200, n_changes=int(n_records / 2.5), partitions=PARTITIONS)
    return retopic(db2.records, prefix) + retopic([r for r in oracle.records if r.topic == oracle.data_topic], prefix)


def crash_loop(broker: TansuBroker, root: Path, trials: int, n_records: int, seed: int) -> None:  # noqa: F811
    prefix = unique("crash") + "."
    records = long_stream(prefix, n_records)
    expected = publish(broker, records, PARTITIONS)
    topics = sorted({r.topic for r in records})
    assert len(topics) == 3
    settings = kafka_settings(root, broker, topics=topics, max_records=400, latency_threshold_s=0.3)
    config = root / "cdclake.yml"
    rng = random.Random(seed)
    started = time.monotonic()
    outstanding_kills = 0
    for trial in range(1, trials + 1):
        ingester = Ingester(config)
        if trial % 2 == 1:
            # Shortly after a commit: the next flush is then being prepared or committed.
            flushes = rng.randint(1, 6)
            delay = rng.uniform(0.0, 0.25)
            ingester.wait_for_flushes(flushes, timeout_s=30)
            time.sleep(delay)
            moment = f"{delay * 1000:.0f} ms after flush #{flushes}"
        else:
            delay = rng.uniform(0.5, 4.0)  # from start-up (imports, group join) to the middle of a commit
            time.sleep(delay)
            moment = f"{delay:.2f} s after start"
        exited = ingester.process.poll()
        ingester.kill()
        assert exited is None, f"trial {trial}: the ingester exited by itself ({exited}):\n{ingester.tail()}"
        in_bronze = sum(bronze_coordinates(settings).values())
        outstanding_kills += in_bronze < len(expected)
        print(f"trial {trial}: SIGKILL {moment} ({ingester.flushes} flushes logged); {in_bronze} rows in bronze")

    drain = Ingester(config, once=True)
    code = drain.wait(timeout_s=300)
    assert code == 0, f"the draining run failed ({code}):\n{drain.tail()}"
    counts = bronze_coordinates(settings)
    lost, duplicated = lost_and_duplicated(expected, counts)
    unexpected = set(counts) - expected
    print(
        f"crash test: {trials} trials ({outstanding_kills} killed mid-stream), {len(expected)} records, "
        f"{len(lost)} lost, {len(duplicated)} duplicated, {len(unexpected)} unexpected, "
        f"{time.monotonic() - started:.1f} s"
    )
    assert outstanding_kills > 0, "every kill came after the stream was drained: the test proved nothing"
    assert not lost, f"lost {len(lost)}, e.g. {sorted(lost)[:5]}"
    assert not duplicated, f"duplicated {len(duplicated)}, e.g. {sorted(duplicated)[:5]}"
    assert not unexpected


def test_sigkill_never_loses_or_duplicates(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    crash_loop(broker, lakehouse, trials=3, n_records=20_000, seed=20240601)


@pytest.mark.slow
def test_sigkill_never_loses_or_duplicates_long(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    crash_loop(broker, lakehouse, trials=15, n_records=60_000, seed=7)
