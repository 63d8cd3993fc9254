"""The source interface of the read stage."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from ingest.debezium.envelope import RawRecord

# (topic, partition) -> next offset to read, or None when bronze holds nothing for it (start at the beginning).
OffsetResolver = Callable[[str, int], int | None]


class Source(Protocol):
    def start(self, resolve: OffsetResolver) -> None:
        """Subscribe/open; every partition is positioned at the offset ``resolve`` finds in bronze."""

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout_s`` for the first."""

    def caught_up(self) -> bool:
        """True when every assigned partition has been read to its end (for ``--once``)."""

    def commit_advisory(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Tell the broker how far bronze got (monitoring only; bronze's own offsets are authoritative)."""

    def lag(self) -> dict[tuple[str, int], int]:
        """Records between the read position and the end of each partition, where known."""

    def close(self) -> None: ...
