"""The generic dbt tests cdclake ships (keys unique, equals recomputation, no deleted keys): they pass on what
cdc_silver builds — current state and history, hard and soft deletes, late changes and truncates — and each one
fails when silver is wrong."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest
import yaml
from pyspark.sql import functions as F

from ingest.dbt_runner import run_dbt
from ingest.scaffold import History, model_yaml
from tests.silver_harness import Change, SilverHarness, Topic

pytestmark = [pytest.mark.spark, pytest.mark.dbt]

C, U, D, T = "c", "u", "d", "t"
FIRST = [
    *[Change(C, 1, 1, "a"), Change(C, 2, 2, "b"), Change(C, 3, 3, "c"), Change(D, 3, 4), Change(C, 6, 5, "f")],
    *[Change(C, 4, 12, "d"), Change(U, 4, 14, "d2")],
]
# A truncate at 10 voids everything before it, including a create at 8 landing with it; a late update of key 4
# (13, after the applied 14) is ignored by current state and lands in its place in a history.
SECOND = [Change(T, 0, 10), Change(C, 5, 8, "older"), Change(U, 4, 13, "late"), Change(U, 1, 20, "a2")]
SECOND += [Change(C, 7, 21, "g"), Change(D, 7, 22)]
TESTS = ("cdclake_keys_unique", "cdclake_equals_recompute", "cdclake_no_deleted_keys")


CONFIGS: dict[str, tuple[History, str]] = {
    "current_hard": ("current", ""),
    "current_soft": ("current", "delete_mode='soft'"),
    "scd2_hard": ("scd2", "history='scd2'"),
    "scd2_soft": ("scd2", "history='scd2', delete_mode='soft'"),
}


@pytest.fixture(scope="module")
def built(harness: SilverHarness, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Topic]:
    """One silver table per config from two units of work, each with the YAML `cdclake scaffold` writes (the
    tests); `dbt build` runs the tests after the first unit and they must pass (after the second, each
    test_shipped_tests_pass_on_silver runs them: a second run here would repeat theirs)."""
    dumps = tmp_path_factory.mktemp("dumps")
    topics = {name: harness.topic(f"generic_{name}") for name in CONFIGS}
    for name, (history, config) in CONFIGS.items():
        harness.write_model(topics[name], config)
        described = model_yaml(topics[name].table, ["id"], "bronze", None, history)
        if name == "current_soft":  # one key as text, as the model's `keys` takes it (each test read `i`, `d`)
            for test in described["models"][0]["data_tests"]:
                for arguments in test.values():
                    arguments["arguments"]["keys"] = "id"
        (harness.project / "models" / "silver" / f"{topics[name].table}.yml").write_text(yaml.safe_dump(described))
    for command, unit in (("build", FIRST), ("run", SECOND)):
        for topic in topics.values():
            harness.land(topic, unit, dumps)
        tables = [topic.table for topic in topics.values()]
        assert run_dbt(harness.settings, [command, "--select", *tables]), f"dbt {command} failed (a model or a test)"
    return topics


def failed_tests(harness: SilverHarness, topic: Topic) -> set[str]:
    """The shipped tests that fail on ``topic``'s silver table (one `dbt test` run)."""
    run_dbt(harness.settings, ["test", "--select", topic.table, "--write-json"])
    results = orjson.loads((harness.project / "target" / "run_results.json").read_bytes())["results"]
    assert len(results) == len(TESTS) + 1  # + not_null of the key
    return {name for result in results for name in TESTS if name in result["unique_id"] and result["status"] != "pass"}


