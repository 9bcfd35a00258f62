"""``TwsTester``: PySpark 4.3's unit-test helper for ``transformWithState`` processors
(``pyspark.sql.streaming.tws_tester.TwsTester``), on Statebox's SDK.

The same API and behaviour as Spark's: ``test(key, rows)`` runs ``handleInputRows`` for one
key and returns the emitted rows; ``setProcessingTime(ms)`` / ``setWatermark(ms)`` move time
forward and fire the due timers; ``updateValueState`` / ``peekValueState`` (and the list and
map variants) and ``deleteState`` reach into the state; ``initialStateRow`` feeds
``handleInitialState``; in event time, rows at or before the watermark are dropped before
they reach the processor (``eventTimeExtractor``).

By default the processor runs here, in memory, like Spark's tester, but through the SDK's
own state classes and value conversion: a value that does not match its variable's schema
fails as it would in the component, and values read back are what the component's would be
(``Row``s, single-precision floats). Async processors (``AsyncStatefulProcessor``) work too.

``TwsTester(processor, host=True)`` (or ``STATEBOX_TWS_HOST=1`` in the environment) runs
the same calls against the processor built into a component, in the real host
(``statebox tws-driver``): real schema checks, real timers and TTL, the engine's
behaviour. There, ``peek*State`` reads the checkpoint; ``update*State`` and ``deleteState``
write the key's state in a batch of their own, through the component's state imports, so
the host checks each value against the variable's schema (the driver builds the processor
with a hook that applies those writes instead of calling ``handleInputRows``);
``setWatermark`` moves the query's watermark, and the engine fires the event-time timers
(and expires event-time TTL) due by it, as in production.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys

from . import _codec
from .aio import AsyncStatefulProcessor, AsyncStatefulProcessorHandle, collect
from .aio import run as _run_async
from .processor import ExpiredTimerInfo, StateError, StatefulProcessorHandle, TimerValues
from .row import Row

__all__ = ["TwsTester"]


class _Page:
    """A host iterator resource over a finished list, handed out a page at a time."""

    def __init__(self, items):
        self._items = list(items)

    def next_page(self, n):
        page, self._items = self._items[:n], self._items[n:]
        return page


class _Entry:
    __slots__ = ("key", "value")

    def __init__(self, key, value):
        self.key = key
        self.value = value


class _MemoryVar:
    """One variable's data: grouping key -> stored JSON text(s), as the host keeps it."""

    def __init__(self, host, name, kind, key_codec, value_codec):
        self.host = host
        self.name = name
        self.kind = kind
        self.key_codec = key_codec
        self.value_codec = value_codec
        self.data = {}

    def _k(self):
        return self.host.current_key()

    # value state
    def exists(self):
        return bool(self.data.get(self._k()))

    def get(self):
        if self.kind == "list":
            return _Page(self.data.get(self._k(), []))
        return self.data.get(self._k())

    def update(self, text):
        self.data[self._k()] = text

    def clear(self):
        self.data.pop(self._k(), None)

    # list state
    def put(self, texts):
        if not texts:
            raise StateError("empty-list", f"ListState {self.name!r}: put of an empty list")
        self.data[self._k()] = list(texts)

    def append_value(self, text):
        self.data.setdefault(self._k(), []).append(text)

    def append_list(self, texts):
        if not texts:
            raise StateError("empty-list", f"ListState {self.name!r}: appendList of an empty list")
        self.data.setdefault(self._k(), []).extend(texts)

    # map state (entries ordered by the user key's JSON text, as the host orders them)
    def _map(self):
        return self.data.setdefault(self._k(), {})

    def get_value(self, key):
        return self.data.get(self._k(), {}).get(key)

    def contains_key(self, key):
        return key in self.data.get(self._k(), {})

    def update_value(self, key, value):
        self._map()[key] = value

    def remove_key(self, key):
        m = self.data.get(self._k())
        if m is not None:
            m.pop(key, None)
            if not m:
                self.data.pop(self._k(), None)

    def iterator(self):
        m = self.data.get(self._k(), {})
        return _Page(_Entry(k, m[k]) for k in sorted(m))

    def keys(self):
        return _Page(sorted(self.data.get(self._k(), {})))

    def values(self):
        m = self.data.get(self._k(), {})
        return _Page(m[k] for k in sorted(m))


