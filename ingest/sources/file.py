"""Topic dumps in the JSON-lines format of ``kcat -C -J``: for replays, backfills and tests.

Each line: ``{"topic", "partition", "offset", "ts", "key", "payload"}``; ``payload: null`` is a tombstone. Only
the topics the configuration follows are read (all, unless source.topics or source.topic_pattern say). As
from Kafka, offsets increase within a partition: a record the dump had before is skipped (logged, a repeated
range), and one at or below an offset read before that the dump did not have (a dump out of order) stops ingest,
unless bronze holds it already. The last line of a dump
kcat is still writing may be cut short: it is read once it is whole.
A Kafka key or value may be any bytes: kcat writes bytes that are not UTF-8 into the JSON string as they are, and
they are read back as the same bytes (so such a record reaches the decoder, and the dead-letter table, unchanged).
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from array import array
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from ingest.debezium.envelope import RawRecord
from ingest.errors import ConfigError
from ingest.sources.base import OffsetResolver, TopicSelection
from ingest.text import first_few

log = logging.getLogger(__name__)
_GZIP_MAGIC = b"\x1f\x8b"


class NotJsonLineError(ConfigError):
    """A line of a dump that is not JSON at all (perhaps cut short: the last line of a dump kcat is writing)."""


def _json_kind(value: Any) -> str:
    return "a JSON " + ("object" if isinstance(value, dict) else type(value).__name__)


def _text_to_bytes(value: Any, field: str, where: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            # Undo surrogateescape (bytes that were not UTF-8, see parse_line); a valid string encodes as usual.
            return value.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:
            return value.encode("utf-8", errors="surrogatepass")
    raise ConfigError(
        f"{where}: '{field}' must be a string or null, not {_json_kind(value)} (kcat deserializes with -s; dump "
        "with `kcat -C -J` and no -s, so that it is the record's bytes)"
    )


def _headers(value: Any, where: str) -> list[tuple[str, bytes | None]] | None:
    """kcat -J writes a record's headers as one flat array, name then value (null for a null value), and leaves the
    field out when the record has none."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) % 2:
        raise ConfigError(f"{where}: 'headers' must be kcat's flat array of names and values")
    headers: list[tuple[str, bytes | None]] = []
    for at in range(0, len(value), 2):
        name = value[at]
        if not isinstance(name, str):
            raise ConfigError(f"{where}: header name {at // 2} must be a string, not {_json_kind(name)}")
        try:
            name.encode("utf-8")  # a Kafka header's name is text; a value may be any bytes
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: header name {at // 2} is not valid UTF-8") from None
        headers.append((name, _text_to_bytes(value[at + 1], f"headers[{at + 1}]", where)))
    return headers or None  # as from Kafka, where a record without headers and one with an empty list are alike


def parse_line(line: bytes, where: str) -> RawRecord:
    lenient = False
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            # Bytes that are not UTF-8 (raw, or as \udcXX escapes): stdlib json keeps them as lone surrogates.
            item = json.loads(line.decode("utf-8", errors="surrogateescape"))
        except ValueError as exc:  # this parser's reason: orjson's blames the bytes that are not UTF-8
            hint = " (a gzip-compressed dump: decompress it first)" if line.startswith(_GZIP_MAGIC) else ""
            raise NotJsonLineError(f"{where}: not a kcat -J JSON line ({exc}){hint}") from None
        lenient = True
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: not a kcat -J JSON object")
    try:
        topic, partition, offset = item["topic"], item["partition"], item["offset"]
    except KeyError as exc:
        raise ConfigError(f"{where}: missing {exc.args[0]!r}") from None
    if not isinstance(topic, str) or type(partition) is not int or type(offset) is not int:
        raise ConfigError(f"{where}: topic must be a string, partition and offset integers")
    if not (0 <= partition < 2**31 and 0 <= offset < 2**63):  # Kafka's int32 and int64 (bronze's columns)
        raise ConfigError(f"{where}: partition {partition} or offset {offset} out of Kafka's range")
    if lenient:
        try:
            topic.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: the topic name is not valid UTF-8") from None
    # kcat writes "payload" always (null for a tombstone). Without it, or where kcat says it could not deserialize a
    # key or value (-s), the record's bytes are not in the dump: landing it would make a tombstone of a change.
    if "payload" not in item:
        raise ConfigError(f"{where}: missing 'payload' (null for a tombstone)")
    for field in ("key_error", "payload_error"):
        if item.get(field) is not None:
            raise ConfigError(
                f"{where}: kcat could not deserialize the record ({field}: {item[field]}); dump the topic with "
                "`kcat -C -J` and no -s, so that key and payload are the record's bytes"
            )
    timestamp = item.get("ts")
    return RawRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp if type(timestamp) is int else None,
        key=_text_to_bytes(item.get("key"), "key", where),
        value=_text_to_bytes(item.get("payload"), "payload", where),
        headers=_headers(item.get("headers"), where),
    )


