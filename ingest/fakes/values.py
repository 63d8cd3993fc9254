"""Deterministic fake column values: readable, typed, and spread over the interesting ranges.

Values include negatives, NULLs, pre-epoch dates and sub-second timestamps so type mapping downstream is
exercised, while staying exactly representable (no float rounding noise between Python and Java).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from random import Random

Gen = Callable[[Random, int], object]

FIRST_NAMES = (
    "Sally",
    "George",
    "Edward",
    "Anne",
    "John",
    "Maria",
    "Wei",
    "Aisha",
    "Lars",
    "Chloé",
    "Kenji",
    "Olga",
)
LAST_NAMES = (
    "Thomas",
    "Bailey",
    "Walker",
    "Kretchmar",
    "Doe",
    "García",
    "Zhang",
    "Khan",
    "Nilsson",
    "Dubois",
    "Sato",
)
_OFFSETS = (timedelta(0), timedelta(hours=1), timedelta(hours=2), timedelta(hours=-5), timedelta(hours=5, minutes=30))


def first_name(rng: Random, _key: int) -> object:
    return rng.choice(FIRST_NAMES)


def last_name(rng: Random, _key: int) -> object:
    return rng.choice(LAST_NAMES)


def email(rng: Random, key: int) -> object:
    return f"user{key}.{rng.randrange(10_000):04d}@example.org"


def decimal(precision: int, scale: int) -> Gen:
    """DECIMAL(p, s) values, about a fifth negative, never wider than the column."""
    limit = 10 ** (precision - 1)

    def gen(rng: Random, _key: int) -> object:
        unscaled = rng.randrange(-limit // 4, limit)
        return Decimal(unscaled).scaleb(-scale)

    return gen


def birth_date(nullable: bool) -> Gen:
    """Dates from 1940 to 2005 (pre-epoch ones included); NULL one time in eight when ``nullable``."""

    def gen(rng: Random, _key: int) -> object:
        if nullable and rng.random() < 0.125:
            return None
        return date(1940, 1, 1) + timedelta(days=rng.randrange(365 * 65))

    return gen


def date_time(nullable: bool) -> Gen:
    """Oracle DATE: a date with a time of day to the second (pre-epoch included); NULL one time in eight."""

    def gen(rng: Random, _key: int) -> object:
        if nullable and rng.random() < 0.125:
            return None
        return datetime(1940, 1, 1) + timedelta(seconds=rng.randrange(65 * 365 * 86_400))

    return gen


def naive_timestamp(resolution_us: int) -> Gen:
    """Naive (zone-less) timestamps in 2020-2024 at the given resolution in microseconds."""

    def gen(rng: Random, _key: int) -> object:
        micros = rng.randrange(0, 5 * 365 * 86_400 * 1_000_000, resolution_us)
        return datetime(2020, 1, 1) + timedelta(microseconds=micros)

    return gen


def zoned_timestamp(rng: Random, _key: int) -> object:
    """Aware timestamps with assorted offsets (TIMESTAMP WITH TIME ZONE keeps the offset)."""
    micros = rng.randrange(0, 5 * 365 * 86_400 * 1_000_000, 10)
    offset = rng.choice(_OFFSETS)
    utc = datetime(2020, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return utc.astimezone(timezone(offset))


def integer(low: int, high: int) -> Gen:
    def gen(rng: Random, _key: int) -> object:
        return rng.randint(low, high)

    return gen


def quarter_steps(nullable: bool) -> Gen:
    """Doubles on a 0.25 grid: exact in binary, printed identically by Jackson and orjson."""

    def gen(rng: Random, _key: int) -> object:
        if nullable and rng.random() < 0.125:
            return None
        return rng.randrange(0, 21) / 4

    return gen


def boolean(rng: Random, _key: int) -> object:
    return rng.random() < 0.7
