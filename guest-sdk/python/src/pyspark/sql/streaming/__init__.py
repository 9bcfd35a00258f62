"""``pyspark.sql.streaming`` inside a Statebox component: the ``transformWithState`` API."""

from statebox.processor import StatefulProcessor, StatefulProcessorHandle

__all__ = ["StatefulProcessor", "StatefulProcessorHandle"]
