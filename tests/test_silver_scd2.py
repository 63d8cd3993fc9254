"""history='scd2' with real dbt on real Spark and Iceberg: versions, replays, late changes, truncate, full refresh."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.silver_harness import Change, SilverHarness, Version, dbt_examples, with_replay

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

C, U, D, R, T = "c", "u", "d", "r", "t"
HARD = "history='scd2'"
SOFT = "history='scd2', delete_mode='soft'"


def source_ts(lsn: int) -> dt.datetime:
    """The harness writes source.ts_ms = 1_700_000_000_000 + lsn; pyspark gives naive UTC datetimes."""
    return dt.datetime(2023, 11, 14, 22, 13, 20) + dt.timedelta(milliseconds=lsn)


def test_versions_of_a_create_update_update_delete_history(harness: SilverHarness, tmp_path: Path) -> None:
    hard, soft = harness.topic("cuud_hard"), harness.topic("cuud_soft")
    history = [Change(C, 1, 10, "a"), Change(U, 1, 20, "b"), Change(U, 1, 30, "c"), Change(D, 1, 40)]
    harness.apply(hard, history, tmp_path, HARD)
    harness.apply(soft, history, tmp_path, SOFT)
    assert harness.history(hard) == [
        Version(1, 10, 0, C, "a", 20, False),
        Version(1, 20, 1, U, "b", 30, False),
        Version(1, 30, 2, U, "c", 40, False),  # closed by the delete: no current version
    ]
    assert harness.history(hard) == hard.expected_history()
    assert harness.history(soft) == soft.expected_history(soft=True)
    assert harness.history(soft)[-1] == Version(1, 40, 3, D, None, None, True)  # the delete marker is current
    rows = harness.rows(f"silver.{soft.table}", order="_cdc_valid_from")
    assert [row["_cdc_deleted"] for row in rows] == [False, False, False, True]
    assert [(row["_cdc_valid_from_ts"], row["_cdc_valid_to_ts"]) for row in rows] == [
        (source_ts(10), source_ts(20)),
        (source_ts(20), source_ts(30)),
        (source_ts(30), source_ts(40)),
        (source_ts(40), None),
    ]
    assert all(row["_cdc_applied_at"] is not None for row in rows)
    assert {"id", "v", "n", "_cdc_is_current", "_cdc_valid_to", "_cdc_op", "_cdc_offset"} <= rows[0].keys()
    # Hard deletes: the delete is kept in the tombstones table, so a late change before it stays closed.
    tombstones = harness.rows(f"silver.{hard.table}__cdc_tombstones")
    assert [(row["id"], row["_cdc_order"], row["_cdc_op"]) for row in tombstones] == [(1, [40, 40, -1], D)]


def test_replays_and_reruns_change_nothing(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("scd2_replay")
    changes = [
        Change(C, 1, 1, "a"),
        Change(C, 2, 2, "b"),
        Change(U, 1, 3, "a2"),
        Change(D, 2, 4),
        Change(C, 2, 5, "b2"),
    ]
    harness.apply(topic, changes, tmp_path, HARD)
    before = harness.rows(f"silver.{topic.table}", order="id, _cdc_valid_from")
    snapshot = harness.silver_snapshot(topic)
    assert harness.build(topic)  # nothing new: no commit
    assert harness.silver_snapshot(topic) == snapshot
    harness.apply(topic, changes, tmp_path, HARD)  # the same changes land again, at new offsets
    harness.apply(topic, changes[1:3], tmp_path, HARD)  # and a part of them once more
    # Not a row rewritten: same versions, same offsets (the first landed copy), same _cdc_applied_at.
    assert harness.rows(f"silver.{topic.table}", order="id, _cdc_valid_from") == before
    assert harness.history(topic) == topic.expected_history()


@pytest.mark.parametrize("config", [HARD, SOFT], ids=["hard", "soft"])
def test_a_replay_at_a_lower_offset_replaces_the_stored_copy(
    harness: SilverHarness, tmp_path: Path, config: str
) -> None:
    """Debezium replays changes after a restart; on a topic of several partitions the replay can land at a lower
    offset than the stored copy (another partition; a truncate's null key goes to any). The replay sorts first, as
    in a rebuild: it takes the stored copy's place. The stored copy stayed too: a key with two current versions,
    two truncate tombstones or markers."""
    topic = harness.topic(f"scd2_replay_partitions_{config.count(',')}")
    first = topic.records([Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(T, 0, 5)])
    for offset, line in enumerate(first, 50):
        line["partition"], line["offset"] = 1, offset
    harness.write_model(topic, config)
    harness.land_lines(f"{topic.table}-first", first, tmp_path)
    assert harness.build(topic)
    replay = topic.records([Change(C, 1, 1, "a"), Change(T, 0, 5)])
    for offset, line in enumerate(replay):
        line["partition"], line["offset"] = 0, offset
    harness.land_lines(f"{topic.table}-replay", replay, tmp_path)
    assert harness.build(topic)
    names = [c for c in harness.spark.table(f"silver.{topic.table}").columns if c != "_cdc_applied_at"]
    order = "id, _cdc_valid_from, _cdc_op, _cdc_offset"
    incremental = harness.rows(f"silver.{topic.table}", ", ".join(names), order)
    # Key 1's create is the replay's (partition 0, offset 0), key 2's the first landing's (offset 51); the
    # truncate's marker or tombstone is the replay's (offset 1).
    versions = [(row["id"], row["_cdc_valid_from"][0], row["_cdc_op"], row["_cdc_offset"]) for row in incremental]
    if config == SOFT:
        assert versions == [(1, 1, "c", 0), (1, 5, "t", 1), (2, 2, "c", 51), (2, 5, "t", 1)]
    else:
        assert versions == [(1, 1, "c", 0), (2, 2, "c", 51)]
        tombstones = harness.rows(f"silver.{topic.table}__cdc_tombstones", "id, _cdc_order[0] as at, _cdc_offset", "id")
        assert tombstones == [{"id": 1, "at": 5, "_cdc_offset": 1}, {"id": 2, "at": 5, "_cdc_offset": 1}]
    assert harness.build(topic, "--full-refresh")
    assert harness.rows(f"silver.{topic.table}", ", ".join(names), order) == incremental


def test_a_value_set_back_at_one_position_is_the_current_version(harness: SilverHarness, tmp_path: Path) -> None:
    """A, B, A at one position (MongoDB or Oracle changes of one transaction, without transaction metadata): the
    Kafka offset orders them, as in current state, so A is current. It used to count as a replay of the first A:
    B stayed current, while a current-state model of the same bronze said A."""
    history, current = harness.topic("aba_history"), harness.topic("aba_current")
    changes = [Change(C, 1, 10, "a"), Change(U, 1, 20, "A"), Change(U, 1, 20, "B"), Change(U, 1, 20, "A")]
    harness.apply(history, changes, tmp_path, HARD)
    harness.apply(current, changes, tmp_path)
    assert harness.silver(current) == {1: "A"}
    assert harness.history(history) == [
        Version(1, 10, 0, C, "a", 20, False),
        Version(1, 20, 1, U, "A", 20, False),
        Version(1, 20, 2, U, "B", 20, False),
        Version(1, 20, 3, U, "A", None, True),
    ]
    assert harness.history(history) == history.expected_history()
    # The last change landed again (a replay): a copy of the version before it, nothing changes.
    harness.apply(history, changes[-1:], tmp_path, HARD)
    assert harness.history(history)[-1] == Version(1, 20, 3, U, "A", None, True)
    assert harness.history(history) == history.expected_history()


def test_a_run_changes_the_history_in_one_step_of_main(harness: SilverHarness, tmp_path: Path) -> None:
    """A run's closed versions and new versions reach silver's main branch in one step (staged on a branch of the
    run, as in current state: readers never see versions closed without the ones that close them), and the branch
    goes; a unit of new keys only closes nothing."""
    topic = harness.topic("scd2_one_step")
    harness.apply(topic, [Change(C, 1, 10, "a"), Change(U, 1, 30, "a3"), Change(C, 2, 20, "b")], tmp_path, HARD)
    table = f"silver.{topic.table}"
    before = harness.rows(f"{table}.snapshots", "snapshot_id", "committed_at")
    steps = harness.rows(f"{table}.history", "snapshot_id", "made_current_at")
    # A late change (between key 1's versions at 10 and 30), an update of key 2, a new key.
    harness.apply(topic, [Change(U, 1, 20, "a2"), Change(U, 2, 40, "b2"), Change(C, 3, 50, "c")], tmp_path, HARD)
    assert harness.history(topic) == topic.expected_history()
    added = harness.rows(f"{table}.snapshots", "snapshot_id, parent_id, operation", "committed_at")[len(before) :]
    # The DELETE of the closed versions and the INSERT, each a snapshot of the branch; main moved once, to the last.
    assert [row["operation"] for row in added] == ["delete", "append"]
    assert added[0]["parent_id"] == before[-1]["snapshot_id"]
    made_current = harness.rows(f"{table}.history", "snapshot_id", "made_current_at")[len(steps) :]
    assert made_current == [{"snapshot_id": added[-1]["snapshot_id"]}]
    assert [row["name"] for row in harness.rows(f"{table}.refs", "name")] == ["main"]  # the run's branch is gone
    # New keys only: nothing is closed or deleted: one append.
    harness.apply(topic, [Change(C, 4, 60, "d")], tmp_path, HARD)
    operations = [row["operation"] for row in harness.rows(f"{table}.snapshots", "operation", "committed_at")]
    assert operations[len(before) + len(added) :] == ["append"]
    assert harness.history(topic) == topic.expected_history()


def test_versions_keep_a_column_the_model_no_longer_selects(harness: SilverHarness, tmp_path: Path) -> None:
    """The model's `exclude_columns` drops `n` after silver was built with it: silver keeps the column, new versions
    leave it null, and the versions a run closes keep their values (updated in place, not rewritten from what the
    run reads: it does not read `n`)."""
    topic = harness.topic("scd2_kept_column")
    harness.apply(topic, [Change(C, 1, 10, "a", n=7), Change(C, 2, 20, "b", n=8)], tmp_path, HARD)
    excluded = f"{HARD}, exclude_columns=['n']"
    harness.apply(topic, [Change(U, 1, 30, "a2", n=9), Change(U, 2, 5, "b0", n=6)], tmp_path, excluded)
    rows = harness.rows(f"silver.{topic.table}", "id, v, n, _cdc_valid_from[0] as valid_from, _cdc_is_current", "id, 4")
    assert rows == [
        {"id": 1, "v": "a", "n": 7, "valid_from": 10, "_cdc_is_current": False},  # closed by the update at 30
        {"id": 1, "v": "a2", "n": None, "valid_from": 30, "_cdc_is_current": True},
        {"id": 2, "v": "b0", "n": None, "valid_from": 5, "_cdc_is_current": False},  # a late change before 20
        {"id": 2, "v": "b", "n": 8, "valid_from": 20, "_cdc_is_current": True},
    ]


@pytest.mark.parametrize("config", [HARD, SOFT], ids=["hard", "soft"])
def test_late_changes_land_in_their_place(harness: SilverHarness, tmp_path: Path, config: str) -> None:
    topic = harness.topic("scd2_late")
    soft = "soft" in config
    harness.apply(
        topic,
        [Change(C, 1, 10, "a"), Change(U, 1, 30, "c"), Change(C, 2, 10, "x"), Change(D, 2, 30)],
        tmp_path,
        config,
    )
    # A late update in the middle of key 1's history, a late update of key 2 before its delete, and a delete of
    # key 3 that arrives before the insert it follows (the insert comes later and must stay closed).
    harness.apply(topic, [Change(U, 1, 20, "b"), Change(U, 2, 20, "y"), Change(D, 3, 50)], tmp_path, config)
    harness.apply(topic, [Change(C, 3, 40, "late insert"), Change(U, 1, 5, "before the insert")], tmp_path, config)
    history = harness.history(topic)
    assert history == topic.expected_history(soft=soft)
    key1 = [(v.valid_from, v.v, v.valid_to, v.is_current) for v in history if v.id == 1]
    assert key1 == [
        (5, "before the insert", 10, False),
        (10, "a", 20, False),
        (20, "b", 30, False),
        (30, "c", None, True),
    ]
    live = [(v.id, v.v) for v in history if v.is_current and v.op != D]
    assert live == [(1, "c")]


@pytest.mark.parametrize("config", [HARD, pytest.param(SOFT, marks=pytest.mark.slow)], ids=["hard", "soft"])
def test_truncate_ends_every_open_version(harness: SilverHarness, tmp_path: Path, config: str) -> None:
    topic = harness.topic("scd2_truncate")
    harness.apply(
        topic,
        [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c"), Change(D, 3, 4)],
        tmp_path,
        config,
    )
    harness.apply(topic, [Change(U, 2, 6, "b2"), Change(C, 4, 12, "new")], tmp_path, config)
    # The truncate at 10 ends keys 1 and 2 (key 3 was deleted before it); key 4 was created after it; an
    # insert older than it, landing with it, is ended by it too.
    harness.apply(topic, [Change(T, 0, 10), Change(C, 5, 8, "older")], tmp_path, config)
    history = harness.history(topic)
    assert history == topic.expected_history(soft="soft" in config)
    ends = {v.id: v.valid_to for v in history if v.op in "cur" and v.valid_to is not None}
    assert ends == {1: 10, 2: 10, 5: 10, 3: 4}
    assert [(v.id, v.v) for v in history if v.is_current and v.op in "cur"] == [(4, "new")]


@pytest.mark.parametrize("config", [HARD, pytest.param(SOFT, marks=pytest.mark.slow)], ids=["hard", "soft"])
def test_a_late_change_older_than_an_applied_truncate_is_ended_by_it(
    harness: SilverHarness, tmp_path: Path, config: str
) -> None:
    """A change older than a truncate that an earlier unit of work applied: the truncate ends its version, as in a
    rebuild, also for a key that had no version open at the truncate, and after a late delete voided the
    truncate's end of a key's version."""
    topic = harness.topic("scd2_late_truncate")
    soft = "soft" in config
    # The truncate at 10 ends key 1; key 2 was deleted before it; key 3 comes after it.
    harness.apply(
        topic,
        [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(D, 2, 3), Change(T, 0, 10), Change(C, 3, 12, "c")],
        tmp_path,
        config,
    )
    # Late: key 4 created before the truncate (no version of its own at it), key 2 created again before it, and
    # key 1 deleted before it (the truncate no longer ends key 1's version: the delete does).
    harness.apply(topic, [Change(C, 4, 5, "late d"), Change(C, 2, 7, "late b"), Change(D, 1, 6)], tmp_path, config)
    assert harness.history(topic) == topic.expected_history(soft=soft)
    # Later still, key 1 created again between its late delete and the truncate: the truncate ends it.
    harness.apply(topic, [Change(C, 1, 8, "late a")], tmp_path, config)
    history = harness.history(topic)
    assert history == topic.expected_history(soft=soft)
    ends = sorted((v.id, v.valid_from, v.valid_to) for v in history if v.op in "cur")
    assert ends == [(1, 1, 6), (1, 8, 10), (2, 2, 3), (2, 7, 10), (3, 12, None), (4, 5, 10)]
    # The truncate the runs compare late changes with (the one in bronze: "<order,...>;<offset>").
    truncate = harness.spark.sql(
        f"select concat_ws(',', transform(_cdc_order, x -> cast(x as string))) || ';' || _cdc_offset"
        f" from bronze.{topic.table} where op = 't'"
    ).collect()
    properties = {row.key: row.value for row in harness.spark.sql(f"show tblproperties silver.{topic.table}").collect()}
    assert [properties.get("cdclake.truncated_before")] == [row[0] for row in truncate]
    assert harness.build(topic, "--full-refresh")
    assert harness.history(topic) == history


@pytest.mark.parametrize("config", [HARD, pytest.param(SOFT, marks=pytest.mark.slow)], ids=["hard", "soft"])
def test_full_refresh_gives_the_same_table(harness: SilverHarness, tmp_path: Path, config: str) -> None:
    topic = harness.topic("scd2_refresh")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, config)
    harness.apply(topic, [Change(U, 2, 3, "b2"), Change(D, 1, 4), Change(C, 3, 5, "c")], tmp_path, config)
    harness.apply(topic, [Change(U, 1, 3, "late"), Change(T, 0, 6), Change(C, 1, 7, "again")], tmp_path, config)
    names = [c for c in harness.spark.table(f"silver.{topic.table}").columns if c != "_cdc_applied_at"]
    columns = ", ".join(names)
    incremental = harness.rows(f"silver.{topic.table}", columns, "id, _cdc_valid_from, _cdc_offset")
    assert harness.build(topic, "--full-refresh")
    assert harness.rows(f"silver.{topic.table}", columns, "id, _cdc_valid_from, _cdc_offset") == incremental
    assert harness.history(topic) == topic.expected_history(soft="soft" in config)


def test_switching_history_needs_a_full_refresh(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("scd2_switch")
    harness.apply(topic, [Change(C, 1, 1, "a")], tmp_path, "")
    harness.land(topic, [Change(U, 1, 2, "b")], tmp_path)
    harness.write_model(topic, HARD)
    assert not harness.build(topic)
    assert "rebuild it with --full-refresh" in (harness.project / "logs" / "dbt.log").read_text()
    assert harness.build(topic, "--full-refresh")
    assert harness.history(topic) == topic.expected_history()
    # And back: the history table is replaced, and its properties with it (a stale history='scd2' failed every run).
    harness.land(topic, [Change(U, 1, 3, "c")], tmp_path)
    harness.write_model(topic, "")
    assert not harness.build(topic)
    assert harness.build(topic, "--full-refresh")
    harness.land(topic, [Change(U, 1, 4, "d")], tmp_path)
    assert harness.build(topic)
    assert harness.silver(topic) == {1: "d"}


def test_switching_delete_mode_needs_a_full_refresh(harness: SilverHarness, tmp_path: Path) -> None:
    """A hard table has no `_cdc_deleted` columns and a soft one no tombstones table: the run after the model's
    delete_mode changed failed on a missing table or column, and so did every later one. It names the fix now."""
    topic = harness.topic("delete_mode_switch")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b")], tmp_path, "")
    harness.land(topic, [Change(D, 1, 3)], tmp_path)
    harness.write_model(topic, "delete_mode='soft'")
    assert not harness.build(topic)
    assert (
        "was built with delete_mode='hard', the model now says 'soft'"
        in (harness.project / "logs" / "dbt.log").read_text()
    )
    assert harness.build(topic, "--full-refresh")
    assert harness.spark.sql(f"show tables in silver like '{topic.table}__cdc_tombstones'").count() == 0
    assert harness.silver(topic, "not _cdc_deleted") == {2: "b"}
    assert harness.silver(topic, "_cdc_deleted") == {1: "a"}  # a soft delete keeps the key's last values


@pytest.mark.parametrize("then", ["back", pytest.param("forward", marks=pytest.mark.slow)])
def test_a_rebuild_that_switches_history_and_stops_midway_is_finished_by_the_next_run(
    harness: SilverHarness, tmp_path: Path, then: str
) -> None:
    """A --full-refresh from a history to current state replaces the tombstones, then silver. One that failed (or
    was killed) between the two left current-state tombstones beside the history: every later run of the history
    model failed on the tombstones' columns, and the current-state model's asked for the rebuild again. The next
    run, of either model, finishes it now."""
    topic = harness.topic(f"scd2_unfinished_{then}")
    harness.apply(topic, [Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(D, 1, 3)], tmp_path, HARD)
    harness.land(topic, [Change(U, 2, 4, "boom")], tmp_path)
    # Current state, with a column that fails on the new value: only the silver CREATE reads it, so the run
    # stops after it replaced the tombstones, as a run killed there does.
    harness.write_model(topic)
    (harness.project / "models" / "silver" / f"{topic.table}.sql").write_text(
        "{{ config(materialized='cdc_silver') }}\n"
        "select *, case when after.v = 'boom' then raise_error('boom') end as boom"
        f" from {{{{ source('bronze', '{topic.table}') }}}}\n"
    )
    assert not harness.build(topic, "--full-refresh")
    # What that left: the history, beside tombstones of current state (a history's carry the source timestamp).
    assert "_cdc_valid_from" in harness.spark.table(f"silver.{topic.table}").columns
    assert "_cdc_source_ts" not in harness.spark.table(f"silver.{topic.table}__cdc_tombstones").columns
    harness.land(topic, [Change(C, 3, 5, "c")], tmp_path)
    harness.write_model(topic, HARD if then == "back" else "")
    assert harness.build(topic), "the run after the unfinished rebuild failed"
    assert "did not finish; rebuilding it from bronze" in (harness.project / "logs" / "dbt.log").read_text()
    properties = {row[0] for row in harness.spark.sql(f"show tblproperties silver.{topic.table}").collect()}
    assert "cdclake.refresh_pending" not in properties
    if then == "back":
        assert harness.history(topic) == topic.expected_history()
    else:
        assert harness.silver(topic) == {2: "boom", 3: "c"}
    harness.land(topic, [Change(D, 3, 6)], tmp_path)
    assert harness.build(topic)
    if then == "back":
        assert harness.history(topic) == topic.expected_history()
    else:
        assert harness.silver(topic) == {2: "boom"}


def test_a_moved_keys_soft_delete_marker_holds_no_computed_values(harness: SilverHarness, tmp_path: Path) -> None:
    """Keys read from the images (a table without a primary key): an update that moves its row to another key also
    deletes the old key, as a copy of the update with no `after`. Columns the model computes kept the update's
    values there, so with soft deletes the history's marker of the old key held the new row's values, where a
    delete's marker holds none."""
    topic = harness.topic("scd2_moved_key")
    harness.write_model(topic, f"{SOFT}, keys=['id']")  # the sources; the model itself computes a column:
    (harness.project / "models" / "silver" / f"{topic.table}.sql").write_text(
        f"{{{{ config(materialized='cdc_silver', {SOFT}, keys=['id']) }}}}\n"
        f"select *, upper(after.v) as v_upper from {{{{ source('bronze', '{topic.table}') }}}}\n"
    )
    lines = topic.records([Change(C, 4, 1, "d"), Change(U, 4, 2, "e")])
    moved = json.loads(lines[1]["payload"])
    moved["payload"]["after"]["id"] = 5  # the update's after image holds another key
    lines[1]["payload"] = json.dumps(moved)
    for line in lines:
        line["key"] = None  # Debezium's key for a table without a primary key
    harness.land_lines(f"{topic.table}-0", lines, tmp_path)
    assert harness.build(topic)
    rows = harness.rows(f"silver.{topic.table}", "id, v, v_upper, _cdc_op, _cdc_deleted", "_cdc_valid_from[0], id")
    assert rows == [
        {"id": 4, "v": "d", "v_upper": "D", "_cdc_op": "c", "_cdc_deleted": False},
        {"id": 4, "v": None, "v_upper": None, "_cdc_op": "d", "_cdc_deleted": True},
        {"id": 5, "v": "e", "v_upper": "E", "_cdc_op": "u", "_cdc_deleted": False},
    ]


def change_lists(ops: str) -> st.SearchStrategy[list[tuple[str, int, int, str | None]]]:
    return st.lists(
        st.tuples(st.sampled_from(ops), st.integers(1, 3), st.integers(1, 40), st.sampled_from(["p", "q", None])),
        min_size=1,
        max_size=10,
    )


@dbt_examples(4)
# Two batches at least: dbt_examples draws a fixed handful, and with one batch each would test a first build only.
# One change in eleven is a truncate, in any batch: later batches bring changes older than it.
@given(
    batches=st.lists(change_lists("cccuuuddrrt"), min_size=1, max_size=2),
    last=change_lists("cccuuuddrrt"),
    replay=st.booleans(),
    soft=st.booleans(),
)
def test_random_histories_match_the_reference_model(
    harness: SilverHarness,
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[str, int, int, str | None]]],
    last: list[tuple[str, int, int, str | None]],
    replay: bool,
    soft: bool,
) -> None:
    """Random per-key histories of c/u/d/r/t, random batching, duplicates, late changes and replays: the versions
    equal the reference model's after every batch, and a full refresh gives the same versions."""
    topic = harness.topic("scd2_property")
    dumps = tmp_path_factory.mktemp("scd2_property")
    config = SOFT if soft else HARD
    landed: list[Change] = []
    for batch in [*batches, last]:
        changes = [Change(op, key, lsn, None if op == "d" else (value or "v")) for op, key, lsn, value in batch]
        changes = with_replay(landed, changes, replay)
        harness.apply(topic, changes, dumps, config)
        assert harness.history(topic) == topic.expected_history(soft=soft)
    assert harness.build(topic, "--full-refresh")
    assert harness.history(topic) == topic.expected_history(soft=soft)


