"""Statebox's stand-in for PySpark inside a processor component: the parts of
``pyspark.sql`` a ``transformWithState`` processor uses, backed by the Statebox SDK."""