class _MemoryHost:
    """The host side of the handle, in memory: variables, timers per key, the current key."""

    def __init__(self, time_mode):
        self.time_mode = time_mode
        self.vars = {}
        self.timers = {}
        self.key = None
        self.in_init = True

    def current_key(self):
        if self.key is None:
            raise StateError("wrong-phase", "state is per key: no key is being processed")
        return self.key

    def _declare(self, name, kind, ddl, ttl, key_ddl=None):
        if not self.in_init:
            raise StateError("wrong-phase", f"state variable {name!r} declared outside init")
        var = self.vars.get(name)
        if var is not None and var.kind != kind:
            raise StateError(
                "invalid-use", f"state variable {name!r} is a {var.kind} state, not a {kind}"
            )
        if var is None:
            var = self.vars[name] = _MemoryVar(self, name, kind, key_ddl, ddl)
        return var

    def get_value_state(self, name, ddl, ttl):
        return self._declare(name, "value", ddl, ttl)

    def get_list_state(self, name, ddl, ttl):
        return self._declare(name, "list", ddl, ttl)

    def get_map_state(self, name, key_ddl, ddl, ttl):
        return self._declare(name, "map", ddl, ttl, key_ddl)

    def delete_if_exists(self, name):
        self.vars.pop(name, None)

    def _timers_allowed(self, what):
        if self.time_mode == "none":
            raise StateError(
                "unsupported-in-time-mode", f"{what} needs time mode ProcessingTime or EventTime"
            )

    def register_timer(self, ms):
        self._timers_allowed("registerTimer")
        self.timers.setdefault(self.current_key(), set()).add(ms)

    def delete_timer(self, ms):
        self._timers_allowed("deleteTimer")
        self.timers.get(self.current_key(), set()).discard(ms)

    def list_timers(self):
        self._timers_allowed("listTimers")
        return sorted(self.timers.get(self.current_key(), ()))

    def get_query_info(self):
        class _Info:
            query_id = "00000000-0000-0000-0000-000000000000"
            run_id = "00000000-0000-0000-0000-000000000000"
            batch_id = 0

        return _Info()


_TIME_MODES = {"none": "none", "processingtime": "processing-time", "eventtime": "event-time"}


def _as_key(key):
    return key if isinstance(key, tuple) else (key,)


