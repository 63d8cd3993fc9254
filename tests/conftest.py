"""Shared fixtures. Spark, the broker and dbt are started once per test session (they start slowly)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ingest.config import Settings, load_settings

FIXTURES = Path(__file__).parent / "fixtures"
os.environ.setdefault("TZ", "UTC")
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")


def make_settings(root: Path, **sections: Any) -> Settings:
    """Settings for a lakehouse under ``root`` (SQLite catalog), written as a real cdclake.yml."""
    import yaml

    config: dict[str, Any] = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
        **sections,
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cdclake.yml"
    path.write_text(yaml.safe_dump(config))
    return load_settings(path, environ={})


@pytest.fixture
def lakehouse(tmp_path: Path) -> Path:
    return tmp_path / "lakehouse"
