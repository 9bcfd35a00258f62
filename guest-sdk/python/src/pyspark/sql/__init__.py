"""``pyspark.sql`` inside a Statebox component: ``Row``, ``types``, and for a whole job
script the recording ``SparkSession`` and ``DataFrame`` (see ``statebox._job``)."""

from statebox._job import DataFrame, SparkSession
from statebox.row import Row

from . import types

__all__ = ["DataFrame", "Row", "SparkSession", "types"]
