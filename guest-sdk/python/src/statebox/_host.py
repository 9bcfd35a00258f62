"""The host's side of the WIT imports, when running inside a component.

Outside a component (under plain CPython, e.g. in a test that only imports the SDK) the
generated bindings do not exist; nothing here fails until a processor actually runs.
"""

try:
    from componentize_py_types import Err as HostError
except ImportError:  # pragma: no cover - only inside a component

    class HostError(Exception):
        """Stands in for the bindings' ``Err`` outside a component."""


def host_error(err):
    """The ``(kind, message)`` of a host ``Err(StateError)``."""
    value = getattr(err, "value", None)
    kind = getattr(value, "kind", None)
    message = getattr(value, "message", None)
    if kind is None or message is None:
        return "unknown", repr(value)
    return kind.name.lower().replace("_", "-"), message


def handle_module():
    """The ``handle`` interface's bindings."""
    from wit_world.imports import handle

    return handle


def log_module():
    """The ``log`` interface's bindings."""
    from wit_world.imports import log

    return log
