"""Bronze tables in the Iceberg catalog: create, evolve, and append one batch together with its source offsets.

Exactly once rests on one rule: a table's data and the Kafka offsets it covers are committed in one Iceberg
commit. The offsets go into the snapshot summary (lineage, like the Iceberg Kafka Connect sink) and into the
table properties of that same commit, which survive snapshot expiry and compaction. On start the ingester
resumes from the properties; records below a table's offset are never written to it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import DayTransform
from sqlalchemy.exc import IntegrityError, OperationalError

from ingest.bronze.append import append
from ingest.bronze.columnar import conform_table, drop_committed
from ingest.bronze.dead_letters import dead_lettered_offsets
from ingest.bronze.evolution import merge_schemas, normalized
from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.order_watermark import ORDER_MAX_PROPERTY, ORDER_REGRESSIONS_PROPERTY, order_summary
from ingest.bronze.rows import PARTITION_SOURCE_COLUMN, Layout
from ingest.errors import CommitError, DecodeError, TypeConflictError

log = logging.getLogger(__name__)
_T = TypeVar("_T")

OFFSETS_PROPERTY = "cdclake.offsets"
LAYOUT_PROPERTY = "cdclake.layout"
# "true" while the table holds tombstones only, whose layout follows the key converter: the first change record's
# layout (the value converter's) replaces it (BronzeTables.commit).
LAYOUT_PROVISIONAL_PROPERTY = "cdclake.layout-provisional"
KIND_PROPERTY = "cdclake.kind"
COMMIT_ID_PROPERTY = "cdclake.commit-id"
# Snapshot summary: how many truncate records (op 't') the table's appends hold up to this snapshot. Two snapshots'
# counts tell a silver run whether its unit of work has a truncate, without reading the unit for one.
TRUNCATES_PROPERTY = "cdclake.truncates-total"
# Likewise for updates whose image holds Debezium's placeholder for a value it did not read (PostgreSQL's unchanged
# TOAST columns, Oracle's unchanged LOBs): silver keeps the key's previous value for those columns.
UNAVAILABLE_PROPERTY = "cdclake.unavailable-total"
UNAVAILABLE_VALUE = "__debezium_unavailable_value"  # Debezium's default unavailable.value.placeholder
# What Debezium puts in a uuid array for it: Java's UUID.nameUUIDFromBytes of its bytes (DBZ-6720).
UNAVAILABLE_UUID = str(
    uuid.UUID(bytes=hashlib.md5(UNAVAILABLE_VALUE.encode(), usedforsecurity=False).digest(), version=3)
)
# What it puts in an hstore column with hstore.handling.mode=json (the default; a map of it to itself, DBZ-7582).
UNAVAILABLE_HSTORE_JSON = orjson.dumps({UNAVAILABLE_VALUE: UNAVAILABLE_VALUE}).decode()
# The running values each append records, and their values before the first snapshot (running_values).
_RUNNING_INITIAL = {
    TRUNCATES_PROPERTY: "0",
    UNAVAILABLE_PROPERTY: "0",
    ORDER_REGRESSIONS_PROPERTY: "0",
    ORDER_MAX_PROPERTY: "null",
}
MOVED_FROM_HEADER = "__debezium.oldkey"  # the Kafka header of a primary-key change's create
# Snapshot summary of a replay's commits (`cdclake replay-dead-letters`): how many dead letters a data table
# landed, or the dead-letter table deleted as landed.
REPLAYED_PROPERTY = "cdclake.replayed-dead-letters"
# Read by pyiceberg from the table object it commits; set in memory only (see _commit_once), never stored.
PYICEBERG_COMMIT_RETRIES = "commit.retry.num-retries"
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.parquet.compression-codec": "zstd",
    # A column chunk's dictionary stops at 64 KiB (Iceberg's default: 2 MiB): low-cardinality columns (op, topic,
    # the source block's names) stay dictionary-encoded, while keys, images and positions, whose dictionaries never
    # pay off under zstd, fall back to plain early. On the ingest benchmark's rows: Parquet written ~30% faster
    # and ~20% smaller.
    "write.parquet.dict-size-bytes": str(64 * 1024),
    # Bronze is append-only; silver's MERGE uses position deletes (never equality deletes).
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}

# (topic, partition) -> next offset to read
Offsets = dict[tuple[str, int], int]


def encode_offsets(offsets: Offsets) -> str:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return orjson.dumps(nested).decode()


def decode_offsets(text: str | None) -> Offsets:
    if not text:
        return {}
    nested = orjson.loads(text)
    return {
        (topic, int(partition)): int(offset) for topic, parts in nested.items() for partition, offset in parts.items()
    }


def merge_offsets(stored: Offsets, new: Mapping[tuple[str, int], int]) -> Offsets:
    """Offsets only move forward: a commit never drops or rewinds another writer's partitions."""
    merged = dict(stored)
    for tp, offset in new.items():
        merged[tp] = max(offset, merged.get(tp, offset))
    return merged


