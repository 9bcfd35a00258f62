"""A stand-in for the component's generated bindings (``componentize_py_types`` and
``wit_world``), so the export glue (``statebox._component.export``) runs under plain CPython.

``install()`` must run before ``statebox`` is imported (the SDK binds the bindings' ``Err``
at import). The fake host keeps value state per key in a dict and records every
``use-key`` call; ``HOST`` is the one instance.
"""

import enum
import sys
import types
from dataclasses import dataclass


class Err(Exception):
    """The bindings' ``Err``: the failure case of a WIT ``result``."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value


@dataclass
class TimerValues:
    current_processing_time_ms: int
    current_watermark_ms: int


@dataclass
class ExpiredTimerInfo:
    expiry_time_ms: int


class ErrorKind(enum.Enum):
    INVALID_SCHEMA = 0
    SCHEMA_MISMATCH = 1
    EMPTY_LIST = 2
    NULL_ELEMENT = 3
    WRONG_PHASE = 4
    UNSUPPORTED_IN_TIME_MODE = 5
    INVALID_USE = 6
    LIMIT_EXCEEDED = 7


@dataclass
class StateError:
    kind: ErrorKind
    message: str


class TimeMode(enum.Enum):
    NONE = 0
    PROCESSING_TIME = 1
    EVENT_TIME = 2


@dataclass
class BadRow:
    index: int
    message: str


@dataclass
class ProcessorError_BadInputRow:  # noqa: N801 - the bindings' name
    value: BadRow


@dataclass
class ProcessorError_Failed:  # noqa: N801 - the bindings' name
    value: str


@dataclass
class ProcessorInfo:
    name: str
    output_schema: str
    input_schema: object
    output_event_time_column: object


@dataclass
class KeyRows:
    key: str
    rows: list


@dataclass
class KeyTimer:
    key: str
    expired_timer_info: ExpiredTimerInfo


@dataclass
class BatchError:
    index: int
    error: object


@dataclass
class HeldWrites:
    entries: list
    variables: list
    values: list
    user_keys: list


@dataclass
class WriteFailure:
    position: int
    error: StateError


@dataclass
class QueryInfo:
    query_id: str
    run_id: str
    batch_id: int


class FakeHost:
    """The host's side: the entries of the batched call in progress, the selected key,
    value state per (variable, key), and a log of ``use-key`` calls."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.entries = []
        self.current = None
        self.switches = []
        self.values = {}
        # Variables by number, and the number of writes in each `apply-writes` call.
        self.numbered = {}
        self.applied = []
        # Timers by key, and the timer calls made directly (not held), by name.
        self.timers = {}
        self.timer_calls = []
        self.query = QueryInfo("0f6a3c52-6a43-4a8e-9c4e-0d4b1b8e2f11", "run-1", 0)

    def begin_batch(self, keys):
        """A batched call starts: no key selected."""
        self.entries = list(keys)
        self.current = None
        self.switches = []

    def use_key(self, index):
        if not 0 <= index < len(self.entries):
            raise Err(StateError(ErrorKind.INVALID_USE, f"no entry {index}"))
        self.switches.append(index)
        self.current = self.entries[index]

    def apply_writes(self, writes):
        """Applies held value updates and timer registrations and deletions (variables
        2^32 - 1 and 2^32 - 2, the time as a JSON integer) in order; refuses a negative
        count, as a host refuses a value its schema does not allow."""
        self.applied.append(len(writes.values))
        for position, (entry, number, text) in enumerate(
            zip(writes.entries, writes.variables, writes.values)
        ):
            if number in (TIMER_REGISTER, TIMER_DELETE):
                timers = self.timers.setdefault(self.entries[entry], set())
                (timers.add if number == TIMER_REGISTER else timers.discard)(int(text))
                continue
            if '"count":-' in text:
                error = StateError(ErrorKind.SCHEMA_MISMATCH, f"refused {text}")
                raise Err(WriteFailure(position, error))
            self.values[(self.numbered[number], self.entries[entry])] = text

    def register_timer(self, at):
        self.timer_calls.append("register")
        self.timers.setdefault(self.key(), set()).add(at)

    def delete_timer(self, at):
        self.timer_calls.append("delete")
        self.timers.setdefault(self.key(), set()).discard(at)

    def list_timers(self):
        self.timer_calls.append("list")
        return sorted(self.timers.get(self.key(), ()))

    def key(self):
        if self.current is None:
            raise Err(StateError(ErrorKind.WRONG_PHASE, "no key selected"))
        return self.current


# The variable numbers of held timer registrations and deletions (`wit/batch.wit`).
TIMER_REGISTER = (1 << 32) - 1
TIMER_DELETE = (1 << 32) - 2

HOST = FakeHost()


class _Value:
    def __init__(self, name):
        self.name = name

    def exists(self):
        return (self.name, HOST.key()) in HOST.values

    def get(self):
        return HOST.values.get((self.name, HOST.key()))

    def update(self, text):
        HOST.values[(self.name, HOST.key())] = text

    def clear(self):
        HOST.values.pop((self.name, HOST.key()), None)

    def number(self):
        number = len(HOST.numbered)
        HOST.numbered[number] = self.name
        return number


def _get_value_state(name, schema, ttl):
    return _Value(name)


def _unsupported(*args):
    raise Err(StateError(ErrorKind.UNSUPPORTED_IN_TIME_MODE, "not in the fake host"))


def install():
    """Puts the fake bindings into ``sys.modules`` (idempotent)."""
    if "wit_world" in sys.modules:
        return
    cpt = types.ModuleType("componentize_py_types")
    cpt.Err = Err
    sys.modules["componentize_py_types"] = cpt

    world = types.ModuleType("wit_world")
    world.__path__ = []
    exports = types.ModuleType("wit_world.exports")
    exports.Processor = type("Processor", (), {})
    exports.BatchProcessor = type("BatchProcessor", (), {})
    imports = types.ModuleType("wit_world.imports")
    imports.__path__ = []

    wit_types = types.ModuleType("wit_world.imports.types")
    for cls in (
        TimerValues,
        ExpiredTimerInfo,
        ErrorKind,
        StateError,
        TimeMode,
        BadRow,
        ProcessorError_BadInputRow,
        ProcessorError_Failed,
        ProcessorInfo,
        KeyRows,
        KeyTimer,
        BatchError,
        QueryInfo,
    ):
        setattr(wit_types, cls.__name__, cls)

    keys = types.ModuleType("wit_world.imports.keys")
    keys.use_key = HOST.use_key
    keys.apply_writes = HOST.apply_writes
    keys.HeldWrites = HeldWrites

    handle = types.ModuleType("wit_world.imports.handle")
    handle.get_value_state = _get_value_state
    handle.get_list_state = _unsupported
    handle.get_map_state = _unsupported
    handle.delete_if_exists = lambda name: None
    handle.register_timer = HOST.register_timer
    handle.delete_timer = HOST.delete_timer
    handle.list_timers = HOST.list_timers
    handle.get_query_info = lambda: HOST.query

    log = types.ModuleType("wit_world.imports.log")
    log.Level = enum.Enum("Level", "TRACE DEBUG INFO WARN ERROR")
    log.log = lambda level, message: None

    world.exports = exports
    world.imports = imports
    for name, mod in (
        ("types", wit_types),
        ("keys", keys),
        ("handle", handle),
        ("log", log),
    ):
        setattr(imports, name, mod)
        sys.modules[f"wit_world.imports.{name}"] = mod
    sys.modules["wit_world"] = world
    sys.modules["wit_world.exports"] = exports
    sys.modules["wit_world.imports"] = imports
