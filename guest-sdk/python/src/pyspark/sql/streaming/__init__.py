"""``pyspark.sql.streaming`` inside a Statebox component: the ``transformWithState`` API,
synchronous (``StatefulProcessor``) and asynchronous (``AsyncStatefulProcessor``, the import
the Databricks documentation uses), and ``tws_tester.TwsTester``."""

from statebox.aio import AsyncStatefulProcessor, AsyncStatefulProcessorHandle
from statebox.processor import StatefulProcessor, StatefulProcessorHandle

__all__ = [
    "AsyncStatefulProcessor",
    "AsyncStatefulProcessorHandle",
    "StatefulProcessor",
    "StatefulProcessorHandle",
]
