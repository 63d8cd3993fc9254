"""KafkaSource's per-poll bookkeeping (no broker): read positions and end-of-partition state, worked out once per
poll from its end, equal the message-by-message rule (a record moves its partition's position and clears its end
state; an end-of-partition event sets it, and moves the position to where the partition ends: past the commit
markers of a transactional producer)."""

from __future__ import annotations

import random

import pytest

from ingest.config import SourceSettings
from ingest.debezium.envelope import RawRecord
from ingest.sources.kafka import KafkaSource

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
