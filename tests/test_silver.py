"""Silver semantics with real dbt on real Spark and Iceberg (net effect, ordering guard, tombstones, truncate)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.catalog import Catalog

from ingest.dbt_runner import run_dbt
from ingest.lakehouse import load_catalog, warehouse_uri
from ingest.maintenance import timestamp_literal
from ingest.snapshots import APPLIED_RECORDS_PROPERTY, APPLIED_SNAPSHOT_PROPERTY
from tests.silver_harness import Change, MongoChange, SilverHarness, Topic, dbt_examples, with_replay, without_schema

pytestmark = [pytest.mark.spark, pytest.mark.dbt]


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    return tmp_path


C, U, D, R, T = "c", "u", "d", "r", "t"


def test_seed_002_worked_example(harness: SilverHarness, dumps: Path) -> None:
    """IBM CDC's example (reference §6.2/§6.4): three tables, one unit of work, net effect per table."""
    t1, t2, t3 = harness.topic("table1"), harness.topic("table2"), harness.topic("table3")
    models = ["build", "--select", t1.table, t2.table, t3.table]  # one dbt build applies all three tables
    # State before the unit of work: TABLE1 has keys 2 and 3, TABLE2 has key 1.
    harness.land(t1, [Change(C, 2, 1, "othercolval2"), Change(C, 3, 2, "othercolval3-old")], dumps)
    harness.land(t2, [Change(C, 1, 3, "othercolval1-old")], dumps)
    harness.land(t3, [], dumps)
    for topic in (t1, t2, t3):
        harness.write_model(topic)
    assert run_dbt(harness.settings, models)
    # The eleven source operations, in order (positions 10..20).
    uow = [
        (t1, Change(C, 1, 10, "othercolval1")),
        (t1, Change(D, 2, 11)),
        (t2, Change(D, 1, 12)),
        (t2, Change(C, 1, 13, "othercolval1")),
        (t1, Change(U, 3, 14, "othercolval3")),
        (t3, Change(C, 1, 15, "othercolval1")),
        (t2, Change(C, 2, 16, "othercolval2")),
        (t3, Change(C, 2, 17, "othercolval2")),
        (t2, Change(C, 3, 18, "othercolval3")),
        (t2, Change(D, 3, 19)),
        (t1, Change(C, 4, 20, "othercolval4")),
    ]
    for topic in (t1, t2, t3):
        harness.land(topic, [change for owner, change in uow if owner is topic], dumps)
    assert run_dbt(harness.settings, models)
    assert harness.silver(t1) == {1: "othercolval1", 3: "othercolval3", 4: "othercolval4"}
    assert harness.silver(t2) == {1: "othercolval1", 2: "othercolval2"}
    assert harness.silver(t3) == {1: "othercolval1", 2: "othercolval2"}
    for topic in (t1, t2, t3):
        assert harness.silver(topic) == topic.expected()


