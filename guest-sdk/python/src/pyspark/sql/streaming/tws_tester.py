"""``pyspark.sql.streaming.tws_tester``: PySpark's ``TwsTester`` on Statebox's SDK (see
``statebox.tws_tester``)."""

from statebox.tws_tester import TwsTester

__all__ = ["TwsTester"]