class TwsTester:
    """Runs a stateful processor key by key, as ``transformWithState`` would, for unit tests.
    See the module's documentation."""

    def __init__(
        self,
        processor,
        initialStateRow=None,
        initialStatePandas=None,
        timeMode="None",
        outputMode="Append",
        eventTimeExtractor=None,
        host=None,
    ):
        if initialStatePandas is not None:
            raise ValueError(
                "initialStatePandas needs pandas, which Statebox does not use: give "
                "initialStateRow=[(key, Row(...)), ...]"
            )
        mode = str(timeMode).replace("_", "").replace("-", "").lower()
        if mode not in _TIME_MODES:
            raise ValueError(
                f"timeMode must be None, ProcessingTime or EventTime, got {timeMode!r}"
            )
        if mode == "eventtime" and eventTimeExtractor is None:
            raise ValueError("eventTimeExtractor is required when timeMode is EventTime")
        self.processor = processor
        self._timeMode = mode
        self._outputMode = outputMode
        self._eventTimeExtractor = eventTimeExtractor
        self._processingTimeMs = 0
        self._watermarkMs = 0
        self._async = isinstance(processor, AsyncStatefulProcessor)
        self._memory = _MemoryHost(_TIME_MODES[mode])
        sync_handle = StatefulProcessorHandle(self._memory, _TIME_MODES[mode])
        self.handle = AsyncStatefulProcessorHandle(sync_handle) if self._async else sync_handle
        # The variables the processor declares, by name: (kind, SDK state object).
        self._states = {}
        self._wrap_declarations(sync_handle)
        self._call(lambda: self.processor.init(self.handle))
        self._memory.in_init = False
        if host is None:
            host = os.environ.get("STATEBOX_TWS_HOST", "") not in ("", "0")
        self._host = _HostDriver(self, initialStateRow) if host else None
        if initialStateRow is not None and self._host is None:
            for key, row in initialStateRow:
                self._memory.key = _as_key(key)
                self._call(
                    lambda: self.processor.handleInitialState(
                        _as_key(key), row, self._timerValues()
                    )
                )

    # --- plumbing -----------------------------------------------------------------------

    def _wrap_declarations(self, handle):
        states = self._states
        for kind, method in (("value", "getValueState"), ("list", "getListState"), ("map", "getMapState")):
            declare = getattr(handle, method)

            def wrapped(*args, _declare=declare, _kind=kind, **kwargs):
                state = _declare(*args, **kwargs)
                states[state.name] = (_kind, state)
                return state

            setattr(handle, method, wrapped)

    def _call(self, fn):
        """Runs a processor method, awaiting it for an async processor; returns its rows."""
        if not self._async:
            result = fn()
            return [] if result is None else list(result)
        return _run_async(collect(fn()))

    def _timerValues(self):
        if self._timeMode == "none":
            return TimerValues(-1, -1)
        if self._timeMode == "processingtime":
            return TimerValues(self._processingTimeMs, -1)
        return TimerValues(self._processingTimeMs, self._watermarkMs)

    def _state(self, stateName, kind):
        found = self._states.get(stateName)
        if found is None:
            raise AssertionError(f"State {stateName} has not been initialized.")
        if found[0] != kind:
            raise TypeError(f"State {stateName} is a {found[0]} state, not a {kind} state")
        return found[1]

    # --- Spark's API --------------------------------------------------------------------

    def test(self, key, input):
        """Runs ``handleInputRows`` for ``key`` with ``input`` (a list of ``Row``s); returns
        the rows it emitted. In event time, rows at or before the watermark are dropped."""
        rows = list(input)
        if self._timeMode == "eventtime":
            rows = [r for r in rows if self._eventTimeExtractor(r) > self._watermarkMs]
        if self._host is not None:
            return self._host.test(_as_key(key), rows)
        self._memory.key = _as_key(key)
        return self._call(
            lambda: self.processor.handleInputRows(_as_key(key), iter(rows), self._timerValues())
        )

    def testInPandas(self, key, input):
        raise NotImplementedError(
            "testInPandas needs pandas, which Statebox does not use: call test(key, rows)"
        )

    def updateValueState(self, stateName, key, value):
        state = self._state(stateName, "value")
        if self._host is not None:
            op = {"var": stateName, "op": "value", "value": state._c.dumps(value)}
            return self._host.write(_as_key(key), [op])
        self._memory.key = _as_key(key)
        state.update(value)

    def peekValueState(self, stateName, key):
        state = self._state(stateName, "value")
        if self._host is not None:
            return self._host.peek(stateName, "value", _as_key(key), state)
        self._memory.key = _as_key(key)
        return state.get()

    def updateListState(self, stateName, key, value):
        state = self._state(stateName, "list")
        if self._host is not None:
            texts = [state._c.dumps(v) for v in value]
            return self._host.write(_as_key(key), [{"var": stateName, "op": "list", "values": texts}])
        self._memory.key = _as_key(key)
        if value:
            state.put(value)
        else:
            state.clear()

    def peekListState(self, stateName, key):
        state = self._state(stateName, "list")
        if self._host is not None:
            return self._host.peek(stateName, "list", _as_key(key), state)
        self._memory.key = _as_key(key)
        return list(state.get())

    def updateMapState(self, stateName, key, value):
        state = self._state(stateName, "map")
        if self._host is not None:
            entries = [[state._k.dumps(k), state._v.dumps(v)] for k, v in dict(value).items()]
            return self._host.write(
                _as_key(key), [{"var": stateName, "op": "map", "entries": entries}]
            )
        self._memory.key = _as_key(key)
        state.clear()
        for k, v in dict(value).items():
            state.updateValue(k, v)

    def peekMapState(self, stateName, key):
        state = self._state(stateName, "map")
        if self._host is not None:
            return self._host.peek(stateName, "map", _as_key(key), state)
        self._memory.key = _as_key(key)
        return dict(state.iterator())

    def deleteState(self, stateName, key):
        kind, state = self._states.get(stateName, (None, None))
        if state is None:
            raise AssertionError(f"State {stateName} has not been initialized.")
        if self._host is not None:
            return self._host.write(_as_key(key), [{"var": stateName, "op": "delete"}])
        self._memory.key = _as_key(key)
        state.clear()

    def setProcessingTime(self, currentTimeMs):
        """Moves processing time forward to ``currentTimeMs`` and fires the due timers;
        returns the rows ``handleExpiredTimer`` emitted."""
        if self._timeMode != "processingtime":
            raise ValueError("setProcessingTime needs timeMode ProcessingTime")
        if currentTimeMs <= self._processingTimeMs:
            raise ValueError(
                f"Processing time must move forward. Current: {self._processingTimeMs} ms, "
                f"provided: {currentTimeMs} ms."
            )
        self._processingTimeMs = currentTimeMs
        if self._host is not None:
            return self._host.advance(currentTimeMs)
        return self._fire(currentTimeMs)

    def setWatermark(self, currentWatermarkMs):
        """Moves the watermark forward and fires the due event-time timers."""
        if self._timeMode != "eventtime":
            raise ValueError("setWatermark needs timeMode EventTime")
        if currentWatermarkMs <= self._watermarkMs:
            raise ValueError(
                f"Watermark must move forward. Current: {self._watermarkMs} ms, provided: "
                f"{currentWatermarkMs} ms."
            )
        self._watermarkMs = currentWatermarkMs
        if self._host is not None:
            return self._host.set_watermark(currentWatermarkMs)
        return self._fire(currentWatermarkMs)

    def _fire(self, threshold):
        out = []
        timers = self._memory.timers
        for key in list(timers):
            for expiry in sorted(t for t in timers.get(key, ()) if t <= threshold):
                self._memory.key = key
                out.extend(
                    self._call(
                        lambda: self.processor.handleExpiredTimer(
                            key, self._timerValues(), ExpiredTimerInfo(expiry)
                        )
                    )
                )
                timers.get(key, set()).discard(expiry)
        return out

    def close(self):
        """Ends a host-mode run (the driver process); a no-op in memory."""
        if self._host is not None:
            self._host.close()