def test_idempotent_reruns_and_replays(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("replays")
    changes = [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(U, 1, 3, "a2"), Change(D, 2, 4)]
    harness.apply(topic, changes, dumps)
    assert harness.silver(topic) == {1: "a2"}
    before = harness.silver_snapshot(topic)
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    assert harness.build(topic)  # nothing new: no commit at all
    assert harness.silver_snapshot(topic) == before
    # Found up to date from bronze's table properties alone: no Spark job reads its metadata tables.
    statements = log.read_bytes()[start:].decode()
    assert "is up to date with" in statements
    assert f"show tblproperties bronze.{topic.table}" in statements
    assert f"bronze.{topic.table}.snapshots" not in statements
    assert f"bronze.{topic.table}.refs" not in statements
    # At-least-once: the same changes land again (new offsets, same positions) -> same silver.
    harness.apply(topic, changes, dumps)
    assert harness.silver(topic) == {1: "a2"}


@pytest.mark.parametrize("mode", ["hard", "soft"])
def test_a_replayed_delete_keeps_when_the_key_was_deleted(harness: SilverHarness, dumps: Path, mode: str) -> None:
    """A delete landed again (Debezium's at-least-once replay: same position, another offset) deleted the deleted key
    again: its `_cdc_deleted_at` (the tombstone's, or the soft-deleted row's) moved to the replay's run, which also
    put off the purge after `tombstone_horizon_days`. It is the same delete: nothing changes."""
    topic = harness.topic(f"replayed_delete_{mode}")
    config = "delete_mode='soft'" if mode == "soft" else ""
    table = f"silver.{topic.table}" if mode == "soft" else f"silver.{topic.table}__cdc_tombstones"
    changes = [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(D, 2, 4)]
    harness.apply(topic, changes, dumps, config)
    deleted = harness.rows(table, "id, _cdc_order, _cdc_offset, _cdc_deleted_at", "id")
    deleted = [row for row in deleted if row["id"] == 2]
    assert len(deleted) == 1
    assert deleted[0]["_cdc_deleted_at"] is not None
    harness.apply(topic, changes[-1:], dumps, config)  # the replay
    harness.apply(topic, [Change(U, 1, 5, "a2"), *changes[-1:]], dumps, config)  # again, beside a newer change
    assert [
        row for row in harness.rows(table, "id, _cdc_order, _cdc_offset, _cdc_deleted_at", "id") if row["id"] == 2
    ] == deleted
    live = "not _cdc_deleted" if mode == "soft" else "true"
    assert harness.silver(topic, live) == {1: "a2"}


def test_late_older_changes_never_resurrect_or_overwrite(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("late")
    harness.apply(
        topic, [Change(C, 1, 10, "x"), Change(D, 1, 20), Change(C, 2, 10, "y"), Change(U, 2, 30, "y3")], dumps
    )
    assert harness.silver(topic) == {2: "y3"}
    # An older update of the deleted key, and an older update of the live key, arrive in a later unit of work.
    harness.apply(topic, [Change(U, 1, 15, "zombie"), Change(U, 2, 25, "stale")], dumps)
    assert harness.silver(topic) == {2: "y3"}
    # A newer change of the deleted key does apply.
    harness.apply(topic, [Change(C, 1, 40, "reborn")], dumps)
    assert harness.silver(topic) == {1: "reborn", 2: "y3"}


def test_a_tombstone_recorded_twice_is_harmless(harness: SilverHarness, dumps: Path) -> None:
    """Two overlapping runs of one model that apply the same delete can both find no tombstone for the key and both
    add one. Later units must still decide one row per key: no duplicate silver row, no failed tombstone MERGE."""
    topic = harness.topic("twice")
    harness.apply(topic, [Change(C, 1, 10, "x"), Change(C, 2, 10, "y")], dumps)
    harness.apply(topic, [Change(D, 1, 20)], dumps)
    tombstones = f"silver.{topic.table}__cdc_tombstones"
    harness.spark.sql(f"insert into {tombstones} select * from {tombstones}")
    assert len(harness.rows(tombstones)) == 2
    # A late older update (below the applied position: positions are looked up) stays void.
    harness.apply(topic, [Change(U, 1, 15, "zombie")], dumps)
    assert harness.silver(topic) == {2: "y"}
    # A newer insert (above it: only the tombstones' existence is looked up) applies once and retires them.
    harness.apply(topic, [Change(C, 1, 30, "reborn")], dumps)
    assert harness.silver(topic) == {1: "reborn", 2: "y"}
    assert harness.rows(tombstones) == []
    harness.apply(topic, [Change(D, 1, 40), Change(U, 1, 35, "late")], dumps)
    assert harness.silver(topic) == {2: "y"}


def test_insert_then_delete_in_one_unit_leaves_nothing(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("transient")
    harness.apply(topic, [Change(C, 1, 1, "keep")], dumps)
    harness.apply(topic, [Change(C, 2, 2, "gone"), Change(U, 2, 3, "gone2"), Change(D, 2, 4)], dumps)
    assert harness.silver(topic) == {1: "keep"}


def test_primary_key_change_ends_with_the_new_key(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("pkchange")
    harness.apply(topic, [Change(C, 2, 1, "george")], dumps)
    # UPDATE ... SET id = 102: delete(old key) + tombstone + create(new key) at one position.
    harness.apply(topic, [Change(D, 2, 5), Change(C, 102, 5, "george")], dumps)
    assert harness.silver(topic) == {102: "george"}


def test_snapshot_read_never_overwrites_a_newer_streamed_change(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("snapshot")
    harness.apply(topic, [Change(U, 1, 12, "streamed")], dumps)
    harness.apply(topic, [Change(R, 1, 10, "snapshot"), Change(R, 2, 10, "only-in-snapshot")], dumps)
    assert harness.silver(topic) == {1: "streamed", 2: "only-in-snapshot"}
    # Same position: a change beats a snapshot read of it.
    harness.apply(topic, [Change(R, 3, 50, "read"), Change(U, 3, 50, "changed")], dumps)
    assert harness.silver(topic)[3] == "changed"


def test_truncate_removes_older_rows(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("truncate")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.apply(
        topic, [Change(T, 0, 5), Change(C, 3, 6, "after-truncate"), Change(U, 1, 4, "before-truncate")], dumps
    )
    assert harness.silver(topic) == {3: "after-truncate"} == topic.expected()


def test_a_truncate_is_one_commit_and_holds_for_later_units(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("truncate_later")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    before = harness.silver_snapshot(topic)
    harness.apply(topic, [Change(T, 0, 5), Change(C, 3, 6, "after")], dumps)
    assert harness.silver(topic) == {3: "after"}
    # One step of main: a reader sees the rows before the truncate or the state after it with its changes, never
    # between (the truncate's DELETE and the INSERT are staged on a branch that main is fast-forwarded to).
    assert main_steps(harness, topic, before) == [harness.silver_snapshot(topic)]
    # Changes from before the truncate that arrive in a later unit of work stay void.
    harness.apply(topic, [Change(U, 1, 4, "late"), Change(C, 4, 3, "late-insert"), Change(U, 3, 7, "after2")], dumps)
    assert harness.silver(topic) == {3: "after2"} == topic.expected()


def test_a_change_older_than_a_truncate_gives_a_soft_deleted_row_no_values(harness: SilverHarness, dumps: Path) -> None:
    """A truncate voids every older change, also as the change whose values a soft-deleted row keeps: in a later
    unit of work, for a delete older than silver's row of the key (late) or not, and in --full-refresh. (Found by
    the soft variant of the property test: a delete after the truncate kept an update from before it.)"""
    topic = harness.topic("soft_truncate")
    config = "delete_mode='soft'"
    harness.apply(topic, [Change(C, 1, 5, "a"), Change(D, 2, 60), Change(T, 0, 31)], dumps, config)
    assert harness.silver(topic, "_cdc_deleted") == {2: None}
    assert harness.silver(topic, "not _cdc_deleted") == {}
    later = [Change(U, 2, 21, "q"), Change(D, 2, 34), Change(U, 3, 20, "x"), Change(D, 3, 40)]
    harness.apply(topic, later, dumps, config)
    assert harness.silver(topic, "_cdc_deleted") == {2: None, 3: None} == topic.expected_deleted()
    # Values silver's rows hold from before a truncate: of a live row deleted in the truncate's unit, and of a row
    # deleted before a truncate that lands later but is older than the delete.
    harness.apply(topic, [Change(C, 4, 50, "e"), Change(C, 5, 51, "f"), Change(D, 5, 90)], dumps, config)
    harness.apply(topic, [Change(D, 4, 95), Change(T, 0, 70)], dumps, config)  # keys 2 and 3: older, gone
    assert harness.silver(topic, "_cdc_deleted") == {4: None, 5: None} == topic.expected_deleted()
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic, "_cdc_deleted") == {4: None, 5: None}
    assert harness.silver(topic, "not _cdc_deleted") == {}


def test_a_unit_is_read_for_truncates_only_when_bronze_cannot_rule_them_out(
    harness: SilverHarness, dumps: Path
) -> None:
    """cdclake ingest keeps a running count of truncates in bronze's snapshot summaries: a run whose unit the counts
    show truncate-free does not read it for one. A truncate another writer appended (no count) is still found and
    applied."""
    topic = harness.topic("counted_truncates")
    log = harness.project / "logs" / "dbt.log"

    def apply_probing(changes: list[Change]) -> bool:
        """Apply ``changes``; whether the run read its unit for a truncate (the probe's SQL is in dbt's log)."""
        size = log.stat().st_size if log.exists() else 0
        harness.apply(topic, changes, dumps)
        with log.open("rb") as text:
            text.seek(size)
            return b"where op = 't'" in text.read()

    apply_probing([Change(C, 1, 1, "a"), Change(C, 2, 2, "b")])
    assert not apply_probing([Change(U, 1, 3, "a2")])
    assert harness.silver(topic) == {1: "a2", 2: "b"} == topic.expected()
    assert apply_probing([Change(T, 0, 4), Change(C, 3, 5, "c")])
    assert harness.silver(topic) == {3: "c"} == topic.expected()
    # Another writer appends a truncate of this topic (a well-formed bronze row, landed for another topic first: a
    # truncate of another topic would stop the run, test_silver_postgres.py::test_a_truncated_partition_stops_...).
    other = harness.topic("counted_truncates_source")
    harness.land(other, [Change(T, 0, 6)], dumps)
    catalog = load_catalog(harness.settings)
    appended = catalog.load_table(f"bronze.{other.table}").scan().to_arrow()
    column = appended.schema.get_field_index("_cdc_topic")
    appended = appended.set_column(
        column, appended.schema.field(column), pa.array([topic.name] * appended.num_rows, pa.string())
    )
    catalog.load_table(f"bronze.{topic.table}").append(appended)
    assert apply_probing([Change(C, 4, 7, "d")])
    assert harness.silver(topic) == {4: "d"}


@pytest.mark.parametrize("history", ["current", "scd2"])
def test_a_run_whose_applied_bronze_snapshot_expired_rereads_all_of_bronze(
    harness: SilverHarness, dumps: Path, history: str
) -> None:
    """Expiring bronze's snapshots by hand (`cdclake maintain` keeps the one silver applied) can remove the snapshot
    silver last applied: the next run says so and re-reads all of bronze, and the ordering guard and tombstones make
    that harmless (the deleted key's old insert does not come back, nothing is applied twice, a tombstone keeps
    its time)."""
    topic = harness.topic(f"expired_{history}")
    config = "history='scd2'" if history == "scd2" else ""
    log = harness.project / "logs" / "dbt.log"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps, config)
    harness.apply(topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4)], dumps, config)
    tombstones = f"silver.{topic.table}__cdc_tombstones"
    deleted = harness.rows(tombstones, "id, _cdc_order, _cdc_deleted_at", "id")
    assert [row["id"] for row in deleted] == [2]
    catalog = load_catalog(harness.settings)
    silver_properties = catalog.load_table(f"silver.{topic.table}").properties
    applied = int(silver_properties[APPLIED_SNAPSHOT_PROPERTY])
    # With bronze's row count there (what `cdclake status` compares once the snapshot is expired).
    assert silver_properties[APPLIED_RECORDS_PROPERTY] == records_at(catalog, f"bronze.{topic.table}", applied)
    # Two appends after the applied snapshot, of which only the last one's snapshot is kept: a read of the
    # snapshots that remain would miss key 3.
    harness.land(topic, [Change(C, 3, 5, "c")], dumps)
    harness.land(topic, [Change(U, 1, 6, "a3")], dumps)
    bronze = f"bronze.{topic.table}"
    later = timestamp_literal(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1))
    harness.spark.sql(
        f"call lake.system.expire_snapshots(table => '{bronze}', older_than => {later}, retain_last => 1)"
    ).collect()
    remaining = [row["snapshot_id"] for row in harness.rows(f"{bronze}.snapshots", "snapshot_id")]
    assert len(remaining) == 1
    assert applied not in remaining
    size = log.stat().st_size
    assert harness.build(topic)
    with log.open("rb") as text:
        text.seek(size)
        assert b"has been expired; re-reading all of" in text.read()
    if history == "scd2":
        assert harness.history(topic) == topic.expected_history()
    else:
        assert harness.silver(topic) == {1: "a3", 3: "c"} == topic.expected()
    # The delete read again is the delete applied before: its tombstone keeps the time it was deleted at, from
    # which tombstone_horizon_days counts (it was set anew, putting off the purge).
    assert harness.rows(tombstones, "id, _cdc_order, _cdc_deleted_at", "id") == deleted
    # The run recorded bronze's current snapshot: the next one has nothing to do.
    silver_properties = catalog.load_table(f"silver.{topic.table}").properties
    current = int(silver_properties[APPLIED_SNAPSHOT_PROPERTY])
    assert current == remaining[0]
    assert silver_properties[APPLIED_RECORDS_PROPERTY] == records_at(catalog, bronze, current)
    assert harness.build(topic)
    assert harness.silver(topic, "true" if history == "current" else "_cdc_is_current") == {1: "a3", 3: "c"}


def records_at(catalog: Catalog, table: str, snapshot_id: int) -> str:
    """Bronze's row count at a snapshot, as its summary says (``total-records``)."""
    snapshot = catalog.load_table(table).snapshot_by_id(snapshot_id)
    assert snapshot is not None
    assert snapshot.summary is not None
    return str(snapshot.summary["total-records"])


def main_steps(harness: SilverHarness, topic: Topic, since: int) -> list[int]:
    """The snapshots main has been at after snapshot ``since`` (its snapshot log); the table must have no other ref."""
    table = load_catalog(harness.settings).load_table(f"silver.{topic.table}")
    assert set(table.metadata.refs) == {"main"}, f"refs other than main: {sorted(table.metadata.refs)}"
    log = [entry.snapshot_id for entry in table.history()]
    return log[log.index(since) + 1 :]


def test_replaced_and_new_keys_move_main_once(harness: SilverHarness, dumps: Path) -> None:
    """A unit that replaces, deletes and adds keys is a DELETE and an INSERT on a branch of the run, then one
    fast-forward of main: main goes from the old state straight to the new one, and the branch is gone."""
    topic = harness.topic("one_step")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps)
    before = harness.silver_snapshot(topic)
    harness.apply(topic, [Change(U, 1, 4, "a2"), Change(D, 2, 5), Change(C, 4, 6, "d")], dumps)
    assert harness.silver(topic) == {1: "a2", 3: "c", 4: "d"} == topic.expected()
    after = harness.silver_snapshot(topic)
    assert main_steps(harness, topic, before) == [after]
    # Time travel to the snapshot before the unit still gives the old state.
    old = harness.spark.sql(f"select id, v from silver.{topic.table} version as of {before}").collect()
    assert {row["id"]: row["v"] for row in old} == {1: "a", 2: "b", 3: "c"}
    # A unit of inserts (staged too: an insert may replace a row), then one of deletes only (one DELETE on main).
    harness.apply(topic, [Change(C, 5, 7, "e")], dumps)
    harness.apply(topic, [Change(D, 3, 8)], dumps)
    assert len(main_steps(harness, topic, after)) == 2
    assert harness.silver(topic) == {1: "a2", 4: "d", 5: "e"} == topic.expected()


def run_id(began: dt.datetime) -> str:
    """The id of a run of a cdc_silver model that began at ``began`` (run_tables.sql, run_id)."""
    return began.strftime("%Y%m%d%H%M%S") + "0123456789abcdef0123456789abcdef"


def test_a_branch_left_by_a_killed_run_is_dropped(harness: SilverHarness, dumps: Path) -> None:
    """A run killed between its staged DELETE and the fast-forward leaves its batch table and its cdclake_apply_*
    branch (main untouched); the next run applies the unit again and drops both once its commits are done, if the
    killed run began over `stale_run_hours` (24) ago or was a run of an older version (whose id carries no time).
    A younger run's table and branch stay: it may still be going, and dropping them raced with the run dropping
    its own tables (in CI, a run that had applied its unit failed so). A run after a finished one drops no branch
    but its own, and lists no refs."""
    topic = harness.topic("leftover")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    before = harness.silver_snapshot(topic)
    table = f"silver.{topic.table}"
    now = dt.datetime.now(dt.UTC)
    # The killed runs' ids: an older version's (the invocation id), one of a run that began 25 hours ago.
    killed = ["0123456789abcdef0123456789abcdef", run_id(now - dt.timedelta(hours=25))]
    going = run_id(now - dt.timedelta(hours=23))
    for run in (*killed, going):
        harness.spark.sql(
            f"create table cdclake_scratch.silver.{topic.table}__cdc_batch_{run} using iceberg as select 1 as id"
        )
        harness.spark.sql(f"alter table {table} create branch cdclake_apply_{run}")
    harness.spark.sql(f"create table cdclake_scratch.silver.{topic.table}__cdc_batch_{going}_folded (id int)")
    harness.spark.sql(f"delete from {table}.branch_cdclake_apply_{killed[0]} where id = 1")
    assert harness.silver(topic) == {1: "a", 2: "b"}  # main: the old state

    def scratch_tables() -> list[str]:
        rows = harness.spark.sql(f"show tables in cdclake_scratch.silver like '{topic.table}__cdc_batch_*'").collect()
        return sorted(row["tableName"] for row in rows)

    def refs() -> list[str]:
        return sorted(row["name"] for row in harness.spark.sql(f"select name from {table}.refs").collect())

    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    harness.apply(topic, [Change(U, 1, 3, "a2"), Change(C, 3, 4, "c")], dumps)
    assert harness.silver(topic) == {1: "a2", 2: "b", 3: "c"} == topic.expected()
    statements = log.read_bytes()[start:].decode()
    for run in killed:
        assert f"drop branch if exists cdclake_apply_{run}" in statements
    assert f"cdclake_apply_{going}" not in statements
    assert f"leaving the tables of run {going} of {table}, which began 138" in statements  # 23 hours, in minutes
    assert refs() == [f"cdclake_apply_{going}", "main"]
    (own,) = [name for name in scratch_tables() if going not in name]  # the run's own batch table
    assert scratch_tables() == sorted([own, *(f"{topic.table}__cdc_batch_{going}{kind}" for kind in ("", "_folded"))])
    log_snapshots = [entry.snapshot_id for entry in load_catalog(harness.settings).load_table(table).history()]
    assert log_snapshots[log_snapshots.index(before) + 1 :] == [harness.silver_snapshot(topic)]
    start = log.stat().st_size
    harness.apply(topic, [Change(U, 2, 5, "b2")], dumps)
    statements = log.read_bytes()[start:].decode()
    assert statements.count("drop branch if exists") == 1, statements  # its own
    assert f"{table}.refs" not in statements
    assert harness.silver(topic) == {1: "a2", 2: "b2", 3: "c"} == topic.expected()
    # A model whose runs never overlap may say so: whatever a run other than the last one left is dropped at once.
    harness.apply(topic, [Change(U, 3, 6, "c2")], dumps, "stale_run_hours=0")
    assert refs() == ["main"]
    (left,) = scratch_tables()  # the run's own batch table
    assert going not in left
    assert harness.silver(topic) == {1: "a2", 2: "b2", 3: "c2"} == topic.expected()


@pytest.mark.parametrize("batch_catalog", [None, "lake"])
def test_each_run_decides_into_a_batch_table_of_its_own(
    harness: SilverHarness, dumps: Path, batch_catalog: str | None
) -> None:
    """A run of the model overlapping another cannot replace the batch the other applies: each run writes
    `<model>__cdc_batch_<invocation>` and drops, files and all, the ones earlier runs left (also those older
    versions kept in silver's namespace). By default they live in the `cdclake_scratch` Hadoop catalog under the
    warehouse, whose drop deletes a directory; `batch_catalog` names another catalog (here the lake's own)."""
    topic = harness.topic("batches")
    config = "" if batch_catalog is None else f"batch_catalog='{batch_catalog}'"
    harness.apply(topic, [Change(C, 1, 1, "a")], dumps, config)
    older = f"{topic.table}__cdc_batch"
    catalog = load_catalog(harness.settings)
    legacy = [older, f"{older}_0123456789abcdef"]  # what older versions left in silver's namespace
    legacy_files = []
    for name in legacy:
        harness.spark.sql(f"create table silver.{name} using iceberg as select 1 as id")
        legacy_files.append(Path(catalog.load_table(f"silver.{name}").location().removeprefix("file:")))
    assert all(any(files.rglob("*.parquet")) for files in legacy_files)
    scratch = Path(warehouse_uri(harness.settings).removeprefix("file:")) / "_cdclake_scratch" / "silver"
    where = "silver" if batch_catalog is not None else "cdclake_scratch.silver"

    def batch_tables() -> list[str]:
        if batch_catalog is None:  # the Hadoop catalog's tables are the directories of its namespace
            return sorted(path.name for path in scratch.iterdir() if path.name.startswith(older))
        names = [row["tableName"] for row in harness.spark.sql("show tables in silver").collect()]
        return sorted(name for name in names if name.startswith(older))

    harness.apply(topic, [Change(U, 1, 2, "b")], dumps, config)
    first = batch_tables()
    assert len(first) == 1, first
    assert first[0].startswith(f"{older}_"), first
    assert first[0] not in legacy, first
    assert harness.spark.sql(f"select id, v from {where}.{first[0]}").collect() == [(1, "b")]
    assert not any(any(files.rglob("*.parquet")) for files in legacy_files), "a dropped table's files were left"
    shown = {row["tableName"] for row in harness.spark.sql("show tables in silver").collect()}
    assert not shown & set(legacy), shown
    harness.apply(topic, [Change(U, 1, 3, "c")], dumps, config)
    second = batch_tables()
    assert len(second) == 1, second
    assert second != first
    assert harness.silver(topic) == {1: "c"}
    # The previous batch in a catalog this session does not define (a batch_catalog since removed) stays there.
    harness.spark.sql(f"alter table silver.{topic.table} set tblproperties ('cdclake.batch_schema' = 'gone.silver')")
    harness.apply(topic, [Change(U, 1, 4, "d")], dumps, config)
    assert harness.silver(topic) == {1: "d"}


def test_a_run_that_fails_drops_no_batch_table_of_another_run(harness: SilverHarness, dumps: Path) -> None:
    """A run drops the batch tables other runs left only once its own commits are done. Before, two overlapping
    runs could each drop the other's table right after writing their own, and both failed (seen in CI). Here a run
    fails mid-apply (silver's data file format is one Iceberg cannot write) while the previous run's batch table
    and one of a run still going exist: both stay, and silver is unchanged; the next run that succeeds applies the
    unit and drops every batch table but its own (with `stale_run_hours=0`: by default, the tables of a run that
    began less than 24 hours ago stay, test_a_branch_left_by_a_killed_run_is_dropped)."""
    topic = harness.topic("failed_run")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.apply(topic, [Change(U, 1, 3, "a1")], dumps)  # an incremental run: its batch table stays
    prefix = f"{topic.table}__cdc_batch_"

    def batch_tables() -> set[str]:
        rows = harness.spark.sql(f"show tables in cdclake_scratch.silver like '{prefix}*'").collect()
        return {row["tableName"] for row in rows}

    (previous,) = batch_tables()
    running = prefix + run_id(dt.datetime.now(dt.UTC))
    harness.spark.sql(f"create table cdclake_scratch.silver.{running} using iceberg as select 1 as id")
    silver = f"silver.{topic.table}"
    harness.spark.sql(f"alter table {silver} set tblproperties ('write.format.default' = 'no-such-format')")
    harness.land(topic, [Change(U, 1, 4, "a2"), Change(D, 2, 5)], dumps)
    assert not harness.build(topic), "a run that cannot write silver's files succeeded"
    assert harness.silver(topic) == {1: "a1", 2: "b"}
    left = batch_tables()
    assert {previous, running} < left, left
    assert len(left) == 3, left  # and the failed run's own
    harness.spark.sql(f"alter table {silver} unset tblproperties ('write.format.default')")
    harness.write_model(topic, "stale_run_hours=0")
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a2"} == topic.expected()
    after = batch_tables()
    assert len(after) == 1, after
    assert not after & left, after


@pytest.mark.parametrize("history", ["current", "scd2"])
def test_overlapping_first_builds_leave_no_delete_unapplied(harness: SilverHarness, dumps: Path, history: str) -> None:
    """Two first builds of one model overlapping: each drops and creates the tombstones, then creates silver, so
    the one whose silver create fails (the table exists) may have replaced the other's tombstones with its own, from
    a longer bronze range. Simulated here: silver is built, a late delete lands (a position below silver's
    applied position, as from another partition of the topic), and the tombstones become those of a first build
    of all of bronze. The next run must still apply the delete, although its tombstone has its position: a delete
    at its own tombstone's position is applied again (idempotent when silver and the tombstones agree)."""
    topic = harness.topic(f"first_builds_{history}")
    config = "history='scd2'" if history == "scd2" else ""
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 5, "b")], dumps, config)
    harness.land(topic, [Change(D, 1, 3)], dumps)
    other = f"{topic.table}_other"
    harness.write_model(topic, config, name=other)
    assert run_dbt(harness.settings, ["build", "--select", other])
    tombstones = f"silver.{topic.table}__cdc_tombstones"
    harness.spark.sql(f"insert overwrite {tombstones} select * from silver.{other}__cdc_tombstones")
    assert harness.build(topic)
    if history == "scd2":
        assert harness.history(topic) == topic.expected_history()
    else:
        assert harness.silver(topic) == {2: "b"} == topic.expected()