def _tp(row: Mapping[str, object]) -> tuple[str, int]:
    return (row["_cdc_topic"], row["_cdc_partition"])  # type: ignore[return-value]


def _conflicting_columns(current: pa.Schema, incoming: pa.Schema) -> list[str]:
    """The top-level columns of ``current`` that ``incoming`` types otherwise, beyond widening."""
    conflicting = []
    for column in current:
        index = incoming.get_field_index(column.name)
        if index < 0:
            continue
        try:
            merge_schemas("", pa.schema([column]), pa.schema([incoming.field(index)]))
        except TypeConflictError:
            conflicting.append(column.name)
    return conflicting


def _conformed(batch: TableBatch, table: Table) -> TableBatch:
    """A batch of tombstones only (``provisional_layout``) for a table that another writer laid out otherwise:
    in its layout, without the columns it types otherwise (their keys stay in _cdc_key_json)."""
    table_schema = normalized(table.schema().as_arrow())
    dropped: set[str] = set()
    for schema in batch.schemas:
        dropped.update(_conflicting_columns(schema, table_schema))
    return replace(
        batch,
        layout=Layout(table.properties[LAYOUT_PROPERTY]),
        schemas=[pa.schema([f for f in schema if f.name not in dropped]) for schema in batch.schemas],
        rows=[{k: v for k, v in row.items() if k not in dropped} for row in batch.rows],
        tables=[part.drop_columns([c for c in part.column_names if c in dropped]) for part in batch.tables],
    )


DEAD_LETTER_KIND = "dead_letter"  # TableBatch.kind of the dead-letter table's batches


@dataclass
class _Written:
    """The data files a commit attempt wrote, and what they hold (``_rows_identity``). When another writer's commit
    beats the attempt, the next attempt appends these files again if its rows are the same (the other writer
    committed other partitions), and deletes them if not, as Iceberg's own writers clean up after a commit refused
    for good. ``refused``: None until the attempt's commit fails, then whether the catalog refused it (a
    CommitFailedException); after any other error nobody can tell, and the files stay for `cdclake maintain`'s
    orphan-file removal."""

    identity: tuple[object, ...]
    files: list[DataFile]
    io: FileIO
    refused: bool | None = None

    def delete(self, table_name: str) -> None:
        """Deletes the files, which no commit references; any left are the orphan-file removal's."""
        for data_file in self.files:
            try:
                self.io.delete(data_file.file_path)
            except OSError as exc:
                log.warning(
                    "bronze table %s: unused data file %s not deleted: %s", table_name, data_file.file_path, exc
                )


def _rows_identity(table: Table, data: pa.Table) -> tuple[object, ...]:
    """What tells two attempts' rows of one batch apart. Each attempt drops from the same batch the rows other
    writers committed meanwhile, and those only ever grow, so the same row count means the same rows; the offsets'
    sum and range check it. Files are laid out by the table's schema and partition spec: those take part too."""
    metadata = table.metadata
    identity: tuple[object, ...] = (metadata.current_schema_id, metadata.default_spec_id, data.num_rows)
    if data.num_rows and "_cdc_offset" in data.column_names:
        offsets = data.column("_cdc_offset")
        bounds = pc.min_max(offsets)
        identity += (pc.sum(offsets).as_py(), bounds["min"].as_py(), bounds["max"].as_py())
    return identity


