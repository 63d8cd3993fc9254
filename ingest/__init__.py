"""cdclake: Debezium change events into Iceberg bronze, net-effect silver with dbt on Spark."""

__version__ = "0.1.0"