# A stand-in for another run of the model that commits while this one runs: overrides of batch_sql and
# scd2_events_sql (dispatched, like any cdclake macro a project overrides), which run after the run read silver's
# properties.
OVERTAKING_MACROS = """
{% macro overtake(target) -%}
  {%- set by = var('overtaken_by', none) -%}
  {%- if by == 'snapshot' -%}
    {% do run_query("call system.rewrite_data_files(table => '" ~ target.schema ~ "." ~ target.identifier
                    ~ "', options => map('rewrite-all', 'true'))") %}
  {%- elif by == 'properties' -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties ('cdclake.bronze_snapshot_id' = '1')") %}
  {%- endif -%}
{%- endmacro %}

{% macro spark__batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate,
                          broadcast) -%}
  {% do overtake(target) %}
  {{ return(cdclake.default__batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position,
                                       truncate, broadcast)) }}
{%- endmacro %}

{% macro spark__scd2_events_sql(input_sql, layout, target, tombstones, delete_mode, truncates, broadcast=false) -%}
  {%- if target is not none %}{% do overtake(target) %}{% endif -%}
  {{ return(cdclake.default__scd2_events_sql(input_sql, layout, target, tombstones, delete_mode, truncates,
                                             broadcast)) }}
{%- endmacro %}
"""


@pytest.mark.parametrize("history", ["current", "scd2"])
@pytest.mark.parametrize("overtaken_by", ["snapshot", "properties"])
def test_a_run_overtaken_by_another_applies_nothing(
    harness: SilverHarness, tmp_path: Path, overtaken_by: str, history: str
) -> None:
    """Two runs of a model overlapping, the other one committing after this one read silver's properties (its
    applied bronze snapshot and position): this run made its branch from main as it was when it staged, so its
    fast-forward succeeded, and its older, shorter unit of work went over the other run's newer rows (a truncate
    the other applied undone for good, a newer update overwritten). Now its branch starts at the snapshot the
    properties describe, and it checks them again before the fast-forward: it fails, applying nothing, and the
    next run converges. A history run (its versions decided from silver as it read it, then staged on a branch)
    checks them before its fast-forward too. The other run's commit is simulated inside this run: a rewrite of
    silver's files moves main; a bronze snapshot recorded in the properties is the other run's last step."""
    own = SilverHarness.create(harness.settings, tmp_path / "project")
    own.spark = harness.spark
    (own.project / "macros" / "overtaking.sql").write_text(OVERTAKING_MACROS)
    with (own.project / "dbt_project.yml").open("a") as project_yml:
        project_yml.write('  - macro_namespace: cdclake\n    search_order: ["cdclake_project", "cdclake"]\n')
    topic = own.topic(f"overtaken_by_{overtaken_by}_{history}")
    config = "history='scd2'" if history == "scd2" else ""
    own.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, config)

    def state() -> object:
        return own.history(topic) if history == "scd2" else own.silver(topic)

    before = state()
    own.land(topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4)], tmp_path)
    assert not own.build(topic, "--vars", f"{{overtaken_by: {overtaken_by}}}")
    assert "changed while this run applied bronze from snapshot" in (own.project / "logs" / "dbt.log").read_text()
    assert state() == before
    staged = "startswith(name, 'cdclake_apply_')"
    assert own.rows(f"silver.{topic.table}.refs", "name", where=staged) == []
    # Nor does it leave its tables (no other run would drop them for a day): only the last run's batch table stays.
    last = load_catalog(own.settings).load_table(f"silver.{topic.table}").properties["cdclake.run_id"]
    tables = own.spark.sql(f"show tables in cdclake_scratch.silver like '{topic.table}__cdc_batch_*'").collect()
    assert {row["tableName"] for row in tables} <= {f"{topic.table}__cdc_batch_{last}"}
    assert own.build(topic)
    assert state() == (topic.expected_history() if history == "scd2" else topic.expected())


def test_a_null_key_part_is_one_key(harness: SilverHarness, dumps: Path) -> None:
    """A key part may be null (keys of a table without a primary key): rows with a null part are one key, matched
    null-safely. A run whose batch holds no null key matches silver's keys with `=` (faster), which must leave the
    null-keyed row alone; a run whose batch holds one must still replace and delete it."""
    topic = harness.topic("null_key_part")

    def land(changes: list[tuple[Change, str | None]]) -> None:
        harness.land_part_keyed(topic, changes, dumps)

    def silver() -> list[tuple[int, str | None, str | None]]:
        return [(r["id"], r["part"], r["v"]) for r in harness.rows(f"silver.{topic.table}", "id, part, v", "1, 2")]

    land([(Change(C, 1, 1, "a"), None), (Change(C, 1, 2, "b"), "x")])
    harness.write_model(topic)
    assert harness.build(topic)
    assert silver() == [(1, None, "a"), (1, "x", "b")]
    land([(Change(U, 1, 3, "c"), "x")])  # no null key in the batch
    assert harness.build(topic)
    assert silver() == [(1, None, "a"), (1, "x", "c")]
    land([(Change(U, 1, 4, "d"), None)])
    assert harness.build(topic)
    assert silver() == [(1, None, "d"), (1, "x", "c")]
    land([(Change(D, 1, 5), None), (Change(U, 1, 6, "e"), "x")])
    assert harness.build(topic)
    assert silver() == [(1, "x", "e")]
    land([(Change(U, 1, 4, "late"), None)])  # older than the null key's tombstone
    assert harness.build(topic)
    assert silver() == [(1, "x", "e")]