def retry_commit(
    commit: Callable[[], _T],
    attempts: int,
    failed: Callable[[int], str],
    on_conflict: Callable[[int, Exception], None] | None = None,
) -> _T:
    """``commit()``, run again from the table's latest state while another writer's commit (a conflict, or the SQL
    catalog's lock) beats it, backing off from 50 ms to 2 s; after ``attempts`` a CommitError saying ``failed(n)``
    and the last conflict. ``commit`` must load the table itself: a retry must not re-base stale work."""
    delay = 0.05
    for attempt in range(1, attempts + 1):
        try:
            return commit()
        except (CommitFailedException, OperationalError) as exc:
            if attempt == attempts:
                raise CommitError(f"{failed(attempt)}, last: {exc}") from exc
            if on_conflict is not None:
                on_conflict(attempt, exc)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")


@dataclass
class TableBatch:
    """Rows for one bronze table from one flush, with the offsets they cover."""

    name: str
    layout: Layout
    kind: str
    schemas: list[pa.Schema] = field(default_factory=list)
    rows: list[dict[str, object]] = field(default_factory=list)
    # Rows the fast path built as Arrow tables (see ingest.bronze.columnar), in addition to ``rows``.
    tables: list[pa.Table] = field(default_factory=list)
    offsets: Offsets = field(default_factory=dict)
    # Tombstones only, of a table no change record laid out: ``layout`` is their key's (LAYOUT_PROVISIONAL_PROPERTY).
    provisional_layout: bool = False
    # Dead letters landed again (ingest.replay): below the table's offsets by nature, so kept unless the table
    # holds their coordinates already (an earlier replay that died before it deleted them as dead letters).
    replay: bool = False


