"""Where raw records come from: a Kafka cluster or a topic dump. Both yield :class:`RawRecord` batches."""

from ingest.sources.base import OffsetResolver, Source

__all__ = ["OffsetResolver", "Source"]