def test_changes_above_the_applied_position_skip_the_lookup_but_late_ones_do_not(
    harness: SilverHarness, dumps: Path
) -> None:
    """cdclake.applied_position bounds what silver and the tombstones hold: changes above it need no lookup of
    silver's positions (the tombstones are read for every touched key, which also says whether it has one),
    changes at or below it are still guarded, in the same unit and for the same key."""
    topic = harness.topic("applied_position")
    harness.apply(topic, [Change(C, 1, 10, "x"), Change(C, 2, 20, "y"), Change(D, 3, 30)], dumps)
    properties = load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties
    assert json.loads(properties["cdclake.applied_position"])["o"] == [30, 30, -1]  # Informix: total_order last
    # Key 1: a late update (15) and a newer one (40); key 2: only a late one (5); key 3 (deleted at 30): a late
    # update (29) stays void. Then a newer create (50) brings key 3 back, and later late ones stay void.
    log = harness.project / "logs" / "dbt.log"
    size = log.stat().st_size
    harness.apply(
        topic,
        [Change(U, 1, 15, "late"), Change(U, 1, 40, "x2"), Change(U, 2, 5, "stale"), Change(U, 3, 29, "zombie")],
        dumps,
    )
    with log.open("rb") as text:  # the lookup of silver's rows takes only the keys of changes at or below 30
        text.seek(size)
        assert b"i._cdc_offset) <= named_struct('o', cast(array(30, 30, -1) as array<bigint>)" in text.read()
    assert harness.silver(topic) == {1: "x2", 2: "y"} == topic.expected()
    harness.apply(topic, [Change(C, 3, 50, "reborn"), Change(U, 1, 35, "late2"), Change(U, 3, 45, "late3")], dumps)
    assert harness.silver(topic) == {1: "x2", 2: "y", 3: "reborn"} == topic.expected()
    properties = load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties
    assert json.loads(properties["cdclake.applied_position"])["o"] == [50, 50, -1]
    # A unit whose every change is newer than all bronze held before it (its snapshots' order counts say so)
    # leaves silver out of the batch: only the tombstones are looked up. Its late neighbours above read silver.
    size = log.stat().st_size
    harness.apply(topic, [Change(U, 1, 60, "x3"), Change(D, 2, 61), Change(C, 2, 62, "y2")], dumps)
    with log.open("rb") as text:
        text.seek(size)
        batch = text.read().decode().split("create or replace table", 1)[1].split("select count(*)", 1)[0]
    assert batch.count("left semi join") == 1, batch
    assert f"silver.{topic.table}__cdc_tombstones b" in batch, batch
    assert harness.silver(topic) == {1: "x3", 2: "y2", 3: "reborn"} == topic.expected()
    # And a late one again (below 62) is looked up and stays void.
    harness.apply(topic, [Change(U, 2, 55, "stale2"), Change(U, 3, 63, "r2")], dumps)
    assert harness.silver(topic) == {1: "x3", 2: "y2", 3: "r2"} == topic.expected()

    # The applied position moves to bronze's greatest order (its snapshot summary), which no change is above: the
    # batch's positions are not read for it. Where the summary does not say (bronze compacted since, another
    # writer's append), the batch's greatest position is read as before; a late change is still looked up.
    def applied() -> dict[str, Any]:
        properties = load_catalog(harness.settings).load_table(f"silver.{topic.table}").properties
        return dict(json.loads(properties["cdclake.applied_position"]))

    assert applied() == {"o": [63, 63, -1], "r": 4, "f": 2**63 - 1}
    harness.land(topic, [Change(U, 1, 70, "x4")], dumps)
    harness.spark.sql(
        f"call lake.system.rewrite_data_files(table => 'bronze.{topic.table}', options => map('min-input-files', '1'))"
    )
    assert harness.build(topic)
    position = applied()
    assert (position["o"], position["r"]) == ([70, 70, -1], 2), position
    assert position["f"] < 2**63 - 1, position
    harness.apply(topic, [Change(U, 1, 69, "late4")], dumps)
    assert harness.silver(topic) == {1: "x4", 2: "y2", 3: "r2"} == topic.expected()


def test_soft_deletes_keep_the_row_flagged(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("soft")
    config = "delete_mode='soft'"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps, config)
    harness.apply(topic, [Change(D, 1, 3), Change(U, 1, 2, "late")], dumps, config)
    assert harness.silver(topic, "not _cdc_deleted") == {2: "b"}
    flagged = harness.spark.sql(
        f"select id, _cdc_deleted_at is not null as stamped from silver.{topic.table} where _cdc_deleted"
    ).collect()
    assert [(row["id"], row["stamped"]) for row in flagged] == [(1, True)]


def test_soft_deleted_rows_keep_their_keys_last_values(harness: SilverHarness, dumps: Path) -> None:
    """A soft-deleted row holds the values its key had before the delete, wherever that change landed: in an
    earlier unit of work (silver's row) or in the same one; a key with no such change holds nulls. --full-refresh,
    which sees all of them in one unit, gives the same table."""
    topic = harness.topic("soft_values")
    config = "delete_mode='soft'"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps, config)
    second = [
        Change(D, 1, 4),  # its values are silver's
        Change(U, 2, 5, "b2"),
        Change(D, 2, 6),  # its values are the update's, in this unit
        Change(C, 4, 7, "d"),
        Change(D, 4, 8),  # created and deleted in this unit
        Change(D, 5, 9),  # never seen: nothing to keep
    ]
    harness.apply(topic, second, dumps, config)
    expected = {1: "a", 2: "b2", 4: "d", 5: None}
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {3: "c"}
    # A late update, older than silver's row, lands with the delete: the row keeps silver's (newer) values.
    harness.apply(topic, [Change(U, 3, 10, "c10")], dumps, config)
    harness.apply(topic, [Change(U, 3, 9, "late"), Change(D, 3, 11)], dumps, config)
    expected[3] = "c10"
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {}
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {}


def test_a_late_change_gives_a_soft_deleted_row_the_values_a_rebuild_gives(harness: SilverHarness, dumps: Path) -> None:
    """A change landing after silver applied its key's delete, older than the delete but newer than the values the
    soft-deleted row kept, gives the row its values; the delete stays, with its position and _cdc_deleted_at. A
    change older than the kept values changes nothing. --full-refresh gives the same table. A row written before
    silver kept where its values come from (_cdc_values_position, added to such a table by its next run) keeps
    them: which change they are from is not known."""
    topic = harness.topic("soft_late")
    config = "delete_mode='soft'"
    table = f"silver.{topic.table}"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps, config)
    # Key 1 keeps this unit's update, key 2 silver's row, key 4 (never seen) nothing.
    harness.apply(topic, [Change(U, 1, 5, "a5"), Change(D, 1, 10), Change(D, 2, 10), Change(D, 4, 10)], dumps, config)
    assert harness.silver(topic, "_cdc_deleted") == {1: "a5", 2: "b", 4: None}
    metadata = "id, _cdc_order, _cdc_op, _cdc_offset, _cdc_deleted_at"
    deleted = harness.rows(table, metadata, "id", "_cdc_deleted")
    late = [
        Change(U, 1, 7, "a7"),  # between the kept values (5) and the delete (10)
        Change(U, 1, 4, "a4"),  # older than the kept values
        Change(U, 2, 6, "b6"),
        Change(D, 2, 9),  # a late delete: its key's values before it are the update's
        Change(C, 4, 8, "d8"),
        Change(U, 3, 2, "c2"),  # older than key 3's live row: ignored
    ]
    harness.apply(topic, late, dumps, config)
    expected = {1: "a7", 2: "b6", 4: "d8"}
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {3: "c"}
    assert harness.rows(table, metadata, "id", "_cdc_deleted") == deleted
    harness.apply(topic, [Change(U, 1, 6, "a6")], dumps, config)  # older than key 1's kept values (7)
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {3: "c"}

    # A table from before _cdc_values_position (whose layout signature an earlier cdclake wrote): its rows' kept
    # values are of an unknown change.
    harness.spark.sql(f"alter table {table} drop column _cdc_values_position")
    harness.spark.sql(f"alter table {table} unset tblproperties ('cdclake.layout_signature')")
    harness.apply(topic, [Change(U, 1, 9, "a9"), Change(U, 3, 20, "c20")], dumps, config)
    assert "_cdc_values_position" in harness.spark.table(table).columns
    assert harness.silver(topic, "_cdc_deleted") == expected
    assert harness.silver(topic, "not _cdc_deleted") == {3: "c20"}
    # A row deleted from then on knows where its values come from.
    harness.apply(topic, [Change(D, 3, 30)], dumps, config)
    harness.apply(topic, [Change(U, 3, 25, "c25"), Change(U, 3, 15, "c15")], dumps, config)
    assert harness.silver(topic, "_cdc_deleted") == {**expected, 3: "c25"}


def test_a_replayed_delete_beside_a_late_change_gives_a_soft_deleted_row_its_values(
    harness: SilverHarness, dumps: Path
) -> None:
    """A replay of a soft-deleted row's delete is that delete (its offset and _cdc_deleted_at stay), but a late
    change in its unit of work still gives the row its values. (Found by the soft property test with a
    --full-refresh at its end: the replay's unit was left out whole.)"""
    topic = harness.topic("soft_replay")
    config = "delete_mode='soft'"
    table = f"silver.{topic.table}"
    metadata = "id, _cdc_order, _cdc_op, _cdc_offset, _cdc_deleted_at"
    harness.apply(topic, [Change(D, 2, 25)], dumps, config)
    deleted = harness.rows(table, metadata, "id")
    harness.apply(topic, [Change(D, 2, 25), Change(C, 2, 1, "r")], dumps, config)
    assert harness.silver(topic, "_cdc_deleted") == {2: "r"} == topic.expected_deleted()
    assert harness.rows(table, metadata, "id") == deleted
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic, "_cdc_deleted") == {2: "r"}


def test_full_refresh_gives_the_same_table(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("refresh")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.apply(topic, [Change(U, 2, 3, "b2"), Change(D, 1, 4), Change(C, 3, 5, "c")], dumps)
    incremental = harness.silver(topic)
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic) == incremental == topic.expected()


def test_silver_rows_carry_their_metadata(harness: SilverHarness, dumps: Path) -> None:
    topic = harness.topic("metadata")
    harness.apply(topic, [Change(C, 1, 7, "a")], dumps)
    row = harness.spark.sql(f"select * from silver.{topic.table}").collect()[0].asDict()
    assert row["_cdc_order"] == [7, 7, -1]  # commit_lsn, change_lsn, transaction.total_order (none)
    assert row["_cdc_op"] == "c"
    assert row["_cdc_source_ts"] is not None
    assert row["_cdc_applied_at"] is not None
    assert {"id", "v", "n"} <= row.keys()


