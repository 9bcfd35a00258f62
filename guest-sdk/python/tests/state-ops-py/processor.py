"""Exercises every state, timer and initial-state operation of the Python SDK inside a
component; driven by `tests/scenarios/python-sdk-state-ops-py.json`, which states what each
operation must return."""

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

OUTPUT_SCHEMA = "k string, op string, result string"


class Ops(StatefulProcessor):
    # Writes held back and sent together: the scenario's expectations, those of writes made
    # one by one, must hold with them (plugins/counter-py and the other examples write
    # through).
    HOLD_WRITES = True

    def init(self, handle):
        self.handle = handle
        handle.deleteIfExists("dropped")
        self.value = handle.getValueState("value", "n long, tag string")
        self.items = handle.getListState("items", StructType([StructField("n", LongType())]))
        self.map = handle.getMapState("map", "name string", "n long", ttlDurationMs=10_000)
        self.bare = handle.getValueState("bare", "array<string>")

    def handleInitialState(self, key, initialState, timerValues):
        self.value.update((initialState.n, "initial"))
        self.handle.registerTimer(initialState.n)

    def handleInputRows(self, key, rows, timerValues):
        k = key[0]
        for row in rows:
            if row.op == "append":
                self.items.appendValue((row.n,))
                self.items.appendList([(row.n + 1,), (row.n + 2,)])
            elif row.op == "put":
                self.items.put([(row.n,)])
            elif row.op == "map":
                self.map.updateValue((row.name,), (row.n,))
            elif row.op == "remove":
                self.map.removeKey((row.name,))
            elif row.op == "bare":
                self.bare.update(["a", row.name])
            elif row.op == "timer":
                self.handle.registerTimer(row.n)
            elif row.op == "untimer":
                self.handle.deleteTimer(row.n)
            elif row.op == "clear":
                self.items.clear()
                self.map.clear()
                self.value.clear()
        yield Row(k=k, op="value", result=str(self.value.get()))
        yield Row(k=k, op="items", result=str([t.n for t in self.items.get()]))
        yield Row(k=k, op="map", result=str(list(self.map.iterator())))
        yield Row(k=k, op="keys", result=str([k_.name for k_ in self.map.keys()]))
        yield Row(k=k, op="values", result=str(list(self.map.values())))
        yield Row(k=k, op="contains", result=str(self.map.containsKey(("a",))))
        yield Row(k=k, op="exists", result=str((self.value.exists(), self.items.exists(), self.map.exists())))
        yield Row(k=k, op="bare", result=str(self.bare.get()))
        yield Row(k=k, op="timers", result=str(list(self.handle.listTimers())))
        yield Row(k=k, op="time", result=str(timerValues.getCurrentProcessingTimeInMs()))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(k=key[0], op="fired", result=str((expiredTimerInfo.getExpiryTimeInMs(), list(self.handle.listTimers()))))
