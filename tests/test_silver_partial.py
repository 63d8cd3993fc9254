"""Partial images with real dbt on real Spark and Iceberg: PK-only updates (ignore_null_updates) and MongoDB
updates without a full document (updateDescription, oplog patch) are folded across the unit of work."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from ingest.bronze.tables import UNAVAILABLE_UUID, UNAVAILABLE_VALUE
from ingest.dbt_runner import run_dbt
from ingest.scaffold import model_yaml
from tests.silver_harness import (
    OP_RANK,
    Change,
    MongoChange,
    SilverHarness,
    Topic,
    TransactedTopic,
    dbt_examples,
    with_replay,
    without_schema,
)

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

C, U, D = "c", "u", "d"


def images(harness: SilverHarness, topic: Topic, where: str = "true") -> dict[int, tuple[str | None, int | None]]:
    if not harness.has_silver(topic):
        return {}
    rows = harness.spark.sql(f"select id, v, n from silver.{topic.table} where {where}").collect()
    return {row["id"]: (row["v"], row["n"]) for row in rows}


def test_pk_only_updates_fold_across_the_unit_of_work(harness: SilverHarness, tmp_path: Path) -> None:
    """Oracle with PK-only supplemental logging: an update carries the key and the columns it changed."""
    topic = harness.topic("pk_only")
    config = "ignore_null_updates=true"
    harness.write_tests(topic)  # cdclake_equals_recompute must not compare the nulls the updates do not carry
    harness.apply(topic, [Change(C, 1, 10, "a", n=100), Change(C, 2, 20, "x", n=200)], tmp_path, config)
    # Two updates of key 1 in one unit of work, each carrying one column: both survive (the winner alone would
    # have taken v from silver). Key 2's late update, older than silver's row, changes nothing.
    harness.apply(
        topic,
        [Change(U, 1, 30, "b", n=None), Change(U, 1, 40, None, n=101), Change(U, 2, 15, "stale", n=None)],
        tmp_path,
        config,
    )
    assert images(harness, topic) == {1: ("b", 101), 2: ("x", 200)}
    # After a delete, a full image's null is a value: the next partial update folds onto the new insert, not
    # onto the deleted row.
    harness.apply(
        topic,
        [
            Change(D, 1, 50),
            Change(C, 1, 60, "new", n=None),
            Change(U, 1, 70, None, n=None),
            Change(U, 2, 80, None, n=201),
        ],
        tmp_path,
        config,
    )
    assert images(harness, topic) == {1: ("new", None), 2: ("x", 201)}
    assert harness.build(topic, "--full-refresh")
    assert images(harness, topic) == {1: ("new", None), 2: ("x", 201)}


def test_unavailable_values_keep_the_keys_previous_value(harness: SilverHarness, tmp_path: Path) -> None:
    """PostgreSQL's unchanged TOAST columns (Oracle's unchanged LOBs) come as Debezium's placeholder: the key keeps
    its previous value for them, from silver or from earlier in the unit of work, while a null an update carries
    stays null (no ignore_null_updates). The same in a history; unavailable_value=none takes the placeholder as
    a value."""
    topic = harness.topic("toast")
    harness.write_tests(topic)  # cdclake_equals_recompute must not compare the placeholders
    harness.apply(topic, [Change(C, 1, 10, "big-1", n=100), Change(C, 2, 20, "big-2", n=200)], tmp_path)
    unit = [
        Change(U, 1, 30, UNAVAILABLE_VALUE, n=101),
        Change(C, 3, 31, "big-3", n=300),
        Change(U, 3, 32, UNAVAILABLE_VALUE, n=301),
        Change(U, 2, 33, None, n=201),
    ]
    harness.apply(topic, unit, tmp_path)
    expected = {1: ("big-1", 101), 2: (None, 201), 3: ("big-3", 301)}
    assert images(harness, topic) == expected
    assert harness.build(topic, "--full-refresh")
    assert images(harness, topic) == expected

    history, literal = f"{topic.table}_history", f"{topic.table}_literal"
    harness.write_model(topic, "history='scd2'", name=history)
    harness.write_model(topic, "unavailable_value=none", name=literal)
    harness.write_tests(topic, history, "scd2")
    harness.write_tests(topic, literal)  # here the placeholder is a value, compared
    assert run_dbt(harness.settings, ["build", "--select", history, literal])
    rows = harness.rows(f"silver.{history}", "id, v, n, _cdc_valid_from[0] as at", "id, at")
    assert [(row["id"], row["at"], row["v"], row["n"]) for row in rows] == [
        (1, 10, "big-1", 100),
        (1, 30, "big-1", 101),
        (2, 20, "big-2", 200),
        (2, 33, None, 201),
        (3, 31, "big-3", 300),
        (3, 32, "big-3", 301),
    ]
    assert harness.rows(f"silver.{literal}", "id, v", "id")[0] == {"id": 1, "v": UNAVAILABLE_VALUE}


def test_unavailable_values_in_schemaless_images(harness: SilverHarness, tmp_path: Path) -> None:
    """Without schemas silver keeps the image as JSON text, folded the same way: a placeholder takes the key's
    earlier value, a column the update's image no longer has (dropped at the source) goes, and a placeholder with
    no earlier value anywhere is left out of the document (a typed image gets a null) instead of failing the run.
    Bronze keeps no count of placeholders in JSON text: silver looks into every unit."""
    topic = harness.topic("toast_json")

    def land(changes: list[Change], drop: str | None = None, v: Any = None) -> None:
        lines = topic.records(changes)
        for line in lines:
            line["key"], line["payload"] = without_schema(line["key"]), without_schema(line["payload"])
            payload = orjson.loads(line["payload"])
            if drop is not None:
                del payload["after"][drop]
            if v is not None:
                payload["after"]["v"] = v
            line["payload"] = orjson.dumps(payload).decode()
        harness.land_lines(f"{topic.table}-{topic.next_offset}", lines, tmp_path)

    def documents() -> dict[str, Any]:
        rows = harness.rows(f"silver.{topic.table}", "id, _cdc_document", "id")
        return {row["id"]: orjson.loads(row["_cdc_document"]) for row in rows}

    land([Change(C, 1, 10, "big-1", n=100), Change(C, 2, 11, "big-2", n=200)])
    harness.write_model(topic, "keys=['id']")
    assert harness.build(topic)
    land([Change(U, 1, 30, UNAVAILABLE_VALUE, n=101), Change(U, 4, 40, UNAVAILABLE_VALUE, n=400)])
    land([Change(U, 2, 31, UNAVAILABLE_VALUE)], drop="n")
    expected = {"1": {"id": 1, "v": "big-1", "n": 101}, "2": {"id": 2, "v": "big-2"}, "4": {"id": 4, "n": 400}}
    for extra in ([], ["--full-refresh"]):
        assert harness.build(topic, *extra)
        assert documents() == expected
    # The other forms, each alone in a unit of work (the unit's cheap text search must find each one): an hstore
    # as JSON text (its quotes escaped inside the string), an integer array of the bytes, a uuid array, an hstore map.
    hstore = {UNAVAILABLE_VALUE: UNAVAILABLE_VALUE}
    forms = [orjson.dumps(hstore).decode(), list(UNAVAILABLE_VALUE.encode()), [UNAVAILABLE_UUID], hstore]
    for n, form in enumerate(forms, 102):
        land([Change(U, 1, n, "-", n=n)], v=form)
        assert harness.build(topic)
        assert documents()["1"] == {"id": 1, "v": "big-1", "n": n}, form


def test_pk_only_updates_give_complete_versions(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("pk_only_scd2")
    config = "ignore_null_updates=true, history='scd2'"
    harness.apply(topic, [Change(C, 1, 10, "a", n=100), Change(U, 1, 20, "b", n=None)], tmp_path, config)
    harness.apply(topic, [Change(U, 1, 30, None, n=101), Change(U, 1, 25, None, n=99)], tmp_path, config)
    rows = harness.rows(f"silver.{topic.table}", "v, n, _cdc_valid_from[0] as at", "at")
    # The late update at 25 lands between 20 and 30, folded onto the version before it.
    assert [(row["at"], row["v"], row["n"]) for row in rows] == [
        (10, "a", 100),
        (20, "b", 100),
        (25, "b", 99),
        (30, "b", 101),
    ]


Image = dict[str, Any] | None
Position = tuple[int, int, int]


@dataclasses.dataclass
class FoldedRows:
    """The reference's silver with partial images: per key the position and image it holds (None: deleted), and
    the newest truncate applied (every change older than it is void, for any key)."""

    rows: dict[int, tuple[Position, Image]] = dataclasses.field(default_factory=dict)
    truncated_at: Position | None = None
    # Per key, what it held after each change applied to it, in order: a primary-key change's create takes the old
    # key's image before its delete, which may have been applied in an earlier unit of work.
    held: dict[int, list[tuple[Position, Image]]] = dataclasses.field(default_factory=dict)

    def fold(self, unit: list[tuple[Change, int]]) -> None:
        """One unit of work: per key, the changes newer than what silver holds (row, tombstone or truncate) apply
        in order; an update keeps the previous value of each column it does not carry."""
        for change, offset in sorted(unit, key=lambda item: (item[0].lsn, OP_RANK[item[0].op], item[1])):
            position = (change.lsn, OP_RANK[change.op], offset)
            if self.truncated_at is not None and position < self.truncated_at:
                continue
            if change.op == "t":
                self.truncated_at = position
                for key, (held, _image) in self.rows.items():
                    if held < position:
                        self.set(key, position, None)
                continue
            if change.id in self.rows and position <= self.rows[change.id][0]:
                continue
            previous = self.rows.get(change.id, (position, None))[1]
            if change.old_key is not None:  # a primary-key change: the old key's image, when it has one before it
                before = [image for held, image in self.held.get(change.old_key, []) if held < position]
                previous = before[-1] if before and before[-1] is not None else previous
            image: Image = None
            if change.op == "c" and change.old_key is not None:
                carried = {"v": change.v, "n": change.n_value}
                image = {k: value if value is not None else (previous or {}).get(k) for k, value in carried.items()}
            elif change.op in "cr":
                image = {"v": change.v, "n": change.n_value}
            elif change.op == "u":
                carried = {"v": change.v, "n": change.n_value}
                image = {k: value if value is not None else (previous or {}).get(k) for k, value in carried.items()}
            self.set(change.id, position, image)

    def set(self, key: int, position: Position, image: Image) -> None:
        self.rows[key] = (position, image)
        self.held.setdefault(key, []).append((position, image))

    def images(self) -> dict[int, tuple[Any, Any]]:
        return {key: (image["v"], image["n"]) for key, (_, image) in self.rows.items() if image is not None}


partial_changes = st.lists(
    st.tuples(
        st.sampled_from("cccuuuddrrt"),  # one change in eleven a truncate
        st.integers(1, 3),
        st.integers(1, 30),
        st.sampled_from(["p", "q", None]),
        st.sampled_from([1, 2, None]),
    ),
    min_size=1,
    max_size=10,
)


@dbt_examples(3)
@given(batches=st.lists(partial_changes, min_size=1, max_size=3), replay=st.booleans())
def test_random_partial_updates_match_the_reference_model(
    harness: SilverHarness,
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[str, int, int, str | None, int | None]]],
    replay: bool,
) -> None:
    units = [
        [Change(op, key, lsn, None if op == "d" else v, n=None if op == "d" else n) for op, key, lsn, v, n in batch]
        for batch in batches
    ]
    assert_pk_only_silver_matches_the_reference(harness, tmp_path_factory, "pk_only_property", units, replay)


def assert_pk_only_silver_matches_the_reference(
    harness: SilverHarness,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    units: list[list[Change]],
    replay: bool,
) -> None:
    """Applies each unit of work (after a replay of half of what landed before, with ``replay``) with
    ignore_null_updates; after each, silver holds the reference's images."""
    topic = harness.topic(name)
    dumps = tmp_path_factory.mktemp(name)
    reference = FoldedRows()
    landed: list[Change] = []
    for unit in units:
        changes = with_replay(landed, unit, replay)
        harness.apply(topic, changes, dumps, "ignore_null_updates=true")
        reference.fold(topic.landed[-len(changes) :])
        assert images(harness, topic) == reference.images()


