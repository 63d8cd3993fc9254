"""Appending a flush to a bronze table: pyiceberg's ``Transaction.append``, minus a copy of the data, and able to
append the files an earlier attempt of the same commit wrote.

For a partitioned table, pyiceberg (0.12) filters the Arrow table once per partition value and combines the chunks
of each part, copying every row twice before the Parquet writer sees it: a good part of a bronze commit's CPU time.
Bronze is partitioned by the day of ``_cdc_ingested_at``, and a flush nearly always holds one day; then its rows are
handed to pyiceberg's own file writer as they are, with the partition key pyiceberg would have computed. Any other
case (a flush across midnight, another partition spec) takes the data-file writer of ``Transaction.append``.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    _dataframe_to_data_files,
    bin_pack_arrow_table,
    pyarrow_to_schema,
    write_file,
)
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table import (
    DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE,
    TableProperties,
    Transaction,
    WriteTask,
)
from pyiceberg.transforms import DayTransform
from pyiceberg.typedef import EMPTY_DICT
from pyiceberg.utils.config import Config
from pyiceberg.utils.properties import property_as_int


def append(
    transaction: Transaction,
    data: pa.Table,
    snapshot_properties: dict[str, str] = EMPTY_DICT,
    written: Sequence[DataFile] | None = None,
) -> list[DataFile]:
    """``transaction.append(data, snapshot_properties)``, with the same snapshot, files and statistics. ``written``:
    the files an earlier attempt wrote of the same ``data`` for the same schema and spec, appended instead of
    writing them again. Returns the data files appended."""
    metadata = transaction.table_metadata
    downcast = Config().get_bool(DOWNCAST_NS_TIMESTAMP_TO_US_ON_WRITE) or False
    _check_pyarrow_schema_compatible(
        metadata.schema(),
        provided_schema=data.schema,
        downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version,
    )
    with transaction._append_snapshot_producer(snapshot_properties) as append_files:
        if written is not None:
            files = list(written)
        elif not data.num_rows:
            files = []
        elif (key := _single_day(transaction, data)) is None:
            io = transaction._table.io
            files = list(_dataframe_to_data_files(metadata, data, io, write_uuid=append_files.commit_uuid))
        else:
            files = list(_data_files(transaction, data, key, downcast, append_files.commit_uuid))
        for data_file in files:
            append_files.append_data_file(data_file)
    return files


def _single_day(transaction: Transaction, data: pa.Table) -> PartitionKey | None:
    """The partition key of ``data`` when the spec is one day transform and every row falls on one day."""
    metadata = transaction.table_metadata
    spec, schema = metadata.spec(), metadata.schema()
    if data.num_rows == 0 or len(spec.fields) != 1 or not isinstance(spec.fields[0].transform, DayTransform):
        return None
    partition_field = spec.fields[0]
    source = schema.find_field(partition_field.source_id)
    if source.name not in data.column_names:
        return None
    days = partition_field.transform.pyarrow_transform(source.field_type)(data.column(source.name))
    bounds = pc.min_max(days)
    if days.null_count or bounds["min"].as_py() != bounds["max"].as_py():
        return None
    # As pyiceberg's _determine_partitions takes it: the transformed value, as a Python value.
    value = bounds["min"].as_py()
    return PartitionKey([PartitionFieldValue(partition_field, value)], spec, schema)


def _data_files(
    transaction: Transaction, data: pa.Table, key: PartitionKey, downcast: bool, write_uuid: uuid.UUID
) -> Iterator[DataFile]:
    """pyiceberg's ``_dataframe_to_data_files`` for one known partition (no filter): the rows in one piece, as
    pyiceberg hands them over (its schema projection runs once per piece, ~2 ms each; a flush has one per poll)."""
    data = data.combine_chunks()
    metadata = transaction.table_metadata
    target_file_size = property_as_int(
        metadata.properties,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES,
        TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT,
    )
    assert target_file_size is not None
    task_schema = pyarrow_to_schema(
        data.schema,
        name_mapping=metadata.schema().name_mapping,
        downcast_ns_timestamp_to_us=downcast,
        format_version=metadata.format_version,
    )
    counter = itertools.count(0)
    tasks: Iterable[WriteTask] = (
        WriteTask(
            write_uuid=write_uuid,
            task_id=next(counter),
            record_batches=batches,
            partition_key=key,
            schema=task_schema,
        )
        for batches in bin_pack_arrow_table(data, target_file_size)
    )
    return write_file(io=transaction._table.io, table_metadata=metadata, tasks=iter(tasks))
