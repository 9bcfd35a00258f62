"""The glue between the component's exports (``processor`` and ``batch-processor``) and a
user's processor class.

``statebox build-python`` generates the component's entry module, which calls
:func:`export` while componentize-py pre-initialises the interpreter: the user's file is
compiled and imported then (so syntax and import errors, and handler methods with the wrong
signature, fail the build with file and line), and the interpreter is snapshotted with it
loaded, so an instance starts without importing anything.
"""

import functools
import inspect
import json
import linecache
import sys
import traceback
import types as _types

from . import _checks, _codec, _env
from ._host import HostError, handle_module
from .aio import (
    AsyncStatefulProcessor,
    AsyncStatefulProcessorHandle,
    collect,
    run_entries,
    run_keys,
)
from .processor import (
    ExpiredTimerInfo,
    StateError,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    _Held,
    _lift,
)
from .row import Row
from .types import StructType, as_type, to_ddl


class ProcessorDefinitionError(Exception):
    """The processor file does not define a usable processor. The message starts with
    ``file:line:``."""


class BadInputRow(Exception):
    """Input row ``index`` of the call could not be read."""

    def __init__(self, index, message):
        super().__init__(message)
        self.index = index
        self.message = message


# The parameters PySpark passes to each method, after ``self``.
_METHODS = {
    "init": ("handle",),
    "handleInputRows": ("key", "rows", "timerValues"),
    "handleExpiredTimer": ("key", "timerValues", "expiredTimerInfo"),
    "handleInitialState": ("key", "initialState", "timerValues"),
    "close": (),
}

_SNAKE = {
    "handle_input_rows": "handleInputRows",
    "handle_expired_timer": "handleExpiredTimer",
    "handle_initial_state": "handleInitialState",
    "handleinputrows": "handleInputRows",
    "handleInput": "handleInputRows",
    "handleExpiredTimers": "handleExpiredTimer",
}


def _where(obj, display_path):
    try:
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        code = getattr(obj, "__code__", None)
        line = code.co_firstlineno if code is not None else 1
    return f"{display_path}:{line}"


def load_module(source_path, display_path, module_name):
    """Compiles and runs the user's file as module ``module_name``, with ``display_path`` as
    its file name so tracebacks (at build time and at run time) name the user's file."""
    with open(source_path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines(True)
    linecache.cache[display_path] = (len(source), None, lines, display_path)
    code = compile(source, display_path, "exec")
    module = _types.ModuleType(module_name)
    module.__file__ = display_path
    module.__statebox_code__ = code
    # A notebook's predefined `spark`: the recording stand-in of a job script.
    from ._job import SparkSession, UnsupportedCall

    module.__dict__["spark"] = SparkSession.getActiveSession()
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except UnsupportedCall as e:
        # A PySpark call the stand-in does not provide, made at module level: its message
        # starts with the file and line.
        raise ProcessorDefinitionError(str(e)) from None
    except _env.MissingEnvironmentVariable as e:
        line = _checks.line_in(e.__traceback__, display_path)
        raise ProcessorDefinitionError(f"{display_path}:{line}: {e}") from None
    except ImportError as e:
        line = _checks.line_in(e.__traceback__, display_path)
        raise ProcessorDefinitionError(
            f"{display_path}:{line}: {_checks.explain_import(e)}"
        ) from None
    return module


def find_processor(module, display_path, class_name=None):
    """The processor class (or instance) the module defines."""
    if class_name:
        found = getattr(module, class_name, None)
        if found is None:
            raise ProcessorDefinitionError(
                f"{display_path}:1: there is no {class_name!r} in the processor file"
            )
        return found
    explicit = getattr(module, "PROCESSOR", None)
    if explicit is not None:
        return explicit
    bases = (StatefulProcessor, AsyncStatefulProcessor)
    candidates = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, bases)
        and obj not in bases
        and obj.__module__ == module.__name__
    ]
    if not candidates:
        raise ProcessorDefinitionError(
            f"{display_path}:1: no processor: define a class that subclasses StatefulProcessor "
            f"(from pyspark.sql.streaming import StatefulProcessor) or AsyncStatefulProcessor"
        )
    if len(candidates) > 1:
        # Prefer the one no other candidate derives from (a processor built on a base class).
        leaves = [c for c in candidates if not any(o is not c and issubclass(o, c) for o in candidates)]
        if len(leaves) != 1:
            names = ", ".join(c.__name__ for c in candidates)
            raise ProcessorDefinitionError(
                f"{display_path}:1: several processor classes ({names}): set "
                f"PROCESSOR = TheOne in the file or pass --class"
            )
        return leaves[0]
    return candidates[0]