def moved(old: int, new: int, lsn: int, v: str | None, n: int | None) -> list[Change]:
    """A primary-key change from ``old`` to ``new`` under PK-only logging: the create carries what changed."""
    return [Change(D, old, lsn, new_key=new), Change(C, new, lsn, v, n=n, old_key=old)]


def test_a_primary_key_change_takes_the_old_keys_values(harness: SilverHarness, tmp_path: Path) -> None:
    """Oracle's PK-only logging (or PostgreSQL's unchanged TOAST values): the create of a primary-key change carries
    the key and what changed; the rest is the old key's, from silver or from the same unit of work. Then an update of
    the moved key folds onto it, and a replay of the change (at other offsets) changes nothing."""
    topic = harness.topic("pk_moves")
    config = "ignore_null_updates=true"
    harness.apply(topic, [Change(C, 1, 10, "a", n=100), Change(C, 2, 11, "b", n=200)], tmp_path, config)
    unit = [*moved(1, 5, 20, None, None), Change(U, 2, 21, None, n=201), *moved(2, 6, 22, "b2", None)]
    harness.apply(topic, [*unit, Change(U, 5, 23, "a2", n=None)], tmp_path, config)
    assert images(harness, topic) == {5: ("a2", 100), 6: ("b2", 201)}
    # Replayed (the changes of keys 1 and 2 again, at other offsets): older than what silver holds for 5 and 6.
    harness.apply(topic, [*moved(1, 5, 20, None, None), *moved(2, 6, 22, "b2", None)], tmp_path, config)
    assert images(harness, topic) == {5: ("a2", 100), 6: ("b2", 201)}


