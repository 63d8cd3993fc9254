"""The SparkSession of a lakehouse. dbt's session method and `cdclake sql` reuse it within one process."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from ingest.config import Settings
from ingest.jvm_archive import driver_spark_conf

log = logging.getLogger(__name__)
_warned: set[str] = set()  # each suspect setting once per process

# HotSpot's JIT for a driver that runs only short builds over a few rows (the demo, cdclake's tests): the quick
# compiler (C1) alone, with the code cache tiered compilation would have had (C1 alone reserves 48 MB, which Spark's
# generated classes fill; methods flushed are then compiled again). On 2 cores the optimizing compiler (C2) took
# about half such a driver's CPU time, for code that runs a few times. Large units of work need C2: the shipped
# settings keep the JDK's default. Measured in docs/architecture.md ("The Spark driver's start").
SHORT_RUN_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def prepare_driver_process(settings: Settings) -> None:
    """What the process needs before a driver starts in it (idempotent; spark_session calls it)."""
    from ingest.lakehouse import is_local_master, local_warehouse_on_cluster, spark_master

    suspect = local_warehouse_on_cluster(settings)
    if suspect is not None and suspect not in _warned:
        _warned.add(suspect)
        log.warning("%s", suspect)
    # pyspark turns timestamps into naive datetimes of the process's time zone: keep the Python side in UTC, as the
    # session is, whatever the user's TZ says (else `cdclake sql` would print them shifted).
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if is_local_master(spark_master(settings)):  # a cluster's executors must reach the driver: its own address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(settings: Settings, app_name: str = "cdclake") -> Any:
    """Create (or reuse) the process's SparkSession with every setting of this lakehouse."""
    from ingest.lakehouse import check_catalog_reachable

    check_catalog_reachable(settings)  # one line naming the setting, rather than the JVM's stack trace
    prepare_driver_process(settings)
    from pyspark.sql import SparkSession

    conf = driver_spark_conf(settings)  # the driver maps the classes setup archived
    launch, secrets = split_secrets(conf)
    builder = SparkSession.builder.appName(app_name)
    for key, value in launch.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    apply_secrets(session, secrets)
    session.sparkContext.setLogLevel("ERROR")
    return session


def split_secrets(conf: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The settings a new driver is launched with, and the secrets set once it runs. pyspark launches the driver
    as `spark-submit --conf KEY=VALUE ...`, a command line any local user can read (`ps`): the catalog's and the
    storage's secrets (``spark.sql.*``, ``spark.hadoop.*``; the catalog is loaded at the first statement) stay off
    it. Other secret settings are Spark's own launch settings, which a running session cannot take."""
    from ingest.lakehouse import secret_spark_keys

    secrets = {key: conf[key] for key in secret_spark_keys(conf) if key.startswith(("spark.sql.", "spark.hadoop."))}
    return {key: value for key, value in conf.items() if key not in secrets}, secrets


def apply_secrets(session: Any, secrets: dict[str, str]) -> None:
    """Set :func:`split_secrets`'s secrets on the running ``session``: Hadoop's in its configuration (Spark reads
    ``spark.hadoop.*`` into it only at launch), the others as session settings."""
    prefix = "spark.hadoop."
    hadoop = {key.removeprefix(prefix): value for key, value in secrets.items() if key.startswith(prefix)}
    if hadoop:
        configuration = session.sparkContext._jsc.hadoopConfiguration()
        for key, value in hadoop.items():
            configuration.set(key, value)
    for key, value in secrets.items():
        if not key.startswith(prefix):
            session.conf.set(key, value)
