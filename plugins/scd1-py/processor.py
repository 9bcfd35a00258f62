"""Slowly changing dimension, type 1: keeps the latest location of each user by `time`, and
emits a user's row whenever it changes. The PySpark version of `plugins/scd1` (same output).

Rows may arrive out of order: within a batch the newest row wins (the first of equal
times), and a row no newer than the stored one is ignored.
"""

from typing import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

OUTPUT_SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("time", LongType()),
        StructField("location", StringType()),
    ]
)
INPUT_SCHEMA = "user string, time long, location string"


class SCDType1StatefulProcessor(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.latest_location = handle.getValueState(
            "latestLocation",
            StructType([StructField("time", LongType()), StructField("location", StringType())]),
        )

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        newest = None
        for row in rows:
            if newest is None or row.time > newest.time:
                newest = row
        if newest is None:
            return
        stored = self.latest_location.get()
        if stored is not None and stored[0] >= newest.time:
            return
        self.latest_location.update((newest.time, newest.location))
        yield Row(user=newest.user, time=newest.time, location=newest.location)

    def close(self) -> None:
        pass
