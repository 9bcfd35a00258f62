"""Asynchronous processors: ``async def`` handlers, awaited state and timer operations,
``async for`` over list, map and timer iterators.

An :class:`AsyncStatefulProcessor` has the same methods as a ``StatefulProcessor`` but as
coroutines; ``handleInputRows`` and ``handleExpiredTimer`` are async generators
(``yield Row(...)``) or coroutines returning an iterable of rows. State is the same as the
synchronous API's (same variables, same stored values), so a processor can move between the
two on one checkpoint.

Calls run on a small cooperative scheduler of the SDK's own (``asyncio``'s event loop needs
sockets, which the sandbox does not have). The host hands the component many keys per call
(the ``batch-processor`` export); the handlers of all those keys run at once, each key's
calls strictly in order, different keys interleaving whenever one suspends (``await
statebox.aio.sleep(0)``, ``await asyncio.sleep(0)``, :func:`gather`). Before resuming a task,
the scheduler makes that task's key the host's current key (``keys.use-key``), so every
state and timer operation acts on the key of the handler that makes it; coroutines started
by :func:`gather` inside a handler belong to that handler's key. :func:`run_keys` is the same
scheduler for per-key call chains.
"""

import types as _types

from .processor import ExpiredTimerInfo, StatefulProcessorHandle, TimerValues

__all__ = [
    "AsyncStatefulProcessor",
    "AsyncStatefulProcessorHandle",
    "AsyncValueState",
    "AsyncListState",
    "AsyncMapState",
    "TimerValues",
    "ExpiredTimerInfo",
    "gather",
    "sleep",
    "run_keys",
    "run_entries",
    "run",
]


class AsyncStatefulProcessor:
    """An asynchronous stateful processor: ``async def init(self, handle)``,
    ``async def handleInputRows(self, key, rows, timerValues)`` yielding ``Row``s,
    ``async def handleExpiredTimer(self, key, timerValues, expiredTimerInfo)``,
    ``async def handleInitialState(self, key, initialState, timerValues)``,
    ``async def close(self)``."""

    async def init(self, handle):
        raise NotImplementedError("an AsyncStatefulProcessor must implement async def init(self, handle)")

    async def handleInputRows(self, key, rows, timerValues):
        raise NotImplementedError(
            "an AsyncStatefulProcessor must implement "
            "async def handleInputRows(self, key, rows, timerValues)"
        )

    async def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        return ()

    async def handleInitialState(self, key, initialState, timerValues):
        return None

    async def close(self):
        return None


class _Awaitable:
    """Mixin: ``await obj`` is ``obj``. The async handle's declarations and timer calls run
    at once and return such objects, so both spellings in use work: the Databricks
    documentation's ``self.count = handle.getValueState(...)`` (creating state objects stays
    synchronous) and ``await handle.getValueState(...)``."""

    __slots__ = ()

    def __await__(self):
        return self
        yield  # noqa: unreachable - makes this a generator that finishes at once


class _Done(_Awaitable):
    """The result of an operation that already ran: awaiting it is optional."""

    __slots__ = ()


_DONE = _Done()


class _AsyncPages(_Awaitable):
    """An async iterator over a synchronous one (a paged host iterator); also iterable with
    plain ``for``, and ``await``-able (giving itself)."""

    __slots__ = ("_it",)

    def __init__(self, it):
        self._it = it

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self._it)
        except StopIteration:
            raise StopAsyncIteration from None

    def __iter__(self):
        return self._it


class AsyncValueState(_Awaitable):
    """``ValueState`` with awaitable operations."""

    __slots__ = ("_s",)

    def __init__(self, state):
        self._s = state

    async def exists(self):
        return self._s.exists()

    async def get(self):
        return self._s.get()

    async def update(self, newValue):
        self._s.update(newValue)

    async def clear(self):
        self._s.clear()


class AsyncListState(_Awaitable):
    """``ListState`` with awaitable operations; ``get()`` is used with ``async for``."""

    __slots__ = ("_s",)

    def __init__(self, state):
        self._s = state

    async def exists(self):
        return self._s.exists()

    def get(self):
        return _AsyncPages(self._s.get())

    async def put(self, newState):
        self._s.put(newState)

    async def appendValue(self, newState):
        self._s.appendValue(newState)

    async def appendList(self, newState):
        self._s.appendList(newState)

    async def clear(self):
        self._s.clear()


class AsyncMapState(_Awaitable):
    """``MapState`` with awaitable operations; ``iterator()``, ``keys()`` and ``values()``
    are used with ``async for``."""

    __slots__ = ("_s",)

    def __init__(self, state):
        self._s = state

    async def exists(self):
        return self._s.exists()

    async def getValue(self, key):
        return self._s.getValue(key)

    async def containsKey(self, key):
        return self._s.containsKey(key)

    async def updateValue(self, key, value):
        self._s.updateValue(key, value)

    async def removeKey(self, key):
        self._s.removeKey(key)

    def iterator(self):
        return _AsyncPages(self._s.iterator())

    def keys(self):
        return _AsyncPages(self._s.keys())

    def values(self):
        return _AsyncPages(self._s.values())

    async def clear(self):
        self._s.clear()


