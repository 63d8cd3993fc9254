"""The tombstone lifecycle of cdc_silver (field notes §4.7, Spark SDP #55993): deleted keys keep a tombstone that
stops a late older change from resurrecting them, and tombstones older than `tombstone_horizon_days` are purged.
Also the table format silver is written in (field notes §4.11: v2 merge-on-read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.silver_harness import Change, SilverHarness, Topic
from tests.spark_fixtures import SparkLakehouse, spark_lakehouse  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.dbt]


@pytest.fixture(scope="module")
def harness(spark_lakehouse: SparkLakehouse, tmp_path_factory: pytest.TempPathFactory) -> SilverHarness:  # noqa: F811
    harness = SilverHarness.create(spark_lakehouse.settings, tmp_path_factory.mktemp("dbt"))
    harness.spark = spark_lakehouse.spark
    return harness


def apply(harness: SilverHarness, topic: Topic, changes: list[Change], dumps: Path, config: str) -> None:
    harness.land(topic, changes, dumps)
    harness.write_model(topic, config)
    assert harness.build(topic), "dbt build failed"


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
    apply(harness, topic, [Change("c", 1, 10, "a"), Change("c", 2, 11, "b"), Change("d", 1, 20)], tmp_path, config)
    assert tombstone_keys(harness, topic) == [1]
    # Within the horizon the tombstone holds: a late older update of key 1 does not bring it back.
    apply(harness, topic, [Change("u", 1, 15, "zombie"), Change("d", 2, 30)], tmp_path, config)
    assert harness.silver(topic) == {}
    assert tombstone_keys(harness, topic) == [1, 2]
    # Key 1's tombstone passes the horizon; key 2's does not: the next run purges only key 1's.
    age(harness, f"silver.{topic.table}__cdc_tombstones", days=4, where="id = 1")
    apply(harness, topic, [Change("c", 3, 40, "c")], tmp_path, config)
    assert tombstone_keys(harness, topic) == [2]
    assert harness.silver(topic) == {3: "c"}


def test_without_a_horizon_tombstones_are_kept(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("forever")
    apply(harness, topic, [Change("c", 1, 10, "a"), Change("d", 1, 20)], tmp_path, "")
    age(harness, f"silver.{topic.table}__cdc_tombstones", days=10_000)
    apply(harness, topic, [Change("c", 2, 30, "b"), Change("u", 1, 12, "zombie")], tmp_path, "")
    assert tombstone_keys(harness, topic) == [1]
    assert harness.silver(topic) == {2: "b"}


def test_soft_deleted_rows_are_purged_after_the_horizon(harness: SilverHarness, tmp_path: Path) -> None:
    topic = harness.topic("soft_horizon")
    config = "delete_mode='soft', tombstone_horizon_days=3"
    apply(harness, topic, [Change("c", 1, 10, "a"), Change("c", 2, 11, "b"), Change("d", 1, 20)], tmp_path, config)
    assert set(harness.silver(topic, where="_cdc_deleted")) == {1}
    age(harness, f"silver.{topic.table}", days=4, where="_cdc_deleted")
    apply(harness, topic, [Change("d", 2, 30)], tmp_path, config)
    # Key 1's soft-deleted row was past the horizon: gone; key 2 was deleted in this run: flagged, kept.
    assert set(harness.silver(topic)) == {2}
    assert set(harness.silver(topic, where="_cdc_deleted")) == {2}


def test_silver_is_format_v2_merge_on_read(harness: SilverHarness, tmp_path: Path) -> None:
    """Row-level deletes as position deletes (v2), not v3 deletion vectors, and no copy-on-write rewrites per run."""
    topic = harness.topic("format")
    apply(harness, topic, [Change("c", 1, 10, "a")], tmp_path, "")
    apply(harness, topic, [Change("u", 1, 11, "b")], tmp_path, "")
    properties = {
        row["key"]: row["value"] for row in harness.spark.sql(f"show tblproperties silver.{topic.table}").collect()
    }
    assert properties.get("format-version") == "2"
    for operation in ("delete", "update", "merge"):
        assert properties.get(f"write.{operation}.mode") == "merge-on-read", operation
    delete_files = harness.spark.sql(f"select count(*) as n from silver.{topic.table}.delete_files").collect()[0]["n"]
    assert delete_files >= 1, "the update was applied as a position delete"
    assert harness.silver(topic) == {1: "b"}
