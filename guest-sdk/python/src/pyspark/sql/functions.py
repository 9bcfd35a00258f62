"""``pyspark.sql.functions`` for a job script: column references by name, and
``from_json`` to parse a Kafka record's value."""

from statebox._job import col, column, from_json

__all__ = ["col", "column", "from_json"]