class FileSource:
    """Reads a dump: every topic in it, or, as the Kafka source follows them, ``topics`` or those whose name
    ``topic_pattern`` matches from its start (source.topics / source.topic_pattern)."""

    def __init__(self, path: str | Path, topics: Collection[str] = (), topic_pattern: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():  # a named pipe (kcat ... > fifo) or /dev/stdin will do, read once
            raise ConfigError(f"source.path {self.path}: file not found")
        if self.path.is_dir():
            raise ConfigError(f"source.path {self.path}: a directory, not a dump")
        self._selection = TopicSelection.of(topics, topic_pattern)
        self._selected: dict[str, bool] = {}
        self.unselected = 0  # records of topics not followed
        self._handle: IO[bytes] | None = None
        self._lines: Iterator[bytes] = iter(())
        self._line_number = 0  # of the last whole line read
        self._resolve: OffsetResolver | None = None
        self._positions: dict[tuple[str, int], int | None] = {}
        self._last_read: dict[tuple[str, int], int] = {}  # the greatest offset read so far per partition
        # Per partition, the offsets read so far as runs of consecutive offsets (their firsts and lasts, in order;
        # 16 bytes a run, so a compacted topic's gaps stay cheap): a record at or below the greatest offset read is
        # a repeat only if it was read; one that was not would be lost.
        self._read_runs: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
        self._unfinished: bytes | None = None  # the last line so far, kcat still writing it
        self.repeated = 0  # records skipped because their partition's offsets did not increase
        self._done = False
        self._empty_polls = 0  # polls in a row that found nothing new

    def start(self, resolve: OffsetResolver) -> None:
        self._resolve = resolve
        self._handle = self.path.open("rb")
        self._lines = iter(self._handle)

    def _wanted(self, record: RawRecord, where: str) -> bool:
        """Whether to hand ``record`` over: not below where bronze resumes its partition, and, as from Kafka, at a
        greater offset than any record of its partition before it (a dump appended twice, or a range repeated, would
        otherwise land those records twice: bronze's offsets only say where a partition resumes)."""
        tp = (record.topic, record.partition)
        last = self._last_read.get(tp)
        if last is not None and record.offset <= last:
            if record.offset >= (self._start(tp) or 0) and not self._was_read(tp, record.offset):
                # An offset this pass never read and bronze does not hold (a dump of a later range put before an
                # earlier one): skipped like a repeat, it would be lost for good, bronze's offset being past it.
                raise ConfigError(
                    f"{where}: {record.topic}[{record.partition}] offset {record.offset} comes after offset {last}, "
                    "and this dump has not had it before: the dump is out of order; sort it by partition and offset"
                )
            if not self.repeated:
                log.warning(
                    "%s: %s[%d] offset %d after offset %d: offsets must increase within a partition; "
                    "skipping such records (a repeated range of the dump)",
                    where,
                    record.topic,
                    record.partition,
                    record.offset,
                    last,
                )
            self.repeated += 1
            return False
        self._last_read[tp] = record.offset
        firsts, lasts = self._read_runs.setdefault(tp, (array("q"), array("q")))
        if lasts and lasts[-1] == record.offset - 1:
            lasts[-1] = record.offset
        else:
            firsts.append(record.offset)
            lasts.append(record.offset)
        start = self._start(tp)
        return start is None or record.offset >= start

    def _was_read(self, tp: tuple[str, int], offset: int) -> bool:
        runs = self._read_runs.get(tp)
        if runs is None:
            return False
        firsts, lasts = runs
        index = bisect.bisect_right(firsts, offset) - 1
        return index >= 0 and lasts[index] >= offset

    def _start(self, tp: tuple[str, int]) -> int | None:
        """Where bronze resumes the partition (None: it holds none of it)."""
        if tp not in self._positions:
            assert self._resolve is not None
            self._positions[tp] = self._resolve(*tp)
        return self._positions[tp]

    def _follows(self, topic: str) -> bool:
        selected = self._selected.get(topic)
        if selected is None:
            selected = self._selected[topic] = self._selection.follows(topic)
        return selected

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        batch: list[RawRecord] = []
        for piece in self._lines:
            line = piece if self._unfinished is None else self._unfinished + piece  # the rest of a cut line
            self._unfinished = None
            whole = line.endswith(b"\n")  # a line counts once its newline is there
            if not line.strip():
                self._line_number += whole
                continue
            where = f"{self.path}:{self._line_number + 1}"
            try:
                record = parse_line(line, where)
            except NotJsonLineError:
                if whole or line.startswith(_GZIP_MAGIC):
                    raise
                # The last line so far, cut short (kcat writes in blocks): read once it is whole, not now.
                self._unfinished = line
                break
            self._line_number += whole
            if not self._follows(record.topic):
                self.unselected += 1
                continue
            if self._wanted(record, where):
                batch.append(record)
                if len(batch) >= max_records:
                    self._empty_polls = 0
                    return batch
        self._done = True
        self._empty_polls = 0 if batch else self._empty_polls + 1
        # Drained: wait like a consumer would, instead of spinning a core, but not on the first poll that finds the
        # end: `--once` stops on it (0.2 s each run of a dump, otherwise).
        if self._empty_polls > 1:
            time.sleep(timeout_s)
        return batch

    def caught_up(self, once: bool = False) -> bool:
        return self._done

    def commit_advisory(self, offsets: Mapping[tuple[str, int], int]) -> None:
        return None

    def lag(self) -> dict[tuple[str, int], int]:
        return {}

    def close(self) -> None:
        if self._handle is not None:
            if self._unfinished is not None:
                log.warning(
                    "%s:%d: the last line is unfinished (no newline, not JSON yet): not read; the next run reads it "
                    "once it is whole",
                    self.path,
                    self._line_number + 1,
                )
            if self.repeated:
                log.warning(
                    "%s: skipped %d record(s) whose offsets did not increase within their partition",
                    self.path,
                    self.repeated,
                )
            if self.unselected:
                skipped = sorted(topic for topic, selected in self._selected.items() if not selected)
                log.info(
                    "%s: left out %d record(s) of topic(s) not followed (source.topics / source.topic_pattern): %s",
                    self.path,
                    self.unselected,
                    first_few(skipped, 6),
                )
            self._handle.close()
            self._handle = None