def test_relations_are_listed_without_describing_every_table(harness: SilverHarness, dumps: Path) -> None:
    """dbt fills its relation cache with one `show tables` per schema (relations.sql), not dbt-spark's `describe
    extended` of every table in it; the existing silver table is still found, so the next run is incremental.
    Bronze's schema, which dbt does not cache, is not listed at all."""
    topic, other = harness.topic("listed"), harness.topic("unselected")
    harness.apply(other, [Change(C, 1, 1, "x")], dumps)
    harness.apply(topic, [Change(C, 1, 1, "a")], dumps)
    created = harness.rows(f"silver.{topic.table}.snapshots", "snapshot_id", "committed_at")
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    harness.apply(topic, [Change(U, 1, 2, "b")], dumps)
    statements = log.read_bytes()[start:].decode()
    assert "show tables in silver" in statements
    # The current catalog comes from a command, not from a query (relations.sql, current_catalog).
    assert "show current namespace" in statements
    assert "current_catalog()" not in statements
    # Bronze's table is looked up by name (relations.sql, table_exists), not by listing all of bronze for dbt's cache.
    assert f"show tables in bronze like '{topic.table}'" in statements
    assert "show tables in bronze like '*'" not in statements
    # Main's snapshot is bronze's current-snapshot-id property; the summaries of it and the applied one are read.
    assert f"bronze.{topic.table}.refs" not in statements
    assert f"from bronze.{topic.table}.snapshots where snapshot_id in (" in statements
    assert f"describe extended silver.{other.table}" not in statements
    assert f"describe extended bronze.{other.table}" not in statements
    # The model's columns and the fields of bronze's structs: one probe (bronze.sql, input_columns), and no setting
    # for DESCRIBE when no type comes out cut.
    assert statements.count("describe query select * from (select key.*, true as _cdc_end_of_fields, ") == 1
    assert f"select key.* from bronze.{topic.table} where false" not in statements
    assert f"select after.* from bronze.{topic.table} where false" not in statements
    assert "maxToStringFields" not in statements
    assert harness.silver(topic) == {1: "b"}
    # Found as an existing Iceberg table: the run added to its snapshots instead of creating it again.
    assert harness.rows(f"silver.{topic.table}.snapshots", "snapshot_id", "committed_at")[: len(created)] == created


def test_a_run_hands_dbt_a_profile_without_spark_settings_once_the_session_is_set_up(
    harness: SilverHarness, dumps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dbt-spark's session cursor re-applies the profile's Spark settings before every statement (one py4j call
    each): a run that sets the session up first reads a profile without them, a command that sends no SQL gets
    them all (as plain dbt does from the well-known profile: test_config.py), and the model still applies."""
    import yaml
    from dbt.cli.main import dbtRunner

    from ingest.dbt_runner import profile

    read: list[tuple[str, dict[str, str]]] = []
    real_invoke = dbtRunner.invoke

    def invoke(self: dbtRunner, args: list[str], **kwargs: object) -> object:
        text = (Path(args[args.index("--profiles-dir") + 1]) / "profiles.yml").read_text()
        read.append((args[0], yaml.safe_load(text)["cdclake"]["outputs"]["session"]["server_side_parameters"]))
        return real_invoke(self, args, **kwargs)

    monkeypatch.setattr(dbtRunner, "invoke", invoke)
    topic = harness.topic("profile")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.apply(topic, [Change(U, 1, 3, "c"), Change(D, 2, 4)], dumps)
    assert harness.silver(topic) == {1: "c"}
    assert run_dbt(harness.settings, ["parse"])
    read = [(command, parameters) for command, parameters in read if command != "deps"]  # a new project's first
    assert [command for command, _ in read] == ["build", "build", "parse"]
    assert read[0][1] == read[1][1] == {}
    assert read[2][1]["spark.sql.catalog.lake.uri"].startswith("jdbc:")
    # Not compared with the well-known profile: another test's run (another xdist worker) may rewrite it meanwhile.
    assert read[2][1] == profile(harness.settings)["cdclake"]["outputs"]["session"]["server_side_parameters"]


# One change in eleven is a truncate (which voids every older change of the table).
changes_strategy = st.lists(
    st.tuples(
        st.sampled_from("cccuuuddrrt"), st.integers(1, 4), st.integers(1, 60), st.sampled_from(["p", "q", "r", None])
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.parametrize("mode", ["hard", "soft"])
@dbt_examples(4)
@given(batches=st.lists(changes_strategy, min_size=1, max_size=3), replay=st.booleans())
def test_random_histories_match_the_reference_model(
    harness: SilverHarness,
    tmp_path_factory: pytest.TempPathFactory,
    mode: str,
    batches: list[list[tuple[str, int, int, str | None]]],
    replay: bool,
) -> None:
    """Random per-key histories of c/u/d/r/t, random batching, duplicates and replays: silver == reference after
    every batch (with soft deletes, the deleted keys and the values they keep too), and after a --full-refresh."""
    topic = harness.topic("property")
    dumps = tmp_path_factory.mktemp("property")
    config = "delete_mode='soft'" if mode == "soft" else ""
    landed: list[Change] = []

    def check() -> None:
        if mode == "soft":
            assert harness.silver(topic, "not _cdc_deleted") == topic.expected()
            assert harness.silver(topic, "_cdc_deleted") == topic.expected_deleted()
        else:
            assert harness.silver(topic) == topic.expected()

    for batch in batches:
        changes = [Change(op, key, lsn, None if op == "d" else (value or "v")) for op, key, lsn, value in batch]
        changes = with_replay(landed, changes, replay)
        harness.apply(topic, changes, dumps, config)
        check()
    assert harness.build(topic, "--full-refresh")
    check()


def test_schemaless_topic_needs_keys_and_keeps_documents(harness: SilverHarness, dumps: Path) -> None:
    """schemas.enable=false: no key schema, so the model must name its keys; rows keep the image as JSON."""
    import orjson

    from ingest.bronze.tables import BronzeTables
    from ingest.lakehouse import load_catalog
    from ingest.pipeline import Pipeline
    from ingest.sources.file import FileSource

    topic = harness.topic("schemaless")
    source = {"connector": "informix", "commit_lsn": "1", "change_lsn": "1"}
    lines = [
        {
            "topic": topic.name,
            "partition": 0,
            "offset": i,
            "key": orjson.dumps({"id": k}).decode(),
            "payload": orjson.dumps(
                {"op": op, "after": after, "before": None, "source": {**source, "commit_lsn": str(i + 1)}}
            ).decode(),
        }
        for i, (k, op, after) in enumerate(
            [(1, "c", {"id": 1, "v": "a"}), (2, "c", {"id": 2, "v": "b"}), (1, "u", {"id": 1, "v": "a2"})]
        )
    ]
    path = dumps / "schemaless.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    tables = BronzeTables(load_catalog(harness.settings), "bronze")
    Pipeline(harness.settings.ingest, tables, FileSource(path)).run(once=True)

    harness.write_model(topic)
    assert not harness.build(topic)  # no key: a clear compile error (see the dbt log), nothing built
    log = (harness.project / "logs" / "dbt.log").read_text()
    assert f"bronze table bronze.{topic.table} has no key" in log

    harness.write_model(topic, "keys=['id']")
    assert harness.build(topic)
    rows = harness.spark.sql(f"select id, _cdc_document from silver.{topic.table} order by id").collect()
    assert [(row["id"], orjson.loads(row["_cdc_document"])["v"]) for row in rows] == [("1", "a2"), ("2", "b")]


def test_a_schemaless_key_named_in_another_case_reads_the_sources_field(harness: SilverHarness, dumps: Path) -> None:
    """JSON names are case-sensitive: a model saying keys=['id'] over a schemaless topic whose key and images say
    "ID" (Oracle's upper-case names) read every key as NULL, and silver held one row for the whole table, with every
    shipped test passing. It reads "ID" now, as Spark reads a typed key's fields; a name no field has fails the run
    naming the fields there are."""
    topic = harness.topic("upper_key")

    def land(changes: list[Change]) -> None:
        lines = topic.records(changes)
        for line in lines:
            for part in ("key", "payload"):
                text = without_schema(line[part])
                line[part] = None if text is None else text.replace('"id":', '"ID":')
        harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, dumps)

    land([Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c"), Change(U, 1, 4, "a2"), Change(D, 2, 5)])
    harness.write_model(topic, "keys=['id']")
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "cast(id as int) as id, get_json_object(_cdc_document, '$.v') as v")
    assert {row["id"]: row["v"] for row in rows} == {1: "a2", 3: "c"} == topic.expected()

    harness.write_model(topic, "keys=['idx']")
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    assert not harness.build(topic, "--full-refresh")
    message = log.read_bytes()[start:].decode()
    assert "key column 'idx' is neither a field of the Kafka key nor of the change images" in message
    assert "(their fields: key: ID; after: " in message


def test_the_recomputation_tests_read_what_a_models_where_keeps(harness: SilverHarness, dumps: Path) -> None:
    """A model may narrow bronze with a `where`. The shipped tests recomputed silver from all of bronze and failed on
    a correct table ("missing from silver"); given the model's condition as `bronze_where`, they read what it
    reads."""
    import yaml

    from ingest.scaffold import model_yaml

    topic = harness.topic("narrowed")
    harness.land(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "hidden"), Change(C, 3, 3, "c"), Change(D, 3, 4)], dumps)
    condition = "coalesce(after.v, '') <> 'hidden'"
    harness.write_model(topic)  # declares the source
    (harness.project / "models" / "silver" / f"{topic.table}.sql").write_text(
        "{{ config(materialized='cdc_silver') }}\n"
        f"select * from {{{{ source('bronze', '{topic.table}') }}}} where {condition}\n"
    )
    tested = model_yaml(topic.table, ["id"], "bronze", None)
    path = harness.project / "models" / "silver" / f"{topic.table}.yml"
    path.write_text(yaml.safe_dump(tested))
    assert not harness.build(topic)  # silver is right; the recomputation read keys the model never sees
    assert harness.silver(topic) == {1: "a"}
    for test in tested["models"][0]["data_tests"]:
        arguments = next(iter(test.values()))["arguments"]
        if "bronze" in arguments:
            arguments["bronze_where"] = condition
    path.write_text(yaml.safe_dump(tested))
    assert harness.build(topic)


# The schemaless case lost data (every change had a null key); the typed one failed the run: `make test-slow`.
@pytest.mark.parametrize("schemas", [pytest.param(True, marks=pytest.mark.slow), False], ids=["typed", "schemaless"])
def test_keys_of_a_table_without_a_primary_key_are_read_from_the_images(
    harness: SilverHarness, dumps: Path, schemas: bool
) -> None:
    """Debezium sends a null Kafka key for a table without a primary key: the model names its keys, which are read
    from each change's image (`after`, or `before` for a delete), typed or schemaless. Reading them from the missing
    key failed the run (typed) or gave every change the key NULL, one silver row (schemaless). The shipped tests
    read the keys the same way."""
    import yaml

    from ingest.scaffold import model_yaml

    topic = harness.topic(f"keyless_{'typed' if schemas else 'schemaless'}")

    def land(changes: list[Change]) -> None:
        lines = topic.records(changes)
        for line in lines:
            line["key"] = None
            if not schemas:
                line["payload"] = without_schema(line["payload"])
        harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, dumps)

    def silver() -> dict[int, str | None]:
        if schemas:
            return harness.silver(topic)
        rows = harness.rows(f"silver.{topic.table}", "id, get_json_object(_cdc_document, '$.v') as v")
        assert len({row["id"] for row in rows}) == len(rows), rows
        return {int(row["id"]): row["v"] for row in rows}

    harness.write_model(topic, "keys=['id']")
    tested = model_yaml(topic.table, ["id"], "bronze", None)  # keys unique, equals recomputation, no deleted keys
    (harness.project / "models" / "silver" / f"{topic.table}.yml").write_text(yaml.safe_dump(tested))
    land([Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c"), Change(U, 1, 4, "a2"), Change(D, 2, 5)])
    assert harness.build(topic)
    assert silver() == {1: "a2", 3: "c"} == topic.expected()
    land([Change(U, 3, 6, "c2"), Change(D, 1, 7), Change(C, 4, 8, "d"), Change(C, 2, 9, "b2"), Change(U, 3, 2, "old")])
    assert harness.build(topic)
    assert silver() == {2: "b2", 3: "c2", 4: "d"} == topic.expected()
    assert harness.rows(f"silver.{topic.table}__cdc_tombstones", "cast(id as int) as id") == [{"id": 1}]

    def land_update(before_id: int, after_id: int | None, lsn: int, v: str) -> None:
        """An update whose before image holds `before_id` and whose after image holds `after_id`."""
        lines = topic.records([Change(U, before_id, lsn, v)])
        for line in lines:
            envelope = json.loads(line["payload"])
            envelope["payload"]["after"]["id"] = after_id
            line["key"] = None
            line["payload"] = json.dumps(envelope if schemas else envelope["payload"])
        harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, dumps)

    # An update that changes the key column moves the row: the old key's row goes, with a tombstone, as when
    # Debezium sends a delete and a create for a primary key (it does not for a table without one). The shipped
    # tests (recomputation, no deleted keys) read the move the same way.
    land_update(4, 5, 10, "d5")
    assert harness.build(topic)
    assert silver() == {2: "b2", 3: "c2", 5: "d5"}
    assert harness.rows(f"silver.{topic.table}__cdc_tombstones", "cast(id as int) as id", "id") == [
        {"id": 1},
        {"id": 4},
    ]
    assert harness.build(topic, "--full-refresh")
    assert silver() == {2: "b2", 3: "c2", 5: "d5"}
    if schemas:
        return
    # An update that sets the key column to NULL moves the row to the NULL key: the key is read from the image the
    # change has (`after`; `before` only for a delete), never from `before` (which updated key 3 in place).
    (harness.project / "models" / "silver" / f"{topic.table}.yml").unlink()  # its not_null test would fail
    land_update(3, None, 11, "n")
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "id, get_json_object(_cdc_document, '$.v') as v")
    assert sorted((row["id"] or "", row["v"]) for row in rows) == [("", "n"), ("2", "b2"), ("5", "d5")]


def test_a_key_the_kafka_key_carries_is_not_read_from_the_image(harness: SilverHarness, dumps: Path) -> None:
    """Schemaless keys are known only per row: a key field the Kafka key carries is the key, even when the image
    has a field of that name too (a MongoDB document with its own `id`: the key is the document's `_id`)."""
    topic = harness.mongo_topic("own_id", schemas=False)
    harness.apply(
        topic,
        [
            MongoChange("c", 1, 100, after={"_id": 1, "id": "x", "v": "a"}),
            MongoChange("c", 2, 101, after={"_id": 2, "id": "x", "v": "b"}),
            MongoChange("u", 1, 102, after={"_id": 1, "id": "y", "v": "a2"}),
        ],
        dumps,
        "keys=['id']",
    )
    rows = harness.rows(f"silver.{topic.table}", "id, get_json_object(_cdc_document, '$.v') as v", "id")
    assert rows == [{"id": "1", "v": "a2"}, {"id": "2", "v": "b"}]


def test_hostile_column_names_are_quoted(harness: SilverHarness, dumps: Path) -> None:
    """Column names come from source databases: a backquote or SQL in a name must stay a name."""
    import orjson

    from ingest.bronze.tables import BronzeTables
    from ingest.lakehouse import load_catalog
    from ingest.pipeline import Pipeline
    from ingest.sources.file import FileSource

    topic = harness.topic("hostile")
    hostile = "x`) from t; drop table silver.y; --"
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": hostile},
    ]
    row = {"type": "struct", "optional": True, "fields": fields}
    schema = {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "field": "source",
                "fields": [
                    {"type": "string", "field": "connector"},
                    {"type": "int64", "field": "ts_ms"},
                    {"type": "string", "field": "commit_lsn"},
                    {"type": "string", "field": "change_lsn"},
                ],
            },
            {"type": "string", "field": "op"},
        ],
    }
    key_schema = {"type": "struct", "fields": [fields[0]]}
    lines = []
    for offset, (key, value) in enumerate([(1, "a"), (2, "b"), (1, "c")]):
        payload = {
            "before": None,
            "after": {"id": key, hostile: value},
            "op": "c" if offset < 2 else "u",
            "source": {"connector": "informix", "ts_ms": 1, "commit_lsn": str(offset + 1), "change_lsn": "1"},
        }
        lines.append(
            {
                "topic": topic.name,
                "partition": 0,
                "offset": offset,
                "key": orjson.dumps({"schema": key_schema, "payload": {"id": key}}).decode(),
                "payload": orjson.dumps({"schema": schema, "payload": payload}).decode(),
            }
        )
    path = dumps / "hostile.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    Pipeline(harness.settings.ingest, BronzeTables(load_catalog(harness.settings), "bronze"), FileSource(path)).run(
        once=True
    )
    harness.write_model(topic)
    harness.write_tests(topic)  # the shipped tests name the column too
    assert harness.build(topic)
    quoted = "`" + hostile.replace("`", "``") + "`"
    rows = harness.spark.sql(f"select id, {quoted} as value from silver.{topic.table} order by id").collect()
    assert [(r["id"], r["value"]) for r in rows] == [(1, "c"), (2, "b")]


