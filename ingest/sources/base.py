"""The source interface of the read stage."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from ingest.debezium.envelope import RawRecord

# (topic, partition) -> next offset to read, or None when bronze holds nothing for it (start at the beginning).
OffsetResolver = Callable[[str, int], int | None]


@dataclass(frozen=True)
class TopicSelection:
    """Which topics a source follows (source.topics / source.topic_pattern), as librdkafka subscribes: a pattern is
    anchored at the name's start and never takes the internal topics (``__consumer_offsets``, ...); neither given,
    every topic (a dump's)."""

    topics: frozenset[str]
    pattern: re.Pattern[str] | None

    @classmethod
    def of(cls, topics: Collection[str] = (), pattern: str | None = None) -> TopicSelection:
        anchored = None if not pattern else re.compile(pattern if pattern.startswith("^") else "^" + pattern)
        return cls(frozenset(topics), anchored)

    def follows(self, topic: str) -> bool:
        if self.pattern is not None:
            return not topic.startswith("__") and self.pattern.search(topic) is not None
        return not self.topics or topic in self.topics


class Source(Protocol):
    def start(self, resolve: OffsetResolver) -> None:
        """Subscribe/open; every partition is positioned at the offset ``resolve`` finds in bronze."""

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout_s`` for the first."""

    def caught_up(self, once: bool = False) -> bool:
        """True when every assigned partition has been read to its end (for ``--once``). ``once``: a source that
        cannot start reading at all in time raises instead of waiting on."""

    def commit_advisory(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Tell the broker how far bronze got (monitoring only; bronze's own offsets are authoritative)."""

    def lag(self) -> dict[tuple[str, int], int]:
        """Records between the read position and the end of each partition, where known."""

    def close(self) -> None: ...
