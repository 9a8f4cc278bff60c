"""How the process logs: text for a terminal, or one JSON object a line with zap's keys for a log
pipeline, each line carrying the fields of the pass it was written in (docs/observability.md).

A controller binds its name and the employer's namespace and name around each pass
(``employer_fields``, a context variable, so the tasks and adapter threads of the pass carry them
too); a log call may add fields of its own with ``extra={"pod": name}``. The JSON formatter writes
them beside zap's ``level``, ``ts``, ``logger``, ``caller`` and ``msg``; the text format stays as it
was. Standard library only: the command line sets logging up before it loads anything else.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Final, TextIO

#: The levels ``--log-level`` takes.
LEVELS: Final = ("debug", "info", "warning", "error")
#: The formats ``--log-format`` takes.
FORMATS: Final = ("text", "json")
#: The line of the text format (unchanged since the first release).
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The fields a line carries when known: the pass binds them all; a call's ``extra`` may give
#: these (not ``name``, which is the logger's own attribute on a ``LogRecord``).
EXTRA_FIELDS: Final = ("controller", "namespace", "pod")

#: zap's level names (``warn``, not ``warning``); Python's CRITICAL has no zap twin.
_ZAP_LEVELS: Final = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}

_FIELDS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "resourceconsist_log_fields", default=None
)


@contextmanager
def log_fields(**fields: str) -> Iterator[None]:
    """Lines logged inside (tasks and threads started inside included) carry ``fields``."""
    current = _FIELDS.get()
    token = _FIELDS.set({**current, **fields} if current else fields)
    try:
        yield
    finally:
        _FIELDS.reset(token)


def employer_fields(controller: str, key: str) -> AbstractContextManager[None]:
    """``log_fields`` of one pass: the controller, and the employer of ``key`` (no namespace for
    a cluster-scoped employer)."""
    # Here, not at the top: the command line sets up logging before it loads the cluster I/O.
    from resourceconsist.cluster.kube import EmployerKey

    key = EmployerKey(key)
    if key.namespace:
        return log_fields(controller=controller, namespace=key.namespace, name=key.name)
    return log_fields(controller=controller, name=key.name)


class JSONFormatter(logging.Formatter):
    """One JSON object a line with zap's production keys: ``level``, ``ts`` (seconds since the
    epoch, a float, as zap's production encoder writes it), ``logger``, ``caller``, ``msg``, the
    known ``FIELDS``, and ``error`` and ``stacktrace`` when an exception is logged."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "level": _ZAP_LEVELS.get(record.levelno) or record.levelname.lower(),
            "ts": record.created,
            "logger": record.name,
            "caller": _caller(record),
            "msg": record.getMessage(),
        }
        fields = _FIELDS.get()
        if fields:
            entry.update(fields)
        for field in EXTRA_FIELDS:
            value = record.__dict__.get(field)
            if value is not None:
                entry[field] = value
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry["error"] = str(error) or type(error).__name__
            entry["stacktrace"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["stacktrace"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":"), default=str)


def _caller(record: logging.LogRecord) -> str:
    """``package/file.py:line``, zap's short caller."""
    parts = record.pathname.replace("\\", "/").rsplit("/", 2)
    return f"{'/'.join(parts[-2:])}:{record.lineno}"


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``setup`` installs: found again and replaced by the next ``setup``."""


def setup(level: str = "info", log_format: str = "text", stream: TextIO | None = None) -> None:
    """Log at ``level`` and above to ``stream`` (stderr), as text or JSON (``--log-level``,
    ``--log-format``)."""
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JSONFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # The official client logs every request body at DEBUG; keep it quiet.
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