# -- tombstone lifecycle (field notes §4.7, Spark SDP #55993) and silver's table format (§4.11) ---------------------
def tombstone_keys(harness: SilverHarness, topic: Topic) -> list[int]:
    rows = harness.spark.sql(f"select id from silver.{topic.table}__cdc_tombstones order by id").collect()
    return [row["id"] for row in rows]


def age(harness: SilverHarness, table: str, days: int, where: str = "true") -> None:
    """Pretend the deletes were applied ``days`` ago."""
    harness.spark.sql(
        f"update {table} set _cdc_deleted_at = current_timestamp() - interval {days} days where {where}"
    ).collect()


def test_tombstones_outlive_their_key_until_the_horizon(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("horizon")
    config = "tombstone_horizon_days=3"
    first = [Change("c", 1, 10, "a"), Change("c", 2, 11, "b"), Change("d", 1, 20)]
    harness.apply(topic, first, tmp_path, config=config)
    assert tombstone_keys(harness, topic) == [1]
    # Within the horizon the tombstone holds: a late older update of key 1 does not bring it back.
    harness.apply(topic, [Change("u", 1, 15, "zombie"), Change("d", 2, 30)], tmp_path, config=config)
    assert harness.silver(topic) == {}
    assert tombstone_keys(harness, topic) == [1, 2]
    # Key 1's tombstone passes the horizon; key 2's does not: the next run purges only key 1's.
    age(harness, f"silver.{topic.table}__cdc_tombstones", days=4, where="id = 1")
    harness.apply(topic, [Change("c", 3, 40, "c")], tmp_path, config=config)
    assert tombstone_keys(harness, topic) == [2]
    assert harness.silver(topic) == {3: "c"}


@pytest.mark.parametrize("mode", ["hard", pytest.param("soft", marks=pytest.mark.slow)])
def test_a_quiet_table_purges_past_the_horizon_too(harness: SilverHarness, tmp_path: Path, mode: str) -> None:
    """A run with nothing new in bronze still purges what passed the horizon (before, only a run with changes did,
    so a table that went quiet kept its tombstones, or soft-deleted rows, for good); one with nothing to purge
    either leaves silver and its tombstones as they were."""
    topic = harness.topic(f"quiet_horizon_{mode}")
    config = f"tombstone_horizon_days=3, delete_mode='{mode}'"
    harness.apply(topic, [Change("c", 1, 10, "a"), Change("c", 2, 11, "b"), Change("d", 1, 20)], tmp_path, config)
    table = f"silver.{topic.table}" + ("__cdc_tombstones" if mode == "hard" else "")

    def held() -> list[int]:  # the tombstones, or silver's rows soft-deleted ones included
        return tombstone_keys(harness, topic) if mode == "hard" else sorted(harness.silver(topic))

    assert held() == ([1] if mode == "hard" else [1, 2])

    def snapshots() -> list[int]:
        return [len(harness.rows(f"{t}.snapshots", "snapshot_id")) for t in (f"silver.{topic.table}", table)]

    before = snapshots()
    assert harness.build(topic)  # nothing to purge
    assert snapshots() == before
    age(harness, table, days=4, where="id = 1")
    assert harness.build(topic)
    assert held() == ([] if mode == "hard" else [2])


def test_without_a_horizon_tombstones_are_kept(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("forever")
    harness.apply(topic, [Change("c", 1, 10, "a"), Change("d", 1, 20)], tmp_path)
    age(harness, f"silver.{topic.table}__cdc_tombstones", days=10_000)
    harness.apply(topic, [Change("c", 2, 30, "b"), Change("u", 1, 12, "zombie")], tmp_path)
    assert tombstone_keys(harness, topic) == [1]
    assert harness.silver(topic) == {2: "b"}


def test_soft_deleted_rows_are_purged_after_the_horizon(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("soft_horizon")
    config = "delete_mode='soft', tombstone_horizon_days=3"
    first = [Change("c", 1, 10, "a"), Change("c", 2, 11, "b"), Change("d", 1, 20)]
    harness.apply(topic, first, tmp_path, config=config)
    assert set(harness.silver(topic, where="_cdc_deleted")) == {1}
    age(harness, f"silver.{topic.table}", days=4, where="_cdc_deleted")
    steps = f"select count(*) as n from silver.{topic.table}.history"  # main's snapshot log
    before = harness.spark.sql(steps).collect()[0]["n"]
    harness.apply(topic, [Change("d", 2, 30)], tmp_path, config=config)
    # Key 1's soft-deleted row was past the horizon: gone; key 2 was deleted in this run: flagged, kept.
    assert set(harness.silver(topic)) == {2}
    assert set(harness.silver(topic, where="_cdc_deleted")) == {2}
    # The purge is staged with the run's changes: main moved once.
    assert harness.spark.sql(steps).collect()[0]["n"] == before + 1


def test_silver_is_format_v2_merge_on_read(harness: SilverHarness, tmp_path: Path) -> None:
    """Row-level deletes as position deletes (v2), not v3 deletion vectors, and no copy-on-write rewrites per run."""
    topic = harness.topic("format")
    harness.apply(topic, [Change("c", 1, 10, "a")], tmp_path)
    harness.apply(topic, [Change("u", 1, 11, "b")], tmp_path)
    properties = {
        row["key"]: row["value"] for row in harness.spark.sql(f"show tblproperties silver.{topic.table}").collect()
    }
    assert properties.get("format-version") == "2"
    for operation in ("delete", "update", "merge"):
        assert properties.get(f"write.{operation}.mode") == "merge-on-read", operation
    delete_files = harness.spark.sql(f"select count(*) as n from silver.{topic.table}.delete_files").collect()[0]["n"]
    assert delete_files >= 1, "the update was applied as a position delete"
    assert harness.silver(topic) == {1: "b"}


@pytest.mark.parametrize(
    ("config", "kept"),
    [
        ("columns=['v']", ["id", "v"]),
        ("columns=['V']", ["id", "v"]),  # Spark's names are case-insensitive; so are these
        ("exclude_columns=['n']", ["id", "v"]),
        ("exclude_columns=['N', 'V']", ["id"]),
    ],
    ids=["columns", "columns_other_case", "exclude", "exclude_other_case"],
)
def test_columns_and_exclude_columns_choose_silvers_image_columns(
    harness: SilverHarness, dumps: Path, config: str, kept: list[str]
) -> None:
    """`columns` keeps only the named image columns (the key always), `exclude_columns` drops the named ones; names
    match whatever their case (a name in another case used to drop the column silently)."""
    topic = harness.topic("chosen")
    harness.apply(
        topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(U, 1, 3, "a2"), Change(D, 2, 4)], dumps, config
    )
    data = [c for c in harness.rows(f"silver.{topic.table}")[0] if not c.startswith("_cdc_")]
    assert data == kept
    assert harness.rows(f"silver.{topic.table}", ", ".join(kept), "id") == [
        {"id": 1, **({"v": "a2"} if "v" in kept else {})}
    ]


@pytest.mark.parametrize("option", ["columns", "exclude_columns"])
def test_a_column_option_naming_no_column_fails_the_run(harness: SilverHarness, dumps: Path, option: str) -> None:
    """A name in `columns` or `exclude_columns` that bronze's images do not have (a typo) fails the run with a
    message naming it and the columns there are, instead of silently keeping or dropping nothing."""
    topic = harness.topic(f"typo_{option}")
    harness.land(topic, [Change(C, 1, 1, "a")], dumps)
    harness.write_model(topic, f"{option}=['v', 'nmae']")
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert not harness.build(topic)
    message = log.read_bytes()[start:].decode()
    assert f"cdc_silver model '{topic.table}': {option} names nmae, which the images of bronze" in message
    assert "(they have: id, v, n)" in message


def test_a_model_column_named_like_an_image_column_fails_the_run(harness: SilverHarness, dumps: Path) -> None:
    """A column the model's SQL adds under the name of an image column (`lower(after.v) as V`) fails the run with a
    message naming it and the way out, instead of Spark's error about a duplicate column; excluding the image
    column lets the model's own take its place."""
    topic = harness.topic("clash")
    harness.land(topic, [Change(C, 1, 1, "A")], dumps)
    model = harness.project / "models" / "silver" / f"{topic.table}.sql"
    harness.write_model(topic)
    sql = f"select *, lower(after.v) as V from {{{{ source('bronze', '{topic.table}') }}}}\n"
    model.write_text("{{ config(materialized='cdc_silver') }}\n" + sql)
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert not harness.build(topic)
    message = log.read_bytes()[start:].decode()
    assert f"cdc_silver model '{topic.table}': its SQL adds column(s) V, which silver already takes" in message
    model.write_text("{{ config(materialized='cdc_silver', exclude_columns=['v']) }}\n" + sql)
    assert harness.build(topic)
    assert harness.rows(f"silver.{topic.table}", "id, v", "id") == [{"id": 1, "v": "a"}]


def test_a_model_column_named_like_the_layout_probes_marker(harness: SilverHarness, dumps: Path) -> None:
    """The fields of bronze's structs and the model's columns are read from one `describe query`, each struct's
    fields closed by a column `_cdc_end_of_fields`; a model column of that name is not taken for one (the run asks
    each part on its own) and lands in silver like any column the model adds."""
    topic = harness.topic("marker")
    harness.land(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.write_model(topic)
    model = harness.project / "models" / "silver" / f"{topic.table}.sql"
    sql = f"select *, upper(after.v) as _cdc_end_of_fields from {{{{ source('bronze', '{topic.table}') }}}}\n"
    model.write_text("{{ config(materialized='cdc_silver') }}\n" + sql)
    assert harness.build(topic)
    harness.land(topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4)], dumps)
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "id, v, n, _cdc_end_of_fields", "id")
    assert [(r["id"], r["v"], r["_cdc_end_of_fields"]) for r in rows] == [(1, "a2", "A2")]
    assert rows[0]["n"] == 3


