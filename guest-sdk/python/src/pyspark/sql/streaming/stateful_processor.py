"""``pyspark.sql.streaming.stateful_processor`` inside a Statebox component."""

from statebox.processor import (  # noqa: F401
    ExpiredTimerInfo,
    ListState,
    MapState,
    QueryInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
)

__all__ = [
    "ExpiredTimerInfo",
    "ListState",
    "MapState",
    "QueryInfo",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TimerValues",
    "ValueState",
]
