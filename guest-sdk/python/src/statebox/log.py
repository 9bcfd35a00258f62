"""Logging to the host: messages become ``tracing`` events tagged with the processor.

``print`` works too (the host captures stdout and stderr into its log)."""

from ._host import log_module

__all__ = ["trace", "debug", "info", "warn", "warning", "error"]


def _log(level_name, message):
    log = log_module()
    log.log(getattr(log.Level, level_name), str(message))


def trace(message):
    _log("TRACE", message)


def debug(message):
    _log("DEBUG", message)


def info(message):
    _log("INFO", message)


def warn(message):
    _log("WARN", message)


warning = warn


def error(message):
    _log("ERROR", message)