def test_a_primary_key_change_alone_in_its_unit_folds_the_placeholder(harness: SilverHarness, tmp_path: Path) -> None:
    """A unit of work that holds nothing but a primary-key change whose create carries the placeholder (an unchanged
    TOAST column): bronze's running count of placeholders counts the create, so the run folds it onto the old key's
    value. Before, the count covered updates only, the run skipped the fold and silver kept the placeholder."""
    topic = harness.topic("pk_move_placeholder")
    harness.apply(topic, [Change(C, 1, 10, "a", n=100), Change(C, 2, 11, "b", n=200)], tmp_path)
    harness.apply(topic, [*moved(1, 5, 20, UNAVAILABLE_VALUE, 101)], tmp_path)
    assert images(harness, topic) == {2: ("b", 200), 5: ("a", 101)}


@pytest.mark.parametrize("split", [False, True], ids=["one_unit", "split"])
def test_a_primary_key_change_with_transaction_metadata_takes_the_old_keys_values(
    harness: SilverHarness, tmp_path: Path, split: bool
) -> None:
    """Oracle and Informix with provide.transaction.metadata: a change's position ends in its place in its
    transaction, so a primary-key change's delete and create are one place apart, not at one position. The create
    still pairs with its delete (in its unit of work, or in bronze when the delete landed in the unit before) and
    takes the old key's values, without a warning. Before, it paired with neither: the run warned that the delete
    was still to come, and silver's new row had nulls for what the create did not carry."""
    source = TransactedTopic(harness.topic(f"pk_moves_tx_{'split' if split else 'unit'}"))
    topic = source.topic
    first = source.changes([Change(C, 1, 10, "a", n=100), Change(C, 2, 11, "b", n=200)], [("c0", 1), ("c0", 2)])
    harness.land_lines("moves-0", [*first, source.end("c0", 2)], tmp_path)
    harness.write_model(topic, "ignore_null_updates=true")
    harness.write_tests(topic)
    assert harness.build(topic, "--warn-error")
    delete, create = source.changes(moved(1, 5, 20, None, None), [("t1", 1), ("t1", 2)])[::2]  # no tombstone
    later = source.changes([Change(U, 5, 21, "a2", n=None)], [("t2", 1)])
    if split:
        harness.land_lines("moves-1", [delete], tmp_path)
        assert harness.build(topic, "--warn-error")
        assert images(harness, topic) == {2: ("b", 200)}
        harness.land_lines("moves-2", [create, *later, source.end("t1", 2), source.end("t2")], tmp_path)
    else:
        harness.land_lines("moves-1", [delete, create, *later, source.end("t1", 2), source.end("t2")], tmp_path)
    assert harness.build(topic, "--warn-error")
    assert images(harness, topic) == {2: ("b", 200), 5: ("a2", 100)}


