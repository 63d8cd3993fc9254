"""Kafka records as the fakes produce them, and their ``kcat -C -J`` JSON-lines form.

The kcat form is what the file source replays and what fixtures are stored as, so fakes and real topic dumps
go through the same ingest path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record on a topic partition; ``value=None`` is a tombstone."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: list[tuple[str, bytes | None]] | None = None


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def to_kcat_json(record: KafkaRecord) -> dict[str, Any]:
    """The object ``kcat -C -J`` prints for ``record`` (key and payload as UTF-8 text, null if absent; headers, when
    the record has any, as one flat array of names and values)."""
    line: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "tstype": "create",
        "ts": record.timestamp_ms,
        "broker": -1,
    }
    if record.headers:
        line["headers"] = [part for name, value in record.headers for part in (name, _text(value))]
    return {**line, "key": _text(record.key), "payload": _text(record.value)}


def kcat_line(record: KafkaRecord) -> bytes:
    """One JSON line (with the trailing newline)."""
    return orjson.dumps(to_kcat_json(record)) + b"\n"


def write_kcat_jsonl(records: Iterable[KafkaRecord], path: str | Path) -> None:
    """Write ``records`` in stream order as kcat JSON lines."""
    with Path(path).open("wb") as handle:
        for record in records:
            handle.write(kcat_line(record))
