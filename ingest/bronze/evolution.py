"""Schema evolution for bronze: union a record's columns into the table's, widening only where Iceberg can.

Allowed: new columns (also nested struct fields), int -> long, float -> double, decimal(P,S) -> decimal(P',S) with
P' >= P (not in a map's key: Iceberg never changes one). Anything else raises :class:`TypeConflictError` naming
table, column and both types, so a type flip after a connector restart never turns into silent coercion
(memiiso/debezium-server-iceberg#49, #572, #580); so does a new column whose name differs from one the table has
only in case (Spark, case-insensitive, could not read either).
"""

from __future__ import annotations

import pyarrow as pa

from ingest.errors import TypeConflictError


def _normalize(data_type: pa.DataType) -> pa.DataType:
    """pyiceberg reads strings/binaries/lists back as their large variants; they are the same Iceberg type."""
    if pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type):
        return pa.binary()
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp("us", tz="UTC")
    return data_type


def _is_list(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_list(data_type) or pa.types.is_large_list(data_type))


def _merge_type(table: str, path: str, current: pa.DataType, incoming: pa.DataType) -> pa.DataType:
    current, incoming = _normalize(current), _normalize(incoming)
    if current.equals(incoming):
        return current
    if pa.types.is_struct(current) and pa.types.is_struct(incoming):
        return pa.struct(_merge_fields(table, path + ".", list(current), list(incoming)))
    if _is_list(current) and _is_list(incoming):
        return pa.list_(_merge_type(table, path + ".element", current.value_type, incoming.value_type))
    if pa.types.is_map(current) and pa.types.is_map(incoming):
        if not _normalize_deep(current.key_type).equals(_normalize_deep(incoming.key_type)):
            raise TypeConflictError(
                f"table {table}: column {path}.key changed type from {current.key_type} to {incoming.key_type}; "
                "Iceberg never changes a map's key type: migrate the table (or map the topic to a new table) and "
                "restart"
            )
        value = _merge_type(table, path + ".value", current.item_type, incoming.item_type)
        return pa.map_(current.key_type, value)
    if pa.types.is_integer(current) and pa.types.is_integer(incoming):
        return pa.int64() if pa.int64() in (current, incoming) else current
    if pa.types.is_floating(current) and pa.types.is_floating(incoming):
        return pa.float64()
    if pa.types.is_decimal(current) and pa.types.is_decimal(incoming) and current.scale == incoming.scale:
        return current if current.precision >= incoming.precision else incoming
    raise TypeConflictError(
        f"table {table}: column {path} changed type from {current} to {incoming}, which cannot widen; "
        "migrate the table (or map the topic to a new table) and restart"
    )


def _merge_fields(table: str, prefix: str, current: list[pa.Field], incoming: list[pa.Field]) -> list[pa.Field]:
    merged: dict[str, pa.Field] = {field.name: field for field in current}
    folded = {field.name.lower(): field.name for field in current}
    for field in incoming:
        existing = merged.get(field.name)
        if existing is None:
            other = folded.get(field.name.lower())
            if other is not None:
                raise TypeConflictError(
                    f"table {table}: column {prefix}{field.name} differs from column {prefix}{other} only in case, "
                    "which Spark (case-insensitive) cannot tell apart; migrate the table (or map the topic to a new "
                    "table) and restart"
                )
            merged[field.name] = pa.field(field.name, _normalize_deep(field.type), nullable=True)
            folded[field.name.lower()] = field.name
        else:
            merged_type = _merge_type(table, prefix + field.name, existing.type, field.type)
            merged[field.name] = pa.field(field.name, merged_type, nullable=True)
    return list(merged.values())


def _normalize_deep(data_type: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(data_type):
        return pa.struct([pa.field(f.name, _normalize_deep(f.type), nullable=True) for f in data_type])
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(_normalize_deep(data_type.value_type))
    if pa.types.is_map(data_type):
        return pa.map_(_normalize_deep(data_type.key_type), _normalize_deep(data_type.item_type))
    return _normalize(data_type)


def merge_schemas(table: str, current: pa.Schema | None, incoming: pa.Schema) -> pa.Schema:
    """The union of ``current`` (the table) and ``incoming`` (a record); raises on a type that cannot widen."""
    if current is None:
        return pa.schema([pa.field(f.name, _normalize_deep(f.type), nullable=True) for f in incoming])
    return pa.schema(_merge_fields(table, "", list(current), list(incoming)))


def normalized(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _normalize_deep(f.type), nullable=True) for f in schema])