class BronzeTables:
    """Catalog access for one bronze namespace."""

    def __init__(self, catalog: Catalog, namespace: str, commit_attempts: int = 8) -> None:
        self.catalog = catalog
        self.namespace = namespace
        self.commit_attempts = commit_attempts
        # Per data table: the dead-letter table's snapshot whose dead letters this writer has checked that table's
        # commits against (or written itself); only a newer one of another writer's is read (_without_dead_letters).
        self._dead_letters_checked: dict[str, int] = {}
        # Per table whose commit is under way: what its last attempt wrote (_Written).
        self._written: dict[str, _Written] = {}
        # IntegrityError: another process created it between pyiceberg's existence check and its insert.
        with contextlib.suppress(NamespaceAlreadyExistsError, IntegrityError):
            catalog.create_namespace(namespace)

    def identifier(self, name: str) -> str:
        return f"{self.namespace}.{name}"

    def load(self, name: str) -> Table | None:
        try:
            return self.catalog.load_table(self.identifier(name))
        except NoSuchTableError:
            return None

    def offsets(self, name: str) -> Offsets:
        table = self.load(name)
        return {} if table is None else decode_offsets(table.properties.get(OFFSETS_PROPERTY))

    def list_tables(self) -> list[str]:
        return sorted(identifier[-1] for identifier in self.catalog.list_tables(self.namespace))

    def _create(self, batch: TableBatch, schema: pa.Schema) -> Table | None:
        """The new table, or None when another writer created it meanwhile (the caller starts over on theirs)."""
        properties = {**TABLE_PROPERTIES, LAYOUT_PROPERTY: batch.layout.value, KIND_PROPERTY: batch.kind}
        if batch.provisional_layout:
            properties[LAYOUT_PROVISIONAL_PROPERTY] = "true"
        try:
            # Schema, properties and partition spec in one commit: a crash cannot leave an unpartitioned table.
            transaction = self.catalog.create_table_transaction(
                self.identifier(batch.name), schema=schema, properties=properties
            )
            # Partition by ingest day so time-bounded scans (and silver's incremental reads) prune.
            with transaction.update_spec() as spec:
                spec.add_field(PARTITION_SOURCE_COLUMN, DayTransform(), "_cdc_ingested_day")
            return transaction.commit_transaction()
        except Exception:
            # Another writer may have created it first: its layout and columns may differ from this batch's.
            if self.load(batch.name) is None:
                raise
            return None

    def _lay_out_again(self, table: Table, batch: TableBatch) -> Table:
        """The layout of ``batch``'s change records for a table that holds tombstones only (laid out like their
        keys): the columns the two layouts type differently are dropped (a tombstone's key stays in _cdc_key_json)
        and come back with the changes' types."""
        incoming: pa.Schema | None = None
        for schema in batch.schemas:
            incoming = merge_schemas(self.identifier(batch.name), incoming, schema)
        assert incoming is not None
        current = normalized(table.schema().as_arrow())
        conflicting = _conflicting_columns(current, incoming)
        log.info(
            "bronze table %s: laid out as %s (its first change record), no longer as its tombstones' keys (%s)%s",
            self.identifier(batch.name),
            batch.layout.value,
            table.properties.get(LAYOUT_PROPERTY),
            f"; columns dropped to take their new types: {', '.join(conflicting)}" if conflicting else "",
        )
        with table.transaction() as transaction:
            if conflicting:
                with transaction.update_schema() as update:
                    for name in conflicting:
                        update.delete_column(name)
            transaction.set_properties({LAYOUT_PROPERTY: batch.layout.value})
        return self.catalog.load_table(self.identifier(batch.name))

    def commit(self, batch: TableBatch, on_retry: Callable[[str], None] | None = None) -> int:
        """Append ``batch`` and its offsets in one commit, retrying on conflicts (``on_retry`` is told the table's
        name before each retry: a metric). Returns rows written."""

        def conflict(attempt: int, exc: Exception) -> None:
            log.warning("commit conflict on %s (attempt %d): %s", batch.name, attempt, exc)
            if (written := self._written.get(batch.name)) is not None and written.refused is None:
                written.refused = isinstance(exc, CommitFailedException)
            if on_retry is not None:
                on_retry(batch.name)

        try:
            return retry_commit(
                lambda: self._commit_once(batch),
                self.commit_attempts,
                lambda attempts: f"bronze table {self.identifier(batch.name)}: commit failed {attempts} times",
                conflict,
            )
        except CommitError as exc:
            if (written := self._written.get(batch.name)) is not None:
                refused = (
                    isinstance(exc.__cause__, CommitFailedException) if written.refused is None else written.refused
                )
                if refused:
                    written.delete(self.identifier(batch.name))
            raise
        finally:
            self._written.pop(batch.name, None)

    def _files_to_reuse(self, name: str, identity: tuple[object, ...], rows: int) -> list[DataFile] | None:
        """The files the previous attempt of this commit wrote, if they hold the ``rows`` rows of ``identity``
        (_rows_identity); otherwise None, and those files are deleted if their commit was refused."""
        written = self._written.pop(name, None)
        if written is None:
            return None
        if written.identity == identity and (written.files or not rows):
            return written.files
        if written.refused:
            written.delete(self.identifier(name))
        return None

    def _commit_once(self, batch: TableBatch) -> int:
        table = self.load(batch.name)
        provisional = table is not None and table.properties.get(LAYOUT_PROVISIONAL_PROPERTY) == "true"
        if table is not None and table.properties.get(LAYOUT_PROPERTY, batch.layout.value) != batch.layout.value:
            if provisional and not batch.provisional_layout:
                table = self._lay_out_again(table, batch)
            elif batch.provisional_layout:
                batch = _conformed(batch, table)
        current = None if table is None else normalized(table.schema().as_arrow())
        target = current
        for schema in batch.schemas:
            target = merge_schemas(self.identifier(batch.name), target, schema)
        assert target is not None
        if table is None:
            created = self._create(batch, target)
            if created is None:  # another writer's table, laid out by its records: start over on it
                return self._commit_once(batch)
            table = created
            current = normalized(table.schema().as_arrow())
        layout = table.properties.get(LAYOUT_PROPERTY, batch.layout.value)
        if layout != batch.layout.value:
            raise DecodeError(
                f"table {self.identifier(batch.name)} holds {layout} records; got {batch.layout.value} records "
                "(schemas.enable differs between records of one topic)"
            )
        if not target.equals(current):
            with table.update_schema() as update:
                update.union_by_name(target)
            table = self.catalog.load_table(self.identifier(batch.name))
        stored = decode_offsets(table.properties.get(OFFSETS_PROPERTY))
        # Rows another writer (a restarted process, the new owner after a rebalance, or a zombie that lost its
        # partitions) committed meanwhile are dropped here, against the offsets of the very metadata we commit on.
        # A dead letter's destination is the identifier of a table of this namespace (its name after the dot).
        checked = None
        if batch.replay:
            data = pa.Table.from_pylist(batch.rows, schema=target)
            parts = [conform_table(part, target) for part in batch.tables]
            data = _not_held(table, pa.concat_tables([data, *parts]) if parts else data)
        else:
            rows = _unwritten_rows(
                table, batch, stored, lambda destination: self.offsets(destination.rpartition(".")[2])
            )
            data = pa.Table.from_pylist(rows, schema=target)
            if batch.tables:
                parts = [conform_table(part, target) for part in batch.tables]
                data = drop_committed(
                    pa.concat_tables([data, *parts] if data.num_rows else parts), stored, list(batch.offsets)
                )
            if batch.kind != DEAD_LETTER_KIND:
                data, checked = self._without_dead_letters(batch, data, stored)
        merged = merge_offsets(stored, batch.offsets)
        identity = _rows_identity(table, data)
        reuse = self._files_to_reuse(batch.name, identity, data.num_rows)
        if not data.num_rows and merged == stored:
            # Everything in this batch is in the table already (another writer committed it): nothing to commit.
            # A properties-only commit would write offsets computed from metadata that may be stale by then.
            return 0
        offsets = encode_offsets(merged)
        commit_id = str(uuid.uuid4())
        # Several writers: the offsets and the row filter above hold only for the metadata they were computed from.
        # Every commit therefore carries a snapshot (possibly empty), whose AssertRefSnapshotId makes the commit fail
        # if another writer's commit landed meanwhile, and pyiceberg must not retry by itself: its retry re-bases
        # the append on the new metadata but keeps these stale offsets (they would overwrite the other writer's)
        # and these rows (which it may have committed too). Our loop in commit() retries from scratch instead.
        without_pyiceberg_retries(table)
        # The crash test kills the process between these two lines (data files written, catalog not yet updated).
        log.debug("committing %s: %d rows", self.identifier(batch.name), data.num_rows)
        summary = {OFFSETS_PROPERTY: offsets, COMMIT_ID_PROPERTY: commit_id}
        if batch.replay:
            summary[REPLAYED_PROPERTY] = str(data.num_rows)
        running = running_values(table, _RUNNING_INITIAL)
        for key, count in ((TRUNCATES_PROPERTY, count_truncates), (UNAVAILABLE_PROPERTY, count_unavailable)):
            if (total := running[key]) is not None:
                summary[key] = str(int(total) + count(data))
        regressions = running[ORDER_REGRESSIONS_PROPERTY]
        summary.update(
            order_summary(data, running[ORDER_MAX_PROPERTY], None if regressions is None else int(regressions))
        )
        base = table.current_snapshot() if batch.kind == DEAD_LETTER_KIND else None
        with table.transaction() as transaction:
            files = append(transaction, data, summary, reuse)
            self._written[batch.name] = _Written(identity, files, table.io)
            transaction.set_properties({OFFSETS_PROPERTY: offsets})
            if provisional and not batch.provisional_layout:
                transaction.remove_properties(LAYOUT_PROVISIONAL_PROPERTY)
        log.debug("committed %s", self.identifier(batch.name))
        if checked is not None:
            self._dead_letters_checked[batch.name] = checked
        elif base is not None and (new := table.current_snapshot()) is not None:  # a dead-letter commit
            # Right after a snapshot already checked: this writer's own dead letters are in no data batch of its own.
            for name, seen in list(self._dead_letters_checked.items()):
                if seen == base.snapshot_id:
                    self._dead_letters_checked[name] = new.snapshot_id
        return int(data.num_rows)

    def _without_dead_letters(self, batch: TableBatch, data: pa.Table, stored: Offsets) -> tuple[pa.Table, int | None]:
        """``data`` without the records the dead-letter table holds for this table: another writer of the partition
        (the old owner after a rebalance, or a process that died between its two commits) dead-lettered them after
        this one had started past its offsets, and a record stays in exactly one of the two tables. The reverse of
        _unwritten_rows' rule for dead letters; like the restart's check (Pipeline._dead_lettered), the dead-letter
        table decides, not how this writer decoded the record.

        Also returns the dead-letter snapshot checked. Read only when another writer committed dead letters since
        the one this writer checked last (or wrote its own on): once per table and process, and after such commits.
        """
        dead_table = self.load(DEAD_LETTER_TABLE) if data.num_rows else None
        snapshot = None if dead_table is None else dead_table.current_snapshot()
        if dead_table is None or snapshot is None:
            return data, None
        if self._dead_letters_checked.get(batch.name) == snapshot.snapshot_id:
            return data, snapshot.snapshot_id
        dead_offsets = decode_offsets(dead_table.properties.get(OFFSETS_PROPERTY))
        drop = None
        for (topic, partition), high in dead_offsets.items():
            # ``data`` holds no row below the stored offset (dropped above): only [stored, high) can be held.
            low = stored.get((topic, partition), 0)
            if (topic, partition) not in batch.offsets or high <= low:
                continue
            in_partition = pc.and_(pc.equal(data["_cdc_topic"], topic), pc.equal(data["_cdc_partition"], partition))
            if not pc.any(pc.and_(in_partition, pc.less(data["_cdc_offset"], high))).as_py():
                continue
            held = dead_lettered_offsets(dead_table, topic, partition, low, high, self.identifier(batch.name))
            if not held:
                continue
            lettered = pc.and_(in_partition, pc.is_in(data["_cdc_offset"], pa.array(sorted(held), pa.int64())))
            drop = lettered if drop is None else pc.or_(drop, lettered)
        if drop is None or not pc.any(drop).as_py():
            return data, snapshot.snapshot_id
        dropped = pc.sum(pc.cast(drop, pa.int64())).as_py()
        log.warning(
            "bronze table %s: %d record(s) left out, the dead-letter table holds them (another writer of the "
            "partition dead-lettered them first)",
            self.identifier(batch.name),
            dropped,
        )
        return data.filter(pc.invert(drop)), snapshot.snapshot_id