def test_a_unit_over_broadcast_max_changes_is_joined_without_broadcasting(harness: SilverHarness, dumps: Path) -> None:
    """A unit of work of more bronze rows than `broadcast_max_changes` (a snapshot taken again, a long backlog) is
    joined with silver without broadcasting its keys, which need not fit in the driver's memory, and says so; the
    result is the same. A value that is no number fails the run naming the option."""
    topic = harness.topic("no_broadcast")
    config = "broadcast_max_changes=3"
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps, config)
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size
    harness.apply(topic, [Change(U, 1, 4, "a2"), Change(D, 2, 5), Change(C, 4, 6, "d")], dumps, config)
    assert harness.silver(topic) == {1: "a2", 3: "c", 4: "d"} == topic.expected()
    # 4 rows: the delete's tombstone is one too
    logged = log.read_bytes()[start:].decode()
    assert "a unit of 4 bronze rows (over broadcast_max_changes)" in logged
    assert "BROADCAST(" not in logged  # the statements dbt logs
    start = log.stat().st_size
    harness.apply(topic, [Change(U, 3, 7, "c2"), Change(C, 5, 8, "e")], dumps, config)  # 2 rows: broadcast
    assert harness.silver(topic) == {1: "a2", 3: "c2", 4: "d", 5: "e"} == topic.expected()
    logged = log.read_bytes()[start:].decode()
    assert "over broadcast_max_changes" not in logged
    assert "BROADCAST(" in logged
    harness.write_model(topic, "broadcast_max_changes='many'")
    assert not harness.build(topic)
    assert "broadcast_max_changes must be a whole number of bronze rows, not 'many'" in log.read_text()


def test_a_compaction_of_bronze_between_runs_is_neither_missed_nor_applied_again(
    harness: SilverHarness, dumps: Path
) -> None:
    """`cdclake maintain` compacts bronze between dbt runs: its `replace` snapshot adds files holding changes silver
    applied already and ones it has not. The next run reads the appends since its snapshot (Iceberg's incremental
    scan skips the rewrite; were it read, the ordering guard would make the old changes no-ops): it neither fails
    nor misses what landed before or after the compaction."""
    topic = harness.topic("compacted")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.land(topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4)], dumps)
    bronze = f"bronze.{topic.table}"
    harness.spark.sql(
        f"call lake.system.rewrite_data_files(table => '{bronze}', options => map('min-input-files', '1'))"
    ).collect()
    operations = [row["operation"] for row in harness.rows(f"{bronze}.snapshots", "operation", "committed_at")]
    assert operations[-1] == "replace", operations
    harness.land(topic, [Change(C, 3, 5, "c"), Change(U, 3, 6, "c2")], dumps)
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a2", 3: "c2"} == topic.expected()
    assert harness.rows(f"silver.{topic.table}__cdc_tombstones", "id") == [{"id": 2}]
    assert harness.build(topic, "--full-refresh")
    assert harness.silver(topic) == {1: "a2", 3: "c2"}


def test_an_empty_build_checks_the_models_and_applies_nothing(harness: SilverHarness, dumps: Path) -> None:
    """`dbt build --empty` (dbt renders sources and refs as empty subqueries, to check a project without reading
    its data): each model is checked against bronze's columns and nothing is applied, created or replaced, even
    with --full-refresh; the shipped tests have nothing to test. It failed on SQL that read bronze's snapshots
    from the subquery."""
    topic = harness.topic("empty_build")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], dumps)
    harness.write_tests(topic)
    applied = harness.silver_snapshot(topic)
    harness.land(topic, [Change(U, 1, 3, "a2"), Change(D, 2, 4)], dumps)
    for extra in ([], ["--full-refresh"]):
        assert harness.build(topic, "--empty", *extra)
        assert harness.silver_snapshot(topic) == applied
    assert harness.silver(topic) == {1: "a", 2: "b"}
    fresh = harness.topic("empty_build_new")
    harness.land(fresh, [Change(C, 1, 1, "a")], dumps)
    harness.write_model(fresh)
    assert harness.build(fresh, "--empty")
    assert not harness.has_silver(fresh)
    harness.write_model(fresh, "keys=['nope']")
    assert not harness.build(fresh, "--empty")  # the model is checked all the same
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "a2"}


BAD_OPTIONS = {
    "tombstone_horizon_days='30d'": "tombstone_horizon_days must be a whole number of days (0 or more), not '30d'",
    "tombstone_horizon_days=-1": "tombstone_horizon_days must be a whole number of days (0 or more), not -1",
    "history='scd2', tombstone_horizon_days=30": "tombstone_horizon_days does not apply to history='scd2' "
    "(deletes are part of the history)",
    "delete_mode='sof'": "delete_mode must be 'hard' or 'soft', not 'sof'",
    "stale_run_hours=-1": "stale_run_hours must be a whole number of hours (0 or more), not -1",
    "history='scd3'": "history must be 'current' or 'scd2', not 'scd3'",
    "on_schema_change='boom'": "on_schema_change must be 'append_new_columns', 'sync_all_columns', 'ignore' or "
    "'fail', not 'boom'",
    "ignore_null_updates='yes'": "ignore_null_updates must be true or false, not 'yes'",
    "keys=[]": "keys must be a column name or a non-empty list of them, not []",
    "columns={'v': 1}": "columns must be a column name or a non-empty list of them, not {'v': 1}",
    "exclude_changes=1": "exclude_changes must be a SQL condition, not 1",
    "partition_by=[]": "partition_by must be a column or partition transform (bucket(16, id), days(updated_at)), or a "
    "non-empty list of them, not []",
    "tblproperties='zstd'": "tblproperties must be a mapping of table property names to values, not 'zstd'",
    "tblproperties={'cdclake.applied_position': '{}'}": "tblproperties may not set cdclake.applied_position: the "
    "cdclake.* properties are the state of silver's runs",
    "complete_transactions=true": "complete_transactions must name the bronze table of the connector's transaction "
    "topic ('dbserver1_transaction', or 'schema.table'), not True",
    "complete_transactions='t', transaction_timeout_minutes='1h'": "transaction_timeout_minutes must be a whole "
    "number of minutes, not '1h'",
    "transaction_timeout_minutes=5": "transaction_timeout_minutes applies to complete_transactions, which the model "
    "does not set",
    "complete_transactions='bronze.nothing_here'": "complete_transactions names bronze.nothing_here, which does not "
    "exist: it is the bronze table of the connector's transaction topic",
}


