"""Kafka's default partitioner (murmur2 of the key bytes), so fakes land keys where a real producer would.

Port of ``org.apache.kafka.common.utils.Utils.murmur2`` and ``toPositive(murmur2(key)) % partitions``.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2, returned as a signed Java ``int``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length & ~3
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition the Java producer's default partitioner picks for a non-null key."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
