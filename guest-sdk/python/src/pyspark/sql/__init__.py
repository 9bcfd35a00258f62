"""``pyspark.sql`` inside a Statebox component: ``Row`` and ``types``."""

from statebox.row import Row

from . import types

__all__ = ["Row", "types"]
