"""``pyspark.sql.types`` inside a Statebox component."""

from statebox.types import *  # noqa: F401,F403
from statebox.types import __all__  # noqa: F401
