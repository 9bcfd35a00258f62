"""Fails on the key `boom`, and rejects rows with a negative `n` as bad input rows, for
`tests/all/python.rs`: the error of a batched call names the failing key, and a bad input row
its file and line.

(The SDK reports a row it cannot decode as a bad input row; the host checks JSON syntax
before any call, so this processor raises the SDK's `BadInputRow` itself to reach that path.)
"""

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from statebox._component import BadInputRow

OUTPUT_SCHEMA = "k string, total long"


class Fails(StatefulProcessor):
    def init(self, handle):
        self.total = handle.getValueState("total", "total long")

    def handleInputRows(self, key, rows, timerValues):
        total = 0
        for index, row in enumerate(rows):
            if row.n < 0:
                raise BadInputRow(index, f"n must not be negative, got {row.n}")
            total += row.n
        if key[0] == "boom":
            raise RuntimeError("exploded")  # the host names the key
        self.total.update((total,))
        yield Row(k=key[0], total=total)