class AsyncStatefulProcessorHandle:
    """``StatefulProcessorHandle`` with awaitable operations: ``await
    handle.getValueState(...)``, ``await handle.registerTimer(ms)``, ``async for t in
    handle.listTimers()``. The variables it declares are the synchronous handle's, so both
    APIs read and write the same state."""

    def __init__(self, handle: StatefulProcessorHandle):
        self._h = handle

    @property
    def timeMode(self):
        return self._h.timeMode

    # Declaring state and timer calls run immediately (as in the Databricks async API, where
    # creating state objects is synchronous); what they return may also be awaited.

    def getValueState(self, stateName, schema, ttlDurationMs=None):
        return AsyncValueState(self._h.getValueState(stateName, schema, ttlDurationMs))

    def getListState(self, stateName, schema, ttlDurationMs=None):
        return AsyncListState(self._h.getListState(stateName, schema, ttlDurationMs))

    def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
        return AsyncMapState(
            self._h.getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)
        )

    def deleteIfExists(self, stateName):
        self._h.deleteIfExists(stateName)
        return _DONE

    def registerTimer(self, expiryTimestampMs):
        self._h.registerTimer(expiryTimestampMs)
        return _DONE

    def deleteTimer(self, expiryTimestampMs):
        self._h.deleteTimer(expiryTimestampMs)
        return _DONE

    def listTimers(self):
        return _AsyncPages(self._h.listTimers())

    async def getQueryInfo(self):
        """The query and batch this call runs in: ``(await handle.getQueryInfo()).getBatchId()``
        (see ``StatefulProcessorHandle.getQueryInfo``)."""
        return self._h.getQueryInfo()


# --- the scheduler --------------------------------------------------------------------------


class _Suspend:
    """What a task yields to let other tasks run."""

    __slots__ = ()


_SUSPEND = _Suspend()


@_types.coroutine
def _suspend():
    yield _SUSPEND


async def sleep(delay=0):
    """Lets other tasks (other keys' calls, other coroutines of a :func:`gather`) run. There
    is no clock in the sandbox: only ``sleep(0)`` is allowed."""
    if delay:
        raise ValueError(
            "statebox.aio.sleep takes no delay: the sandbox has no real clock (use timers)"
        )
    await _suspend()


class _Task:
    """A coroutine on the scheduler. ``key`` is what the scheduler passes to its ``switch``
    function before resuming the task (None: the task needs no key)."""

    __slots__ = ("coro", "key", "result", "error", "done", "waiters")

    def __init__(self, coro, key=None):
        self.coro = coro
        self.key = key
        self.result = None
        self.error = None
        self.done = False
        self.waiters = []


class _Join:
    """What :func:`gather` yields: wait for these tasks."""

    __slots__ = ("tasks",)

    def __init__(self, tasks):
        self.tasks = tasks


@_types.coroutine
def _join(tasks):
    yield _Join(tasks)


class _WaitIo:
    """What a task yields to wait for a ``wasi:io/poll`` pollable (an HTTP response, body
    bytes): the scheduler runs the other tasks, and when none is ready it polls every
    waiting task's pollable at once, so requests awaited together are in flight together."""

    __slots__ = ("pollable",)

    def __init__(self, pollable):
        self.pollable = pollable


@_types.coroutine
def wait_pollable(pollable):
    """Suspends the calling task until ``pollable`` is ready (the scheduler drops it)."""
    yield _WaitIo(pollable)


async def gather(*aws, return_exceptions=False):
    """Runs coroutines concurrently on the SDK's scheduler; returns their results in order.
    The first error is raised once all have finished (with ``return_exceptions=True`` the
    errors are returned in place of results, as ``asyncio.gather`` does). Inside a
    component ``asyncio.gather`` is this function."""
    tasks = [_Task(a) for a in aws]
    await _join(tasks)
    if return_exceptions:
        return [t.error if t.error is not None else t.result for t in tasks]
    for t in tasks:
        if t.error is not None:
            raise t.error
    return [t.result for t in tasks]


_NOT_AWAITABLE = (
    "a processor awaited {what}, which the Statebox sandbox cannot wait for: only Statebox "
    "state and timer operations, coroutines, statebox.aio.gather and sleep(0) can be awaited "
    "(there is no asyncio event loop, network or clock)"
)


#: No key has been made current yet (the host selects none at the start of a call).
_NO_KEY = object()


