"""The processor API, mirroring PySpark's ``pyspark.sql.streaming.stateful_processor``.

A processor subclasses :class:`StatefulProcessor` and declares its state in ``init`` through
the :class:`StatefulProcessorHandle`. State values are tuples (or ``Row``s) matching the
variable's schema when the schema is a struct (``StructType`` or a DDL field list such as
``"count long"``); a schema that is a single type (``"long"``) holds bare values, a Statebox
extension. Every state and timer operation acts on the grouping key of the call in progress.
"""

import uuid as _uuid

from . import _codec
from ._host import HostError, host_error
from .types import as_type, to_ddl

__all__ = [
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "ValueState",
    "ListState",
    "MapState",
    "TimerValues",
    "ExpiredTimerInfo",
    "QueryInfo",
    "StateError",
    "TimeMode",
]

#: How many items a list or map iterator fetches from the host at a time.
PAGE_SIZE = 256


class TimeMode:
    """The query's time mode, as a string constant."""

    NONE = "none"
    PROCESSING_TIME = "processing-time"
    EVENT_TIME = "event-time"


class StateError(RuntimeError):
    """A state or timer operation the host refused: a bad schema, a value that does not match
    its schema, an empty list, an operation in the wrong phase, timers in time mode none, ...

    ``kind`` names the class of failure (``"schema-mismatch"``, ``"empty-list"``,
    ``"wrong-phase"``, ...); the message names the variable and what was wrong."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __str__(self):
        return f"{self.message} ({self.kind})"


def _lift(err):
    kind, message = host_error(err)
    return StateError(kind, message)


class TimerValues:
    """The times a handler call may consult; identical for every call of one batch and on
    replay. A time that does not apply in the query's time mode is -1."""

    __slots__ = ("_processing", "_watermark")

    def __init__(self, currentProcessingTimeInMs=-1, currentWatermarkInMs=-1):
        self._processing = currentProcessingTimeInMs
        self._watermark = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self):
        """The batch timestamp in milliseconds since the epoch (-1 in time mode none)."""
        return self._processing

    def getCurrentWatermarkInMs(self):
        """The watermark in milliseconds since the epoch (-1 unless the time mode is
        event-time)."""
        return self._watermark

    def __repr__(self):
        return f"TimerValues(processing={self._processing}, watermark={self._watermark})"


class ExpiredTimerInfo:
    """Which timer fired."""

    __slots__ = ("_expiry",)

    def __init__(self, expiryTimeInMs):
        self._expiry = expiryTimeInMs

    def getExpiryTimeInMs(self):
        """The timestamp the timer was registered for, in milliseconds."""
        return self._expiry

    def __repr__(self):
        return f"ExpiredTimerInfo(expiry={self._expiry})"


def _as_uuid(text):
    try:
        return _uuid.UUID(text)
    except (TypeError, ValueError):
        return text


class QueryInfo:
    """The query and batch a call runs in, from ``handle.getQueryInfo()``. Mirrors Spark's
    ``QueryInfo``: ``getQueryId()`` is fixed when the query's checkpoint is created (the same
    across restarts), ``getRunId()`` is new each time the query starts, ``getBatchId()`` is
    the id of the batch in progress (0 outside a batch, e.g. in ``init``). The ids are
    ``uuid.UUID``s, as Spark's are (a host id that is not a UUID is passed on as a string)."""

    __slots__ = ("_query_id", "_run_id", "_batch_id")

    def __init__(self, queryId, runId, batchId):
        self._query_id = _as_uuid(queryId)
        self._run_id = _as_uuid(runId)
        self._batch_id = batchId

    def getQueryId(self):
        """The query's id, the same across restarts of the query."""
        return self._query_id

    def getRunId(self):
        """This run's id, new each time the query is started."""
        return self._run_id

    def getBatchId(self):
        """The id of the batch in progress."""
        return self._batch_id

    def __eq__(self, other):
        if not isinstance(other, QueryInfo):
            return NotImplemented
        return (self._query_id, self._run_id, self._batch_id) == (
            other._query_id,
            other._run_id,
            other._batch_id,
        )

    def __hash__(self):
        return hash((self._query_id, self._run_id, self._batch_id))

    def __repr__(self):
        return (
            f"QueryInfo(queryId={self._query_id}, runId={self._run_id}, "
            f"batchId={self._batch_id})"
        )

    __str__ = __repr__