def test_a_null_key_part_is_one_key(harness: SilverHarness, tmp_path: Path) -> None:
    """A key part may be null (keys of a table without a primary key): versions of a key with a null part are one
    key's, matched null-safely when a run changes them. A run whose unit holds no null key matches with `=`, which
    must leave the null-keyed versions alone; one whose unit holds one must close and end them."""
    topic = harness.topic("scd2_null_key_part")

    def land(changes: list[tuple[Change, str | None]]) -> None:
        harness.land_part_keyed(topic, changes, tmp_path)
        assert harness.build(topic)

    def versions() -> list[tuple[str | None, str | None, int, int | None, bool]]:
        columns = "part, v, _cdc_valid_from[0] as valid_from, _cdc_valid_to[0] as valid_to, _cdc_is_current"
        rows = harness.rows(f"silver.{topic.table}", columns, "part, valid_from")
        return [(r["part"], r["v"], r["valid_from"], r["valid_to"], r["_cdc_is_current"]) for r in rows]

    harness.write_model(topic, HARD)
    land([(Change(C, 1, 1, "a"), None), (Change(C, 1, 2, "b"), "x")])
    assert versions() == [(None, "a", 1, None, True), ("x", "b", 2, None, True)]
    land([(Change(U, 1, 3, "c"), "x")])  # no null key in the unit
    assert versions() == [(None, "a", 1, None, True), ("x", "b", 2, 3, False), ("x", "c", 3, None, True)]
    land([(Change(U, 1, 4, "d"), None)])
    assert versions() == [
        (None, "a", 1, 4, False),
        (None, "d", 4, None, True),
        ("x", "b", 2, 3, False),
        ("x", "c", 3, None, True),
    ]
    land([(Change(D, 1, 5), None), (Change(U, 1, 6, "e"), "x")])
    assert versions() == [
        (None, "a", 1, 4, False),
        (None, "d", 4, 5, False),
        ("x", "b", 2, 3, False),
        ("x", "c", 3, 6, False),
        ("x", "e", 6, None, True),
    ]
