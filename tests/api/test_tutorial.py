"""The tutorial's code, as written in docs/tutorial.md, run against the real control plane."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resourceconsist.flow.budget import Priority, spending_for
from resourceconsist.options import GarbageOptions
from resourceconsist.rules import lifecycle
from resourceconsist.testing import Cluster, LocalControlPlane, async_wait_for, finalizers


async def test_the_tutorial_adapter_converges(
    control_plane: LocalControlPlane, namespace: str, tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    result = await tutorial["tutorial_scenario"](control_plane, tmp_path / "backends", namespace)
    assert result["file_left"] is None, "the backends file must be gone with its Service"
    assert lifecycle.lifecycle_finalizer("web") not in finalizers(result["pod"])


def test_the_tutorial_provider_never_shows_a_reader_half_a_file(
    tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["BackendsDir"](tmp_path)
    big = {f"web-{i}": {"ip": f"10.0.{i // 250}.{i % 250}", "weight": 100} for i in range(500)}
    backends.write("ns", "web", {})
    done = threading.Event()
    seen: list[int] = []

    def writer() -> None:
        try:
            for round_ in range(300):
                backends.write("ns", "web", big if round_ % 2 else {})
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while not done.is_set():
            content = backends.read("ns", "web")  # a torn file raises JSONDecodeError here
            assert content is not None
            seen.append(len(content["pods"]))
    finally:
        thread.join()
    assert set(seen) <= {0, len(big)}
    assert [p.name for p in tmp_path.iterdir()] == ["ns_web.json"], "temp files left behind"


async def test_the_tutorial_adapter_s_stray_file_is_collected(
    cluster: Cluster, run_manager: Callable[..., Any], tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["BackendsDir"](tmp_path)
    backends.write(cluster.namespace, "gone", {})
    backends.write(cluster.namespace, "alive", {})
    await cluster.service("alive")
    async with run_manager(
        tutorial["CollectingFileAdapter"](backends), garbage=GarbageOptions(interval=None)
    ) as manager:
        (controller,) = manager.controllers.values()

        async def reported() -> Any:
            return controller.garbage.last_report

        report = await async_wait_for(reported, timeout=30, message="the start-up garbage pass")
        assert report.collected == [f"{cluster.namespace}/gone"]
    assert backends.read(cluster.namespace, "gone") is None
    assert backends.read(cluster.namespace, "alive") is not None


def test_the_tutorial_metered_provider_spends_the_budget_at_the_priority_set(
    tmp_path: Path, tutorial: dict[str, Any]
) -> None:
    backends = tutorial["MeteredBackendsDir"](tmp_path, account="tutorial:metered-test")
    before = backends.budget.snapshot()
    backends.write("ns", "web", {"web-0": {"ip": "10.0.0.7", "weight": 100}})
    assert backends.read("ns", "web") == {"pods": {"web-0": {"ip": "10.0.0.7", "weight": 100}}}
    with spending_for(Priority.REMOVE_TRAFFIC):
        backends.remove("ns", "web")

    def refused() -> None:
        raise tutorial["ThrottledError"]("3")

    with pytest.raises(tutorial["ThrottledError"]):
        backends.request(refused)
    after = backends.budget.snapshot()
    assert after.granted[Priority.READ] - before.granted[Priority.READ] == 3
    assert after.granted[Priority.REMOVE_TRAFFIC] - before.granted[Priority.REMOVE_TRAFFIC] == 1
    assert after.throttles[Priority.READ] - before.throttles[Priority.READ] == 1
    assert backends.read("ns", "web") is None