def _unwritten_rows(
    table: Table, batch: TableBatch, stored: Offsets, landed: Callable[[str], Offsets] | None = None
) -> list[dict[str, object]]:
    """The batch's rows the table does not hold. Beyond the stored offsets, all of them; below, none of a data
    table's, and the dead letters whose coordinates the dead-letter table does not hold (ingest.bronze.dead_letters:
    its offsets may be ahead of the records a restart reads again, and a record may fail only now).

    ``landed``: a destination table's committed offsets. A dead letter below them is dropped: that record is in its
    data table already, committed by another writer of the partition (the new owner after a rebalance, or the old
    one still flushing) that decoded it, and a record stays in exactly one of the two tables."""
    if landed is not None and batch.kind == DEAD_LETTER_KIND:
        destinations = {str(row["_cdc_destination"]) for row in batch.rows if row.get("_cdc_destination")}
        committed = {destination: landed(destination) for destination in destinations}
        rows = [
            row
            for row in batch.rows
            if row["_cdc_offset"]  # type: ignore[operator]
            >= committed.get(str(row.get("_cdc_destination")), {}).get(_tp(row), -1)
        ]
        batch = replace(batch, rows=rows) if len(rows) != len(batch.rows) else batch
    fresh: list[dict[str, object]] = []
    below: dict[tuple[str, int, str], list[dict[str, object]]] = {}
    for row in batch.rows:
        if row["_cdc_offset"] >= stored.get(_tp(row), -1):  # type: ignore[operator]
            fresh.append(row)
        elif batch.kind == DEAD_LETTER_KIND:
            below.setdefault((*_tp(row), str(row["_cdc_destination"])), []).append(row)
    for (topic, partition, destination), candidates in below.items():
        offsets = [int(row["_cdc_offset"]) for row in candidates]  # type: ignore[call-overload]
        held = dead_lettered_offsets(table, topic, partition, min(offsets), max(offsets) + 1, destination)
        fresh.extend(row for row, offset in zip(candidates, offsets, strict=True) if offset not in held)
    return fresh