class _Codec:
    """The converters of one schema: Python value <-> JSON text. ``dumps`` and ``loads`` are
    built once per variable, and for the common schemas (a struct of strings, integers and
    booleans) each runs a single Python frame: they are on every state operation's path."""

    __slots__ = ("ddl", "what", "dumps", "loads")

    def __init__(self, schema, what):
        data_type = as_type(schema)
        self.ddl = to_ddl(schema)
        self.what = what
        self.dumps = _make_dumps(data_type, what)
        self.loads = _make_loads(data_type)


def _make_dumps(data_type, what, _dumps=_codec.dumps):
    enc = _codec.encoder(data_type)

    def dumps(value):
        if value is None:
            raise ValueError(f"{what} cannot be None")
        return _dumps(enc(value) if enc is not None else value)

    # The concatenating fast path, which falls back to `dumps` for what it cannot write.
    return _codec.struct_text(data_type, dumps) or dumps


def _make_loads(data_type, _loads=_codec.loads, _scan=_codec.scan):
    dec = _codec.decoder(data_type)
    if _scan is None:
        if dec is None:
            return _loads
        return lambda text: dec(_loads(text))

    if dec is None:

        def loads(text):
            try:
                return _scan(text, 0)[0]
            except StopIteration:
                return _loads(text)

        return loads

    plain = _codec.plain_struct_fields(data_type)
    if plain is not None:
        # The struct decoder inlined: one frame from the text to the Row.
        fields, make = plain

        def loads_struct(text, _map=map):
            try:
                obj = _scan(text, 0)[0]
            except StopIteration:
                obj = _loads(text)
            if obj is None:
                return None
            return make(_map(obj.get, fields))

        return loads_struct

    def loads_converted(text):
        try:
            value = _scan(text, 0)[0]
        except StopIteration:
            value = _loads(text)
        return dec(value)

    return loads_converted


# The variable numbers of a held timer registration and deletion for the write's key
# (`wit/batch.wit`, `keys.apply-writes`): no state variable has them. The value is the time,
# as a JSON integer.
_TIMER_REGISTER = (1 << 32) - 1
_TIMER_DELETE = (1 << 32) - 2
_TIMER_NUMBERS = (_TIMER_REGISTER, _TIMER_DELETE)
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class _Held:
    """Writes held back and sent to the host together, for a processor that sets
    ``HOLD_WRITES = True`` (see the Rust SDK's ``held.rs``, which this follows).

    In a batched call, ``ValueState.update``, ``ListState.appendValue``,
    ``MapState.updateValue`` and the handle's ``registerTimer`` and ``deleteTimer`` (in a
    time mode with timers) append their write to the columns here instead of crossing into
    the host, and the columns go in one ``keys.apply-writes`` call: when the batched call
    ends, once ``MAX_WRITES`` writes or ``MAX_BYTES`` characters are held, and before any
    other operation on a variable (for timers: on the timers) the current key wrote, so a
    read sees every earlier write. A write the host refuses raises at the operation that
    sent it and fails the batched call, named by the key it was made for."""

    MAX_WRITES = 4096
    MAX_BYTES = 1 << 20

    __slots__ = (
        "on", "entry", "entries", "variables", "values", "user_keys", "size", "dirty",
        "failed", "_apply", "_columns",
    )

    def __init__(self, apply, columns):
        # `apply(columns(entries, variables, values, user_keys))` sends the writes.
        self._apply = apply
        self._columns = columns
        self.on = False
        self.failed = None
        self.entry = 0
        self._clear()

    def _clear(self):
        self.entries, self.variables, self.values, self.user_keys = [], [], [], []
        self.size = 0
        self.dirty = set()

    def start(self):
        """A batched call begins: writes are held until ``finish``."""
        self.on = True
        self.failed = None
        self.entry = 0
        self._clear()

    def select(self, index):
        """Entry ``index`` of the batched call is handled from now on."""
        self.entry = index
        self.dirty.clear()

    def hold(self, number, text, user_key=None):
        """Holds a write of ``text`` (to a map: under ``user_key``) to variable ``number``."""
        self.entries.append(self.entry)
        self.variables.append(number)
        self.values.append(text)
        self.size += len(text)
        if user_key is not None:
            self.user_keys.append(user_key)
            self.size += len(user_key)
        self.dirty.add(number)
        if len(self.values) >= self.MAX_WRITES or self.size >= self.MAX_BYTES:
            self.send()

    def send(self):
        """Sends every held write; raises the ``StateError`` of one the host refuses."""
        entries, variables, values, user_keys = (
            self.entries, self.variables, self.values, self.user_keys,
        )
        self._clear()
        if not values:
            if self.failed is not None:
                raise self.failed[1]
            return
        try:
            self._apply(self._columns(entries, variables, values, user_keys))
        except HostError as e:
            failure = getattr(e, "value", None)
            position = getattr(failure, "position", 0)
            error = _lift(_Refusal(getattr(failure, "error", None)))
            # Later writes are not sent: the batched call fails.
            self.on = False
            if self.failed is None:
                entry = entries[position] if position < len(entries) else self.entry
                self.failed = (entry, error)
            raise error from None

    def finish(self):
        """Ends the batched call, sending what is still held. Returns ``(entry, error)`` of
        a held write the host refused, now or earlier, or None."""
        try:
            self.send()
        except StateError:
            pass
        self.on = False
        failed, self.failed = self.failed, None
        return failed

    def abandon(self):
        """Ends a batched call that failed: drops what is held. Returns a held write's
        refusal, if one was the reason."""
        self.on = False
        self._clear()
        failed, self.failed = self.failed, None
        return failed


