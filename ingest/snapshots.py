"""Iceberg snapshot lineage as `cdclake status` and `cdclake maintain` read it, and the silver properties that name
the bronze snapshot silver has applied and bronze's row count there (written by the dbt package's cdc_silver
materialization)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

log = logging.getLogger(__name__)

APPLIED_SNAPSHOT_PROPERTY = "cdclake.bronze_snapshot_id"
APPLIED_RECORDS_PROPERTY = "cdclake.bronze_records"
# {"from": the snapshot the next run reads bronze again from, "ids": the held transactions, first held first,
# "since": per id, the snapshot the run that first held it began after, "match": "xid" or "id", how ids are matched}:
# the changes of source transactions not yet complete (complete_transactions; dbt_cdclake/macros/transactions.sql).
HELD_TRANSACTIONS_PROPERTY = "cdclake.held_transactions"


def ancestors(table: Table) -> Iterator[Snapshot]:
    """The current snapshot and its ancestors, newest first.

    pyiceberg's ``ancestors_of`` looks each parent up with a scan of every snapshot, which makes a walk quadratic in
    the table's snapshots (a bronze table committing every few seconds keeps tens of thousands): one dict instead.
    """
    by_id = {snapshot.snapshot_id: snapshot for snapshot in table.snapshots()}
    snapshot = table.current_snapshot()
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None


def silver_positions(
    catalog: Catalog, bronze_namespace: str, loaded: dict[str, Table] | None = None, held: bool = False
) -> dict[int, list[str]]:
    """Bronze snapshot id -> the silver tables that have applied up to it (several models of one bronze table, a
    current state and a history, usually stand at the same snapshot), in any namespace but bronze's: a dbt model
    with a `schema` of its own (dbt writes it to `silver_<schema>`) applies bronze too. ``loaded``, when given,
    receives those tables by identifier (a caller that reads them next need not load them again). With ``held``,
    also the snapshot a silver table holding incomplete transactions reads again from (its next run needs it)."""
    positions: dict[int, list[str]] = {}
    namespaces = sorted(".".join(namespace) for namespace in catalog.list_namespaces())
    for namespace in namespaces:
        if namespace == bronze_namespace:
            continue
        for name in _table_names(catalog, namespace):
            try:
                table = catalog.load_table(f"{namespace}.{name}")
            except NoSuchTableError:
                continue
            except Exception as exc:  # an unreadable table (its metadata file gone) applies nothing anyone can see
                log.warning(
                    "%s.%s cannot be read (%s: %s): not counted as a silver table",
                    namespace,
                    name,
                    type(exc).__name__,
                    exc,
                )
                continue
            value = integer_property(table.properties.get(APPLIED_SNAPSHOT_PROPERTY))
            if value is not None:
                positions.setdefault(value, []).append(f"{namespace}.{name}")
                if loaded is not None:
                    loaded[f"{namespace}.{name}"] = table
                held_from = held_from_snapshot(table) if held else None
                if held_from is not None and held_from != value:
                    positions.setdefault(held_from, []).append(f"{namespace}.{name} (its held transactions)")
    return positions


def held_from_snapshot(table: Table) -> int | None:
    """The bronze snapshot silver ``table`` reads again from at its next run, while it holds the changes of
    incomplete source transactions (None when it holds none, or holds them since its first run)."""
    start = _held(table).get("from")
    return integer_property(start) if isinstance(start, str) else None


def held_transaction_count(table: Table) -> int:
    """How many source transactions silver ``table`` holds the changes of until they are complete."""
    ids = _held(table).get("ids")
    return len(ids) if isinstance(ids, list) else 0


def _held(table: Table) -> dict[str, Any]:
    try:
        held = json.loads(table.properties.get(HELD_TRANSACTIONS_PROPERTY) or "null")
    except ValueError:
        return {}
    return held if isinstance(held, dict) and held.get("ids") else {}


def integer_property(value: str | None) -> int | None:
    """A table property that holds an integer (a snapshot id, a count), or None: missing, or not an integer."""
    if value is None or not value.isascii():  # int() takes other digits too ("１２")
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _table_names(catalog: Catalog, namespace: str) -> list[str]:
    try:
        return sorted(identifier[-1] for identifier in catalog.list_tables(namespace))
    except NoSuchNamespaceError:
        return []