def without_pyiceberg_retries(table: Table) -> None:
    """Make pyiceberg commit ``table`` once, not retry by itself on a conflict: it would re-base the commit on the
    new metadata without computing it again (set in memory only, never stored). The caller retries from scratch."""
    table.metadata = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, PYICEBERG_COMMIT_RETRIES: "0"}}
    )


def held_coordinates(table: Table, coordinates: pa.Table) -> set[tuple[str, int, int]]:
    """The (topic, partition, offset) of ``coordinates`` (columns _cdc_topic, _cdc_partition, _cdc_offset) that
    ``table`` holds: read per partition over the range of offsets asked, which the files' bounds prune."""
    # pyiceberg's predicates are pydantic models: mypy reads their generated signature, not their __init__.
    equal: Any = EqualTo
    between: Any = And
    at_least: Any = GreaterThanOrEqual
    at_most: Any = LessThanOrEqual
    held: set[tuple[str, int, int]] = set()
    asked = {(str(r["_cdc_topic"]), int(r["_cdc_partition"]), int(r["_cdc_offset"])) for r in coordinates.to_pylist()}
    by_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in asked:
        by_partition.setdefault((topic, partition), []).append(offset)
    for (topic, partition), offsets in by_partition.items():
        condition = between(
            between(equal("_cdc_topic", topic), equal("_cdc_partition", partition)),
            between(at_least("_cdc_offset", min(offsets)), at_most("_cdc_offset", max(offsets))),
        )
        found = table.scan(row_filter=condition, selected_fields=("_cdc_offset",)).to_arrow()["_cdc_offset"]
        held.update((topic, partition, offset) for offset in found.to_pylist() if (topic, partition, offset) in asked)
    return held


