"""The SparkSession of a lakehouse. dbt's session method and `cdclake sql` reuse it within one process."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ingest.config import Settings
from ingest.jvm_archive import driver_spark_conf


def prepare_driver_process() -> None:
    """What the process needs before a driver starts in it (idempotent; spark_session calls it)."""
    # pyspark turns timestamps into naive datetimes of the process's time zone: keep the Python side in UTC, as the
    # session is, whatever the user's TZ says (else `cdclake sql` would print them shifted).
    os.environ["TZ"] = "UTC"
    time.tzset()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session(settings: Settings, app_name: str = "cdclake") -> Any:
    """Create (or reuse) the process's SparkSession with every setting of this lakehouse."""
    from ingest.lakehouse import check_catalog_reachable

    check_catalog_reachable(settings)  # one line naming the setting, rather than the JVM's stack trace
    prepare_driver_process()
    from pyspark.sql import SparkSession

    conf = driver_spark_conf(settings)  # the driver maps the classes setup archived
    builder = SparkSession.builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