@pytest.mark.parametrize(
    "mode", ["hard", pytest.param("soft", marks=pytest.mark.slow), pytest.param("scd2", marks=pytest.mark.slow)]
)
def test_a_primary_key_change_split_across_units_of_work_takes_the_old_keys_values(
    harness: SilverHarness, tmp_path: Path, mode: str
) -> None:
    """The delete lands in one unit of work and the create in the next (an ingest flush, or a dbt run, between the
    two records): silver no longer holds the old key's image (with soft deletes, only a deleted row), and its values
    come from bronze. A create whose delete is not in bronze (it comes later, from another Kafka partition) takes
    them from silver's row of the key its `__debezium.oldkey` header names, in either form Kafka Connect's header
    converters write, and a warning says that changes of that key may still come; one whose header does not name
    the key cannot take them, and a warning says so."""
    topic = harness.topic("pk_moves_split")
    # Hard or soft deletes, or a history (hard deletes) whose current versions are compared.
    config = "ignore_null_updates=true, " + ("history='scd2'" if mode == "scd2" else f"delete_mode='{mode}'")
    live = {"hard": "true", "soft": "not _cdc_deleted", "scd2": "_cdc_is_current"}[mode]
    harness.apply(topic, [Change(C, 1, 10, "a", n=100), Change(U, 1, 11, None, n=101)], tmp_path, config)
    delete, create = moved(1, 5, 20, None, None)
    harness.apply(topic, [Change(C, 2, 12, "b", n=200), Change(U, 2, 13, "b1", n=None), delete], tmp_path, config)
    assert images(harness, topic, live) == {2: ("b1", 200)}
    harness.apply(topic, [create, Change(U, 5, 21, "a2", n=None)], tmp_path, config)
    assert images(harness, topic, live) == {2: ("b1", 200), 5: ("a2", 101)}
    # The create replayed alone: older than silver's row of 5, and still folded without a warning.
    harness.land(topic, [create], tmp_path)
    assert harness.build(topic, "--warn-error")
    assert images(harness, topic, live) == {2: ("b1", 200), 5: ("a2", 101)}
    # The other order: 2 -> 6's create first, its header as the JSON header converter writes it (with the schema).
    delete, create = moved(2, 6, 30, None, 201)
    key_schema = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}], "optional": False}
    header = orjson.dumps({"schema": key_schema, "payload": {"ID": 2}}).decode()
    create = dataclasses.replace(create, oldkey_header=header)
    harness.land(topic, [create], tmp_path)
    # Folded, and said: key 2's partition may still hold a change of 2 before its delete, which the fold misses.
    assert not harness.build(topic, "--warn-error"), "a create folded without its delete is warned about"
    assert harness.build(topic)
    log = (harness.project / "logs" / "dbt.log").read_text()
    assert "the creates take the values of the old key their __debezium.oldkey header names" in log
    assert images(harness, topic, live) == {2: ("b1", 200), 5: ("a2", 101), 6: ("b1", 201)}
    harness.apply(topic, [delete], tmp_path, config)
    assert images(harness, topic, live) == {5: ("a2", 101), 6: ("b1", 201)}
    # A header that does not name the key (a converter that wrote something else): a warning, and the create as
    # it came until the delete lands and a --full-refresh folds it.
    delete, create = moved(5, 7, 40, None, 301)
    create = dataclasses.replace(create, oldkey_header='{"code": 5}')
    harness.land(topic, [create], tmp_path)
    offset = topic.landed[-1][1]
    assert not harness.build(topic, "--warn-error"), "a create without its delete or a readable header is warned about"
    assert harness.build(topic)
    log = (harness.project / "logs" / "dbt.log").read_text()
    assert f"1 primary-key change(s) in bronze.{topic.table} ({topic.name} partition 0 offset {offset})" in log
    assert "header does not name all of the key columns id, so" in log
    # What the failed run left of its own (its bronze rows of earlier units) the next run dropped.
    left = harness.spark.sql(f"show tables in cdclake_scratch.silver like '{topic.table}__cdc_batch_*_moves*'")
    assert left.collect() == []
    assert images(harness, topic, live) == {5: ("a2", 101), 6: ("b1", 201), 7: (None, 301)}
    harness.apply(topic, [delete], tmp_path, config)
    assert images(harness, topic, live) == {6: ("b1", 201), 7: (None, 301)}
    # --full-refresh folds it, now that both are in bronze.
    assert harness.build(topic, "--full-refresh")
    assert images(harness, topic, live) == {6: ("b1", 201), 7: ("a2", 301)}


@st.composite
def key_moving_histories(draw: st.DrawFn) -> list[list[Change]]:
    """Units of work of a table's history of inserts, PK-only updates, deletes and primary-key changes, as the
    source could have made them (a key changes to one not in use)."""
    live: set[int] = set()
    changes: list[Change] = []
    splits: set[int] = set()
    steps = st.tuples(
        st.sampled_from("cuudmm"), st.integers(1, 4), st.integers(1, 4), st.sampled_from(["p", "q", None])
    )
    for lsn, (op, key, other, v) in enumerate(draw(st.lists(steps, min_size=1, max_size=12)), start=1):
        n = draw(st.sampled_from([lsn, None]))
        if op == "c" and key not in live:
            changes.append(Change(C, key, lsn, v or "x", n=n))
            live.add(key)
        elif op == "u" and key in live:
            changes.append(Change(U, key, lsn, v, n=n))
        elif op == "d" and key in live:
            changes.append(Change(D, key, lsn))
            live.remove(key)
        elif op == "m" and key in live and other not in live:
            pair = moved(key, other, lsn, v, n)
            # Split across units of work: the delete first (a flush between them), or the create (the two keys in
            # different Kafka partitions, the new key's read first).
            split = draw(st.sampled_from([None, "delete first", "create first"]))
            changes += pair[::-1] if split == "create first" else pair
            live = (live - {key}) | {other}
            if split is not None:
                splits.add(len(changes) - 1)
    drawn = draw(st.sets(st.integers(1, max(len(changes) - 1, 1)), max_size=2))
    cuts = sorted(cut for cut in drawn | splits if cut < len(changes))
    units = [changes[a:b] for a, b in zip([0, *cuts], [*cuts, len(changes)], strict=True)]
    return [unit for unit in units if unit]


# A key changed twice in one unit of work (2 -> 1 -> 3): 3's create takes 1's values, which 1's create took from 2
# (found by `make explore`).
CHAINED_MOVES = [
    [
        Change(C, 4, 1, "q", n=None),
        Change(C, 2, 2, "q", n=2),
        Change(U, 2, 5, "q", n=5),
        Change(U, 4, 7, "q", n=None),
        *moved(2, 1, 10, "p", None),
        *moved(1, 3, 11, "p", None),
    ]
]


# A primary-key change whose delete lands in one unit of work and its create in the next.
SPLIT_MOVE = [
    [Change(C, 1, 1, "p", n=1), Change(U, 1, 2, None, n=2), moved(1, 2, 3, None, None)[0]],
    [moved(1, 2, 3, None, None)[1], Change(U, 2, 4, "q", n=None)],
]

# The other order: the create lands in a unit of work before its delete.
CREATE_FIRST_MOVE = [
    [Change(C, 1, 1, "p", n=1), Change(U, 1, 2, None, n=2), moved(1, 2, 3, None, None)[1]],
    [moved(1, 2, 3, None, None)[0], Change(U, 2, 4, "q", n=None)],
]

# A chain across units (1 -> 2 -> 4 -> 1, found by `make explore`): 4's create, whose delete landed in the unit before,
# takes 2's values, which 2's create (of that unit too) took from 1; 1's create, whose delete lands in the next unit,
# takes 4's.
CHAINED_SPLIT_MOVES = [
    [Change(C, 1, 4, "x", n=4), *moved(1, 2, 7, "q", None), moved(2, 4, 8, "q", None)[0]],
    [moved(2, 4, 8, "q", None)[1], moved(4, 1, 9, "p", None)[1]],
    [moved(4, 1, 9, "p", None)[0], *moved(1, 3, 12, "p", 12)],
]