def check_processor(cls, display_path):
    """Checks the handler methods' names and signatures against PySpark's."""
    is_async = issubclass(cls, AsyncStatefulProcessor)
    if not is_async and not issubclass(cls, StatefulProcessor):
        raise ProcessorDefinitionError(
            f"{_where(cls, display_path)}: {cls.__name__} must subclass StatefulProcessor or "
            f"AsyncStatefulProcessor"
        )
    base = AsyncStatefulProcessor if is_async else StatefulProcessor
    for wrong, right in _SNAKE.items():
        fn = getattr(cls, wrong, None)
        if fn is not None and getattr(cls, right) is getattr(base, right):
            raise ProcessorDefinitionError(
                f"{_where(fn, display_path)}: {cls.__name__}.{wrong} is never called: "
                f"the method is named {right} (PySpark's name)"
            )
    for name, params in _METHODS.items():
        fn = getattr(cls, name)
        if fn is getattr(base, name):
            if name in ("init", "handleInputRows"):
                raise ProcessorDefinitionError(
                    f"{_where(cls, display_path)}: {cls.__name__} does not implement "
                    f"{name}(self, {', '.join(params)})"
                )
            continue
        if not callable(fn):
            raise ProcessorDefinitionError(
                f"{display_path}:1: {cls.__name__}.{name} is not a method"
            )
        where = _where(fn, display_path)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(None, *params)
        except TypeError:
            raise ProcessorDefinitionError(
                f"{where}: {cls.__name__}.{name}{sig} cannot be called as "
                f"{name}(self{''.join(', ' + p for p in params)}): Spark and Statebox "
                f"call it with these arguments, so declare them all (PySpark would fail "
                f"the same way, when the first batch calls it)"
            ) from None
        coroutine = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
        if is_async and not coroutine:
            raise ProcessorDefinitionError(
                f"{where}: {cls.__name__}.{name} must be `async def` in an "
                f"AsyncStatefulProcessor"
            )
        if not is_async and coroutine:
            raise ProcessorDefinitionError(
                f"{where}: {cls.__name__}.{name} is `async def`: subclass "
                f"AsyncStatefulProcessor (from pyspark.sql.streaming import "
                f"AsyncStatefulProcessor) for an asynchronous processor"
            )
    return is_async


def _setting(module, cls, names):
    for name in names:
        value = getattr(module, name, None)
        if value is not None:
            return value
    for name in names:
        value = getattr(cls, name, None)
        if value is not None:
            return value
    return None


def _schema_setting(value, what, display_path):
    if value is None:
        return None
    try:
        ddl = to_ddl(value)
        return ddl, as_type(ddl)
    except (TypeError, ValueError) as e:
        raise ProcessorDefinitionError(f"{display_path}:1: the {what} is invalid: {e}") from None