def _not_held(table: Table, data: pa.Table) -> pa.Table:
    """``data`` without the rows whose coordinates ``table`` holds already."""
    if not data.num_rows or table.current_snapshot() is None:
        return data
    held = held_coordinates(table, data.select(["_cdc_topic", "_cdc_partition", "_cdc_offset"]))
    if not held:
        return data
    keep = [
        (topic, partition, offset) not in held
        for topic, partition, offset in zip(
            data["_cdc_topic"].to_pylist(),
            data["_cdc_partition"].to_pylist(),
            data["_cdc_offset"].to_pylist(),
            strict=True,
        )
    ]
    return data.filter(pa.array(keep, pa.bool_()))


def count_truncates(data: pa.Table) -> int:
    """Truncate records (op 't') in ``data``; tables without an ``op`` column (transactions, dead letters) hold none."""
    if "op" not in data.column_names:
        return 0
    return int(pc.sum(pc.equal(data["op"], "t")).as_py() or 0)


def count_unavailable(data: pa.Table) -> int:
    """Updates (op 'u'), and primary-key changes' creates, whose ``after`` holds Debezium's unavailable-value
    placeholder in a text or bytes column, as the only element of a text array, as an integer array of its bytes
    (DBZ-5936), as the only element of a uuid array (its UUID, DBZ-6720), or as an hstore that maps it to itself
    (DBZ-7582): JSON text, or a map's only entry."""
    if "op" not in data.column_names or "after" not in data.column_names:
        return 0
    after = data["after"].combine_chunks()
    if not pa.types.is_struct(after.type):
        # Schemaless: the image is JSON text, not counted (silver looks into every unit of such a table, as counts
        # of 0 were written for them before it folded their placeholders).
        return 0
    found = None
    for index in range(after.type.num_fields):
        child = after.field(index)
        if pa.types.is_string(child.type) or pa.types.is_large_string(child.type):
            hit = pc.is_in(child, value_set=pa.array([UNAVAILABLE_VALUE, UNAVAILABLE_HSTORE_JSON], child.type))
        elif pa.types.is_binary(child.type) or pa.types.is_large_binary(child.type):
            hit = pc.equal(child, pa.scalar(UNAVAILABLE_VALUE.encode(), child.type))
        elif pa.types.is_list(child.type) and pa.types.is_integer(child.type.value_type):
            hit = _lists_equal_to(child, list(UNAVAILABLE_VALUE.encode()))
        elif pa.types.is_list(child.type) and pa.types.is_string(child.type.value_type):
            flat = pc.list_flatten(child)
            hit = _only_element_is(child, pc.is_in(flat, value_set=pa.array([UNAVAILABLE_VALUE, UNAVAILABLE_UUID])))
        elif (
            pa.types.is_map(child.type)
            and pa.types.is_string(child.type.key_type)
            and pa.types.is_string(child.type.item_type)
        ):
            # Arrow's list kernels take no maps (list_parent_indices even aborts the process): as a list of entries.
            entries = child.cast(pa.list_(pa.struct([child.type.key_field, child.type.item_field])))
            flat = pc.list_flatten(entries)
            is_placeholder = [pc.equal(pc.struct_field(flat, [index]), UNAVAILABLE_VALUE) for index in (0, 1)]
            hit = _only_element_is(entries, pc.and_(*is_placeholder))
        else:
            continue
        found = hit if found is None else pc.or_kleene(found, hit)
    if found is None:
        return 0
    op = data["op"].combine_chunks()
    partial = pc.equal(op, "u")
    if "_cdc_headers" in data.column_names:
        # A primary-key change's create (it carries `__debezium.oldkey`) holds the placeholder as an update does.
        headers = data["_cdc_headers"].combine_chunks()
        names = pc.struct_field(pc.list_flatten(headers), [0])
        rows = pc.filter(pc.list_parent_indices(headers), pc.fill_null(pc.equal(names, MOVED_FROM_HEADER), False))
        moved = pc.is_in(pa.array(range(len(headers)), pa.int64()), value_set=rows.cast(pa.int64()))
        partial = pc.or_(partial, pc.and_(pc.equal(op, "c"), moved))
    return int(pc.sum(pc.and_(partial, pc.fill_null(found, False))).as_py() or 0)


