"""Shared fixtures. Spark, the broker and dbt are started once per test session (they start slowly)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import settings as hypothesis_settings

from ingest.bronze.tables import BronzeTables
from ingest.config import Settings, load_settings
from ingest.lakehouse import load_catalog
from ingest.pipeline import Pipeline
from ingest.sources.file import FileSource
from ingest.spark import SHORT_RUN_JIT_OPTIONS

FIXTURES = Path(__file__).parent / "fixtures"
os.environ.setdefault("TZ", "UTC")
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
# dbt writes target/manifest.json (every macro: 644 of them) and run_results.json at each invocation, 0.26 s of
# each small one's 5 (measured with cProfile, 2026-11-27); the tests read none of it unless they ask (--write-json).
# Users' `cdclake dbt` writes them as dbt does.
os.environ.setdefault("DBT_WRITE_JSON", "false")
# Property tests explore new examples on every local run; CI replays the same ones (derandomized), so a landing is
# not decided by which examples a run happened to draw. A failure found locally becomes an explicit test.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


# The tests' JVMs run statements over a few rows each, thousands of them: HotSpot's optimizing compiler (C2)
# took half their CPU time (measured per JVM thread) for code that runs a few times. With the quick compiler alone
# two SCD2 tests took 65 s of JVM CPU instead of 103. C1 alone reserves only 48 MB for compiled code, which Spark's
# generated classes fill: the code cache sweeper then flushed methods that C1 compiled again (34 of 145 JVM
# CPU-seconds in those two threads for test_silver_schema_changes.py, 140 s; with 240 MB, tiered compilation's
# default, 94 CPU-seconds and 113 s). JIT settings (the demo's too); the Spark ones follow.
TEST_JAVA_OPTIONS = f"-Duser.timezone=UTC {SHORT_RUN_JIT_OPTIONS}"
# Spark's execution strategy for statements over a few rows, not its semantics: compiling generated code (whole-stage
# and per expression; factoryMode is the switch Spark's own tests use for its interpreted paths) and re-planning each
# stage adaptively cost more than the rows. Nine test_silver.py tests: 140 s and 126 JVM CPU-seconds with spark_conf's
# settings, 96-105 s and 72-84 with these (measured 2026-11-27). Two shuffle partitions, one per core, keep the
# tests' plans multi-partition. The shipped settings run in the demo, the benchmarks and the cluster test.
TEST_SPARK_CONF: dict[str, str] = {
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}


# `make test` hands whole modules to its two dbt workers in collection order (scripts/test_suite.sh passes
# --no-loadscope-reorder; xdist's own order is by number of tests), each worker taking the next module when two
# tests of its current one are left: the longest start first and the short ones fill in at the end. Seconds of
# one run alone (2026-12-04, `--durations=0`): 526, 508, 485, 265, 216, 171, 152, 142, 109. In xdist's order the
# two workers ran 1,366 and 1,212 s. A module not named here comes after these, in its place.
DBT_MODULES_LONGEST_FIRST = (
    "test_silver.py",
    "test_silver_transactions.py",
    "test_silver_partial.py",
    "test_reliability.py",
    "test_silver_scd2.py",
    "test_scaleout.py",
    "test_silver_generic_tests.py",
    "test_silver_postgres.py",
    "test_silver_schema_changes.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of DBT_MODULES_LONGEST_FIRST first, in that order; each module's tests keep theirs."""
    rank = {name: at for at, name in enumerate(DBT_MODULES_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def make_settings(root: Path, **sections: Any) -> Settings:
    """Settings for a lakehouse under ``root`` (SQLite catalog), written as a real cdclake.yml."""
    import yaml

    config: dict[str, Any] = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
        "spark": {"conf": dict(TEST_SPARK_CONF)},
        **sections,
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cdclake.yml"
    path.write_text(yaml.safe_dump(config))
    return load_settings(path, environ={})


@pytest.fixture
def lakehouse(tmp_path: Path) -> Path:
    return tmp_path / "lakehouse"


def file_pipeline(settings: Settings, path: Path, **overrides: Any) -> Pipeline:
    """The pipeline `cdclake ingest` builds for a file source (``overrides``: ingest settings)."""
    ingest = settings.ingest.model_copy(update=overrides)
    tables = BronzeTables(load_catalog(settings), settings.lakehouse.bronze_namespace)
    return Pipeline(ingest, tables, FileSource(path))


def ingest_file(settings: Settings, path: Path, **overrides: Any) -> Pipeline:
    """What `cdclake ingest --once` does with a file source, in process."""
    pipeline = file_pipeline(settings, path, **overrides)
    pipeline.run(once=True)
    return pipeline


def topic_counts(path: Path) -> dict[str, int]:
    """Records per topic in a kcat -J dump."""
    counts: dict[str, int] = {}
    for line in path.read_bytes().splitlines():
        topic = orjson.loads(line)["topic"]
        counts[topic] = counts.get(topic, 0) + 1
    return counts


# Registered here, once: imported into each test module instead, pytest would make one session-scoped instance
# per module, and all but the first would see a catalog the JVM does not point at.
from tests.silver_harness import SilverHarness  # noqa: E402
from tests.spark_fixtures import SparkLakehouse, spark_lakehouse  # noqa: E402, F401


@pytest.fixture(scope="module")
def harness(spark_lakehouse: SparkLakehouse, tmp_path_factory: pytest.TempPathFactory) -> SilverHarness:  # noqa: F811
    """A dbt project (the reference project's settings, cdclake's package) on the session's Spark lakehouse: one
    per test module, so each module's models and dbt runs are its own."""
    harness = SilverHarness.create(spark_lakehouse.settings, tmp_path_factory.mktemp("dbt"))
    harness.spark = spark_lakehouse.spark
    return harness