class _Refusal:
    """A ``write-failure``'s ``state-error``, shaped as ``host_error`` reads an ``Err``."""

    __slots__ = ("value",)

    def __init__(self, error):
        self.value = error


class _Pages:
    """A lazy iterator over a host iterator resource, fetched a page at a time."""

    __slots__ = ("_source", "_page", "_convert", "_sync")

    def __init__(self, source, convert, sync=None):
        self._source = source
        self._page = iter(())
        self._convert = convert
        # Sends held writes of the variable iterated before each page.
        self._sync = sync

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            for item in self._page:
                return self._convert(item)
            source = self._source
            if source is None:
                raise StopIteration
            if self._sync is not None:
                self._sync()
            try:
                page = source.next_page(PAGE_SIZE)
            except HostError as e:
                self._source = None
                raise _lift(e) from None
            if not page:
                self._source = None
                raise StopIteration
            self._page = iter(page)


def _method(host, name):
    """``host.name``, bound once when a variable is declared. A host object without it (only
    a test's stand-in) fails when the method is used, as looking it up then would."""
    try:
        return getattr(host, name)
    except AttributeError:

        def missing(*args):
            raise AttributeError(f"{type(host).__name__!r} object has no attribute {name!r}")

        return missing


class _Var:
    """What the state classes share: ``_held`` (the processor's held writes, None unless it
    holds them) and ``_n`` (the variable's number, which names it in them)."""

    __slots__ = ()

    def _sync(self):
        """Sends the held writes if the current key wrote this variable since they were last
        sent: called before any operation on it that is not held."""
        held = self._held
        if held is not None and self._n in held.dirty:
            held.send()


