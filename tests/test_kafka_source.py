"""KafkaSource's per-poll bookkeeping (no broker): read positions and end-of-partition state, worked out once per
poll from its end, equal the message-by-message rule (a record moves its partition's position and clears its end
state; an end-of-partition event sets it, and moves the position to where the partition ends: past the commit
markers of a transactional producer). The lag it reports across a group handover is read on the embedded broker."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from ingest.broker import TansuBroker
from ingest.cli.ingest_cmd import build_pipeline
from ingest.config import SourceSettings
from ingest.debezium.envelope import RawRecord
from ingest.fakes import build_stream
from ingest.pipeline import Pipeline
from ingest.sources.kafka import JOIN_GRACE_S, GroupJoinTimeoutError, KafkaSource, consumer_config
from tests.kafka_fixtures import ONE_RECORD_BATCHES, broker, kafka_settings, publish, retopic, unique  # noqa: F401 - the session broker
from tests.processes import wait_until

Event = tuple[str, int, int, bool]  # topic, partition, offset, whether an end-of-partition event (at that offset)


def one_by_one(
    events: list[Event], at_eof: set[tuple[str, int]], positions: dict[tuple[str, int], int]
) -> tuple[set[tuple[str, int]], dict[tuple[str, int], int]]:
    at_eof, positions = set(at_eof), dict(positions)
    for topic, partition, offset, end in events:
        if end:
            at_eof.add((topic, partition))
            positions[(topic, partition)] = max(positions.get((topic, partition), -1), offset)
        else:
            at_eof.discard((topic, partition))
            positions[(topic, partition)] = offset + 1
    return at_eof, positions


@pytest.mark.parametrize("seed", range(200))
def test_positions_and_end_of_partition_match_the_message_by_message_rule(seed: int) -> None:
    rng = random.Random(seed)
    assigned = {(topic, partition) for topic in ("a", "b") for partition in range(rng.randrange(1, 4))}
    assigned_list = sorted(assigned)
    events: list[Event] = []
    next_offset = {tp: rng.randrange(0, 50) for tp in assigned_list}
    for _ in range(rng.randrange(0, 40)):
        tp = rng.choice(assigned_list)
        if rng.random() < 0.15:
            next_offset[tp] += rng.randrange(0, 2)  # a transaction's commit marker takes an offset
            events.append((*tp, next_offset[tp], True))
        else:
            events.append((*tp, next_offset[tp], False))
            next_offset[tp] += 1
    before_eof = {tp for tp in assigned_list if rng.random() < 0.5}
    before_positions = {tp: rng.randrange(0, 50) for tp in assigned_list if rng.random() < 0.5}

    source = KafkaSource(SourceSettings(bootstrap_servers="127.0.0.1:1", topics=["a", "b"], group_id="g"))
    known = set(assigned) if seed % 4 else set()  # also before the first assignment is known
    source._assigned, source._at_eof, source._positions = known, set(before_eof), dict(before_positions)
    batch: list[RawRecord] = []
    eof_at: list[tuple[int, tuple[str, int], int]] = []
    for topic, partition, offset, end in events:
        if end:
            eof_at.append((len(batch), (topic, partition), offset))
        else:
            batch.append(RawRecord(topic, partition, offset, None, None, b"{}"))
    source._note_positions(batch, eof_at)
    assert (source._at_eof, source._positions) == one_by_one(events, before_eof, before_positions)


def waiting_for_the_first_assignment(subscribed: set[tuple[str, int]], waited_s: float) -> KafkaSource:
    """A source whose group join started ``waited_s`` ago, the cluster's metadata just read."""
    source = KafkaSource(SourceSettings(bootstrap_servers="127.0.0.1:1", topics=["a"], group_id="g"))
    source._consumer = object()  # type: ignore[assignment]  # never asked: the metadata below is fresh
    now = time.monotonic()
    source._join_started_at = now - waited_s
    source._subscribed, source._subscribed_at, source._subscribed_known = subscribed, now, True
    return source


