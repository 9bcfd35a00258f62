"""Processors for the TwsTester suite (``test_tws_tester.py``), shaped after the ones Spark's
own TwsTester tests use: a running count, top-k scores in list state, word frequencies in
map state, one that exercises every state method, processing-time and event-time timers.
The file builds into a component unchanged (``--class NAME``), so the suite also runs
against the real host. Each class carries its output schema (several share the file)."""

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import DoubleType, IntegerType, StringType, StructField, StructType


class RunningCount(StatefulProcessor):
    outputSchema = "key string, count int"

    def init(self, handle):
        self.count = handle.getValueState(
            "count", StructType([StructField("count", IntegerType())])
        )

    def handleInputRows(self, key, rows, timerValues):
        count = self.count.get()[0] if self.count.exists() else 0
        count += sum(1 for _ in rows)
        self.count.update((count,))
        yield Row(key=key[0], count=count)

    def handleInitialState(self, key, initialState, timerValues):
        self.count.update((initialState.initial_count,))


class TopK(StatefulProcessor):
    outputSchema = "key string, score double"
    k = 2

    def init(self, handle):
        self.top = handle.getListState("topK", StructType([StructField("score", DoubleType())]))

    def handleInputRows(self, key, rows, timerValues):
        scores = [s[0] for s in self.top.get()] + [r.score for r in rows]
        best = sorted(scores, reverse=True)[: self.k]
        self.top.put([(s,) for s in best])
        for s in best:
            yield Row(key=key[0], score=s)


class WordFrequency(StatefulProcessor):
    outputSchema = "key string, word string, count int"

    def init(self, handle):
        self.freq = handle.getMapState("frequencies", "word string", "count int")

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            old = self.freq.getValue((row.word,))
            count = (old[0] if old else 0) + 1
            self.freq.updateValue((row.word,), (count,))
            yield Row(key=key[0], word=row.word, count=count)


class AllMethods(StatefulProcessor):
    outputSchema = "key string, result string"

    def init(self, handle):
        self.value = handle.getValueState("value", "v int")
        self.items = handle.getListState("items", "item string")
        self.entries = handle.getMapState("entries", "k string", "v int")

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            cmd = row.cmd
            if cmd == "value-exists":
                out = str(self.value.exists())
            elif cmd == "value-set":
                self.value.update((42,))
                out = "done"
            elif cmd == "value-clear":
                self.value.clear()
                out = "done"
            elif cmd == "list-exists":
                out = str(self.items.exists())
            elif cmd == "list-append":
                self.items.appendValue(("a",))
                self.items.appendValue(("b",))
                out = "done"
            elif cmd == "list-append-array":
                self.items.appendList([("c",), ("d",)])
                out = "done"
            elif cmd == "list-get":
                out = ",".join(i[0] for i in self.items.get())
            elif cmd == "map-exists":
                out = str(self.entries.exists())
            elif cmd == "map-add":
                for k, v in (("x", 1), ("y", 2), ("z", 3)):
                    self.entries.updateValue((k,), (v,))
                out = "done"
            elif cmd == "map-keys":
                out = ",".join(k[0] for k in self.entries.keys())
            elif cmd == "map-values":
                out = ",".join(str(v[0]) for v in self.entries.values())
            elif cmd == "map-iterator":
                out = ",".join(f"{k[0]}={v[0]}" for k, v in self.entries.iterator())
            elif cmd == "map-remove":
                self.entries.removeKey(("y",))
                out = "done"
            elif cmd == "map-clear":
                self.entries.clear()
                out = "done"
            else:
                out = "unknown"
            yield Row(key=key[0], result=f"{cmd}:{out}")


class SessionTimeout(StatefulProcessor):
    """Processing time: each input restarts a 1 s timeout; the timeout emits the count."""

    outputSchema = "key string, event string, n long, at long"

    def init(self, handle):
        self.handle = handle
        self.seen = handle.getValueState("seen", "n long")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.seen.get() or (0,))[0] + sum(1 for _ in rows)
        self.seen.update((n,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        now = timerValues.getCurrentProcessingTimeInMs()
        self.handle.registerTimer(now + 1000)
        yield Row(key=key[0], event="input", n=n, at=now)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        n = self.seen.get()[0]
        self.seen.clear()
        yield Row(key=key[0], event="timeout", n=n, at=expiredTimerInfo.getExpiryTimeInMs())


class EventTimeCount(StatefulProcessor):
    """Event time: counts rows on time; a timer 10 ms after the latest event emits the count."""

    outputSchema = "key string, count long, fired long"

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        count = (self.count.get() or (0,))[0]
        latest = None
        for row in rows:
            count += 1
            latest = row.time if latest is None else max(latest, row.time)
        self.count.update((count,))
        if latest is not None:
            self.handle.registerTimer(latest + 10)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(key=key[0], count=self.count.get()[0], fired=expiredTimerInfo.getExpiryTimeInMs())