@dbt_examples(3)
@example(units=CHAINED_MOVES, replay=False)
@example(units=CHAINED_SPLIT_MOVES, replay=False)
@example(units=SPLIT_MOVE, replay=True)
@example(units=CREATE_FIRST_MOVE, replay=True)
@given(units=key_moving_histories(), replay=st.booleans())
def test_random_primary_key_changes_match_the_reference_model(
    harness: SilverHarness, tmp_path_factory: pytest.TempPathFactory, units: list[list[Change]], replay: bool
) -> None:
    assert_pk_only_silver_matches_the_reference(harness, tmp_path_factory, "pk_move_property", units, replay)


# --- MongoDB ------------------------------------------------------------------------------------------------------
def apply_update(document: dict[str, Any] | None, change: MongoChange) -> dict[str, Any] | None:
    """Python reference of a MongoDB update event (what the source did to the document)."""
    if change.op == "d":
        return None
    if change.after is not None:
        return change.after
    patch = change.patch or {}
    if patch and not any(name.startswith("$") for name in patch):
        return patch
    if document is None:
        document = change.before  # a pre-image (change_streams_with_pre_image)
    assert document is not None
    document = copy.deepcopy(document)
    for path, size in change.truncated or []:
        parent, name = _walk(document, path)
        parent[name] = parent[name][:size]
    for path in [*(change.removed or []), *patch.get("$unset", {})]:
        parent, name = _walk(document, path)
        if isinstance(parent, list):  # $unset of an array element leaves a null in its place
            if name < len(parent):
                parent[name] = None
        else:
            parent.pop(name, None)
    for path, value in {**(change.updated or {}), **patch.get("$set", {})}.items():
        parent, name = _walk(document, path)
        if isinstance(parent, list):
            parent.extend([None] * (int(name) + 1 - len(parent)))
            parent[int(name)] = value
        else:
            parent[name] = value
    return document


def _walk(document: Any, path: str) -> tuple[Any, Any]:
    *parents, leaf = path.split(".")
    for name in parents:
        document = document[int(name)] if isinstance(document, list) else document.setdefault(name, {})
    return document, int(leaf) if isinstance(document, list) else leaf


def expected_documents(changes: list[MongoChange]) -> dict[str, Any]:
    documents: dict[str, Any] = {}
    for change in sorted(changes, key=lambda c: (c.sec, c.ord)):
        document = apply_update(documents.get(str(change.id)), change)
        if document is None:
            documents.pop(str(change.id), None)
        else:
            documents[str(change.id)] = document
    return documents


ANNE = {
    "_id": 1,
    "name": "Anne",
    "address": {"city": "Berlin", "zip": "10115"},
    "tags": ["a", "b", "c"],
    "visits": {"$numberLong": "5"},
    "orders": [{"sku": "x", "qty": 1}],
    "grid": [[1, 2, 3], [4, 5]],
}
# Keys Spark's JSON paths name only one way: with a question mark, a single quote, a bracket, trailing whitespace.
BOB = {"_id": 2, "name": "Bob", "score": 1, "done?": True, "it's": 0, "a]b": [1], "trail ": "t"}


@pytest.mark.parametrize("schemas", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["typed", "schemaless"])
def test_mongodb_update_descriptions_fold_into_documents(harness: SilverHarness, tmp_path: Path, schemas: bool) -> None:
    topic = harness.mongo_topic("update_description", schemas)
    config = "" if schemas else "keys=['id']"
    first = [
        MongoChange(C, 1, 100, after=ANNE),
        MongoChange(C, 2, 100, 2, after=BOB),
        MongoChange("u", 1, 101, updated={"name": "Anne Marie"}),
        # nested paths: a field of a sub-document, an element appended to an array, a field inside an element
        MongoChange("u", 1, 102, updated={"address.city": "Lyon", "tags.3": "d", "orders.0.qty": 2}),
    ]
    harness.apply(topic, first, tmp_path, config)
    assert harness.documents(topic) == expected_documents(first)
    second = [
        # JSON types survive: a string that looks like a number or a boolean stays a string, null stays null
        MongoChange(
            "u", 1, 103, updated={"visits": {"$numberLong": "6"}, "code": "0042", "flag": "true", "none": None}
        ),
        MongoChange("u", 1, 104, removed=["name", "address.zip"]),
        MongoChange("u", 1, 105, truncated=[("tags", 2)], updated={"tags.1": "B", "orders.3": {"sku": "y"}}),
        # an array inside an array cut ($pop), and an element unset ($unset leaves a null in its place)
        MongoChange("u", 1, 106, truncated=[("grid.0", 1)], removed=["grid.1.0", "grid.7"]),
        MongoChange("u", 2, 103, updated={"score": 1.5, "new": {"deep": [1, "2"]}, "q?": 5}),
    ]
    harness.apply(topic, second, tmp_path, config)
    expected = expected_documents(first + second)
    assert harness.documents(topic) == expected
    assert expected["1"]["orders"] == [{"sku": "x", "qty": 2}, None, None, {"sku": "y"}]  # padded as MongoDB does
    assert expected["1"]["grid"] == [[1], [None, 5]]
    # A late update (older than silver's document) changes nothing; a full update (change_streams_update_full)
    # replaces the document.
    harness.apply(
        topic,
        [MongoChange("u", 2, 99, updated={"score": -1}), MongoChange("u", 1, 106, after={"_id": 1, "only": True})],
        tmp_path,
        config,
    )
    assert harness.documents(topic) == {"1": {"_id": 1, "only": True}, "2": expected["2"]}
    assert harness.build(topic, "--full-refresh")  # bronze's order puts the late update where it belongs
    assert harness.documents(topic) == {"1": {"_id": 1, "only": True}, "2": expected["2"]}


