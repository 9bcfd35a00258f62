"""The counter (`plugins/counter-py`) as an asynchronous processor: `async def` handlers,
awaited state operations. It declares the same variables with the same schemas, so it and
the synchronous counter can take turns on one checkpoint.
"""

import json

from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType
from statebox.aio import AsyncStatefulProcessor

OUTPUT_SCHEMA = "key string, count long"

COUNT = StructType([StructField("count", LongType())])
STAT_NAME = StructType([StructField("name", StringType())])
CALLS = ("calls",)


def key_label(key) -> str:
    if len(key) == 1:
        return key[0] if isinstance(key[0], str) else json.dumps(key[0], separators=(",", ":"))
    return json.dumps(list(key), separators=(",", ":"))


class AsyncCounterProcessor(AsyncStatefulProcessor):
    async def init(self, handle) -> None:
        self.count = await handle.getValueState("count", COUNT)
        self.batch_counts = await handle.getListState("batchCounts", COUNT)
        self.stats = await handle.getMapState("stats", STAT_NAME, COUNT)

    async def handleInputRows(self, key, rows, timerValues):
        batch = 0
        async for _ in rows:
            batch += 1
        previous = await self.count.get()
        await self.count.update((batch + (previous[0] if previous else 0),))
        await self.batch_counts.appendValue((batch,))
        calls = await self.stats.getValue(CALLS)
        await self.stats.updateValue(CALLS, ((calls[0] if calls else 0) + 1,))
        yield Row(key=key_label(key), count=batch)

    async def close(self) -> None:
        pass
