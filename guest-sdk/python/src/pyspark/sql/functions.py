"""``pyspark.sql.functions`` for a job script: column references by name, and
``from_json`` to parse a Kafka record's value. Any other public name imports (a pasted file
often imports more than it uses) as a function that fails with the caller's file and line
when called, and that a handler cannot use (the build names the line)."""

from statebox._job import SparkFunction, col, column, from_json

__all__ = ["col", "column", "from_json"]


def __getattr__(name):
    if name.startswith("_"):
        raise AttributeError(f"module 'pyspark.sql.functions' has no attribute {name!r}")
    return SparkFunction(name)