def test_an_option_of_the_wrong_kind_fails_the_run_naming_it(harness: SilverHarness, dumps: Path) -> None:
    """Each option's value is checked before the run reads anything. `tombstone_horizon_days='30d'` went through
    `| int` as 0 and purged every tombstone at each run (a late change could then bring any deleted key back);
    `on_schema_change` was checked only once silver existed, the others' wrong values were taken as some default.
    An option name one or two letters off (dbt passes on any config) is a warning naming the option meant."""
    topic = harness.topic("bad_options")
    harness.land(topic, [Change(C, 1, 1, "a")], dumps)
    names = [f"bad_options_{i}" for i in range(len(BAD_OPTIONS))]
    for name, config in zip(names, BAD_OPTIONS, strict=True):
        harness.write_model(topic, config, name=name)
    config = "delete_mod='soft', key=['v'], unique_key='v', file_format='delta', contract={'enforced': true}"
    config += ", tblproperties={'format-version': 3}"
    # Any existing table will do: the topic's changes carry no transaction block.
    config += f", complete_transactions='{topic.table}', tombstone_horizon_days=1"
    harness.write_model(topic, config, name="bad_options_typo")
    harness.write_model(topic, "", name="bad_options__cdc_batch")  # a name kept for a model's own tables
    log = harness.project / "logs" / "dbt.log"
    start = log.stat().st_size if log.exists() else 0
    assert not run_dbt(harness.settings, ["run", "--select", *names, "bad_options_typo", "bad_options__cdc_batch"])
    message = log.read_bytes()[start:].decode()
    assert (
        "cdc_silver model 'bad_options__cdc_batch': its table name bad_options__cdc_batch holds '__cdc_', which "
        "cdc_silver keeps for a model's own tables"
    ) in message
    for name, expected in zip(names, BAD_OPTIONS.values(), strict=True):
        assert f"cdc_silver model '{name}': {expected}" in message
    assert (
        "cdc_silver model 'bad_options_typo': config 'delete_mod' is not a cdc_silver option and is ignored; "
        "did you mean 'delete_mode'?"
    ) in message
    # `key`, shorter than the names compared otherwise (it was ignored without a word).
    assert "config 'key' is not a cdc_silver option and is ignored; did you mean 'keys'?" in message
    # dbt-spark's configs that a dbt user may give a cdc_silver model by habit: ignored, each said so.
    assert (
        "cdc_silver model 'bad_options_typo': config 'unique_key' does not apply to cdc_silver and is ignored: "
        "cdc_silver keys its rows by `keys` (default: the Debezium key's fields)"
    ) in message
    assert "cdc_silver model 'bad_options_typo': file_format 'delta' is ignored: silver tables are Iceberg" in message
    assert "cdc_silver model 'bad_options_typo': its contract is not enforced" in message
    assert (
        "cdc_silver model 'bad_options_typo': tblproperties sets format-version 3 (cdc_silver's default is 2)"
        in message
    )
    # Both: tombstones wait while a transaction is held (test_silver_transactions.py), so there is no warning.
    assert "complete_transactions with tombstone_horizon_days" not in message
    held = {
        row["key"]: row["value"] for row in harness.spark.sql("show tblproperties silver.bad_options_typo").collect()
    }
    assert held["format-version"] == "3"  # as the model says
    built = {row["tableName"] for row in harness.spark.sql("show tables in silver like 'bad_options*'").collect()}
    assert built == {"bad_options_typo", "bad_options_typo__cdc_tombstones"}  # the warning alone fails nothing


def test_partition_by_and_tblproperties_shape_silver(harness: SilverHarness, dumps: Path) -> None:
    """dbt-spark's `partition_by` and `tblproperties` configs: silver (current state and a history) is created
    partitioned as the model says, with the model's table properties beside cdclake's, and later runs apply
    changes to it as to any silver table; a property changed in the model is set at the next run. Both were
    ignored: a model that asked for them got an unpartitioned table with cdclake's properties only. dbt's
    `persist_docs` writes the YAML's column descriptions as silver's column comments."""
    topic = harness.topic("partitioned")
    table = topic.table
    properties = "'write.target-file-size-bytes': 1048576, 'write.parquet.bloom-filter-enabled.column.id': true"
    models = {table: "", f"{table}_history": "history='scd2', "}
    first = [Change(C, key, key, f"v{key}") for key in range(1, 9)]
    harness.land(topic, first, dumps)

    log = harness.project / "logs" / "dbt.log"

    def build(retries: int, buckets: int = 4, *extra: str) -> str:
        """The runs' log."""
        for name, history in models.items():
            retry = f"'commit.retry.num-retries': {retries}"
            config = f"{history}partition_by=['bucket({buckets}, id)'], tblproperties={{{properties}, {retry}}}"
            harness.write_model(topic, config, name=name)
            (harness.project / "models" / "silver" / f"{name}.yml").write_text(
                f"version: 2\nmodels:\n  - name: {name}\n    config: {{persist_docs: {{columns: true}}}}\n"
                "    columns:\n      - name: v\n        description: The row's value (Informix column v).\n"
            )
        start = log.stat().st_size if log.exists() else 0
        assert run_dbt(harness.settings, ["run", "--select", *models, *extra])
        return log.read_bytes()[start:].decode()

    def partitioning(name: str) -> str | None:
        described = {
            row["col_name"]: row["data_type"] for row in harness.spark.sql(f"describe silver.{name}").collect()
        }
        return described.get("Part 0")

    build(retries=7)
    harness.land(topic, [Change(U, 2, 10, "v2b"), Change(D, 3, 11), Change(C, 9, 12, "v9")], dumps)
    assert "partition_by applies when silver is created" not in build(retries=9)
    assert harness.silver(topic) == topic.expected()
    for name in models:
        assert partitioning(name) == "bucket(4, id)"
        comments = {row["col_name"]: row["comment"] for row in harness.spark.sql(f"describe silver.{name}").collect()}
        assert comments["v"] == "The row's value (Informix column v)."
        held = {row["key"]: row["value"] for row in harness.spark.sql(f"show tblproperties silver.{name}").collect()}
        assert held["write.target-file-size-bytes"] == "1048576"
        assert held["write.parquet.bloom-filter-enabled.column.id"] == "true"
        assert held["commit.retry.num-retries"] == "9"  # changed in the model after the first run
        assert held["write.delete.mode"] == "merge-on-read"  # cdclake's own stay
    assert harness.rows(f"silver.{table}_history", "count(*) as n", where="_cdc_is_current")[0]["n"] == 8
    files = harness.rows(f"silver.{table}.files", "count(distinct partition.id_bucket) as n")[0]["n"]
    assert files > 1  # the rows are spread over the buckets
    # A partitioning changed in the model applies at --full-refresh; until then each run says so.
    said = build(9, 8)
    for name in models:
        assert (
            f"cdc_silver model '{name}': silver.{name} is partitioned by [\"bucket(4, id)\"], the model says "
            f'["bucket(8, id)"]: partition_by applies when silver is created; run it with --full-refresh'
        ) in said
        assert partitioning(name) == "bucket(4, id)"
    assert "partition_by applies when silver is created" not in build(9, 8, "--full-refresh")
    for name in models:
        assert partitioning(name) == "bucket(8, id)"
    assert harness.silver(topic) == topic.expected()


def test_models_on_silver_follow_it(harness: SilverHarness, dumps: Path) -> None:
    """A user's models on silver: a table, a view and a merge incremental that reads only the rows applied since its
    last run (`_cdc_applied_at`), soft deletes included. With the reference project's `+file_format: iceberg` for
    every model, dbt-spark replaces the table in one commit and allows the merge; with it set for silver alone, as
    before, the merge failed to compile and the table was dropped, then created anew."""
    topic = harness.topic("downstream")
    table = topic.table
    harness.land(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps)
    harness.write_model(topic, "delete_mode='soft'")
    models = harness.project / "models" / "gold"
    models.mkdir()
    (models / f"{table}_live.sql").write_text(
        f"{{{{ config(materialized='table') }}}}\nselect id, v from {{{{ ref('{table}') }}}} where not _cdc_deleted\n"
    )
    (models / f"{table}_view.sql").write_text(
        f"{{{{ config(materialized='view') }}}}\nselect id, v from {{{{ ref('{table}') }}}} where not _cdc_deleted\n"
    )
    (models / f"{table}_changes.sql").write_text(
        "{{ config(materialized='incremental', incremental_strategy='merge', unique_key='id') }}\n"
        f"select id, v, _cdc_deleted, _cdc_applied_at from {{{{ ref('{table}') }}}}\n"
        "{% if is_incremental() %}where _cdc_applied_at > (select max(_cdc_applied_at) from {{ this }}){% endif %}\n"
    )
    try:
        assert run_dbt(harness.settings, ["build", "--select", f"{table}+"])
        harness.land(topic, [Change(U, 1, 4, "a2"), Change(D, 2, 5)], dumps)
        assert run_dbt(harness.settings, ["build", "--select", f"{table}+"])
    finally:
        shutil.rmtree(models)
    live = [(1, "a2"), (3, "c")]
    assert [(r["id"], r["v"]) for r in harness.rows(f"silver.{table}_live", "id, v", "id")] == live
    assert [(r["id"], r["v"]) for r in harness.rows(f"silver.{table}_view", "id, v", "id")] == live
    changes = [tuple(r.values()) for r in harness.rows(f"silver.{table}_changes", "id, v, _cdc_deleted", "id")]
    assert changes == [(1, "a2", False), (2, "b", True), (3, "c", False)]
    # One table, replaced in a commit of its own at each run (dropped and created, it had the last run's alone).
    assert harness.rows(f"silver.{table}_live.snapshots", "count(*) as n")[0]["n"] == 2


def test_a_copy_on_write_silver_has_an_iceberg_changelog(harness: SilverHarness, dumps: Path) -> None:
    """Iceberg's changelog view cannot read silver's merge-on-read deletes (its changelog scans support no delete
    files). A model that asks for copy-on-write through `tblproperties` gets a silver table whose changelog
    reads: the unit's deletes and its new images, for a consumer downstream of silver."""
    topic = harness.topic("changelog")
    table = topic.table
    modes = ", ".join(f"'write.{kind}.mode': 'copy-on-write'" for kind in ("delete", "update", "merge"))
    harness.apply(
        topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c")], dumps, f"tblproperties={{{modes}}}"
    )
    first = harness.rows(f"silver.{table}.snapshots", "snapshot_id", "committed_at desc")[0]["snapshot_id"]
    harness.apply(topic, [Change(U, 1, 4, "a2"), Change(D, 2, 5)], dumps, f"tblproperties={{{modes}}}")
    assert harness.rows(f"silver.{table}.delete_files", "count(*) as n")[0]["n"] == 0
    catalog = harness.spark.conf.get("spark.sql.defaultCatalog")
    harness.spark.sql(
        f"call {catalog}.system.create_changelog_view(table => 'silver.{table}', changelog_view => '{table}_changes', "
        f"options => map('start-snapshot-id', '{first}'))"
    )
    changes = {(r["_change_type"], r["id"], r["v"]) for r in harness.rows(f"{table}_changes", "_change_type, id, v")}
    assert changes == {("DELETE", 1, "a"), ("DELETE", 2, "b"), ("INSERT", 1, "a2")}
    assert harness.silver(topic) == topic.expected()


# Both histories take one branch, before they part: the history variant runs with `make test-slow`.
@pytest.mark.parametrize("history", ["current", pytest.param("scd2", marks=pytest.mark.slow)])
def test_a_table_whose_first_change_is_a_truncate(harness: SilverHarness, dumps: Path, history: str) -> None:
    """A table truncated before its first captured change (an empty table truncated; a connector started after the
    rows were deleted): Debezium's truncate carries no key, so bronze has no key column yet. The first run applied
    nothing and failed, saying the source table had no key; it applies nothing and says why now, and the run after
    the first change builds silver, the truncate applied (found by `make explore`)."""
    topic = harness.topic(f"truncated_first_{history}")
    config = f"history='{history}'"

    def silver() -> object:
        return harness.history(topic) if history == "scd2" else harness.silver(topic)

    def expected() -> object:
        return topic.expected_history() if history == "scd2" else topic.expected()

    harness.apply(topic, [Change(T, 0, 1)], dumps, config)
    assert not harness.spark.catalog.tableExists(f"silver.{topic.table}")
    log = (harness.project / "logs" / "dbt.log").read_text()
    assert f"bronze.{topic.table} holds only truncates so far" in log
    harness.apply(topic, [Change(C, 1, 2, "a"), Change(U, 1, 0, "older"), Change(C, 2, 3, "b")], dumps, config)
    assert harness.spark.catalog.tableExists(f"silver.{topic.table}")
    assert silver() == expected()
    harness.apply(topic, [Change(T, 0, 4), Change(C, 2, 5, "b2")], dumps, config)
    assert silver() == expected()
    if history == "current":
        assert harness.silver(topic) == {2: "b2"}