# --- against the real host ------------------------------------------------------------------


def _statebox_bin():
    found = os.environ.get("STATEBOX") or shutil.which("statebox")
    if not found:
        raise RuntimeError(
            "TwsTester(host=True) runs the processor in the real host: put statebox on PATH "
            "or set STATEBOX to its path"
        )
    return found


def _plain(value):
    return json.loads(_codec.dumps(_codec.plain(value)))


class _HostDriver:
    """Drives ``statebox tws-driver``: one query on a fresh checkpoint, whose batches are
    the tester's calls (one key each), at the tester's processing time."""

    def __init__(self, tester, initial_state):
        self.tester = tester
        source = inspect.getsourcefile(type(tester.processor))
        if source is None:
            raise RuntimeError("TwsTester(host=True) needs the processor's class in a file")
        output_schema = None
        module = sys.modules.get(type(tester.processor).__module__)
        for holder in (module, type(tester.processor)):
            for name in ("OUTPUT_SCHEMA", "outputSchema", "output_schema"):
                if output_schema is None and getattr(holder, name, None) is not None:
                    output_schema = getattr(holder, name)
        self.output_names = None
        if output_schema is not None:
            from .types import as_type, to_ddl

            self.output_names = list(as_type(to_ddl(output_schema)).names)
        self.key_columns = None
        self.initial_state = initial_state
        self.proc = subprocess.Popen(
            [_statebox_bin(), "tws-driver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.opened = False
        self.event_time = tester._timeMode == "eventtime"
        self.watermark = None  # set before the query opened: applied when it opens
        self.source = source
        self.class_name = type(tester.processor).__name__

    def _send(self, command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"statebox tws-driver exited (status {self.proc.wait()})")
        answer = json.loads(line)
        if answer.get("error"):
            raise RuntimeError(answer["error"])
        return answer

    def _open(self, key):
        width = len(key)
        self.key_columns = [f"__key{i}" for i in range(width)]
        initial = None
        if self.initial_state is not None:
            initial = []
            for k, row in self.initial_state:
                obj = _plain(row) if isinstance(row, dict) or hasattr(row, "__fields__") else {}
                for col, v in zip(self.key_columns, _as_key(k)):
                    obj[col] = _plain(v)
                initial.append(obj)
        self._send(
            {
                "open": {
                    "processor": self.source,
                    "class": self.class_name,
                    "key": self.key_columns,
                    "time_mode": _TIME_MODES[self.tester._timeMode],
                    "output_mode": str(self.tester._outputMode).lower(),
                    "initial_state": initial,
                    "event_time": self.event_time,
                }
            }
        )
        self.opened = True
        if self.watermark is not None:
            self._send({"watermark": self.watermark, "at_ms": self.tester._processingTimeMs})

    def _rows(self, emitted):
        out = []
        for obj in emitted:
            names = self.output_names or list(obj)
            out.append(Row(**{n: obj.get(n) for n in names}))
        return out

    def test(self, key, rows):
        if not self.opened:
            self._open(key)
        if len(key) != len(self.key_columns):
            raise ValueError(f"every key must have {len(self.key_columns)} column(s), got {key!r}")
        batch = []
        for r in rows:
            obj = r.asDict() if hasattr(r, "asDict") else dict(r)
            obj = {k: _plain(v) for k, v in obj.items()}
            for col, v in zip(self.key_columns, key):
                obj[col] = _plain(v)
            if self.event_time:
                obj["__event_time"] = _plain(self.tester._eventTimeExtractor(r))
            batch.append(obj)
        answer = self._send({"batch": batch, "at_ms": self.tester._processingTimeMs})
        return self._rows(answer.get("emitted", []))

    def write(self, key, ops):
        """Writes ``key``'s state (a batch of its own; nothing is emitted)."""
        if not self.opened:
            self._open(key)
        if len(key) != len(self.key_columns):
            raise ValueError(f"every key must have {len(self.key_columns)} column(s), got {key!r}")
        self._send(
            {
                "state": {"key": [_plain(v) for v in key], "ops": ops},
                "at_ms": self.tester._processingTimeMs,
            }
        )

    def set_watermark(self, watermark_ms):
        if not self.opened:
            # No query yet, so no timers: the watermark applies once it opens.
            self.watermark = watermark_ms
            return []
        answer = self._send({"watermark": watermark_ms, "at_ms": self.tester._processingTimeMs})
        return self._rows(answer.get("emitted", []))

    def advance(self, at_ms):
        if not self.opened:
            return []
        answer = self._send({"no_data": True, "at_ms": at_ms})
        return self._rows(answer.get("emitted", []))

    def peek(self, name, kind, key, state):
        if not self.opened:
            return None if kind == "value" else ([] if kind == "list" else {})
        answer = self._send({"read": {"var": name, "key": [_plain(v) for v in key]}})
        rows = answer.get("rows", [])
        if kind == "value":
            if not rows:
                return None
            return state._c.loads(json.dumps(rows[0]["value"]))
        if kind == "list":
            return [state._c.loads(json.dumps(r["list_element"])) for r in rows]
        return {
            state._k.loads(json.dumps(r["user_map_key"])): state._v.loads(
                json.dumps(r["user_map_value"])
            )
            for r in rows
        }

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            finally:
                self.proc.wait(timeout=30)
        self.proc.stdout.close()

    def __del__(self):
        try:
            if self.proc.poll() is None:
                self.proc.kill()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass

