"""Statebox's Python SDK: write stateful stream processors with PySpark's
``transformWithState`` API and run them as sandboxed WebAssembly components.

A processor subclasses :class:`StatefulProcessor` (or :class:`AsyncStatefulProcessor`) and is
built with ``statebox build-python processor.py -o processor.wasm``. Inside the component,
``pyspark.sql.streaming``, ``pyspark.sql`` (``Row``) and ``pyspark.sql.types`` are this SDK,
so a PySpark processor builds unchanged.
"""

from . import log, types
from .aio import AsyncStatefulProcessor, AsyncStatefulProcessorHandle
from .processor import (
    ExpiredTimerInfo,
    ListState,
    MapState,
    QueryInfo,
    StateError,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimeMode,
    TimerValues,
    ValueState,
)
from .row import Row
from .types import StructField, StructType

__all__ = [
    "AsyncStatefulProcessor",
    "AsyncStatefulProcessorHandle",
    "ExpiredTimerInfo",
    "ListState",
    "MapState",
    "QueryInfo",
    "Row",
    "StateError",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "StructField",
    "StructType",
    "TimeMode",
    "TimerValues",
    "ValueState",
    "log",
    "types",
]