class _Rows:
    """The input rows of one call: iterable (also with ``async for``) as ``Row``s, each
    decoded as it is reached, in the shape PySpark hands them over (see
    ``_codec.InputRows``: the input schema's columns in order, absent ones ``None``)."""

    __slots__ = ("_texts", "_columns", "_shape", "_from_lists")

    def __init__(self, texts, columns=None, shape=None, from_lists=None):
        self._texts = texts
        # Set when the host sent the rows by position: the columns of each value array.
        self._columns = columns
        self._shape = shape if shape is not None else _NO_SCHEMA
        # By position: ``shape.lists_reader(columns)``, made once for all keys of a call.
        self._from_lists = from_lists

    def __len__(self):
        if self._columns is not None:
            return len(_scan_plain(self._texts[0], 0)[0])
        return len(self._texts)

    def __iter__(self):
        texts = self._texts
        if self._columns is not None:
            # By position, the host sends one text: an array of the rows' value arrays.
            from_lists = self._from_lists
            if from_lists is None:
                from_lists = self._shape.lists_reader(self._columns)
            return from_lists(_scan_plain(texts[0], 0)[0])
        # One pass of the C decoder over all rows as one JSON array.
        try:
            dicts = _scan_plain("[" + ",".join(texts) + "]", 0)[0]
            if len(dicts) != len(texts) or not all(type(d) is dict for d in dicts):
                raise ValueError("a row is not exactly one JSON object")
        except (ValueError, StopIteration):
            for index, text in enumerate(texts):
                try:
                    value = json.loads(text)
                except ValueError as e:
                    raise BadInputRow(index, f"input row is not valid JSON: {e}") from None
                if type(value) is not dict:
                    raise BadInputRow(index, "input row is not a JSON object") from None
            raise
        return self._shape.from_dicts(dicts)

    async def _aiter(self):
        for row in self:
            yield row

    def __aiter__(self):
        return self._aiter()


_NO_SCHEMA = _codec.InputRows(None)


def _to_row(obj, _new=tuple.__new__):
    row = _new(Row, obj.values())
    row.__dict__["__fields__"] = list(obj)
    return row


_ROW_DECODER = json.JSONDecoder(object_hook=_to_row)
_scan_plain = json.JSONDecoder().scan_once


def _load_row(text, _decode=_ROW_DECODER.decode):
    """One JSON text, objects as ``Row``s (strict: the whole text must be one value)."""
    return _decode(text)


def _key(text):
    # Most keys are one string column without escapes: slice it out of the JSON text.
    if text.startswith('["') and text.endswith('"]'):
        inner = text[2:-2]
        if '"' not in inner and "\\" not in inner:
            return (inner,)
    value = _codec.loads(text)
    return tuple(value) if isinstance(value, list) else (value,)


_GLUE = ("statebox/_component.py", "statebox/aio.py")


def _format_error(method, err):
    frames = traceback.extract_tb(err.__traceback__)
    # Drop the SDK's own frames at the top (the export glue, the async scheduler): the
    # user's code is what matters.
    start = 0
    while start < len(frames) and frames[start].filename.endswith(_GLUE):
        start += 1
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[start:])
    lines += traceback.format_exception_only(type(err), err)
    return f"{method} raised {type(err).__name__}: {err}\n{''.join(lines)}".rstrip()



# --- TwsTester hook (built in by `statebox tws-driver` only) ----------------------------

_TWS_COLUMN = "__statebox_tws"


def _tws_ops(rows):
    """The state writes a tester row carries (``__statebox_tws``), or None for input rows.
    Reads the raw texts, so an input schema that leaves the column out does not hide it."""
    texts = rows._texts
    if not texts:
        return None
    if rows._columns is not None:
        columns = list(rows._columns)
        if _TWS_COLUMN not in columns:
            return None
        first = _scan_plain(texts[0], 0)[0][0]
        return json.loads(first[columns.index(_TWS_COLUMN)])
    first = json.loads(texts[0])
    if type(first) is not dict or _TWS_COLUMN not in first:
        return None
    return json.loads(first[_TWS_COLUMN])


