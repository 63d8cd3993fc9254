"""One lakehouse and one SparkSession for the whole pytest session (the JVM starts slowly; its conf is fixed).

tests/conftest.py registers the fixture once, so every module gets this one instance (imported into each module,
pytest would make one per module, all sharing the first one's JVM and catalog). Ask for ``spark_lakehouse`` and
mark the tests ``@pytest.mark.spark``. Every Spark test shares this lakehouse, so give tables (or namespaces)
names of their own; ``SparkLakehouse.config()`` writes a cdclake.yml for the same lakehouse with other sections
(a source, namespaces, ingest settings) for CLI runs in the same process.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.config import Settings, load_settings
from tests.conftest import TEST_SPARK_CONF, make_settings
from tests.missing import missing_runtime

# The session's Spark settings: they cannot change once the JVM runs, so every config() copies them.
SPARK_SECTION = {"master": "local[2]", "conf": dict(TEST_SPARK_CONF)}


@dataclass
class SparkLakehouse:
    root: Path
    config_path: Path
    settings: Settings
    spark: Any
    _raw: dict[str, Any]

    def config(self, directory: Path, **sections: Any) -> tuple[Path, Settings]:
        """A cdclake.yml in ``directory`` for this lakehouse plus ``sections``; ``lakehouse=`` entries are merged.

        Catalog, warehouse and Spark settings always stay those of the session (the JVM already has them).
        """
        raw = copy.deepcopy(self._raw)
        for name, value in sections.items():
            if name == "lakehouse":
                fixed = {"warehouse", "catalog_uri", "catalog_name"} & set(value)
                if fixed:
                    raise ValueError(f"the shared lakehouse's {', '.join(sorted(fixed))} cannot change")
                raw["lakehouse"].update(value)
            elif name == "spark":
                raise ValueError("the shared SparkSession's settings cannot change")
            else:
                raw[name] = value
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "cdclake.yml"
        path.write_text(yaml.safe_dump(raw))
        return path, load_settings(path, environ={})


@pytest.fixture(scope="session")
def spark_lakehouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkLakehouse]:
    from ingest.errors import SetupError
    from ingest.lakehouse import load_catalog, spark_jars
    from ingest.spark import spark_session

    try:
        spark_jars()
    except SetupError as exc:
        missing_runtime(str(exc))
    root = tmp_path_factory.mktemp("spark_lakehouse")
    settings = make_settings(root, spark=dict(SPARK_SECTION))
    config_path = root / "cdclake.yml"
    raw = yaml.safe_load(config_path.read_text())
    # pyiceberg creates the catalog tables before the JVM connects (Spark must not: see ingest.lakehouse).
    load_catalog(settings).list_namespaces()
    spark = spark_session(settings, app_name="cdclake-tests")
    try:
        yield SparkLakehouse(root=root, config_path=config_path, settings=settings, spark=spark, _raw=raw)
    finally:
        spark.stop()