class ValueState(_Var):
    """A single value per grouping key. Mirrors PySpark's ``ValueState``."""

    # `_get`, `_update`, `_loads`, `_dumps`: the host's methods and the codec's functions,
    # bound once, so a state operation looks up one attribute for each.
    __slots__ = ("_h", "_c", "name", "_get", "_update", "_loads", "_dumps", "_held", "_n")

    def __init__(self, host, codec, name, held=None):
        self._h = host
        self._c = codec
        self.name = name
        self._get = _method(host, "get")
        self._update = _method(host, "update")
        self._loads = codec.loads
        self._dumps = codec.dumps
        self._held = held
        self._n = None if held is None else host.number()

    def exists(self):
        """Whether the current key has a value."""
        self._sync()
        try:
            return self._h.exists()
        except HostError as e:
            raise _lift(e) from None

    def get(self):
        """The current key's value (a tuple for struct schemas), or None."""
        held = self._held
        if held is not None and self._n in held.dirty:
            held.send()
        try:
            text = self._get()
        except HostError as e:
            raise _lift(e) from None
        return None if text is None else self._loads(text)

    def update(self, newValue):
        """Replaces the current key's value, restarting its TTL."""
        text = self._dumps(newValue)
        held = self._held
        if held is not None and held.on:
            held.hold(self._n, text)
            return
        try:
            self._update(text)
        except HostError as e:
            raise _lift(e) from None

    def clear(self):
        """Removes the current key's value."""
        self._sync()
        try:
            self._h.clear()
        except HostError as e:
            raise _lift(e) from None


class ListState(_Var):
    """An ordered list of values per grouping key. Mirrors PySpark's ``ListState``.

    ``get`` is lazy: the host hands the list over page by page, so a list larger than the
    processor's memory can be iterated."""

    __slots__ = ("_h", "_c", "name", "_append", "_dumps", "_held", "_n")

    def __init__(self, host, codec, name, held=None):
        self._h = host
        self._c = codec
        self.name = name
        self._append = _method(host, "append_value")
        self._dumps = codec.dumps
        self._held = held
        self._n = None if held is None else host.number()

    def exists(self):
        """Whether the current key's list has at least one element."""
        self._sync()
        try:
            return self._h.exists()
        except HostError as e:
            raise _lift(e) from None

    def get(self):
        """Iterates the current key's list in insertion order. Valid only during the call that
        made it."""
        self._sync()
        try:
            source = self._h.get()
        except HostError as e:
            raise _lift(e) from None
        return _Pages(source, self._c.loads, None if self._held is None else self._sync)

    def put(self, newState):
        """Replaces the whole list (restamping every element's TTL). An empty list is an
        error."""
        dumps = self._c.dumps
        texts = [dumps(v) for v in newState]
        self._sync()
        try:
            self._h.put(texts)
        except HostError as e:
            raise _lift(e) from None

    def appendValue(self, newState):
        """Appends one element."""
        text = self._dumps(newState)
        held = self._held
        if held is not None and held.on:
            held.hold(self._n, text)
            return
        try:
            self._append(text)
        except HostError as e:
            raise _lift(e) from None

    def appendList(self, newState):
        """Appends elements in order. An empty list is an error."""
        dumps = self._c.dumps
        texts = [dumps(v) for v in newState]
        self._sync()
        try:
            self._h.append_list(texts)
        except HostError as e:
            raise _lift(e) from None

    def clear(self):
        """Removes the current key's list."""
        self._sync()
        try:
            self._h.clear()
        except HostError as e:
            raise _lift(e) from None


