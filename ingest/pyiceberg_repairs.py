"""A repair of a pyiceberg (0.12) bug that changes data; applied once, when cdclake loads a catalog.

A null list of structs is written, and read, as an empty list (apache/iceberg-python#3833): pyiceberg's schema
projection rebuilds such a list from its offsets, which carry no nulls. In bronze, null and empty differ: a record
without Kafka headers against one with none left (``_cdc_headers``), a source's NULL array of structs against an
empty one. The repair puts the nulls back on what pyiceberg built, as the upstream fix (#3834) does within it;
``tests/test_bronze_file.py`` holds bronze to it.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io.pyarrow import ArrowProjectionVisitor

_project_list = ArrowProjectionVisitor.list


def _list_keeping_nulls(self: ArrowProjectionVisitor, list_type: Any, list_array: Any, value_array: Any) -> Any:
    projected = _project_list(self, list_type, list_array, value_array)
    if projected is None or not list_array.null_count or projected.null_count == list_array.null_count:
        return projected
    return type(projected).from_arrays(
        projected.offsets, projected.values, type=projected.type, mask=list_array.is_null()
    )


def apply() -> None:
    """Idempotent."""
    ArrowProjectionVisitor.list = _list_keeping_nulls  # type: ignore[method-assign]