def test_mongodb_oplog_patches_fold_into_documents(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.mongo_topic("oplog")
    changes = [
        MongoChange(C, 1, 100, after=ANNE),
        MongoChange("u", 1, 101, patch={"$v": 1, "$set": {"name": "Anne Marie", "address.city": "Osaka"}}),
        MongoChange("u", 1, 102, patch={"$unset": {"tags": True}}),
        MongoChange(C, 2, 100, 2, after=BOB),
        MongoChange("u", 2, 101, patch={"_id": 2, "name": "Robert"}),  # a replacement: the whole document
        MongoChange("u", 2, 102, patch={"$set": {"score": 2}}),
    ]
    harness.apply(topic, changes, tmp_path, "")
    assert harness.documents(topic) == expected_documents(changes)


def test_a_document_deleted_and_reinserted_in_one_transaction_stays(harness: SilverHarness, tmp_path: Path) -> None:
    """The events of one MongoDB transaction share its cluster time; transaction.total_order orders them. A delete
    and re-insert of one document in one transaction leaves the new document (the op tie-break alone, d after c,
    dropped it), whether the transaction lands in one unit of work or across two."""
    topic = harness.mongo_topic("delete_reinsert")
    harness.apply(topic, [MongoChange(C, 1, 100, after=ANNE), MongoChange(C, 2, 100, 2, after=BOB)], tmp_path, "")
    renamed = {**ANNE, "name": "Anne Marie"}
    harness.apply(
        topic,
        [MongoChange(D, 1, 101, 1, place=1), MongoChange(C, 1, 101, 1, after=renamed, place=2)],
        tmp_path,
        "",
    )
    harness.apply(topic, [MongoChange(D, 2, 102, 1, place=1)], tmp_path, "")
    harness.apply(topic, [MongoChange(C, 2, 102, 1, after=BOB, place=2)], tmp_path, "")
    assert harness.documents(topic) == {"1": renamed, "2": BOB}
    assert harness.build(topic, "--full-refresh")
    assert harness.documents(topic) == {"1": renamed, "2": BOB}


def test_updates_with_a_pre_image_fold_onto_it(harness: SilverHarness, tmp_path: Path) -> None:
    """capture.mode=change_streams_with_pre_image: an update carries the whole document before it (`before`). A
    key with no document in bronze or silver (snapshot.mode=never, a silver table started later) failed the run
    ("the key has no document before it") although its pre-image is that document."""
    topic = harness.mongo_topic("pre_images")
    first = [
        MongoChange(C, 1, 100, after=ANNE),
        MongoChange("u", 7, 101, before={"_id": 7, "name": "a", "tags": ["x", "y"], "n": 1}, updated={"name": "b"}),
        MongoChange("u", 7, 102, before={"_id": 7, "name": "b", "tags": ["x", "y"], "n": 1}, removed=["n"]),
    ]
    harness.apply(topic, first, tmp_path)
    assert harness.documents(topic) == expected_documents(first)
    second = [MongoChange("u", 7, 103, before={"_id": 7, "name": "b", "tags": ["x", "y"]}, updated={"tags.1": "z"})]
    harness.apply(topic, second, tmp_path)
    expected = expected_documents(first + second)
    assert expected["7"] == {"_id": 7, "name": "b", "tags": ["x", "z"]}
    assert harness.documents(topic) == expected


def test_a_soft_deleted_document_keeps_its_last_update(harness: SilverHarness, tmp_path: Path) -> None:
    """Soft deletes of MongoDB documents: a deleted key keeps its document with the updates before the delete
    folded in, also when an update without a full document lands in the delete's unit of work (only each key's
    last change used to be folded, and the deleted row's document came out null); --full-refresh agrees."""
    topic = harness.mongo_topic("soft_documents")
    config = "delete_mode='soft'"
    first = [MongoChange(C, 1, 100, after=ANNE), MongoChange(C, 2, 100, 2, after=BOB)]
    harness.apply(topic, first, tmp_path, config)
    update = MongoChange("u", 1, 101, updated={"name": "X", "address.city": "Lyon"})
    harness.apply(topic, [update, MongoChange(D, 1, 102)], tmp_path, config)
    expected = expected_documents([*first, update])
    assert harness.documents(topic) == expected
    assert harness.build(topic, "--full-refresh")
    assert harness.documents(topic) == expected


def test_replayed_document_updates_under_soft_deletes_are_ignored(harness: SilverHarness, tmp_path: Path) -> None:
    """Soft deletes fold every update of a unit, not only each key's last. Debezium replays updates after a restart
    (same positions, new offsets): a replayed update older than silver's row has no document before it in the unit,
    and used to fail every later run ("the key has no document before it") until --full-refresh. It is older than
    what silver applied, so it is ignored; the replay of silver's own last update folds onto silver's document."""
    topic = harness.mongo_topic("soft_replay")
    config = "delete_mode='soft'"
    create = MongoChange(C, 1, 100, after=ANNE)
    updates = [MongoChange("u", 1, 101, updated={"name": "X"}), MongoChange("u", 1, 102, updated={"visits": 6})]
    harness.apply(topic, [create, *updates], tmp_path, config)
    expected = expected_documents([create, *updates])
    assert harness.documents(topic) == expected
    harness.apply(topic, updates, tmp_path, config)  # the replay, at new offsets
    assert harness.documents(topic) == expected
    later = MongoChange("u", 1, 103, updated={"address.city": "Lyon"})
    harness.apply(topic, [later, MongoChange(D, 1, 104)], tmp_path, config)
    assert harness.documents(topic) == expected_documents([create, *updates, later])
    assert harness.build(topic, "--full-refresh")
    assert harness.documents(topic) == expected_documents([create, *updates, later])


def test_a_replayed_update_of_a_spaced_document_is_one_version(harness: SilverHarness, tmp_path: Path) -> None:
    """Debezium writes documents with spaces (`{"_id": 1, "name": "Anne"}`). An update that adds a field, replayed
    in a later unit of work (same position, another offset), folds to the same text as the version it repeats,
    so a history keeps one version of it."""
    topic = harness.mongo_topic("spaced_replay")
    config = "history='scd2'"
    create, update = MongoChange(C, 1, 100, after=BOB), MongoChange("u", 1, 101, updated={"x": 1})
    lines = topic.records([create])
    value = orjson.loads(lines[0]["payload"])
    value.get("payload", value)["after"] = json.dumps(BOB)  # ", " and ": " as Debezium writes it
    lines[0]["payload"] = orjson.dumps(value).decode()
    harness.land_lines(f"{topic.table}-spaced", lines, tmp_path)
    harness.write_model(topic, config)
    assert harness.build(topic)
    harness.apply(topic, [update], tmp_path, config)
    harness.apply(topic, [update], tmp_path, config)  # the replay
    rows = harness.rows(f"silver.{topic.table}", "_cdc_document, _cdc_valid_from[0] as at, _cdc_is_current", "at")
    assert [(row["at"], row["_cdc_is_current"]) for row in rows] == [(100_000, False), (101_000, True)]  # ts_ms
    assert orjson.loads(rows[1]["_cdc_document"]) == {**BOB, "x": 1}


def test_a_document_updated_many_times_in_one_unit_keeps_every_version(harness: SilverHarness, tmp_path: Path) -> None:
    """A history folds each segment of a key's updates once, keeping each update's document on the way: folding
    every version's own prefix applied n(n+1)/2 edits (1,000 updates of one document in a unit took more than ten
    minutes). Two segments: a full update in the middle starts the second."""
    topic = harness.mongo_topic("hot_document")
    config = "history='scd2'"
    insert = MongoChange(C, 1, 100, after={"_id": 1, "count": 0})
    harness.apply(topic, [insert], tmp_path, config)
    updates = [
        MongoChange("u", 1, sec, after={"_id": 1, "count": -1, "full": True})
        if sec == 250
        else MongoChange("u", 1, sec, updated={"count": sec})
        for sec in range(101, 401)
    ]
    harness.land(topic, updates, tmp_path)
    assert harness.build(topic)
    changes = [insert, *updates]
    rows = harness.rows(f"silver.{topic.table}", "_cdc_document, _cdc_is_current", "_cdc_valid_from")
    assert [orjson.loads(row["_cdc_document"]) for row in rows] == [
        expected_documents(changes[: i + 1])["1"] for i in range(len(changes))
    ]
    assert [row["_cdc_is_current"] for row in rows] == [False] * (len(changes) - 1) + [True]


def test_mongodb_updates_give_complete_versions(harness: SilverHarness, tmp_path: Path) -> None:
    """Also: a run's folded documents and decided versions are tables of the run (a cached relation's plan made
    every statement reading it take 30-40 s), dropped by it; a successful run drops those a failed run left, and
    records where it put them (cdclake.batch_schema), as a current-state run does."""
    topic = harness.mongo_topic("scd2_documents")
    config = "history='scd2'"
    first = [MongoChange(C, 1, 100, after=ANNE), MongoChange("u", 1, 101, updated={"name": "A"})]
    harness.apply(topic, first, tmp_path, config)
    prefix = f"{topic.table}__cdc_batch"

    def scratch_tables() -> set[str]:
        rows = harness.spark.sql(f"show tables in cdclake_scratch.silver like '{prefix}*'").collect()
        return {row["tableName"] for row in rows}

    assert scratch_tables() == set()
    # Where this run's tables were: a later run with another batch_catalog drops what a failed one left there.
    properties = {
        row["key"]: row["value"] for row in harness.spark.sql(f"show tblproperties silver.{topic.table}").collect()
    }
    assert properties["cdclake.batch_schema"] == "cdclake_scratch.silver"
    failed = f"{prefix}_0123456789abcdef0123456789abcdef_history"
    for table in (failed, f"{failed}_events"):
        harness.spark.sql(f"create table cdclake_scratch.silver.{table} using iceberg as select 1 as id")
    second = [MongoChange("u", 1, 103, removed=["tags"]), MongoChange("u", 1, 102, updated={"visits": 7})]
    harness.apply(topic, second, tmp_path, config)
    assert scratch_tables() == set()
    rows = harness.rows(f"silver.{topic.table}", "_cdc_document, _cdc_valid_from[0] as at", "at")
    documents = [orjson.loads(row["_cdc_document"]) for row in rows]
    changes = sorted(first + second, key=lambda c: c.sec)
    expected = [expected_documents(changes[: i + 1])["1"] for i in range(len(changes))]
    assert documents == expected


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ([MongoChange("u", 7, 101, updated={"name": "x"})], "the key has no document before it"),
        (
            [MongoChange(C, 7, 100, after=BOB), MongoChange("u", 7, 101, updated={"name.first": "x"})],
            "cannot set name.first in this document",
        ),
        (
            [MongoChange(C, 7, 100, after={"_id": 7, "a.b": 1, "a": {}}), MongoChange("u", 7, 101, updated={"a.b": 2})],
            "path a.b is ambiguous",
        ),
        (  # where "a.b" is missing, the remove changed nothing (and left the field named "a.b" as it was)
            [MongoChange(C, 7, 100, after={"_id": 7, "a.b": 1}), MongoChange("u", 7, 101, removed=["a.b"])],
            "path a.b is ambiguous",
        ),
        (  # the field "a.b" starts the path: a.b.c set a new {"a": {"b": {"c": 2}}}
            [MongoChange(C, 7, 100, after={"_id": 7, "a.b": {"c": 1}}), MongoChange("u", 7, 101, updated={"a.b.c": 2})],
            "path a.b.c is ambiguous",
        ),
        (  # Debezium writes a double that is not a number bare in a full document: the fold gave a null document
            [
                MongoChange(C, 7, 100, after_text='{"_id": 7, "ratio": NaN, "name": "a"}'),
                MongoChange("u", 7, 101, updated={"name": "b"}),
            ],
            "the document before it is not valid JSON (a bare NaN or Infinity",
        ),
        (
            [
                MongoChange(C, 7, 100, after=BOB),
                MongoChange("u", 7, 101, patch={"$v": 2, "diff": {"u": {"name": "x"}}}),
            ],
            "oplog patches other than $set/$unset",
        ),
        (
            # Spark's JSON path parser skips the leading space: reading ' b' would give the value of 'b'.
            [MongoChange(C, 7, 100, after={"_id": 7, " b": 1, "b": 2}), MongoChange("u", 7, 101, updated={"x": 1})],
            "the key  b cannot be addressed in Spark SQL",
        ),
    ],
    ids=[
        "no-document",
        "path-through-a-scalar",
        "dotted-field-name",
        "dotted-field-removed",
        "dotted-field-starts-the-path",
        "not-a-number",
        "oplog-v2",
        "leading-space-key",
    ],
)
def test_an_update_that_cannot_be_folded_fails_the_run(
    harness: SilverHarness, tmp_path: Path, changes: list[MongoChange], reason: str
) -> None:
    """Never a silently wrong document: the run fails, naming the event (key and offset) and why."""
    topic = harness.mongo_topic("unfoldable")
    harness.land(topic, changes, tmp_path)
    harness.write_model(topic)
    assert not harness.build(topic)
    log = (harness.project / "logs" / "dbt.log").read_text()
    offset = len(changes) - 1
    event = f'key {{"id":"7"}} ({topic.name} partition 0 offset {offset})'
    assert f"cdclake: model '{topic.table}': cannot fold the update of {event}: {reason}" in log
    assert harness.spark.sql(f"show tables in silver like '{topic.table}'").count() == 0  # nothing written