def _tws_apply(states, ops):
    """Writes the current key's state through the host's imports (which check each stored
    JSON text against the variable's schema): ``TwsTester.update*State`` and
    ``deleteState`` against the real host."""
    for op in ops:
        name = op["var"]
        state = states.get(name)
        if state is None:
            raise StateError("invalid-use", f"State {name} has not been initialized.")
        h = state._h
        try:
            kind = op["op"]
            if kind == "value":
                h.update(op["value"])
            elif kind == "list":
                h.clear()
                if op["values"]:
                    h.put(op["values"])
            elif kind == "map":
                h.clear()
                for k, v in op["entries"]:
                    h.update_value(k, v)
            elif kind == "delete":
                h.clear()
            else:
                raise ValueError(f"unknown tester state operation {kind!r}")
        except HostError as e:
            raise _lift(e) from None


async def _no_rows():
    return
    yield  # noqa: B901 - makes this an async generator


def _tws_hook(proc, handle, is_async):
    """Records the variables ``proc`` declares on ``handle`` and makes its
    ``handleInputRows`` apply tester rows instead of seeing them."""
    states = {}
    for method in ("getValueState", "getListState", "getMapState"):
        declare = getattr(handle, method)

        def wrapped(*args, _declare=declare, **kwargs):
            state = _declare(*args, **kwargs)
            states[state.name] = state
            return state

        setattr(handle, method, wrapped)
    original = proc.handleInputRows

    def handleInputRows(key, rows, timerValues):
        ops = _tws_ops(rows)
        if ops is None:
            return original(key, rows, timerValues)
        _tws_apply(states, ops)
        return _no_rows() if is_async else []

    proc.handleInputRows = handleInputRows


