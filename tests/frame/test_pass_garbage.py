"""A pass is freed by reference counting, not by the garbage collector: nothing of it forms a
reference cycle, so the collector never has to find its thousands of objects
(docs/benchmarks.md, "Garbage a pass leaves")."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import pytest

from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.adapter import Outcome as CUDOutcome
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import frames_dropped
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider, ProviderError
from resourceconsist.reconcile.state import PassState
from resourceconsist.testing import Cluster, CollectorFinds, async_wait_for, collector_finds

PODS = 5


async def _web(cluster: Cluster) -> None:
    await cluster.service("web")
    for j in range(PODS):
        await cluster.pod(f"web-{j}", {"app": "web"})
        await cluster.set_status(f"web-{j}")


async def _registered(cluster: Cluster, provider: FakeProvider) -> None:
    await async_wait_for(
        lambda: len(provider.snapshot().get(f"{cluster.namespace}/web", {})) == PODS,
        timeout=60,
        message="the Service's pods registered",
    )


async def _found_over_ten(passes: Callable[[], int]) -> CollectorFinds:
    """What the collector finds of ten more passes (``passes`` counts them)."""
    with collector_finds() as found:
        mark = passes()
        await async_wait_for(lambda: passes() >= mark + 10, timeout=60, message="ten more passes")
    return found


class _PassNotes:
    """What an adapter learns in one pass, kept in ``ctx.scratch`` and holding the context, as
    the built-in adapters' per-pass objects do."""

    def __init__(self, ctx: ReconcileContext) -> None:
        self.ctx = ctx


class ScratchKeeper(DemoAdapter):
    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        ctx.scratch.setdefault("demo.pass", _PassNotes(ctx))
        return super().get_expected_employee(ctx, employer)


@pytest.mark.parametrize("adapter_type", [DemoAdapter, ScratchKeeper], ids=["demo", "scratch-keeper"])
async def test_passes_leave_nothing_for_the_garbage_collector(
    cluster: Cluster, run_manager: Any, adapter_type: type[DemoAdapter]
) -> None:
    """Also for an adapter whose per-pass object in ``ctx.scratch`` holds the context (the
    built-in adapters keep one): the scratch is the pass's, emptied when the pass ends."""
    await _web(cluster)
    provider = FakeProvider()
    async with run_manager(adapter_type(provider), resync_period=0.2) as manager:
        controller = manager.controllers["demo-controller"]
        await _registered(cluster, provider)
        found = await _found_over_ten(lambda: controller.reconciles)
    held = found.count(PassState, ReconcileContext, _PassNotes)
    assert held == 0, (
        f"{held} passes and contexts (of 10 or more passes) were freed by the garbage collector, not by "
        f"reference counting; it found {found}"
    )


class AsyncDemoAdapter(DemoAdapter):
    """The demo adapter with the provider's reads and creates as coroutines, on the loop, as the
    built-in adapters' are (a coroutine's error travels other frames than a thread's)."""

    async def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        return super().get_current_employee(ctx, employer)

    async def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> CUDOutcome[Employee]:
        return super().create_employees(ctx, employer, to_create)


@pytest.mark.parametrize("adapter_type", [DemoAdapter, AsyncDemoAdapter], ids=["threads", "coroutines"])
@pytest.mark.parametrize("failing", ["query_rs", "create_rs"])
async def test_failing_passes_leave_nothing_for_the_garbage_collector(
    cluster: Cluster, run_manager: Any, adapter_type: type[DemoAdapter], failing: str
) -> None:
    """A pass whose provider read or create raises ends as a clean one does: no frame its error's
    traceback reaches holds the error (a cycle), so the pass goes when it ends even while the
    provider fails every call (docs/benchmarks.md, "Garbage a pass leaves")."""
    await _web(cluster)
    provider = FakeProvider()
    if failing == "create_rs":  # the pods are never registered: every pass tries again
        provider.fail_next(failing, times=10**6, message="provider down")
    async with run_manager(adapter_type(provider), resync_period=0.2) as manager:
        controller = manager.controllers["demo-controller"]
        if failing == "query_rs":  # registered first, then every read fails
            await _registered(cluster, provider)
            provider.fail_next(failing, times=10**6, message="provider down")
        mark = controller.failures
        await async_wait_for(lambda: controller.failures > mark, timeout=60, message="a failing pass")
        found = await _found_over_ten(lambda: controller.failures)
        provider.clear_faults()
    assert provider.calls[failing] >= 10, (
        f"the provider was asked {provider.calls[failing]} times to {failing}"
    )
    passes, errors = found.count(PassState), found.count(ProviderError)
    assert passes == errors == 0, (
        f"{passes} failing passes and {errors} of their errors (of 10 or more) were freed by the garbage "
        f"collector, not by reference counting; it found {found}"
    )


def _provider_call() -> None:
    raise ProviderError("connection reset")


def _adapter_read() -> None:
    try:
        _provider_call()
    except ProviderError as err:
        raise RuntimeError("query failed") from err


def test_an_error_with_its_frames_dropped_still_says_where_it_was_raised() -> None:
    try:
        _adapter_read()
    except RuntimeError as caught:
        err = caught
    err.add_note("an adapter's own note")
    cause = err.__cause__
    assert cause is not None and err.__traceback__ is not None
    assert frames_dropped(err) is err
    assert err.__traceback__ is None and cause.__traceback__ is None, "no frame kept, the cause's neither"
    text = "".join(traceback.format_exception(err))
    for where in ("in _adapter_read", "in _provider_call", "ProviderError: connection reset", __file__):
        assert where in text, text
    assert err.__notes__[0] == "an adapter's own note"
    # Dropped again (an error object raised once more): one note of where, the latest.
    try:
        raise err
    except RuntimeError:
        pass
    frames_dropped(err)
    assert len(err.__notes__) == 2 and "test_an_error_with_its_frames_dropped" in err.__notes__[1]
    assert "_adapter_read" not in err.__notes__[1]


def _deep(n: int) -> None:
    if n:
        _deep(n - 1)
    raise ProviderError("at the bottom")


def test_a_recursion_with_its_frames_dropped_is_counted_not_listed() -> None:
    try:
        _deep(500)
    except ProviderError as caught:
        err = frames_dropped(caught)
    note = err.__notes__[-1].splitlines()
    assert len(note) < 10, note
    assert "  [Previous line repeated 497 more times]" in note, note
    assert sum("in _deep" in line for line in note) == 4, note  # 3 calls listed, and the raise