def test_a_full_refresh_that_fails_leaves_the_old_table(harness: SilverHarness, tmp_path: Path) -> None:
    """--full-refresh dropped silver first: a rebuild that then failed (an update with no document before it) left
    no table at all, and readers found none while it ran. Each table is replaced in one commit now."""
    topic = harness.mongo_topic("refresh_fails")
    harness.apply(topic, [MongoChange(C, 1, 100, after=ANNE)], tmp_path)
    built = harness.documents(topic)
    assert built
    harness.land(topic, [MongoChange("u", 7, 101, updated={"name": "x"})], tmp_path)
    assert not harness.build(topic, "--full-refresh")
    assert harness.documents(topic) == built


def test_columns_options_on_documents_fail_naming_what_to_do(harness: SilverHarness, tmp_path: Path) -> None:
    """`exclude_columns=['ssn']` on a MongoDB model was ignored without a word: silver kept the whole document,
    the field the user meant to leave out included. It fails the run now, saying to select fields instead."""
    topic = harness.mongo_topic("document_columns")
    harness.land(topic, [MongoChange(C, 1, 100, after=ANNE)], tmp_path)
    harness.write_model(topic, "exclude_columns=['ssn']")
    assert not harness.build(topic)
    log = (harness.project / "logs" / "dbt.log").read_text()
    assert f"cdc_silver model '{topic.table}': exclude_columns picks columns of typed images, but bronze table " in log
    assert "kept whole in _cdc_document; select the fields to keep in the model's SQL instead" in log
    assert not harness.has_silver(topic)