class MapState(_Var):
    """A map from user keys to values per grouping key. Mirrors PySpark's ``MapState``.

    Iteration is lazy and ordered by the host (ascending by the user key's canonical
    encoding), so it is deterministic."""

    __slots__ = (
        "_h", "_k", "_v", "name", "_get", "_update", "_kdumps", "_vdumps", "_vloads", "_held",
        "_n",
    )

    def __init__(self, host, key_codec, value_codec, name, held=None):
        self._h = host
        self._k = key_codec
        self._v = value_codec
        self.name = name
        self._get = _method(host, "get_value")
        self._update = _method(host, "update_value")
        self._kdumps = key_codec.dumps
        self._vdumps = value_codec.dumps
        self._vloads = value_codec.loads
        self._held = held
        self._n = None if held is None else host.number()

    def exists(self):
        """Whether the current key's map has at least one entry."""
        self._sync()
        try:
            return self._h.exists()
        except HostError as e:
            raise _lift(e) from None

    def getValue(self, key):
        """The value stored under ``key``, or None."""
        k = self._kdumps(key)
        held = self._held
        if held is not None and self._n in held.dirty:
            held.send()
        try:
            text = self._get(k)
        except HostError as e:
            raise _lift(e) from None
        return None if text is None else self._vloads(text)

    def containsKey(self, key):
        """Whether ``key`` is present."""
        k = self._k.dumps(key)
        self._sync()
        try:
            return self._h.contains_key(k)
        except HostError as e:
            raise _lift(e) from None

    def updateValue(self, key, value):
        """Inserts or replaces the entry for ``key``, restarting that entry's TTL."""
        k = self._kdumps(key)
        v = self._vdumps(value)
        held = self._held
        if held is not None and held.on:
            held.hold(self._n, v, k)
            return
        try:
            self._update(k, v)
        except HostError as e:
            raise _lift(e) from None

    def iterator(self):
        """Iterates ``(key, value)`` pairs lazily, in user-key order."""
        self._sync()
        try:
            source = self._h.iterator()
        except HostError as e:
            raise _lift(e) from None
        kl, vl = self._k.loads, self._v.loads
        sync = None if self._held is None else self._sync
        return _Pages(source, lambda entry: (kl(entry.key), vl(entry.value)), sync)

    def keys(self):
        """Iterates the user keys lazily, in order."""
        self._sync()
        try:
            source = self._h.keys()
        except HostError as e:
            raise _lift(e) from None
        return _Pages(source, self._k.loads, None if self._held is None else self._sync)

    def values(self):
        """Iterates the values lazily, in user-key order."""
        self._sync()
        try:
            source = self._h.values()
        except HostError as e:
            raise _lift(e) from None
        return _Pages(source, self._v.loads, None if self._held is None else self._sync)

    def removeKey(self, key):
        """Removes the entry for ``key``, if any."""
        k = self._k.dumps(key)
        self._sync()
        try:
            self._h.remove_key(k)
        except HostError as e:
            raise _lift(e) from None

    def clear(self):
        """Removes every entry of the current key; other keys are untouched."""
        self._sync()
        try:
            self._h.clear()
        except HostError as e:
            raise _lift(e) from None


def _ttl(ttlDurationMs):
    if ttlDurationMs is None:
        return None
    if isinstance(ttlDurationMs, bool) or not isinstance(ttlDurationMs, int):
        raise TypeError(f"ttlDurationMs must be an int of milliseconds, got {ttlDurationMs!r}")
    if ttlDurationMs <= 0:
        raise ValueError(f"ttlDurationMs must be positive, got {ttlDurationMs}")
    return ttlDurationMs


