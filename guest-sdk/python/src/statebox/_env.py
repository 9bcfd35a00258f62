"""``os.environ`` inside a processor: exactly the variables the build was given.

The processor file runs at build time (componentize-py imports it and snapshots the
interpreter), so a module-level ``os.environ["X"]`` is read then, and the value read is the
one every instance starts with. The build therefore decides what the file sees: the
variables passed with ``--env NAME=VALUE`` (or ``--env NAME``, ``STATEBOX_PYTHON_ENV``, or,
for a job script, the ones the script read when Statebox ran it), and nothing else from the
machine that builds it. They stay in the component (its snapshot holds them), so handlers
see the same values at run time.
"""

import os


class MissingEnvironmentVariable(KeyError):
    """``os.environ[NAME]`` for a variable the build was not given. A ``KeyError``, so
    ``try: ... except KeyError`` and ``os.environ.get`` behave as in CPython; its message
    says how to pass the variable."""

    def __init__(self, name, job=False):
        super().__init__(name)
        self.name = name
        self.job = job

    def __str__(self):
        if self.job:
            return (
                f"the environment variable {self.name} is not set: set it where statebox "
                f"runs ({self.name}=VALUE statebox run JOB.py) or pass --env "
                f"{self.name}=VALUE after the script"
            )
        return (
            f"the environment variable {self.name} is not set for this processor: the "
            f"build passes only the variables it is given; pass --env {self.name}=VALUE "
            f"(or --env {self.name} to take it from your environment) to statebox "
            f"build-python or statebox run, or list it in STATEBOX_PYTHON_ENV"
        )


# The variables the build gave, kept apart from ``os.environ`` (see ProcessorEnviron).
_GIVEN = {}


class ProcessorEnviron(dict):
    """``os.environ`` in a component: a dict of the variables the build was given.

    When an instance starts, componentize-py's runtime refills ``os.environ`` from the
    WASI environment, which the host leaves empty: it deletes every variable the snapshot
    holds (seen as an empty ``os.environ`` in handlers). So the variables given at build
    time are also kept apart, in ``_GIVEN``, and read through when the dict no longer
    holds them."""

    def __missing__(self, name):
        if name in _GIVEN:
            return _GIVEN[name]
        raise MissingEnvironmentVariable(name)

    def get(self, name, default=None):
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        return _GIVEN.get(name, default)

    def __contains__(self, name):
        return dict.__contains__(self, name) or name in _GIVEN


def restore():
    """Puts the variables the build gave back into ``os.environ`` when an instance starts
    (after componentize-py's runtime emptied it), so iterating it shows them too."""
    environ = os.environ
    if isinstance(environ, ProcessorEnviron):
        for name, value in _GIVEN.items():
            if not dict.__contains__(environ, name):
                dict.__setitem__(environ, name, value)


def install(variables):
    """Makes ``os.environ`` (and so ``os.getenv``) the given variables only."""
    _GIVEN.clear()
    _GIVEN.update(variables or {})
    environ = ProcessorEnviron(_GIVEN)
    os.environ = environ
    return environ


class ReadingEnviron(dict):
    """``os.environ`` while ``statebox run`` reads a job script under CPython: the real
    environment, noting which variables the script reads, so that the build of its
    processor is given those (and the component sees what ``python job.py`` would)."""

    def __init__(self, variables):
        super().__init__(variables)
        self.read = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)

    def __missing__(self, name):
        raise MissingEnvironmentVariable(name, job=True)

    def get(self, name, default=None):
        self.read.add(name)
        return super().get(name, default)

    def __contains__(self, name):
        self.read.add(name)
        return super().__contains__(name)

    def variables_read(self):
        """The variables the script read that are set: ``{name: value}``."""
        return {n: dict.__getitem__(self, n) for n in sorted(self.read) if dict.__contains__(self, n)}


def record_reads():
    """Makes ``os.environ`` a :class:`ReadingEnviron` of the real environment."""
    environ = ReadingEnviron(os.environ)
    os.environ = environ
    return environ
