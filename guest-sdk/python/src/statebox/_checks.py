"""Build-time checks that turn what a PySpark user may paste into a processor file, but the
sandbox cannot run, into errors naming the file, the line and what to do instead.

Both run while ``statebox build-python`` pre-initialises the component, so nothing here
costs anything at run time:

- :func:`explain_import` words an ``ImportError`` raised by the file: pandas and other
  native-code packages, PySpark APIs the stand-in does not have, modules not in the sandbox.
- :func:`undefined_globals` finds names a handler reads that the file never defines (a
  handler calling ``spark.sql(...)`` is the usual one) and handlers that use a
  ``SparkSession`` or ``DataFrame`` of a job script.
"""

import builtins
import dis
import types

#: Packages with native code (or that need one): a component holds pure Python only.
_NATIVE = {
    "pandas": "pandas needs native code, which the sandbox cannot load: write the processor "
    "with the row-based API (transformWithState: rows are Rows, emit Rows), not "
    "transformWithStateInPandas and DataFrames",
    "numpy": "numpy needs native code, which the sandbox cannot load: use plain Python "
    "numbers, lists and the math/statistics modules",
    "pyarrow": "pyarrow needs native code, which the sandbox cannot load: rows are Rows, "
    "not Arrow batches",
    "scipy": "scipy needs native code, which the sandbox cannot load",
    "sklearn": "scikit-learn needs native code, which the sandbox cannot load",
    "torch": "torch needs native code, which the sandbox cannot load",
    "py4j": "py4j talks to a JVM, which the sandbox does not have",
    "requests": "requests needs sockets, which the sandbox does not have: make HTTP calls "
    "from an AsyncStatefulProcessor with aiohttp (Statebox provides a client over "
    "wasi:http; grant hosts with --allow-http)",
    "httpx": "httpx needs sockets, which the sandbox does not have: use aiohttp from an "
    "AsyncStatefulProcessor (grant hosts with --allow-http)",
    "urllib3": "urllib3 needs sockets, which the sandbox does not have: use aiohttp from an "
    "AsyncStatefulProcessor (grant hosts with --allow-http)",
}

#: What the ``pyspark`` stand-in provides, for the message about a missing part.
_PYSPARK_PARTS = (
    "pyspark.sql (Row, SparkSession for a job script), pyspark.sql.types, "
    "pyspark.sql.functions (col, from_json for a job script), pyspark.sql.streaming "
    "(StatefulProcessor, AsyncStatefulProcessor, their handles), "
    "pyspark.sql.streaming.stateful_processor and pyspark.sql.streaming.tws_tester"
)


def explain_import(err):
    """What to tell the user about ``err``, an ``ImportError`` of the processor file."""
    name = getattr(err, "name", None) or ""
    root = name.split(".")[0]
    if root in _NATIVE:
        return f"import of {name!r} failed: {_NATIVE[root]}"
    if root == "aiohttp":
        return (
            f"{name} is not part of Statebox's aiohttp client ({err}), which provides the "
            f"client: ClientSession, ClientResponse, ClientTimeout, aiohttp.request and the "
            f"client errors"
        )
    if root == "pyspark":
        missing = name if isinstance(err, ModuleNotFoundError) else f"a name from {name}"
        return (
            f"{missing} is not part of Statebox's PySpark stand-in ({err}). The sandbox has "
            f"{_PYSPARK_PARTS}; a processor runs without a SparkSession"
        )
    if isinstance(err, ModuleNotFoundError) and name:
        return (
            f"ModuleNotFoundError: module {name!r} is not in the sandbox: a processor can import the Python "
            f"standard library, pyspark (Statebox's stand-in), aiohttp and statebox only, and "
            f"the file is bundled alone (copy small helpers into it)"
        )
    return f"{type(err).__name__}: {err}"


def line_in(tb, filename):
    """The line of the innermost traceback frame in ``filename`` (1 if none is)."""
    line = 1
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _stored_globals(module_code):
    """Every name some code of the module assigns at module level or with ``global``."""
    names = set()
    for code in _code_objects(module_code):
        for ins in dis.get_instructions(code):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                names.add(ins.argval)
            elif ins.opname in ("STORE_NAME", "IMPORT_NAME") and code is module_code:
                names.add(ins.argval)
    return names


def _is_spark_object(value):
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("statebox._job") or module.startswith("pyspark.sql.session")


def undefined_globals(cls, module, module_code, display_path):
    """``(line, message)`` for the first name a method of ``cls`` reads as a global that the
    file never defines, or that is a job script's ``SparkSession``/``DataFrame``; None if
    there is none."""
    namespace = vars(module)
    stored = _stored_globals(module_code)
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) != module.__name__:
            continue
        for attr, fn in vars(klass).items():
            fn = getattr(fn, "__func__", fn)
            code = getattr(fn, "__code__", None)
            if code is None or code.co_filename != display_path:
                continue
            for sub in _code_objects(code):
                line = sub.co_firstlineno
                for ins in dis.get_instructions(sub):
                    positions = getattr(ins, "positions", None)
                    if positions is not None and positions.lineno:
                        line = positions.lineno
                    if ins.opname != "LOAD_GLOBAL":
                        continue
                    name = ins.argval
                    if name in namespace:
                        if _is_spark_object(namespace[name]):
                            return line, _spark_message(klass, attr, name)
                        continue
                    if hasattr(builtins, name) or name in stored:
                        continue
                    if name in ("spark", "sc", "sqlContext", "dbutils", "display"):
                        return line, _spark_message(klass, attr, name)
                    return line, (
                        f"{klass.__name__}.{attr} uses {name!r}, which the processor file "
                        f"never defines (it would fail with NameError when called)"
                    )
    return None


def _spark_message(klass, attr, name):
    return (
        f"{klass.__name__}.{attr} uses {name!r}: a processor runs in a sandbox without "
        f"Spark, so handlers cannot call a SparkSession (spark.sql(...), spark.read, "
        f"DataFrames) or notebook globals. Load reference data as initial state "
        f"(handleInitialState, --initial-state) or keep it in state"
    )
