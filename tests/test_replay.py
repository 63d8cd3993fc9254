"""`cdclake replay-dead-letters`: dead letters that decode after a fix land once, in order, and leave the dead-letter
table; those that still fail stay; a replay killed between its two commits is finished by the next one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.tables import OFFSETS_PROPERTY, REPLAYED_PROPERTY, BronzeTables, decode_offsets
from ingest.cli import cli
from ingest.config import Settings
from ingest.lakehouse import load_catalog
from ingest.replay import replay_dead_letters
from tests.conftest import FIXTURES, ingest_file, make_settings

INFINITY_DUMP = FIXTURES / "debezium" / "postgres" / "infinity.jsonl"  # real Debezium 3.6.3 output
TOPIC = "dbserver1.inventory.validity"
TABLE = "dbserver1_inventory_validity"
INFINITE = {0, 1, 2, 3}  # the changes holding PostgreSQL's infinity (test_bronze_file.py checks which)


def _changes() -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in INFINITY_DUMP.read_bytes().splitlines()]
    return [line for line in lines if line["topic"] == TOPIC]


N = len(_changes())  # the recording's changes of the table; the first four hold an infinity, the others do not


def validity_dump(path: Path, offsets: range, extra: list[bytes] = ()) -> Path:  # type: ignore[assignment]
    """The recording's changes of the validity table as they came (key, value, headers), renumbered ``offsets``
    (``offsets[i]`` holds change ``i % N``), and ``extra`` lines after them."""
    changes = _changes()
    lines = [orjson.dumps({**changes[index % len(changes)], "offset": offset}) for index, offset in enumerate(offsets)]
    path.write_bytes(b"\n".join([*lines, *extra]) + b"\n")
    return path


def bronze(settings: Settings, table: str) -> list[dict[str, Any]]:
    rows = load_catalog(settings).load_table(f"bronze.{table}").scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda row: (row["_cdc_topic"], row["_cdc_partition"], row["_cdc_offset"]))


def replay(settings: Settings, *args: str) -> str:
    result = CliRunner().invoke(
        cli, ["--config", str(Path(settings.base_dir) / "cdclake.yml"), "replay-dead-letters", *args]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def test_dead_letters_that_decode_after_a_fix_land_once(lakehouse: Path, tmp_path: Path) -> None:
    """PostgreSQL's infinity is a dead letter by default; with `infinite_timestamps: clamp` set afterwards, the
    replay lands those records with their coordinates and headers, in their table, once; a garbled record stays."""
    garbled = orjson.dumps({"topic": TOPIC, "partition": 0, "offset": 2 * N, "key": '{"id": 9}', "payload": "{not"})
    dump = validity_dump(tmp_path / "dump.jsonl", range(2 * N), [garbled])
    settings = make_settings(lakehouse)
    ingest_file(settings, dump)
    dead = bronze(settings, DEAD_LETTER_TABLE)
    assert [row["_cdc_offset"] for row in dead] == [o for o in range(2 * N) if o % N in INFINITE] + [2 * N]
    assert len(bronze(settings, TABLE)) == 2 * (N - 4)

    clamped = make_settings(lakehouse, ingest={"infinite_timestamps": "clamp"})
    snapshots = {
        name: len(load_catalog(clamped).load_table(f"bronze.{name}").snapshots()) for name in (TABLE, DEAD_LETTER_TABLE)
    }
    assert replay(
        clamped, "--dry-run"
    ) == f"{TOPIC}: 8 would land, 1 still dead letters\ndry run: nothing was committed\n" + (
        "the log names why each still fails; `cdclake status` shows the latest reason per topic\n"
    )
    assert {
        name: len(load_catalog(clamped).load_table(f"bronze.{name}").snapshots()) for name in snapshots
    } == snapshots
    assert replay(clamped) == f"{TOPIC}: 8 landed, 1 still dead letters\n" + (
        "the log names why each still fails; `cdclake status` shows the latest reason per topic\n"
    )
    landed = bronze(clamped, TABLE)
    assert [row["_cdc_offset"] for row in landed] == list(range(2 * N))  # each record once
    assert [row["_cdc_offset"] for row in bronze(clamped, DEAD_LETTER_TABLE)] == [2 * N]
    first = landed[0]
    assert first["after"]["valid_to"] == dt.date(9999, 12, 31)
    raw = orjson.loads(INFINITY_DUMP.read_bytes().splitlines()[0])
    assert first["_cdc_kafka_ts"] == dt.datetime.fromtimestamp(raw["ts"] / 1000, dt.UTC)
    assert [header["key"] for header in first["_cdc_headers"]] == raw["headers"][::2]
    table = load_catalog(clamped).load_table(f"bronze.{TABLE}")
    assert table.current_snapshot().summary[REPLAYED_PROPERTY] == "8"

    # Nothing twice: a second replay has nothing to land, and ingest reading the dump again lands nothing.
    assert replay(clamped) == f"{TOPIC}: 0 landed, 1 still dead letters\n" + (
        "the log names why each still fails; `cdclake status` shows the latest reason per topic\n"
    )
    assert ingest_file(clamped, dump).stats.written == 0
    assert len(bronze(clamped, TABLE)) == 2 * N


def test_a_partitions_last_records_replayed_move_its_table_past_them(lakehouse: Path, tmp_path: Path) -> None:
    """Dead letters at a partition's end lie past its data table's offset (ingest resumes after them through the
    dead-letter table). Once replayed, the data table's offset must cover them, or ingest would read them again
    (they are no longer dead letters) and land them twice."""
    settings = make_settings(lakehouse)
    ingest_file(settings, validity_dump(tmp_path / "first.jsonl", range(N)))
    ingest_file(settings, validity_dump(tmp_path / "next.jsonl", range(N, N + 4)))  # a flush of dead letters only
    tables = BronzeTables(load_catalog(settings), "bronze")
    assert tables.offsets(TABLE) == {(TOPIC, 0): N}

    clamped = make_settings(lakehouse, ingest={"infinite_timestamps": "clamp"})
    replay(clamped)
    assert tables.offsets(TABLE) == {(TOPIC, 0): N + 4}
    assert not bronze(clamped, DEAD_LETTER_TABLE)
    # The topic goes on: ingest lands what follows, once.
    assert ingest_file(clamped, validity_dump(tmp_path / "more.jsonl", range(2 * N))).stats.written == N - 4
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(2 * N))


# The test deletes rows with pyiceberg, which writes copy-on-write deletes where the table asks for merge-on-read.
@pytest.mark.filterwarnings("ignore:Merge on read is not yet supported:UserWarning")
def test_dead_letters_after_a_gap_wait_for_it(tmp_path: Path) -> None:
    """A dead letter after records its partition has not landed (its flush's data commit failed after the dead
    letters'): replaying it would move the data table past them. It waits until ingest has landed them."""
    # 0-3 dead letters, the others landed; then four dead letters, a run past the data table's offset N ...
    gap = make_settings(tmp_path / "gap")
    ingest_file(gap, validity_dump(tmp_path / "a.jsonl", range(N)))
    ingest_file(gap, validity_dump(tmp_path / "b.jsonl", range(N, N + 4)))
    gap_tables = BronzeTables(load_catalog(gap), "bronze")
    assert gap_tables.offsets(TABLE) == {(TOPIC, 0): N}
    # ... with a hole at N, as after a flush whose dead letters committed but not its data (record N's).
    gap_dead = gap_tables.load(DEAD_LETTER_TABLE)
    assert gap_dead is not None
    gap_dead.delete(delete_filter=f"_cdc_offset = {N}")
    clamped = make_settings(tmp_path / "gap", ingest={"infinite_timestamps": "clamp"})
    output = replay(clamped)
    assert output.startswith(f"{TOPIC}: 4 landed, 0 still dead letters, 3 wait: their partition has not"), output
    assert gap_tables.offsets(TABLE) == {(TOPIC, 0): N}  # not moved past the hole
    assert [row["_cdc_offset"] for row in bronze(clamped, DEAD_LETTER_TABLE)] == [N + 1, N + 2, N + 3]
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(N))