def test_before_the_first_assignment_only_a_subscription_without_partitions_is_nothing_to_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No such topic (Debezium creates them lazily): `--once` has read everything after the grace. Partitions to
    read: the join is waited for, past the deadline `--once` fails naming them, the service warns and waits on."""
    assert not waiting_for_the_first_assignment(set(), 1.0).caught_up(once=True)
    assert waiting_for_the_first_assignment(set(), JOIN_GRACE_S + 1).caught_up(once=True)
    source = waiting_for_the_first_assignment({("a", 0), ("a", 1)}, JOIN_GRACE_S + 1)
    assert not source.caught_up(once=True)
    source._join_started_at -= source._join_deadline_s
    with pytest.raises(
        GroupJoinTimeoutError,
        match=r"^kafka: group 'g' assigned this member no partition in \d+s, "
        r"while the cluster has 2 partition\(s\) of the subscription \(a\[0\], a\[1\]\)",
    ):
        source.caught_up(once=True)
    with caplog.at_level(logging.WARNING, logger="ingest.sources.kafka"):
        assert not source.caught_up(once=False)
    assert "still waiting for the group" in caplog.text


def reported_lag(pipeline: Pipeline) -> dict[tuple[str, int], float]:
    """Every (topic, partition) the pipeline's `cdclake_consumer_lag` gauge reports, with its value."""
    return {
        (sample.labels["topic"], int(sample.labels["partition"])): sample.value
        for family in pipeline.metrics.registry.collect()
        if family.name == "cdclake_consumer_lag"
        for sample in family.samples
    }


@pytest.mark.kafka
def test_the_lag_of_a_partition_handed_to_another_member_is_no_longer_reported(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
) -> None:
    """`cdclake_consumer_lag` kept the last value of a partition this member no longer reads, forever: alerts on a
    member that lost a partition while behind never cleared, and sums over the group counted it twice. Two members
    of one group on the embedded broker: once the second has joined and taken some partitions (a real cooperative
    rebalance), each reports exactly the partitions it reads, the first none of those it lost. (Read to their end,
    every lag is 0: what a stale value would show here is a partition reported by the wrong member.)"""
    partitions = 3
    stream = build_stream("oracle", seed=5, n_keys=8, n_changes=20, partitions=partitions)
    # One record per batch: Tansu's high watermark is the start of a partition's last batch + 1, which is then the
    # partition's true end, so the lag read is the real one (0 once read to the end).
    delivered = publish(broker, retopic(stream.records, unique("lag-handover")), partitions, ONE_RECORD_BATCHES)
    every = {(topic, partition) for topic, partition, _ in delivered}
    assert len(every) == 2 * partitions  # two topics, every partition holds records
    # Sessions of 6 s (cdclake's default), not the tests' 2: one expiring on a loaded machine would rebalance the
    # group again. Cooperative: the first member keeps its other partitions (and their lag) through the handover.
    settings = kafka_settings(
        lakehouse,
        broker,
        topics=sorted({topic for topic, _ in every}),
        consumer={"partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": "6000"},
    )
    first, second = build_pipeline(settings), build_pipeline(settings)
    first_source, second_source = first.source, second.source
    assert isinstance(first_source, KafkaSource)
    assert isinstance(second_source, KafkaSource)
    runners = [threading.Thread(target=member.run, daemon=True) for member in (first, second)]
    try:
        runners[0].start()
        wait_until(
            lambda: first.stats.records_in == len(delivered) and reported_lag(first) == dict.fromkeys(every, 0.0),
            30,
            "the first member to read every partition to its end",
        )
        runners[1].start()

        def handed_over() -> bool:
            kept, moved = first_source.assignment, second_source.assignment
            return (
                bool(kept)
                and bool(moved)
                and kept | moved == every
                and not kept & moved
                and reported_lag(first) == dict.fromkeys(kept, 0.0)
                and reported_lag(second) == dict.fromkeys(moved, 0.0)
            )

        deadline = time.monotonic() + 45
        while not handed_over() and time.monotonic() < deadline:
            time.sleep(0.2)
        kept, moved = first_source.assignment, second_source.assignment
        assert kept, "the second member took every partition"
        assert moved, "the group handed the second member no partition"
        assert sorted([*kept, *moved]) == sorted(every)  # each partition with one member
        # Each member's gauge names the partitions it reads now, read to their end: over the group, each once.
        assert reported_lag(first) == dict.fromkeys(kept, 0.0)
        assert reported_lag(second) == dict.fromkeys(moved, 0.0)
    finally:
        for member in (first, second):
            member.stop_requested.set()
        for runner in runners:
            if runner.ident is not None:  # started
                runner.join(30)
    assert not any(runner.is_alive() for runner in runners), "a member did not stop"