class StatefulProcessorHandle:
    """Declares state variables (in ``init`` only) and manages the current key's timers.
    Mirrors PySpark's ``StatefulProcessorHandle``. Keep it (``self.handle = handle``) to use
    the timer methods in handlers."""

    def __init__(self, host, time_mode, held=None):
        self._host = host
        self._time_mode = time_mode
        # The processor's held writes, if it holds them (`HOLD_WRITES`).
        self._held = held

    @property
    def timeMode(self):
        """The query's time mode: ``"none"``, ``"processing-time"`` or ``"event-time"``
        (a Statebox extension; Spark fixes it in ``transformWithState``)."""
        return self._time_mode

    def getValueState(self, stateName, schema, ttlDurationMs=None):
        """Declares (or reopens) a value state variable. ``schema`` is a ``StructType`` or DDL
        (``"count long"``); with ``ttlDurationMs`` each value expires that long after the batch
        that wrote it."""
        codec = _Codec(schema, f"the value of state {stateName!r}")
        try:
            h = self._host.get_value_state(stateName, codec.ddl, _ttl(ttlDurationMs))
        except HostError as e:
            raise _lift(e) from None
        return ValueState(h, codec, stateName, self._held)

    def getListState(self, stateName, schema, ttlDurationMs=None):
        """Declares (or reopens) a list state variable; with ``ttlDurationMs`` every element
        has its own time to live."""
        codec = _Codec(schema, f"an element of state {stateName!r}")
        try:
            h = self._host.get_list_state(stateName, codec.ddl, _ttl(ttlDurationMs))
        except HostError as e:
            raise _lift(e) from None
        return ListState(h, codec, stateName, self._held)

    def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
        """Declares (or reopens) a map state variable; with ``ttlDurationMs`` every entry has
        its own time to live."""
        key_codec = _Codec(userKeySchema, f"a key of state {stateName!r}")
        value_codec = _Codec(valueSchema, f"a value of state {stateName!r}")
        try:
            h = self._host.get_map_state(
                stateName, key_codec.ddl, value_codec.ddl, _ttl(ttlDurationMs)
            )
        except HostError as e:
            raise _lift(e) from None
        return MapState(h, key_codec, value_codec, stateName, self._held)

    def deleteIfExists(self, stateName):
        """Drops the named variable's data for all keys, if it exists (``init`` only)."""
        try:
            self._host.delete_if_exists(stateName)
        except HostError as e:
            raise _lift(e) from None

    def _holds_timer(self, expiryTimestampMs):
        """Whether a timer operation at ``expiryTimestampMs`` is held: in a batched call of a
        processor that holds its writes, in a time mode with timers, at a time the host
        takes (an ``int`` in 64 bits; another goes to the host, which refuses it as it
        would unheld)."""
        held = self._held
        return (
            held is not None
            and held.on
            and self._time_mode != "none"
            and type(expiryTimestampMs) is int
            and _I64_MIN <= expiryTimestampMs <= _I64_MAX
        )

    def _sync_timers(self):
        """Sends the held writes if the current key registered or deleted a timer since they
        were last sent: called before any timer operation that is not held."""
        held = self._held
        if held is not None and not held.dirty.isdisjoint(_TIMER_NUMBERS):
            held.send()

    def registerTimer(self, expiryTimestampMs):
        """Registers a timer for the current key; registering an existing one is a no-op."""
        if self._holds_timer(expiryTimestampMs):
            self._held.hold(_TIMER_REGISTER, str(expiryTimestampMs))
            return
        self._sync_timers()
        try:
            self._host.register_timer(expiryTimestampMs)
        except HostError as e:
            raise _lift(e) from None

    def deleteTimer(self, expiryTimestampMs):
        """Deletes the current key's timer; deleting a missing one is a no-op."""
        if self._holds_timer(expiryTimestampMs):
            self._held.hold(_TIMER_DELETE, str(expiryTimestampMs))
            return
        self._sync_timers()
        try:
            self._host.delete_timer(expiryTimestampMs)
        except HostError as e:
            raise _lift(e) from None

    def listTimers(self):
        """Iterates the current key's registered timers, ascending."""
        self._sync_timers()
        try:
            return iter(self._host.list_timers())
        except HostError as e:
            raise _lift(e) from None

    def getQueryInfo(self):
        """The query and batch this call runs in (a :class:`QueryInfo`: ``getQueryId()``,
        ``getRunId()``, ``getBatchId()``), as Spark's ``StatefulProcessorHandle.getQueryInfo``.
        Allowed in ``init`` and in handlers."""
        info = self._host.get_query_info()
        return QueryInfo(info.query_id, info.run_id, info.batch_id)


class StatefulProcessor:
    """A stateful processor. Mirrors PySpark's ``StatefulProcessor``: implement ``init`` and
    ``handleInputRows``; ``handleExpiredTimer``, ``handleInitialState`` and ``close`` do
    nothing unless overridden.

    Within one batch the host calls ``handleInitialState`` (first batch of a new query only),
    then ``handleInputRows`` once per key with all its rows in arrival order, then
    ``handleExpiredTimer`` per expired timer in ascending time order.
    """

    def init(self, handle):
        """Declares the processor's state variables through ``handle``."""
        raise NotImplementedError("a StatefulProcessor must implement init(self, handle)")

    def handleInputRows(self, key, rows, timerValues):
        """Handles all rows of one key in one batch; yields (or returns an iterable of) the
        ``Row``s to emit. ``key`` is a tuple of the key columns' values; ``rows`` an iterator
        of ``Row``s."""
        raise NotImplementedError(
            "a StatefulProcessor must implement handleInputRows(self, key, rows, timerValues)"
        )

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        """Handles one expired timer of ``key``; yields the ``Row``s to emit."""
        return iter(())

    def handleInitialState(self, key, initialState, timerValues):
        """Applies one initial-state row of ``key`` (first batch of a new query only)."""

    def close(self):
        """Releases resources when the instance is torn down."""