def _run_tasks(tasks, switch=None):
    """Steps tasks round-robin until all are done. A task that yields ``None`` (as
    ``asyncio.sleep(0)`` does) or ``_SUSPEND`` is resumed after the others have had a turn;
    one that yields a ``_Join`` waits for the joined tasks, which inherit its key.

    With ``switch``, a task whose ``key`` is not None is resumed only after ``switch(key)``
    made its key current; ``switch`` is called only when the key differs from the one it made
    current last. If ``switch`` raises, the task fails with that error (its coroutine is
    closed). Returns how many tasks are still waiting on a join (0 unless there is a bug)."""
    ready = list(tasks)
    waiting = 0
    current = _NO_KEY
    io = []  # (pollable, task): tasks waiting for I/O
    while ready or io:
        if not ready:
            ready = _poll(io)
        runnable, ready = ready, []
        for task in runnable:
            err = None
            if switch is not None:
                key = task.key
                if key is not None and key != current:
                    current = _NO_KEY
                    try:
                        switch(key)
                    except BaseException as e:  # noqa: BLE001 - the task's failure
                        err = e
                    else:
                        current = key
            if err is not None:
                task.coro.close()
            else:
                try:
                    yielded = task.coro.send(None)
                except StopIteration as stop:
                    task.result = stop.value
                except BaseException as e:  # noqa: BLE001 - reported to whoever awaits it
                    err = e
                    if isinstance(err, RuntimeError) and str(err) == "no running event loop":
                        # asyncio found no loop: say why there is none.
                        wrapped = RuntimeError(
                            _NOT_AWAITABLE.format(what="an asyncio operation")
                        )
                        wrapped.__cause__ = err
                        err = wrapped
                else:
                    if yielded is None or yielded is _SUSPEND:
                        ready.append(task)
                        continue
                    if isinstance(yielded, _WaitIo):
                        io.append((yielded.pollable, task))
                        continue
                    if isinstance(yielded, _Join):
                        children = yielded.tasks
                        pending = [c for c in children if not c.done]
                        if pending:
                            waiting += 1
                            counter = [len(pending)]
                            key = task.key
                            for child in pending:
                                if child.key is None:
                                    child.key = key
                                child.waiters.append((task, counter))
                            ready.extend(pending)
                        else:
                            ready.append(task)
                        continue
                    task.coro.close()
                    err = RuntimeError(_NOT_AWAITABLE.format(what=repr(yielded)))
            task.error = err
            task.done = True
            for parent, counter in task.waiters:
                counter[0] -= 1
                if counter[0] == 0:
                    waiting -= 1
                    ready.append(parent)
            task.waiters = []
    return waiting


def _poll(io):
    """Blocks in ``wasi:io/poll.poll`` until at least one of the waiting tasks' pollables is
    ready; returns those tasks (their pollables dropped) and leaves the rest in ``io``."""
    from wit_world.imports import poll

    indexes = set(poll.poll([p for p, _ in io]))
    woken, rest = [], []
    for i, (pollable, task) in enumerate(io):
        if i in indexes:
            pollable.__exit__(None, None, None)
            woken.append(task)
        else:
            rest.append((pollable, task))
    io[:] = rest
    return woken


def run_entries(coros, switch):
    """Runs one coroutine per entry of a batched call, all at once: entry ``i``'s task (and
    the coroutines it gathers) run with key ``i``, made current with ``switch(i)`` before
    the task is resumed. Returns the finished tasks, in entry order (``.result``,
    ``.error``)."""
    tasks = [_Task(coro, index) for index, coro in enumerate(coros)]
    _run_tasks(tasks, switch)
    return tasks


def run(coro):
    """Runs one coroutine to completion and returns its result (raises its error)."""
    task = _Task(coro)
    _run_tasks([task])
    if task.error is not None:
        raise task.error
    return task.result


async def _chain(calls):
    results = []
    for call in calls:
        results.append(await call())
    return results


def run_keys(chains, switch=None):
    """Runs per-key call chains: ``chains`` maps each key to a list of zero-argument
    functions returning coroutines. A key's calls run one after another, in order; different
    keys' chains run concurrently, interleaving whenever one suspends. Returns
    ``{key: [results...]}``, or ``{key: exception}`` for a chain that failed.

    With ``switch``, ``switch(key)`` is called before a key's chain is resumed whenever
    another key (or none) was current, as the batched export does with ``keys.use-key``."""
    tasks = {
        key: _Task(_chain(calls), key if switch is not None else None)
        for key, calls in chains.items()
    }
    _run_tasks(list(tasks.values()), switch)
    out = {}
    for key, task in tasks.items():
        if task.error is not None:
            out[key] = task.error
        else:
            out[key] = task.result
    return out


async def collect(rows):
    """The rows an async handler produced: an async generator's items, a coroutine's
    returned iterable (or None)."""
    if rows is None:
        return []
    if hasattr(rows, "__anext__"):
        return [row async for row in rows]
    if hasattr(rows, "__await__"):
        rows = await rows
        if rows is None:
            return []
        if hasattr(rows, "__anext__"):
            return [row async for row in rows]
    return list(rows)

