"""What a test does when a runtime part it needs (jars, the broker, the PostgreSQL server) is absent."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing_runtime(reason: str) -> NoReturn:
    """Skip on a developer's machine (`make unit` needs none of them); fail in CI (CI=true), where `make test` has
    run the setup first, so a missing part is a broken setup that skipping would hide."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: `make setup` should have provided it)", pytrace=False)
    pytest.skip(reason)