def export(
    source_path,
    display_path,
    module_name,
    class_name=None,
    name=None,
    output_schema=None,
    input_schema=None,
    output_event_time_column=None,
    tws_driver=False,
    env=None,
):
    """Loads the user's processor and returns the classes implementing the component's
    exports: ``(Processor, BatchProcessor)``, for the ``processor`` interface (``describe``,
    ``init``, initial state, ``close``, and single-key calls) and the ``batch-processor``
    interface (input rows and expired timers of many keys per call)."""
    from componentize_py_types import Err
    from wit_world import exports
    from wit_world.imports import keys as wit_keys
    try:
        # In the world with wasi:http, Statebox's `types` is named after its package (the
        # wasi:http interface is also called `types`).
        from wit_world.imports import statebox_processor_types as wit
    except ImportError:
        from wit_world.imports import types as wit

    # Import every binding now, while componentize-py pre-initialises: the snapshot holds
    # the modules imported by then, and an instance imports nothing more.
    handle_module()
    from . import log

    log.log_module()
    try:
        # The wasi:http bindings the aiohttp client uses (absent outside a component).
        from wit_world.imports import poll  # noqa: F401

        from . import _http

        _http._bindings()
    except ImportError:
        pass

    # The sandbox has no asyncio event loop: asyncio.gather is the SDK scheduler's gather,
    # so the documentation's `await asyncio.gather(*requests)` runs unchanged.
    import asyncio

    from . import aio as _aio

    asyncio.gather = _aio.gather

    # The file sees the variables the build was given, at build time and (from the
    # snapshot) at run time. (`env` is None only when the SDK's own tests call this.)
    if env is not None:
        _env.install(env)
    module = load_module(source_path, display_path, module_name)
    found = find_processor(module, display_path, class_name)
    cls = found if isinstance(found, type) else type(found)
    is_async = check_processor(cls, display_path)
    undefined = _checks.undefined_globals(
        cls, module, module.__statebox_code__, display_path
    )
    if undefined is not None:
        line, message = undefined
        raise ProcessorDefinitionError(f"{display_path}:{line}: {message}")

    output = _schema_setting(
        output_schema
        or _setting(module, cls, ("OUTPUT_SCHEMA", "outputSchema", "output_schema")),
        "output schema",
        display_path,
    )
    if output is None:
        raise ProcessorDefinitionError(
            f"{display_path}:1: no output schema: set OUTPUT_SCHEMA = \"col type, ...\" (or a "
            f"StructType) in the file, or pass --output-schema"
        )
    output_ddl, output_type = output
    if not isinstance(output_type, StructType):
        raise ProcessorDefinitionError(
            f"{display_path}:1: the output schema {output_ddl!r} must be a list of fields"
        )
    inputs = _schema_setting(
        input_schema or _setting(module, cls, ("INPUT_SCHEMA", "inputSchema", "input_schema")),
        "input schema",
        display_path,
    )
    event_time_column = output_event_time_column or _setting(
        module, cls, ("OUTPUT_EVENT_TIME_COLUMN", "outputEventTimeColumn")
    )
    info = wit.ProcessorInfo(
        name=name or _setting(module, cls, ("NAME",)) or module_name,
        output_schema=output_ddl,
        input_schema=inputs[0] if inputs else None,
        output_event_time_column=event_time_column,
    )
    encode_row = _codec.row_encoder(output_type)
    input_type = inputs[1] if inputs else None
    if input_type is not None and not isinstance(input_type, StructType):
        raise ProcessorDefinitionError(
            f"{display_path}:1: the input schema {inputs[0]!r} must be a list of fields"
        )
    shape = _codec.InputRows(input_type)
    time_modes = {
        wit.TimeMode.NONE: "none",
        wit.TimeMode.PROCESSING_TIME: "processing-time",
        wit.TimeMode.EVENT_TIME: "event-time",
    }
    use_key = wit_keys.use_key
    BatchError = wit.BatchError
    # Writes held back and sent together, if the processor asks for it (a synchronous
    # processor only: an async one's keys interleave).
    held = None
    if not is_async and _setting(module, cls, ("HOLD_WRITES", "holdWrites")):
        held = _Held(wit_keys.apply_writes, wit_keys.HeldWrites)

    slot = {}

    def error_of(method, err):
        """The ``processor-error`` reporting ``err``, raised by ``method``."""
        if isinstance(err, BadInputRow):
            return wit.ProcessorError_BadInputRow(wit.BadRow(err.index, err.message))
        if isinstance(err, HostError):
            err = _lift(err)
        return wit.ProcessorError_Failed(_format_error(method, err))

    def failed(method, err):
        return Err(error_of(method, err))

    def before_init():
        return wit.ProcessorError_Failed(f"processor `{info.name}` was called before init")

    def processor(method):
        proc = slot.get("processor")
        if proc is None:
            raise Err(before_init())
        return proc

    def batch_processor():
        proc = slot.get("processor")
        if proc is None:
            raise Err(BatchError(0, before_init()))
        return proc

    def encode_all(rows):
        if rows is None:
            return []
        return [encode_row(r) for r in rows]

    def timer_values(tv):
        return TimerValues(tv.current_processing_time_ms, tv.current_watermark_ms)

    if is_async:

        def call(method, make):
            # A single-key call (the `processor` export): the host has selected the key.
            result = run_keys({0: [make]})[0]
            if isinstance(result, BaseException):
                raise failed(method, result)
            return result[0]

        def switch(index):
            try:
                use_key(index)
            except HostError as e:
                raise _lift(e) from None

        def call_batch(method, coros):
            # Every entry's handler at once: keys interleave whenever one suspends, and the
            # scheduler selects a task's key (use-key) before resuming it.
            tasks = run_entries(coros, switch)
            for index, task in enumerate(tasks):
                if task.error is not None:
                    raise Err(BatchError(index, error_of(method, task.error)))
            return [task.result for task in tasks]

        class Processor(exports.Processor):
            def describe(self):
                return info

            def init(self, time_mode):
                _env.restore()

                def make():
                    proc = found() if isinstance(found, type) else found
                    handle = StatefulProcessorHandle(handle_module(), time_modes[time_mode])
                    if tws_driver:
                        _tws_hook(proc, handle, True)
                    slot["processor"] = None

                    async def go():
                        await proc.init(AsyncStatefulProcessorHandle(handle))
                        slot["processor"] = proc

                    return go()

                try:
                    call("init", make)
                except Err:
                    raise
                except BaseException as e:  # noqa: BLE001
                    raise failed("init", e) from None

            def handle_input_rows(self, key, rows, timer_values_):
                proc = processor("handleInputRows")
                tv = timer_values(timer_values_)

                async def go():
                    out = await collect(proc.handleInputRows(_key(key), _Rows(rows, None, shape), tv))
                    return [encode_row(r) for r in out]

                return call("handleInputRows", go)

            def handle_expired_timer(self, key, timer_values_, expired_timer_info):
                proc = processor("handleExpiredTimer")
                tv = timer_values(timer_values_)
                info_ = ExpiredTimerInfo(expired_timer_info.expiry_time_ms)

                async def go():
                    out = await collect(proc.handleExpiredTimer(_key(key), tv, info_))
                    return [encode_row(r) for r in out]

                return call("handleExpiredTimer", go)

            def handle_initial_state(self, key, initial_state, timer_values_):
                proc = processor("handleInitialState")
                tv = timer_values(timer_values_)

                async def go():
                    await proc.handleInitialState(_key(key), _load_row(initial_state), tv)

                call("handleInitialState", go)

            def close(self):
                proc = slot.pop("processor", None)
                if proc is not None:

                    async def go():
                        await proc.close()

                    call("close", go)

        class BatchProcessor(exports.BatchProcessor):
            def positional_rows(self):
                return True

            def handle_input_batch(self, groups, columns, timer_values_):
                proc = batch_processor()
                tv = timer_values(timer_values_)
                handler = proc.handleInputRows
                from_lists = None if columns is None else shape.lists_reader(columns)

                async def go(group):
                    out = await collect(
                        handler(_key(group.key), _Rows(group.rows, columns, shape, from_lists), tv)
                    )
                    return list(map(encode_row, out))

                return call_batch("handleInputRows", [go(g) for g in groups])

            def handle_expired_timers(self, timers, timer_values_):
                proc = batch_processor()
                tv = timer_values(timer_values_)
                handler = proc.handleExpiredTimer

                async def go(timer):
                    info_ = ExpiredTimerInfo(timer.expired_timer_info.expiry_time_ms)
                    out = await collect(handler(_key(timer.key), tv, info_))
                    return list(map(encode_row, out))

                return call_batch("handleExpiredTimer", [go(t) for t in timers])

        return Processor, BatchProcessor

    class Processor(exports.Processor):
        def describe(self):
            return info

        def init(self, time_mode):
            _env.restore()
            try:
                proc = found() if isinstance(found, type) else found
                handle = StatefulProcessorHandle(handle_module(), time_modes[time_mode], held)
                if tws_driver:
                    _tws_hook(proc, handle, False)
                proc.init(handle)
            except BaseException as e:  # noqa: BLE001
                raise failed("init", e) from None
            slot["processor"] = proc

        def handle_input_rows(self, key, rows, timer_values_):
            proc = processor("handleInputRows")
            try:
                tv = timer_values(timer_values_)
                return encode_all(proc.handleInputRows(_key(key), _Rows(rows, None, shape), tv))
            except BaseException as e:  # noqa: BLE001
                raise failed("handleInputRows", e) from None

        def handle_expired_timer(self, key, timer_values_, expired_timer_info):
            proc = processor("handleExpiredTimer")
            try:
                tv = timer_values(timer_values_)
                info_ = ExpiredTimerInfo(expired_timer_info.expiry_time_ms)
                return encode_all(proc.handleExpiredTimer(_key(key), tv, info_))
            except BaseException as e:  # noqa: BLE001
                raise failed("handleExpiredTimer", e) from None

        def handle_initial_state(self, key, initial_state, timer_values_):
            proc = processor("handleInitialState")
            try:
                tv = timer_values(timer_values_)
                proc.handleInitialState(_key(key), _load_row(initial_state), tv)
            except BaseException as e:  # noqa: BLE001
                raise failed("handleInitialState", e) from None

        def close(self):
            proc = slot.pop("processor", None)
            if proc is not None:
                try:
                    proc.close()
                except BaseException as e:  # noqa: BLE001
                    raise failed("close", e) from None

    class BatchProcessor(exports.BatchProcessor):
        # The throughput path: one export call for up to a few hundred keys; per entry
        # `each_entry` selects the key, runs the handler as the single-key path does and
        # encodes the rows with C-level map().

        def positional_rows(self):
            # Rows by position skip building a dict per row: the biggest part of reading
            # input in Python.
            return True

        def handle_input_batch(self, groups, columns, timer_values_):
            # `each_entry` with the handler's call written out: this loop runs once per key
            # of the input, so it saves the frames of a per-entry closure and of `_key`.
            handler = batch_processor().handleInputRows
            tv = timer_values(timer_values_)
            select, encode, key_of, rows_of = use_key, encode_row, _key, _Rows
            out = []
            append = out.append
            index = 0
            if held is not None:
                held.start()
            try:
                from_lists = None if columns is None else shape.lists_reader(columns)
                for group in groups:
                    select(index)
                    if held is not None:
                        held.select(index)
                    text = group.key
                    # Most keys are one string column without escapes: slice it out.
                    if text[:2] == '["' and text[-2:] == '"]' and '"' not in text[2:-2] and (
                        "\\" not in text
                    ):
                        key = (text[2:-2],)
                    else:
                        key = key_of(text)
                    rows = handler(key, rows_of(group.rows, columns, shape, from_lists), tv)
                    append([] if rows is None else list(map(encode, rows)))
                    index += 1
            except BaseException as e:  # noqa: BLE001
                raise batch_failure(index, "handleInputRows", e) from None
            return finish_batch(out, "handleInputRows")

        def handle_expired_timers(self, timers, timer_values_):
            handler = batch_processor().handleExpiredTimer
            tv = timer_values(timer_values_)
            return each_entry(
                timers,
                "handleExpiredTimer",
                lambda timer: handler(
                    _key(timer.key),
                    tv,
                    ExpiredTimerInfo(timer.expired_timer_info.expiry_time_ms),
                ),
            )

    def each_entry(entries, method, run):
        """Runs the entries of a batched call in order: selects entry ``i``'s key, runs it and
        encodes the rows it emitted. A failure is reported with the entry's index."""
        select, encode = use_key, encode_row
        out = []
        append = out.append
        index = 0
        if held is not None:
            held.start()
        try:
            for entry in entries:
                select(index)
                if held is not None:
                    held.select(index)
                rows = run(entry)
                append([] if rows is None else list(map(encode, rows)))
                index += 1
        except BaseException as e:  # noqa: BLE001
            raise batch_failure(index, method, e) from None
        return finish_batch(out, method)

    def batch_failure(index, method, err):
        """The ``Err`` failing a batched call whose entry ``index`` raised ``err``; a held
        write the host refused earlier is named instead, by its own entry: it may be why."""
        refused = None if held is None else held.abandon()
        if refused is not None:
            index, err = refused
        return Err(BatchError(index, error_of(method, err)))

    def finish_batch(out, method):
        """Sends the writes still held at the end of a batched call; a held write the host
        refused fails the call, named by its entry."""
        if held is not None:
            refused = held.finish()
            if refused is not None:
                index, err = refused
                raise Err(BatchError(index, error_of(method, err)))
        return out

    return Processor, BatchProcessor
