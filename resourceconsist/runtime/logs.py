"""How the process logs: text for a terminal, or one JSON object a line with zap's keys for a log
pipeline, each line carrying the fields of the pass it was written in (docs/observability.md).

A controller binds, around each pass, controller-runtime's keys of a reconcile: its own name
(``controller``), the employer's kind and API group (``controllerKind``, ``controllerGroup``), the
employer's ``namespace`` and ``name``, and a ``reconcileID`` (a UUID per pass: what one greps to
follow one pass across its lines). They live in a context variable (``pass_fields``), so the tasks
and adapter threads of the pass carry them too; a log call may add fields of its own with
``extra={"pod": name}``. The JSON formatter writes them beside zap's ``level``, ``ts``, ``logger``,
``caller`` and ``msg``; the text format writes its line as it always did and, on a line of a pass,
the fields after it as one JSON object (zap's console encoder does the same). Standard library
only: the command line sets logging up before it loads anything else.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Final, TextIO

#: The levels ``--log-level`` takes.
LEVELS: Final = ("debug", "info", "warning", "error")
#: The formats ``--log-format`` takes.
FORMATS: Final = ("text", "json")
#: The line of the text format (unchanged since the first release).
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The fields a call's ``extra`` may give (not ``name``, which is the logger's own attribute on a
#: ``LogRecord``): the pass binds the first ones itself; ``version`` and ``revision`` are on the
#: first line of ``run`` and ``webhook``.
EXTRA_FIELDS: Final = ("controller", "namespace", "pod", "version", "revision")
#: The key of a pass's UUID (controller-runtime's).
RECONCILE_ID: Final = "reconcileID"

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


def pass_fields(controller: str, kind: str, group: str, key: str) -> AbstractContextManager[None]:
    """``log_fields`` of one reconcile pass, with controller-runtime's keys: ``controller``,
    ``controllerGroup`` and ``controllerKind`` (the employer's API group, ``""`` for the core
    group, and kind), the employer's ``namespace`` (none for a cluster-scoped one) and ``name``,
    and a fresh ``reconcileID``."""
    # Here, not at the top: the command line sets up logging before it loads the cluster I/O.
    from resourceconsist.cluster.kube import EmployerKey

    key = EmployerKey(key)
    fields = {"controller": controller, "controllerGroup": group, "controllerKind": kind}
    if key.namespace:
        fields["namespace"] = key.namespace
    fields["name"] = key.name
    fields[RECONCILE_ID] = str(uuid.uuid4())
    return log_fields(**fields)


def current_fields() -> Mapping[str, str]:
    """The fields bound where this runs (empty outside a pass): e.g. its ``reconcileID``."""
    return _FIELDS.get() or {}


def _fields_of(record: logging.LogRecord) -> dict[str, object]:
    """The fields of ``record``: those bound where it was logged, then its ``extra`` ones."""
    fields: dict[str, object] = dict(_FIELDS.get() or {})
    for field in EXTRA_FIELDS:
        value = record.__dict__.get(field)
        if value is not None:
            fields[field] = value
    return fields


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, and on a line with fields (a pass's, a call's ``extra``) those fields as
    one JSON object after it, as zap's console encoder writes them."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields_of(record)
        if not fields:
            return line
        encoded = json.dumps(fields, ensure_ascii=False, separators=(",", ":"), default=str)
        # The fields end the message's first line, before a traceback.
        first, newline, rest = line.partition("\n")
        return f"{first}\t{encoded}{newline}{rest}"


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
        entry.update(_fields_of(record))
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
    handler.setFormatter(JSONFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # The official client logs every request body at DEBUG; keep it quiet.
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