def _only_element_is(lists: pa.Array, element_hits: pa.Array) -> pa.Array:
    """Per row of a list array: whether it holds exactly one element and that one is a hit (``element_hits``: per
    element of its flattened values). Not by list_element, which fails on an empty list."""
    rows = pc.filter(pc.list_parent_indices(lists), pc.fill_null(element_hits, False)).cast(pa.int64())
    return pc.and_(
        pc.equal(pc.list_value_length(lists), 1), pc.is_in(pa.array(range(len(lists)), pa.int64()), value_set=rows)
    )


def _lists_equal_to(lists: pa.Array, expected: list[int]) -> pa.Array:
    """Per row of a list array: whether it holds exactly ``expected`` (null lists: false)."""
    candidates = pc.fill_null(pc.equal(pc.list_value_length(lists), len(expected)), False)
    rows = pc.indices_nonzero(candidates)  # the rows of the right length, in order
    if len(rows) == 0:
        return candidates
    values = pc.list_flatten(pc.filter(lists, candidates))
    same = pc.fill_null(pc.equal(values, pa.array(expected * len(rows), values.type)), False)
    # The candidates with a differing element (element i belongs to candidate i // len(expected)).
    differing = pc.unique(pc.divide(pc.indices_nonzero(pc.invert(same)), len(expected)))
    matching = pc.filter(rows, pc.invert(pc.is_in(pa.array(range(len(rows)), pa.uint64()), value_set=differing)))
    return pc.is_in(pa.array(range(len(lists)), pa.uint64()), value_set=matching)


def truncates_total(table: Table) -> int | None:
    """The running count of truncate records up to the table's current snapshot (see ``running_values``)."""
    value = running_values(table, {TRUNCATES_PROPERTY: "0"})[TRUNCATES_PROPERTY]
    return None if value is None else int(value)


def running_values(table: Table, initial: Mapping[str, str]) -> dict[str, str | None]:
    """Running values of the snapshot summaries (each key of ``initial``) up to the table's current snapshot
    (``initial``'s for a table without one), in one walk back: the newest snapshot summary's, passing snapshots
    that add no rows an incremental read sees (compaction's replace, a delete). None when an append without it
    comes first (another writer's, or cdclake's before it kept one) or the chain reaches an expired snapshot:
    silver then reads its unit instead."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return dict(initial)
    values: dict[str, str] = {}
    while snapshot is not None and snapshot.summary is not None:
        for key in initial.keys() - values.keys():
            if (value := snapshot.summary.get(key)) is not None:
                values[key] = str(value)
        if len(values) == len(initial):
            break
        if (
            snapshot.summary.operation not in (Operation.REPLACE, Operation.DELETE)
            or snapshot.parent_snapshot_id is None
        ):
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return {key: values.get(key) for key in initial}
