"""Exception types. Each names the record, table or setting at fault in its message."""

from __future__ import annotations


class CdclakeError(Exception):
    """Base class of every error cdclake raises on purpose."""


class ConfigError(CdclakeError):
    """The configuration is missing, malformed or inconsistent; the message names the key."""


class CatalogUnavailableError(CdclakeError):
    """The Iceberg catalog's database cannot be opened (unreachable, refused, bad credentials)."""


class DecodeError(CdclakeError):
    """A record cannot be decoded. Such records go to the dead-letter table with this message as reason."""


class TypeConflictError(DecodeError):
    """A column's type changed in a way that cannot widen (names table, column and both types)."""


class CommitError(CdclakeError):
    """A bronze commit kept failing after the configured number of attempts."""


class SetupError(CdclakeError):
    """A runtime part (jars, broker, Spark) is missing; the message says which `make` target installs it."""