def test_the_shipped_tests_pass_on_a_history_after_a_replay(
    harness: SilverHarness, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Debezium replays a key's latest change after a restart (same position, another offset): a history keeps the
    copy it stored first, the recomputation picks the last offset; both are the same change, and the shipped tests
    compare changes, not offsets (cdclake_equals_recompute used to fail here)."""
    dumps = tmp_path_factory.mktemp("replay")
    topic = harness.topic("generic_replay")
    harness.write_model(topic, "history='scd2'")
    described = model_yaml(topic.table, ["id"], "bronze", None, "scd2")
    (harness.project / "models" / "silver" / f"{topic.table}.yml").write_text(yaml.safe_dump(described))
    harness.land(topic, [Change(C, 1, 5, "a"), Change(C, 2, 6, "b")], dumps)
    assert run_dbt(harness.settings, ["build", "--select", topic.table])
    harness.land(topic, [Change(C, 1, 5, "a")], dumps)  # the replay, at a new offset
    assert run_dbt(harness.settings, ["run", "--select", topic.table])
    assert harness.rows(f"silver.{topic.table}", "id, _cdc_offset", "id") == [
        {"id": 1, "_cdc_offset": 0},
        {"id": 2, "_cdc_offset": 1},
    ]
    assert failed_tests(harness, topic) == set()


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_tests_pass_on_silver(harness: SilverHarness, built: dict[str, Topic], name: str) -> None:
    history, config = CONFIGS[name]
    live = " and ".join(
        ["true"]
        + (["_cdc_is_current"] if history == "scd2" else [])
        + (["not _cdc_deleted"] if "soft" in config else [])
    )
    assert harness.silver(built[name], live) == {1: "a2", 4: "d2"}  # what the tests accepted is right
    assert failed_tests(harness, built[name]) == set()


@pytest.mark.parametrize("name", ["current_hard", "scd2_hard"])
def test_each_shipped_test_fails_on_wrong_silver(harness: SilverHarness, built: dict[str, Topic], name: str) -> None:
    topic = built[name]
    table = f"silver.{topic.table}"
    good = harness.silver_snapshot(topic)
    current = "_cdc_is_current" if CONFIGS[name][0] == "scd2" else "true"
    rows = harness.spark.table(table).where(f"id = 1 and {current}")
    corruptions: list[tuple[str, Callable[[], object]]] = [
        # a key twice
        ("cdclake_keys_unique", lambda: rows.writeTo(table).append()),
        # a live key lost
        ("cdclake_equals_recompute", lambda: harness.spark.sql(f"delete from {table} where id = 4").collect()),
        # a live key bronze never held
        ("cdclake_equals_recompute", lambda: rows.withColumn("id", F.lit(99)).writeTo(table).append()),
        # a live key at the right change, with a value the change does not hold
        (
            "cdclake_equals_recompute",
            lambda: harness.spark.sql(f"update {table} set v = 'wrong' where id = 1 and {current}").collect(),
        ),
        # key 7, whose latest change in bronze is a delete, present as a live row
        ("cdclake_no_deleted_keys", lambda: rows.withColumn("id", F.lit(7)).writeTo(table).append()),
    ]
    if current != "true":
        # key 4's first version (12 -> 13) ending after the next one starts; then left open though not current
        corruptions += [
            (
                "cdclake_keys_unique",
                lambda: harness.spark.sql(
                    f"update {table} set _cdc_valid_to = transform(_cdc_valid_to, x -> x + 100) "
                    "where id = 4 and _cdc_valid_from[0] = 12"
                ).collect(),
            ),
            (
                "cdclake_keys_unique",
                lambda: harness.spark.sql(
                    f"update {table} set _cdc_valid_to = null where id = 4 and _cdc_valid_from[0] = 12"
                ).collect(),
            ),
            # key 1's current version stored again, as a replay at an earlier offset closed where it starts: every
            # version once by offset, none overlapping, one current
            (
                "cdclake_keys_unique",
                lambda: (
                    rows.withColumn("_cdc_offset", F.col("_cdc_offset") - 1)
                    .withColumn("_cdc_valid_to", F.col("_cdc_valid_from"))
                    .withColumn("_cdc_is_current", F.lit(False))
                    .writeTo(table)
                    .append()
                ),
            ),
        ]
    # The tests pass on the good table (the fixture's last run does not run them): each failure below is the
    # corruption's.
    assert failed_tests(harness, topic) == set()
    try:
        for test, corruption in corruptions:
            corruption()
            assert test in failed_tests(harness, topic), f"{test} did not fail on a silver table it should reject"
            harness.spark.sql(f"call lake.system.rollback_to_snapshot('{table}', {good})")
    finally:
        harness.spark.sql(f"call lake.system.rollback_to_snapshot('{table}', {good})")
    assert failed_tests(harness, topic) == set()


def test_a_column_the_model_computes_is_not_compared_with_the_image(
    harness: SilverHarness, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A model that replaces an image column with one of its own (`exclude_columns=['v']`, `upper(after.v) as v`):
    the value comparison takes the image columns the model's run applied, not every silver column an image field
    is named like (it compared the computed `v` with the image's and failed on every row)."""
    dumps = tmp_path_factory.mktemp("computed")
    topic = harness.topic("generic_computed")
    harness.write_model(topic)
    (harness.project / "models" / "silver" / f"{topic.table}.sql").write_text(
        "{{ config(materialized='cdc_silver', exclude_columns=['v']) }}\n"
        f"select *, upper(after.v) as v from {{{{ source('bronze', '{topic.table}') }}}}\n"
    )
    harness.write_tests(topic)
    harness.land(topic, [Change(C, 1, 1, "a", n=10), Change(C, 2, 2, "b", n=20), Change(U, 1, 3, "a2", n=11)], dumps)
    assert harness.build(topic), "dbt build failed (a model or a test)"
    assert harness.rows(f"silver.{topic.table}", "id, v, n", "id") == [
        {"id": 1, "v": "A2", "n": 11},
        {"id": 2, "v": "B", "n": 20},
    ]
    assert failed_tests(harness, topic) == set()
    # n is an image column: compared
    harness.spark.sql(f"update silver.{topic.table} set n = 12 where id = 1").collect()
    assert failed_tests(harness, topic) == {"cdclake_equals_recompute"}
