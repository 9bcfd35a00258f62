"""Counts rows per grouping key: Spark's SimpleCounterProcessor example, as a PySpark
`transformWithState` processor. It runs unchanged on Spark and, built with
`statebox build-python`, on Statebox (where it gives the same output as `plugins/counter`).

Per key it keeps the rows seen over all batches (`count`), the rows of each call
(`batchCounts`, one element appended per call) and the number of calls (`stats`, a map
entry), and emits one row per call: the key and its number of rows in this call.
"""

import json
from typing import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

OUTPUT_SCHEMA = StructType(
    [StructField("key", StringType()), StructField("count", LongType())]
)

COUNT = StructType([StructField("count", LongType())])
STAT_NAME = StructType([StructField("name", StringType())])
CALLS = ("calls",)


def key_label(key) -> str:
    """A single string column as is, any other single column as its JSON text, several
    columns as the key's JSON array text."""
    if len(key) == 1:
        return key[0] if isinstance(key[0], str) else json.dumps(key[0], separators=(",", ":"))
    return json.dumps(list(key), separators=(",", ":"))


class CounterProcessor(StatefulProcessor):
    # Statebox sends the three writes of a key to the host with other keys' (Spark ignores it).
    HOLD_WRITES = True

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", COUNT)
        self.batch_counts = handle.getListState("batchCounts", COUNT)
        self.stats = handle.getMapState("stats", STAT_NAME, COUNT)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        batch = sum(1 for _ in rows)
        previous = self.count.get()
        self.count.update((batch + (previous[0] if previous else 0),))
        self.batch_counts.appendValue((batch,))
        calls = self.stats.getValue(CALLS)
        self.stats.updateValue(CALLS, ((calls[0] if calls else 0) + 1,))
        yield Row(key=key_label(key), count=batch)

    def close(self) -> None:
        pass