@pytest.mark.parametrize("config", ["history='scd2'", "delete_mode='soft'"])
def test_an_excluded_change_is_left_out_of_the_fold(harness: SilverHarness, tmp_path: Path, config: str) -> None:
    """A history or soft deletes fold every update: an update with no document before it fails every run, a later
    snapshot of the key included (a model's `where` applies after the fold). exclude_changes leaves it out of
    all the model applies; bronze keeps it, and the shipped tests read bronze as the model does (bronze_where)."""
    topic = harness.mongo_topic(f"excluded_{config.split('=')[0]}")
    harness.land(topic, [MongoChange("u", 7, 100, updated={"name": "b"}), MongoChange(C, 1, 101, after=ANNE)], tmp_path)
    harness.write_model(topic, config)
    assert not harness.build(topic)
    harness.land(topic, [MongoChange("r", 7, 102, after={"_id": 7, "name": "b"})], tmp_path)  # a snapshot later
    assert not harness.build(topic)
    excluded = "_cdc_partition = 0 and _cdc_offset = 0"
    harness.write_model(topic, f'{config}, exclude_changes="{excluded}"')
    described = model_yaml(topic.table, ["id"], "bronze", None, "scd2" if "scd2" in config else "current")
    for test in described["models"][0]["data_tests"]:
        for name, arguments in test.items():
            if name != "cdclake.cdclake_keys_unique":
                arguments["arguments"]["bronze_where"] = f"not ({excluded})"
    (harness.project / "models" / "silver" / f"{topic.table}.yml").write_text(yaml.safe_dump(described))
    assert harness.build(topic), "dbt build failed (a model or a test)"
    current = "_cdc_is_current" if "scd2" in config else "not _cdc_deleted"
    rows = harness.rows(f"silver.{topic.table}", "id, _cdc_document, _cdc_op", "id", where=current)
    assert [(row["id"], orjson.loads(row["_cdc_document"]), row["_cdc_op"]) for row in rows] == [
        ("1", ANNE, C),
        ("7", {"_id": 7, "name": "b"}, "r"),
    ]
    assert harness.rows(f"bronze.{topic.table}", "count(*) as n", "1", where="_cdc_offset = 0") == [{"n": 1}]


def test_fake_mongodb_change_streams_mode(harness: SilverHarness, tmp_path: Path) -> None:
    """The fake MongoDB connector in capture.mode=change_streams (updates without after), two units of work:
    silver's documents equal the source's."""
    from ingest.demo import check_source
    from ingest.fakes import build_stream, continue_stream, to_kcat_json

    topic = harness.mongo_topic("fake")
    stream = build_stream("mongodb", seed=3, n_keys=12, n_changes=80, capture_mode="change_streams")
    for part, current in enumerate([stream, continue_stream(stream, 80)]):
        records = [
            to_kcat_json(dataclasses.replace(record, topic=topic.name))
            for record in current.new_records
            if record.topic == current.data_topic
        ]
        updates = [
            orjson.loads(r["payload"])["payload"] for r in records if r["payload"] and '"op":"u"' in r["payload"]
        ]
        assert updates
        assert all(update["after"] is None for update in updates)
        harness.land_lines(f"{topic.table}-{part}", records, tmp_path)
        harness.write_model(topic)
        assert harness.build(topic)
        check = check_source(harness.spark, current, topic.table, "silver")
        assert check.mismatches == []
        assert check.silver_rows == check.expected_rows