def test_a_replay_killed_between_its_commits_is_finished_by_the_next(
    lakehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the data commit and before the dead letters' delete, the records are in both tables; the next
    replay lands none of them again and deletes them as dead letters."""
    import ingest.replay

    settings = make_settings(lakehouse)
    ingest_file(settings, validity_dump(tmp_path / "dump.jsonl", range(N)))
    clamped = make_settings(lakehouse, ingest={"infinite_timestamps": "clamp"})
    tables = BronzeTables(load_catalog(clamped), "bronze")

    def killed(_tables: Any, _landed: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ingest.replay, "_delete_dead_letters", killed)
    with pytest.raises(KeyboardInterrupt):
        replay_dead_letters(clamped, tables)
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(N))
    assert len(bronze(clamped, DEAD_LETTER_TABLE)) == 4  # in both
    monkeypatch.undo()

    result = replay_dead_letters(clamped, tables)
    assert (result.topics[TOPIC].landed, result.topics[TOPIC].still_dead) == (4, 0)
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(N))  # not twice
    assert not bronze(clamped, DEAD_LETTER_TABLE)
    dead_offsets = decode_offsets(tables.load(DEAD_LETTER_TABLE).properties.get(OFFSETS_PROPERTY))  # type: ignore[union-attr]
    assert dead_offsets == {(TOPIC, 0): 4}  # the dead-letter table's own offsets stay as they were


def test_a_partition_with_nothing_landed_yet_waits(tmp_path: Path) -> None:
    """Every record of the partition so far a dead letter: whether records before the first of them are still on
    their way (a flush whose data commit is pending) is not known, and landing them would move the table's offset
    past those. They wait until a record of the partition lands."""
    settings = make_settings(tmp_path / "lake")
    ingest_file(settings, validity_dump(tmp_path / "infinite.jsonl", range(4)))
    assert not load_catalog(settings).table_exists(f"bronze.{TABLE}")
    clamped = make_settings(tmp_path / "lake", ingest={"infinite_timestamps": "clamp"})
    waiting = "4 wait: their partition has not landed the records before them yet"
    assert replay(clamped) == f"{TOPIC}: 0 landed, 0 still dead letters, {waiting}\n"
    assert len(bronze(clamped, DEAD_LETTER_TABLE)) == 4
    ingest_file(clamped, validity_dump(tmp_path / "more.jsonl", range(N)))  # lands what follows
    assert replay(clamped) == f"{TOPIC}: 4 landed, 0 still dead letters\n"
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(N))


def _as_text(schema: Any, column: str) -> None:
    """The Connect schema with ``column`` typed as a string wherever a struct has it."""
    if isinstance(schema, dict):
        for field in schema.get("fields") or []:
            if field.get("field") == column:
                field.clear()
                field.update({"type": "string", "optional": True, "field": column})
            else:
                _as_text(field, column)


def test_a_mapped_topics_record_that_still_conflicts_stays_a_dead_letter(tmp_path: Path) -> None:
    """A record whose column type conflicts with its table's (`on_type_conflict: dead_letter`), of a topic that
    `ingest.table_mapping` sends to a table: replayed, it fails the same check and stays; the replay goes on."""
    changes = _changes()
    finite = [orjson.dumps({**change, "offset": offset}) for offset, change in enumerate(changes[4:])]
    conflicting = orjson.loads(changes[4]["payload"])
    _as_text(conflicting["schema"], "valid_from")
    for image in ("before", "after"):
        if conflicting["payload"].get(image):
            conflicting["payload"][image]["valid_from"] = "a text now"
    last = {**changes[4], "offset": len(finite), "payload": orjson.dumps(conflicting).decode()}
    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(b"\n".join([*finite, orjson.dumps(last)]) + b"\n")
    sections = {"ingest": {"table_mapping": {TOPIC: "validity"}, "on_type_conflict": "dead_letter"}}
    settings = make_settings(tmp_path / "lake", **sections)
    ingest_file(settings, dump)
    [dead] = bronze(settings, DEAD_LETTER_TABLE)
    assert "valid_from" in dead["_cdc_error"], dead["_cdc_error"]
    assert replay(settings) == f"{TOPIC}: 0 landed, 1 still dead letters\n" + (
        "the log names why each still fails; `cdclake status` shows the latest reason per topic\n"
    )
    assert len(bronze(settings, "validity")) == len(finite)


def test_a_dead_letter_delete_beaten_by_another_writer_is_retried(
    lakehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer (a compaction, a second replay) commits to the dead-letter table between the replay's read of
    it and its delete: the catalog refuses the stale commit, and the replay deletes again from the table's latest
    state, once, leaving no dead letter behind."""
    from pyiceberg.table import Table

    settings = make_settings(lakehouse)
    ingest_file(settings, validity_dump(tmp_path / "dump.jsonl", range(N)))
    deletes: list[int] = []
    delete = Table.delete

    def beaten_once(table: Table, *args: Any, **kwargs: Any) -> None:
        deletes.append(len(deletes))
        if len(deletes) == 1:
            # A compaction's commit: the same rows in new files, a new snapshot.
            other = load_catalog(settings).load_table(f"bronze.{DEAD_LETTER_TABLE}")
            other.overwrite(other.scan().to_arrow(), snapshot_properties={"another.writer": "was here"})
        delete(table, *args, **kwargs)

    monkeypatch.setattr(Table, "delete", beaten_once)
    clamped = make_settings(lakehouse, ingest={"infinite_timestamps": "clamp"})
    assert replay(clamped).startswith(f"{TOPIC}: 4 landed, 0 still dead letters")
    assert deletes == [0, 1]
    assert not bronze(clamped, DEAD_LETTER_TABLE)
    assert [row["_cdc_offset"] for row in bronze(clamped, TABLE)] == list(range(N))
    snapshots = load_catalog(settings).load_table(f"bronze.{DEAD_LETTER_TABLE}").snapshots()
    assert [s.summary.get("another.writer") for s in snapshots[-2:]] == ["was here", None]  # then the delete
