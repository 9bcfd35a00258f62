"""``Row``: a tuple with named fields, as in ``pyspark.sql.Row``."""

import functools

__all__ = ["Row"]


class Row(tuple):
    """A row: a tuple whose items may have names.

    ``Row(user="u1", count=3)`` has fields ``user`` and ``count`` (in that order), readable as
    ``row.user``, ``row["user"]`` or ``row[0]``. ``Row("user", "count")`` makes a row class
    whose call fills the fields by position: ``UserCount = Row("user", "count");
    UserCount("u1", 3)``.
    """

    def __new__(cls, *args, **kwargs):
        if kwargs:
            if args:
                raise ValueError(
                    "a Row takes either positional values or named values, not both"
                )
            if cls is Row:
                # The usual `Row(a=..., b=...)`: a Row of a cached class that holds the field
                # names, so no per-row dict is made (the cache looked up here, not through
                # row_maker: a handler makes one per emitted row).
                names = tuple(kwargs)
                maker = _MAKERS.get(names)
                if maker is None:
                    maker = row_maker(names)
                return maker(kwargs.values())
            row = tuple.__new__(cls, kwargs.values())
            row.__dict__["__fields__"] = list(kwargs)
            return row
        return tuple.__new__(cls, args)

    @classmethod
    def _make(cls, names, values):
        """A row with the given field names and values (the SDK's fast path)."""
        row = tuple.__new__(cls, values)
        row.__dict__["__fields__"] = names
        return row

    def asDict(self, recursive=False):
        """The row as a ``dict`` from field name to value."""
        if not hasattr(self, "__fields__"):
            raise TypeError("cannot convert a Row without field names to a dict")
        if not recursive:
            return dict(zip(self.__fields__, self))

        def convert(value):
            if isinstance(value, Row) and hasattr(value, "__fields__"):
                return value.asDict(True)
            if isinstance(value, list):
                return [convert(v) for v in value]
            if isinstance(value, dict):
                return {k: convert(v) for k, v in value.items()}
            return value

        return {k: convert(v) for k, v in zip(self.__fields__, self)}

    def __contains__(self, item):
        if hasattr(self, "__fields__"):
            return item in self.__fields__
        return tuple.__contains__(self, item)

    def __call__(self, *args):
        """Fills a row class made with ``Row("a", "b")``."""
        if len(args) > len(self):
            raise ValueError(f"too many values: {args!r} for fields {tuple(self)!r}")
        return Row._make(list(self), args)

    def __getitem__(self, item, _int=int, _get=tuple.__getitem__):
        if type(item) is _int or isinstance(item, (int, slice)):
            return _get(self, item)
        try:
            return tuple.__getitem__(self, self.__fields__.index(item))
        except (AttributeError, ValueError):
            raise KeyError(item) from None

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        try:
            return tuple.__getitem__(self, self.__fields__.index(item))
        except (AttributeError, ValueError):
            raise AttributeError(item) from None

    def __setattr__(self, key, value):
        if key != "__fields__":
            raise RuntimeError("Row is read-only")
        self.__dict__[key] = value

    def __reduce__(self):
        if hasattr(self, "__fields__"):
            return (Row._make, (self.__fields__, tuple(self)))
        return (Row, tuple(self))

    def __repr__(self):
        if hasattr(self, "__fields__"):
            return "Row(%s)" % ", ".join(f"{k}={v!r}" for k, v in zip(self.__fields__, self))
        return "<Row(%s)>" % ", ".join(repr(f) for f in self)


_MAKERS = {}


def row_maker(names):
    """A C-level constructor of Rows with the field names ``names`` (a tuple): it takes an
    iterable of values. ``tuple.__new__`` bound to a Row subclass that holds the names as a
    class attribute, so making a row runs no Python code."""
    maker = _MAKERS.get(names)
    if maker is None:
        if len(_MAKERS) > 256:
            _MAKERS.clear()
        shape = type("Row", (Row,), {"__fields__": list(names), "__slots__": ()})
        maker = _MAKERS[names] = functools.partial(tuple.__new__, shape)
    return maker