def test_a_full_prefetch_queue_is_fetched_again_after_10_ms_unless_the_user_says_otherwise() -> None:
    """librdkafka stops fetching a partition whose prefetch queue is full and waits fetch.queue.backoff.ms before it
    fetches again: 1 s by default, which left a reader that drains the queue faster waiting in consume() and capped
    catch-up at ~140k events/s even for a bare consumer (docs/benchmark-notes.md). cdclake waits 10 ms; a user's
    value still wins, and librdkafka accepts both."""
    from confluent_kafka import Consumer

    default = consumer_config(SourceSettings(bootstrap_servers="127.0.0.1:1", topics=["t"]))
    assert default["fetch.queue.backoff.ms"] == 10
    users = consumer_config(
        SourceSettings(
            bootstrap_servers="127.0.0.1:1", topics=["t"], consumer={"fetch.queue.backoff.ms": SecretStr("1000")}
        )
    )
    assert users["fetch.queue.backoff.ms"] == "1000"
    for config in (default, users):
        Consumer(config).close()


def test_partitions_new_to_the_subscription_get_the_whole_handover_grace() -> None:
    """A topic created (or partitions added) while `--once` read a backlog: the grace was timed from the last
    assignment, long past, so the run ended at once, saying another member held partitions nobody held yet (the
    rebalance that assigns them comes with librdkafka's next metadata refresh)."""
    source = waiting_for_the_first_assignment({("a", 0), ("a", 1)}, 100.0)  # another member reads a[1]
    source._assigned_once, source._assigned, source._at_eof = True, {("a", 0)}, {("a", 0)}
    source._assignment_changed_at = time.monotonic() - 100.0
    # a[1] may have appeared lately: the first look waits for one metadata refresh (not the whole grace again)
    assert not source.caught_up(once=True)
    source._held_grew_at -= source._metadata_refresh_s
    assert source.caught_up(once=True)
    source._subscribed = {("a", 0), ("a", 1), ("a", 2)}  # the topic got a partition
    assert not source.caught_up(once=True)
    source._held_grew_at -= source._handover_grace_s
    assert source.caught_up(once=True)


def test_no_assignment_under_kip_848_waits_for_a_dead_members_partitions() -> None:
    """group.protocol consumer (KIP-848): librdkafka reports no empty assignment, and a dead member holds its
    partitions until its session ends (45 s by default). No assignment after the grace counted as nothing to read:
    `--once` exited having read nothing. It is an empty share now, whose partitions get the handover grace."""
    source = waiting_for_the_first_assignment({("a", 0), ("a", 1)}, JOIN_GRACE_S + 1)
    source._next_generation = True
    assert not source.caught_up(once=True)
    source._assignment_changed_at -= source._handover_grace_s
    source._held_grew_at -= source._handover_grace_s
    assert source.caught_up(once=True)
    early = waiting_for_the_first_assignment(set(), 1.0)
    early._next_generation = True
    assert not early.caught_up(once=True)  # within the grace: the join may still come
    nothing = waiting_for_the_first_assignment(set(), JOIN_GRACE_S + 1)  # no such topic
    nothing._next_generation = True
    assert nothing.caught_up(once=True)
