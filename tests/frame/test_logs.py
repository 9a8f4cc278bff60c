"""The log format (docs/observability.md, "Logs"): JSON lines with zap's keys, the fields of the
pass they were written in (also from a worker thread of the pass), controller-runtime's keys of a
pass (``reconcileID``, ``controllerKind``, ``controllerGroup``), a call's own ``pod``, an exception
as ``error`` and ``stacktrace``; the text format as it always was, with a pass's fields after its
line."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from resourceconsist.runtime import logs


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """What ``logs.setup`` writes, for one test; the root logger is as it was afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield io.StringIO()
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)


def _entries(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_zaps_keys_and_the_fields_of_the_pass(stream: io.StringIO) -> None:
    logs.setup("debug", "json", stream)
    log = logging.getLogger("resourceconsist.reconcile")
    with logs.pass_fields("demo-controller", "Service", "", "shop/web"):
        log.info("%s %s: added clean finalizer", "demo-controller", "shop/web")
        log.info("pod web-0: readiness gate True", extra={"pod": "web-0"})
    with logs.pass_fields("nodes", "Node", "", "node-1"):  # a cluster-scoped employer has no namespace
        log.warning("drifted")
    log.debug("outside any pass")
    first, gate, cluster_scoped, outside = _entries(stream)
    assert list(first)[:5] == ["level", "ts", "logger", "caller", "msg"]
    assert first["level"] == "info"
    assert first["logger"] == "resourceconsist.reconcile"
    assert first["msg"] == "demo-controller shop/web: added clean finalizer"
    assert str(first["caller"]).startswith("frame/test_logs.py:")
    assert isinstance(first["ts"], float)
    assert (first["controller"], first["namespace"], first["name"]) == ("demo-controller", "shop", "web")
    assert "pod" not in first
    assert gate["pod"] == "web-0" and gate["name"] == "web"
    assert cluster_scoped["level"] == "warn"
    assert (cluster_scoped["name"], "namespace" in cluster_scoped) == ("node-1", False)
    assert outside["level"] == "debug" and "controller" not in outside


def test_a_thread_of_the_pass_carries_its_fields(stream: io.StringIO) -> None:
    logs.setup("info", "json", stream)

    async def pass_() -> None:
        with logs.pass_fields("demo-controller", "Service", "", "shop/web"):
            # An adapter's blocking call runs in a worker thread (docs/concepts.md).
            await asyncio.to_thread(logging.getLogger("adapter").info, "provider call")

    asyncio.run(pass_())
    (entry,) = _entries(stream)
    assert (entry["controller"], entry["namespace"], entry["name"]) == ("demo-controller", "shop", "web")


def test_an_exception_is_error_and_stacktrace(stream: io.StringIO) -> None:
    logs.setup("info", "json", stream)
    try:
        raise RuntimeError("provider unreachable")
    except RuntimeError:
        logging.getLogger("resourceconsist.runtime.controller").exception("reconcile crashed")
    (entry,) = _entries(stream)
    assert entry["level"] == "error"
    assert entry["error"] == "provider unreachable"
    assert str(entry["stacktrace"]).startswith("Traceback (most recent call last):")
    assert "RuntimeError: provider unreachable" in str(entry["stacktrace"])


def test_text_stays_as_it_was_and_setup_replaces_its_own_handler(stream: io.StringIO) -> None:
    logs.setup("info", "json", stream)
    logs.setup("warning", "text", stream)
    log = logging.getLogger("resourceconsist.runtime.manager")
    log.info("not shown")
    log.warning("manager stopped")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" WARNING resourceconsist.runtime.manager: manager stopped")


def test_a_pass_carries_controller_runtimes_keys_and_an_id_of_its_own(stream: io.StringIO) -> None:
    logs.setup("info", "json", stream)
    log = logging.getLogger("resourceconsist.reconcile")
    with logs.pass_fields("demo-controller", "Service", "", "shop/web"):
        log.info("first line of the pass")
        log.info("second line of the pass")
    with logs.pass_fields("ingress-controller", "Ingress", "networking.k8s.io", "shop/web"):
        log.info("another pass")
    first, second, other = _entries(stream)
    assert {
        k: first[k] for k in ("controller", "controllerGroup", "controllerKind", "namespace", "name")
    } == {
        "controller": "demo-controller",
        "controllerGroup": "",
        "controllerKind": "Service",
        "namespace": "shop",
        "name": "web",
    }
    assert first["reconcileID"] == second["reconcileID"] != other["reconcileID"]
    assert len(str(first["reconcileID"])) == 36  # a UUID
    assert (other["controllerKind"], other["controllerGroup"]) == ("Ingress", "networking.k8s.io")


def test_the_text_format_writes_the_fields_of_a_pass_after_its_line(stream: io.StringIO) -> None:
    logs.setup("info", "text", stream)
    log = logging.getLogger("resourceconsist.reconcile")
    with logs.pass_fields("demo-controller", "Service", "", "shop/web"):
        log.info("added clean finalizer")
        try:
            raise RuntimeError("provider unreachable")
        except RuntimeError:
            log.exception("reconcile crashed")
    log.info("outside any pass")
    lines = stream.getvalue().splitlines()
    line, fields = lines[0].split("\t")
    assert line.endswith(" INFO resourceconsist.reconcile: added clean finalizer")
    bound = json.loads(fields)
    assert (bound["controller"], bound["controllerKind"], bound["name"]) == (
        "demo-controller",
        "Service",
        "web",
    )
    # The fields end the first line of a line with a traceback; the traceback follows.
    crashed = lines[1].split("\t")
    assert crashed[0].endswith("reconcile crashed") and json.loads(crashed[1]) == bound
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1].endswith(" INFO resourceconsist.reconcile: outside any pass")
