"""How librdkafka's prefetch keeps up with a reader that works between polls (docs/benchmark-notes.md, Ingest).

Publishes the ingest benchmark's events once, then reads them with its bare consumer (``raw_consume``: cdclake's
librdkafka settings, polls of ``POLL_BATCH``), sleeping after each poll, as the read loop's own work would leave
librdkafka's threads the time to fetch. For each ``fetch.queue.backoff.ms`` it prints the rate, the time spent inside
``consume()`` and the median and largest prefetch queue (``fetchq_cnt`` in librdkafka's statistics, every 100 ms). With
librdkafka's default of 1,000 ms the queue sits empty most of the time and ``consume()`` waits; cdclake sets 10 ms.

    python -m bench.prefetch_probe [--events N] [--compression lz4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bench.ingest_bench import PARTITIONS, TABLES, Results, produce, raw_consume
from ingest.broker import TansuBroker

BACKOFFS_MS = (1000, 10)  # librdkafka's default, cdclake's
SLEEPS_S = (0.0, 0.015)  # a bare reader; one that works 15 ms (3 s per 1M events) between polls


@dataclass
class Probe:
    backoff_ms: int
    sleep_s: float
    rate: float
    in_consume_s: float
    queued: list[int]

    def row(self) -> str:
        median = int(statistics.median(self.queued)) if self.queued else 0
        return (
            f"  {self.backoff_ms:>10,} ms  {self.sleep_s * 1000:>5.0f} ms  {self.rate:>12,.0f}/s"
            f"  {self.in_consume_s:>9.2f} s  {median:>10,}  {max(self.queued, default=0):>10,}"
        )


def _queued(stats_json: str) -> int:
    stats: dict[str, Any] = orjson.loads(stats_json)
    return sum(
        int(partition.get("fetchq_cnt", 0))
        for topic in stats.get("topics", {}).values()
        for partition in topic["partitions"].values()
        if partition["partition"] >= 0  # -1 is librdkafka's unassigned-partition entry
    )


def probe(broker: TansuBroker, events: int, backoff_ms: int, sleep_s: float) -> Probe:
    """The benchmark's raw consumer (``raw_consume``) with this backoff, sleeping ``sleep_s`` after each poll."""
    results = Results(events, PARTITIONS, "customers")
    queued: list[int] = []
    overrides = {
        "fetch.queue.backoff.ms": backoff_ms,
        "statistics.interval.ms": 100,
        "stats_cb": lambda stats_json: queued.append(_queued(stats_json)),
    }
    in_consume = raw_consume(broker, results, overrides, (lambda: time.sleep(sleep_s)) if sleep_s else None)
    for note in results.notes:
        print(f"note: {note}")
    return Probe(backoff_ms, sleep_s, results.rate(results.raw_consume_s), in_consume, queued)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prefetch_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--compression", default="lz4", choices=["none", "lz4", "zstd", "gzip", "snappy"])
    args = parser.parse_args(argv)
    topic = TABLES["customers"].topic
    with TansuBroker() as broker:
        print(f"publishing {args.events:,} events to {topic} ({PARTITIONS} partitions, {args.compression}) ...")
        produce(broker, args.events, Results(args.events, PARTITIONS, "customers", compression=args.compression))
        probes = [probe(broker, args.events, backoff, sleep) for sleep in SLEEPS_S for backoff in BACKOFFS_MS]
    print("  queue backoff  sleep/poll          rate  in consume()  queue (median)  (max)")
    for result in probes:
        print(result.row())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
