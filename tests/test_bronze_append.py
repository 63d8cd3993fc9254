"""Bronze's append (ingest.bronze.append) writes what pyiceberg's ``Transaction.append`` writes.

Differential: the same flush is committed once through cdclake's append and once through pyiceberg's own, into
two tables created alike; rows, data files (partition, record counts, column statistics), snapshot summaries and
table properties must be equal. A flush across midnight takes pyiceberg's path and splits by day alike.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pytest
from pyiceberg.table import Table, Transaction

import ingest.bronze.tables as bronze_tables
from ingest.bronze.append import _single_day, append
from ingest.bronze.tables import BronzeTables
from ingest.debezium.envelope import RawRecord
from ingest.lakehouse import load_catalog
from ingest.pipeline import Pipeline
from tests.conftest import file_pipeline, ingest_file, make_settings
from tests.kafka_fixtures import Coordinate, bronze_coordinates, bronze_rows
from tests.test_fast_path import PG_DUMP, fake_records, file_records

T = TypeVar("T")
MIDNIGHT = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
# Sizes differ with how the rows are chunked in memory; everything the files say about their rows must not.
SIZE_KEYS = {"added-files-size", "total-files-size"}


def pyiceberg_append(
    transaction: Transaction, data: Any, snapshot_properties: dict[str, str], written: Any = None
) -> list[Any]:
    assert written is None  # no commit of these tests is retried
    transaction.append(data, snapshot_properties=snapshot_properties)
    return []


def commit(root: Path, records: list[RawRecord], stamps: list[dt.datetime], ours: bool) -> dict[str, Table]:
    """``records`` (spread over polls ingested at ``stamps``) committed in one flush, by ours or pyiceberg's append."""
    settings = make_settings(root)
    catalog = load_catalog(settings)
    tables = BronzeTables(catalog, "bronze")
    source: Any = type("NoSource", (), {"commit_advisory": lambda self, offsets: None})()
    pipeline = Pipeline(settings.ingest, tables, source)
    step = -(-len(records) // len(stamps))
    for index, stamp in enumerate(stamps):
        pipeline.accept_batch(records[index * step : (index + 1) * step], stamp)
    with pytest.MonkeyPatch.context() as patch:
        if not ours:
            patch.setattr(bronze_tables, "append", pyiceberg_append)
        pipeline.flush()
    return {name: catalog.load_table(f"bronze.{name}") for name in tables.list_tables()}


def describe(table: Table) -> dict[str, Any]:
    rows = table.scan().to_arrow().to_pylist()
    files = []
    for task in table.scan().plan_files():
        data_file = task.file
        files.append(
            (
                str(data_file.partition),
                data_file.record_count,
                data_file.value_counts,
                data_file.null_value_counts,
                data_file.nan_value_counts,
                data_file.lower_bounds,
                data_file.upper_bounds,
                data_file.file_format,
            )
        )
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    summary = {k: v for k, v in snapshot.summary.additional_properties.items() if k not in SIZE_KEYS}
    summary.pop("cdclake.commit-id")
    return {
        "rows": sorted(rows, key=lambda r: (r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"])),
        "files": sorted(files, key=str),
        "summary": summary,
        "operation": snapshot.summary.operation,
        "properties": table.properties,
        "spec": table.spec(),
    }


@pytest.mark.parametrize("across_midnight", [False, True], ids=["one day", "across midnight"])
def test_append_writes_what_pyiceberg_writes(tmp_path: Path, across_midnight: bool) -> None:
    records = file_records(PG_DUMP) + fake_records("informix", 4, 2) + fake_records("oracle", 2, 3)
    stamps = [MIDNIGHT - dt.timedelta(seconds=1), MIDNIGHT] if across_midnight else [MIDNIGHT, MIDNIGHT]
    ours = commit(tmp_path / "ours", records, stamps, ours=True)
    theirs = commit(tmp_path / "theirs", records, stamps, ours=False)
    assert sorted(ours) == sorted(theirs)
    days = set()
    for name, table in theirs.items():
        expected = describe(table)
        assert describe(ours[name]) == expected, name
        days.add(len({partition for partition, *_ in expected["files"]}))
    assert days == ({1, 2} if across_midnight else {1})  # across midnight, some tables hold both days


def test_single_day_needs_one_day_and_the_bronze_spec(tmp_path: Path) -> None:
    records = fake_records("db2", 1, 1)
    table = next(iter(commit(tmp_path, records, [MIDNIGHT], ours=True).values()))
    data = table.scan().to_arrow()
    transaction = table.transaction()
    key = _single_day(transaction, data)
    assert key is not None
    assert key.partition[0] == (MIDNIGHT.date() - dt.date(1970, 1, 1)).days
    assert _single_day(transaction, data.slice(0, 0)) is None
    stamps = data["_cdc_ingested_at"].to_pylist()
    stamps[-1] -= dt.timedelta(days=1)
    column = data.schema.get_field_index("_cdc_ingested_at")
    two_days = data.set_column(column, "_cdc_ingested_at", pa.array(stamps, data.schema.field(column).type))
    assert _single_day(transaction, two_days) is None


# -- background commits ---------------------------------------------------------------------------------------------
def test_after_a_failed_background_commit_nothing_else_commits(tmp_path: Path) -> None:
    """The commit thread fails on the third flush: run() raises that error, and no later buffer is committed (its
    records lie beyond ones bronze does not have); a restart then lands everything exactly once."""
    from ingest.errors import CommitError
    from tests.conftest import FIXTURES, file_pipeline, ingest_file, topic_counts

    settings = make_settings(tmp_path / "lake")
    dump = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
    pipeline = file_pipeline(settings, dump, max_records=5)
    assert pipeline.settings.background_commit
    commits: list[str] = []
    commit = pipeline.tables.commit

    def failing(batch: Any, on_retry: Any = None) -> int:
        commits.append(batch.name)
        if len(commits) == 3:
            raise CommitError("injected")
        return commit(batch, on_retry)

    pipeline.tables.commit = failing  # type: ignore[method-assign]
    with pytest.raises(CommitError, match="injected"):
        pipeline.run(once=True)
    assert len(commits) == 3  # nothing after the failed one
    again = ingest_file(settings, dump)
    catalog = load_catalog(settings)
    landed: dict[str, list[int]] = {}
    for name in catalog.list_tables("bronze"):
        for row in catalog.load_table(name).scan().to_arrow().select(["_cdc_topic", "_cdc_offset"]).to_pylist():
            landed.setdefault(row["_cdc_topic"], []).append(row["_cdc_offset"])
    assert again.stats.records_in > 0
    for topic, count in topic_counts(dump).items():
        assert sorted(landed[topic]) == list(range(count)), topic  # every record once (dead letters included)


def test_a_failed_commit_in_flight_is_not_followed_by_the_revocation_commit(tmp_path: Path) -> None:
    """run() fails for another reason while the background commit of the buffer before fails too. Closing a Kafka
    source then revokes its partitions (librdkafka calls the rebalance callback on close): that must not commit the
    newer buffer, whose records lie beyond the ones the failed commit did not land."""
    import threading

    from ingest.errors import CommitError
    from tests.conftest import FIXTURES, file_pipeline

    settings = make_settings(tmp_path / "lake")
    dump = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
    pipeline = file_pipeline(settings, dump, max_records=1000, background_decode=False)
    commits: list[str] = []
    release = threading.Event()
    commit = pipeline.tables.commit

    def failing_first(batch: Any, on_retry: Any = None) -> int:
        commits.append(batch.name)
        if len(commits) == 1:
            release.wait(30)
            raise CommitError("injected")
        return commit(batch, on_retry)

    pipeline.tables.commit = failing_first  # type: ignore[method-assign]
    pipeline.source.start(pipeline.resolve)
    first, second = pipeline.source.poll(3, 0.0), pipeline.source.poll(2, 0.0)  # customers 0-2, typed_values 0-1
    assert [r.topic for r in first] == [first[0].topic] * 3
    assert [r.topic for r in second] == [second[0].topic] * 2
    now = dt.datetime.now(dt.UTC)
    pipeline.accept_batch(first, now)
    pipeline._flush(wait=False)  # in flight until released
    pipeline.accept_batch(second, now)
    release.set()
    pipeline._stop_threads()  # run()'s finally, after run() raised for another reason
    pipeline.revoke([(first[0].topic, 0), (second[0].topic, 0)])  # what the Kafka source's close() does
    pipeline.source.close()
    assert commits == [pipeline.table_for(first[0].topic)]  # the failed commit only
    assert load_catalog(settings).list_tables("bronze") == []


# -- background decoding --------------------------------------------------------------------------------------------
def buffered_coordinates(buffer: dict[str, Any]) -> list[Coordinate]:
    """(topic, partition, offset) of every record a pipeline's buffer holds (rows and decoded tables)."""
    found: list[Coordinate] = []
    for batch in buffer.values():
        found += [(row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"]) for row in batch.rows]
        for table in batch.tables:
            columns = [table.column(name).to_pylist() for name in ("_cdc_topic", "_cdc_partition", "_cdc_offset")]
            found += list(zip(*columns, strict=True))
    return found


def coordinates_of(records: Iterable[Any]) -> Counter[Coordinate]:
    """How often each (topic, partition, offset) is among ``records`` (RawRecords or the fakes' records)."""
    return Counter((record.topic, record.partition, record.offset) for record in records)


@pytest.mark.parametrize("background_decode", [True, False])
def test_staged_polls_land_once_and_in_order(tmp_path: Path, background_decode: bool) -> None:
    """run() with polls of 16 and flushes at 96 records: with background decoding a poll is grouped while the
    ones before it decode (here slowly, so that STAGED_POLLS of them wait), and a buffer that the staged polls fill
    books them before flushing. Every record lands exactly once, each flush holds at most max_records, and bronze is
    what the per-record path writes."""
    import ingest.pipeline as pipeline_module
    from ingest.fakes import build_stream, write_kcat_jsonl
    from ingest.sources.file import FileSource
    from tests.conftest import file_pipeline

    stream = build_stream("informix", seed=5, n_keys=40, n_changes=400, partitions=2)
    dump = tmp_path / "informix.jsonl"
    write_kcat_jsonl(stream.records, dump)
    settings = make_settings(tmp_path / "lake")
    pipeline = file_pipeline(settings, dump, max_records=96, background_decode=background_decode)
    sizes: list[int] = []  # records per flush
    spans: list[dict[tuple[str, int], tuple[int, int]]] = []  # per flush: each partition's lowest and highest offset
    commit_buffer = pipeline._commit_buffer

    def counted(buffer: dict[str, Any]) -> dict[tuple[str, int], int]:
        sizes.append(sum(len(batch.rows) + sum(table.num_rows for table in batch.tables) for batch in buffer.values()))
        span: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, partition, offset in buffered_coordinates(buffer):
            low, high = span.get((topic, partition), (offset, offset))
            span[(topic, partition)] = (min(low, offset), max(high, offset))
        spans.append(span)
        return commit_buffer(buffer)

    pipeline._commit_buffer = counted  # type: ignore[method-assign]
    staged = run_staging_slowly(pipeline, lambda: (len(pipeline._staged), pipeline.staged_records))
    assert not pipeline._staged
    assert pipeline._decoder is None
    # Polls were staged only with background decoding, and at most STAGED_POLLS of them.
    assert max(polls for polls, _ in staged) == (pipeline_module.STAGED_POLLS if background_decode else 0)
    assert max(records for _, records in staged) <= pipeline_module.STAGED_POLLS * 16
    assert len(sizes) >= len(stream.records) // 96
    assert max(sizes) <= 96
    # In order: each flush holds a partition's records after those of the flushes before it.
    for tp in {tp for span in spans for tp in span}:
        ranges = [span[tp] for span in spans if tp in span]
        assert all(before[1] < after[0] for before, after in itertools.pairwise(ranges)), (tp, ranges)
    assert bronze_coordinates(settings) == coordinates_of(stream.records)
    reference = make_settings(tmp_path / "reference")
    tables = BronzeTables(load_catalog(reference), "bronze")
    Pipeline(reference.ingest, tables, FileSource(dump), fast_path=False).run(once=True)
    assert comparable(bronze_rows(settings)) == comparable(bronze_rows(reference))


def test_staged_polls_count_against_max_bytes(tmp_path: Path) -> None:
    """Polls waiting for the (here slow) decode thread count against max_bytes as buffered ones do: the read loop
    books them and flushes instead of reading on, so at most one poll more than max_bytes is held."""
    from ingest.fakes import build_stream, write_kcat_jsonl
    from tests.conftest import file_pipeline

    stream = build_stream("informix", seed=6, n_keys=40, n_changes=300, partitions=2)
    dump = tmp_path / "informix.jsonl"
    write_kcat_jsonl(stream.records, dump)
    sizes = sorted(len(record.key or b"") + len(record.value or b"") + 64 for record in stream.records)
    largest_poll = sum(sizes[-16:])
    max_bytes = largest_poll * 3 // 2
    settings = make_settings(tmp_path / "lake")
    pipeline = file_pipeline(settings, dump, max_records=10_000, max_bytes=max_bytes)
    held = run_staging_slowly(pipeline, lambda: pipeline._buffered_bytes + pipeline.staged_bytes)
    assert pipeline.stats.flushes >= len(stream.records) * 64 // max_bytes
    assert max(held) <= max_bytes + largest_poll
    assert bronze_coordinates(settings) == coordinates_of(stream.records)


def run_staging_slowly(pipeline: Pipeline, observe: Callable[[], T]) -> list[T]:
    """``pipeline.run(once=True)`` with polls of 16 records and a decode thread slowed to 10 ms a poll, so that polls
    wait staged; returns what ``observe()`` saw after each poll was staged."""
    import ingest.pipeline as pipeline_module

    seen: list[T] = []
    stage, decode = pipeline.stage_batch, pipeline._decode_staged

    def noted(records: list[RawRecord], ingested_at: dt.datetime) -> None:
        stage(records, ingested_at)
        seen.append(observe())

    def slow(poll: Any) -> None:
        time.sleep(0.01)
        decode(poll)

    pipeline.stage_batch = noted  # type: ignore[method-assign]
    pipeline._decode_staged = slow  # type: ignore[method-assign,assignment]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline_module, "POLL_BATCH", 16)
        pipeline.run(once=True)
    return seen


def comparable(rows: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Bronze rows (kafka_fixtures.bronze_rows) but the ingest time, in Kafka order."""
    return {
        name: sorted(
            ({column: value for column, value in row.items() if column != "_cdc_ingested_at"} for row in table),
            key=lambda row: (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"]),
        )
        for name, table in rows.items()
    }


def test_flush_books_the_staged_polls(tmp_path: Path) -> None:
    """A revoke (or stop) while polls are staged commits them too, oldest first: the partitions may move right
    after. The read loop waits for a poll's decoding (to book it) only when STAGED_POLLS others are staged behind it."""
    import threading

    import ingest.pipeline as pipeline_module

    settings = make_settings(tmp_path / "lake")
    source: Any = type("NoSource", (), {"commit_advisory": lambda self, offsets: None})()
    pipeline = Pipeline(settings.ingest, BronzeTables(load_catalog(settings), "bronze"), source)
    records = fake_records("db2", 3, 1)
    polls = pipeline_module.STAGED_POLLS + 1
    size = len(records) // polls
    assert size >= pipeline_module.FAST_PATH_MIN_RECORDS
    cuts = [*range(0, size * polls, size), len(records)]
    release = threading.Event()
    decode = pipeline._decode_staged

    def held(poll: Any) -> None:
        release.wait(30)
        decode(poll)

    pipeline._decode_staged = held  # type: ignore[method-assign,assignment]
    for low, high in itertools.pairwise(cuts[:-1]):
        pipeline.stage_batch(records[low:high], MIDNIGHT)
    assert pipeline.staged_records == cuts[-2]  # all of them wait for the decode thread
    assert pipeline.stats.records_in == 0
    release.set()
    pipeline.stage_batch(records[cuts[-2] :], MIDNIGHT)  # one too many: the oldest is booked
    assert pipeline.stats.records_in >= size
    booked = Counter(buffered_coordinates(pipeline._buffer))
    assert booked == coordinates_of(records[: pipeline.stats.records_in])  # the oldest polls, whole
    pipeline.revoke([(records[0].topic, records[0].partition)])
    assert pipeline.staged_records == 0
    assert pipeline.stats.records_in == len(records)
    assert bronze_coordinates(settings) == coordinates_of(records)
    pipeline._stop_threads()


# -- the commit metrics -----------------------------------------------------------------------------------------
def sample(pipeline: Pipeline, name: str, labels: dict[str, str] | None = None) -> float:
    value = pipeline.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_the_last_commit_time_survives_a_restart_and_moves_only_with_a_commit(tmp_path: Path) -> None:
    """cdclake_last_commit_timestamp_seconds was 0 after every restart (an alert on the time since the last commit
    fired at once on a quiet source), and moved with flushes that committed nothing. It starts from the last
    commit the tables hold and moves with real commits."""
    settings = make_settings(tmp_path / "lake")
    first = ingest_file(settings, PG_DUMP)
    landed = sample(first, "cdclake_last_commit_timestamp_seconds")
    assert landed > 0
    catalog = load_catalog(settings)
    newest = max(
        catalog.load_table(f"bronze.{name}").current_snapshot().timestamp_ms / 1000
        for name in BronzeTables(catalog, "bronze").list_tables()
    )
    time.sleep(0.05)
    again = ingest_file(settings, PG_DUMP)  # a restart: everything is in bronze already
    assert again.stats.written == 0
    assert sample(again, "cdclake_last_commit_timestamp_seconds") == newest


def test_each_commit_attempt_that_lost_a_race_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cdclake_commit_failures_total counted only a commit that failed for good (and stopped the service): the
    conflicts retried before it succeeded were invisible."""
    from pyiceberg.exceptions import CommitFailedException

    settings = make_settings(tmp_path / "lake")
    pipeline = file_pipeline(settings, PG_DUMP)
    commit_once = BronzeTables._commit_once
    lost: set[str] = set()

    def racing(self: BronzeTables, batch: Any) -> int:
        if batch.name not in lost:  # each table's first attempt loses the race
            lost.add(batch.name)
            raise CommitFailedException("Requirement failed: branch main has changed")
        return commit_once(self, batch)

    monkeypatch.setattr(BronzeTables, "_commit_once", racing)
    pipeline.run(once=True)
    assert lost
    assert pipeline.stats.written > 0
    for name in lost:
        assert sample(pipeline, "cdclake_commit_failures_total", {"table": name}) == 1, name


def test_a_commit_that_hangs_is_not_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz turns unhealthy when the service makes no progress. While caught up, every idle pass counted as
    progress, also while a background commit hung (a catalog gone mid-commit): the service looked healthy."""
    import threading

    settings = make_settings(tmp_path / "lake")
    pipeline = file_pipeline(settings, PG_DUMP, latency_threshold_s=0.1, background_commit=True)
    release = threading.Event()
    commit_once = BronzeTables._commit_once

    def hanging(self: BronzeTables, batch: Any) -> int:
        release.wait(30)
        return commit_once(self, batch)

    monkeypatch.setattr(BronzeTables, "_commit_once", hanging)
    runner = threading.Thread(target=pipeline.run)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while pipeline._in_flight is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pipeline._in_flight is not None, "no commit was handed to the commit thread"
        time.sleep(1.5)  # caught up and idle the while, with the commit hanging
        assert pipeline.metrics._since_progress() > 1.0
    finally:
        release.set()
        pipeline.stop_requested.set()
        runner.join(30)
    assert pipeline.stats.written > 0
    assert pipeline.metrics._since_progress() < 5


# -- a commit attempt that lost a race to another writer ----------------------------------------------------------
CUSTOMERS = "dbserver1.inventory.customers"
CUSTOMERS_TABLE = "bronze.dbserver1_inventory_customers"


def writer(settings: Any) -> Pipeline:
    """A pipeline with a catalog connection of its own, committing what it is handed: one ingest process."""
    source: Any = type("NoSource", (), {"commit_advisory": lambda self, offsets: None})()
    return Pipeline(settings.ingest, BronzeTables(load_catalog(settings), "bronze"), source)


def race_on_first_append(monkeypatch: pytest.MonkeyPatch, other: Pipeline) -> list[str]:
    """Makes ``other`` commit its batch while the first append (the first writer's first attempt) is between
    writing its data files and committing them. Returns the paths of the files that attempt wrote."""
    real_append = append
    first_attempt: list[str] = []

    def racing_append(transaction: Transaction, data: Any, properties: dict[str, str], written: Any = None) -> Any:
        files = real_append(transaction, data, properties, written)
        if not first_attempt:
            first_attempt.extend(f.file_path for f in files)
            other.flush()  # commits to the same table: this attempt's commit is refused
        return files

    monkeypatch.setattr(bronze_tables, "append", racing_append)
    return first_attempt


def added_by_last_commit(table: Table) -> set[str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    entries = table.inspect.entries().to_pylist()
    return {
        e["data_file"]["file_path"] for e in entries if e["snapshot_id"] == snapshot.snapshot_id and e["status"] == 1
    }


def parquet_files(table: Table) -> tuple[set[str], set[str]]:
    """The table's data files: those its snapshots reference, and those on disk."""
    referenced = set(table.inspect.files()["file_path"].to_pylist())
    on_disk = {f"file://{path}" for path in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    return referenced, on_disk


def raced_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs_of: Callable[[list[RawRecord]], list[RawRecord]]
) -> tuple[Table, list[str], list[RawRecord]]:
    """Our flush of the customers records, beaten by another writer's commit of ``theirs_of(records)``."""
    settings = make_settings(tmp_path / "lake")
    records = [r for r in file_records(PG_DUMP) if r.topic == CUSTOMERS]
    ours, theirs = writer(settings), writer(settings)
    ours.accept_batch(records, MIDNIGHT)
    theirs.accept_batch(theirs_of(records), MIDNIGHT)
    first_attempt = race_on_first_append(monkeypatch, theirs)
    ours.flush()
    assert first_attempt
    assert sample(ours, "cdclake_commit_failures_total", {"table": CUSTOMERS_TABLE.partition(".")[2]}) == 1
    landed = {(r.topic, r.partition, r.offset) for r in [*records, *theirs_of(records)]}
    assert bronze_coordinates(settings) == Counter(landed)  # each record once
    return load_catalog(settings).load_table(CUSTOMERS_TABLE), first_attempt, records


def test_a_commit_that_lost_a_race_appends_the_files_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several processes commit to one table (a consumer group shares its partitions): a commit that another
    writer's commit beat was redone from scratch, its rows written to new files, and the files of the refused
    attempt were left as orphans (14 after one 2-process run of 24 commits, scaling.md). When the other writer
    committed other partitions, the rows to write are the same, and the next attempt appends the same files."""
    table, first_attempt, _ = raced_commit(
        tmp_path, monkeypatch, lambda records: [r._replace(partition=1) for r in records]
    )
    assert added_by_last_commit(table) == set(first_attempt)
    referenced, on_disk = parquet_files(table)
    assert on_disk == referenced


def test_a_commit_that_lost_a_race_to_its_own_rows_deletes_the_files_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the other writer committed some of the same records (the partition's old owner after a rebalance),
    the next attempt writes the rest to new files and deletes those of the refused attempt: no commit references
    them."""
    table, first_attempt, records = raced_commit(tmp_path, monkeypatch, lambda records: records[: len(records) // 2])
    added = added_by_last_commit(table)
    assert added
    assert not added & set(first_attempt)
    referenced, on_disk = parquet_files(table)
    assert on_disk == referenced
    rows = table.scan(selected_fields=("_cdc_offset",)).to_arrow()["_cdc_offset"].to_pylist()
    assert sorted(rows) == sorted(r.offset for r in records)
