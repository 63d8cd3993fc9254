"""Bronze: append-only Iceberg tables holding every change record exactly once."""
