"""``pyspark.sql.functions`` for a job script: column references by name."""

from statebox._job import col

column = col

__all__ = ["col", "column"]
