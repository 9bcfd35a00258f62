"""Watches sensors' heartbeats with processing-time timers: a sensor is `up` from its first
heartbeat and `down` once 10 s of processing time pass without one. The PySpark version of
`plugins/heartbeat-monitor` (same output); run it in processing-time mode.

Each heartbeat re-arms the sensor's timer (deleting the previous one); the timer firing
reports `down`. Status changes are emitted, repeated heartbeats are not.
"""

import json
from typing import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

OUTPUT_SCHEMA = "sensor string, status string"

TIMEOUT_MS = 10_000


def sensor_name(key) -> str:
    if len(key) == 1:
        return key[0] if isinstance(key[0], str) else json.dumps(key[0], separators=(",", ":"))
    return json.dumps(list(key), separators=(",", ":"))


class HeartbeatMonitor(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.status = handle.getValueState(
            "status", StructType([StructField("status", StringType())])
        )
        self.deadline = handle.getValueState(
            "deadline", StructType([StructField("deadline", LongType())])
        )

    def report(self, key, status):
        self.status.update((status,))
        return Row(sensor=sensor_name(key), status=status)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        if next(iter(rows), None) is None:
            return
        current = self.status.get()
        if current is None or current[0] != "up":
            yield self.report(key, "up")
        previous = self.deadline.get()
        if previous is not None:
            self.handle.deleteTimer(previous[0])
        deadline = timerValues.getCurrentProcessingTimeInMs() + TIMEOUT_MS
        self.handle.registerTimer(deadline)
        self.deadline.update((deadline,))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        deadline = self.deadline.get()
        if deadline is None or deadline[0] != expiredTimerInfo.getExpiryTimeInMs():
            return
        self.deadline.clear()
        yield self.report(key, "down")

    def close(self) -> None:
        pass
