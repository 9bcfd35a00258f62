"""An async processor whose handlers suspend between state operations, for
`tests/all/python.rs`: the handlers of the keys of one batched call interleave, and each
key's state stays its own.

Every emitted row carries the steps (from one module-level counter) at which its handler
started and ended, so the test sees the interleaving: in one batched call, every key starts
before any key ends.
"""

import asyncio

from pyspark.sql import Row
from statebox import aio
from statebox.aio import AsyncStatefulProcessor

OUTPUT_SCHEMA = "key string, total long, seen string, parts string, first long, last long"

STEP = [0]


def step():
    STEP[0] += 1
    return STEP[0]


class Interleave(AsyncStatefulProcessor):
    async def init(self, handle):
        self.total = await handle.getValueState("total", "total long")
        self.seen = await handle.getListState("seen", "key string")
        self.parts = await handle.getMapState("parts", "part string", "n long")

    async def handleInputRows(self, key, rows, timerValues):
        first = step()
        n = 0
        async for row in rows:
            n += row.n
        previous = await self.total.get()
        await aio.sleep(0)
        await self.total.update(((previous[0] if previous else 0) + n,))
        await asyncio.sleep(0)
        await self.seen.appendValue((key[0],))
        # Coroutines gathered by a key's handler act on that key too.
        await aio.gather(self.part(key, "a", n), self.part(key, "b", 2 * n))
        await aio.sleep(0)
        total = (await self.total.get())[0]
        seen = [s.key async for s in self.seen.get()]
        parts = [f"{k.part}={v.n}" async for k, v in self.parts.iterator()]
        yield Row(
            key=key[0],
            total=total,
            seen=",".join(seen),
            parts=",".join(parts),
            first=first,
            last=step(),
        )

    async def part(self, key, name, n):
        await aio.sleep(0)
        old = await self.parts.getValue((name,))
        await aio.sleep(0)
        await self.parts.updateValue((name,), ((old[0] if old else 0) + n,))
