"""The driver JVM's class-data sharing archive: setup writes it, every driver cdclake starts maps it, and options
by which the user decides class sharing themselves are left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ingest import jvm_archive
from ingest.lakehouse import RUNTIME_DIR_ENV
from tests.conftest import make_settings
from tests.missing import missing_runtime
from tests.spark_fixtures import SparkLakehouse


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path))
    return tmp_path


def archive(runtime: Path, key: str, age_s: float = 0) -> Path:
    path = runtime / "jvm" / f"driver-{key}.jsa"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    mtime = path.stat().st_mtime - age_s
    os.utime(path, (mtime, mtime))
    return path


def test_without_an_archive_the_options_are_unchanged(runtime: Path) -> None:
    assert jvm_archive.with_archive("-Duser.timezone=UTC") == "-Duser.timezone=UTC"


def test_the_driver_maps_the_newest_archive_quietly(runtime: Path) -> None:
    archive(runtime, "old", age_s=60)
    newest = archive(runtime, "new")
    options = jvm_archive.with_archive("-Duser.timezone=UTC").split()
    assert options[0] == "-Duser.timezone=UTC"
    assert f"-XX:SharedArchiveFile={newest}" in options
    # A JVM that cannot use it (another JDK build, other jars) says so on its standard output, which `cdclake sql`
    # prints its results to.
    assert "-Xlog:cds=off,cds+dynamic=off" in options
    assert jvm_archive.with_archive("") == f"-XX:SharedArchiveFile={newest} -Xlog:cds=off,cds+dynamic=off"


@pytest.mark.parametrize(
    "options",
    [
        "-XX:SharedArchiveFile=/mine.jsa",
        "-XX:ArchiveClassesAtExit=/dump.jsa",
        "-Xshare:off -Duser.timezone=UTC",
        # The JVM crashed loading archived classes with a recording started at launch (jvm_archive.py says more).
        "-XX:StartFlightRecording=filename=/tmp/driver.jfr",
        "-javaagent:/opt/agent.jar",
        "-agentpath:/opt/libprofiler.so=start",
    ],
)
def test_class_sharing_the_user_set_or_an_agent_is_left_alone(runtime: Path, options: str) -> None:
    archive(runtime, "any")
    assert jvm_archive.with_archive(options) == options


def fake_jdk(home: Path, version: str) -> Path:
    """A JAVA_HOME whose `java -version` prints ``version`` (on stderr, as java does)."""
    java = home / "bin" / "java"
    java.parent.mkdir(parents=True, exist_ok=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\"' >&2\n")
    java.chmod(0o755)
    return home


def test_the_key_names_the_jdk_pyspark_and_jars(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(runtime / "jdk17", "17.0.9")))
    (runtime / "jars").mkdir()
    (runtime / "jars" / "classpath.txt").write_text("/a/iceberg.jar,/a/sqlite.jar")
    key = jvm_archive.archive_key()
    assert key == jvm_archive.archive_key()
    assert jvm_archive.archive_path(key) == runtime / "jvm" / f"driver-{key}.jsa"
    keys = {key}
    (runtime / "jars" / "classpath.txt").write_text("/a/iceberg.jar,/a/sqlite.jar,/a/postgresql.jar")
    keys.add(jvm_archive.archive_key())
    assert len(keys) == 2, "another jar list must give another archive"
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(runtime / "jdk21", "21.0.2")))
    keys.add(jvm_archive.archive_key())
    assert len(keys) == 3, "another JDK must give another archive"
    monkeypatch.setattr(pyspark, "__version__", "3.5.0-other")
    keys.add(jvm_archive.archive_key())
    assert len(keys) == 4, "another pyspark must give another archive"


def test_the_dbt_profiles_driver_maps_it_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cdclake dbt` (and plain dbt with the profile it writes) starts its driver from the profile's Spark settings
    (dbt-spark's session method), not through cdclake's session: the archive must be in them as well."""
    from ingest.dbt_runner import profile
    from ingest.lakehouse import runtime_dir

    jars = runtime_dir() / "jars"
    if not jars.is_dir():
        missing_runtime("no jars: `make setup` assembles them")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "runtime"))
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "jars").symlink_to(jars)
    settings = make_settings(tmp_path / "lake")
    options = profile(settings)["cdclake"]["outputs"]["session"]["server_side_parameters"]
    assert "SharedArchiveFile" not in options["spark.driver.extraJavaOptions"]
    written = archive(tmp_path / "runtime", "any")
    options = profile(settings)["cdclake"]["outputs"]["session"]["server_side_parameters"]
    assert f"-XX:SharedArchiveFile={written}" in options["spark.driver.extraJavaOptions"].split()


@pytest.mark.spark
def test_the_sessions_driver_was_started_with_the_archive_setup_wrote(spark_lakehouse: SparkLakehouse) -> None:
    written = jvm_archive.current_archive()
    assert written is not None, "`make setup` writes the archive (scripts/setup_runtime.sh): none found"
    assert written == jvm_archive.archive_path(jvm_archive.archive_key()), f"{written} is stale: run `make setup`"
    jvm = spark_lakehouse.spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={written}" in arguments, arguments
