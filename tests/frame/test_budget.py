"""The provider API budget (resourceconsist/flow/budget.py): priority order, rate, burst, throttles
and Retry-After, cancellation, the settings and the metrics (docs/concepts.md, "The provider
budget").

Time is a fake clock the tests move; waiters are real threads, and each step waits for the
budget's own counters (what is queued, what was granted) to say the waiters got where they are.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeClient, KubeObject
from resourceconsist.errors import InvalidOptions
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.flow import budget
from resourceconsist.flow.budget import (
    Priority,
    ProviderBudget,
    current_priority,
    retry_after_seconds,
    spending_for,
)
from resourceconsist.flow.cancellation import Cancellation, PassCancelled, call_adapter
from resourceconsist.options import ManagerOptions, ProviderBudgetOptions
from resourceconsist.rules import lifecycle
from resourceconsist.runtime.manager import Manager
from resourceconsist.runtime.metrics import Metrics
from resourceconsist.testing import Cluster, async_wait_for, finalizers
from resourceconsist.testing.wait import wait_for


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class Waiters:
    """Threads spending from one budget, and the order the budget let them through."""

    def __init__(self, spent: ProviderBudget) -> None:
        self.budget = spent
        self.order: list[str] = []
        self.errors: dict[str, BaseException] = {}
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, priority: Priority, cancellation: Cancellation | None = None) -> None:
        before = sum(self.budget.queued().values())

        def run() -> None:
            try:
                self.budget.spend(priority, cancellation=cancellation or Cancellation())
            except BaseException as err:
                with self._lock:
                    self.errors[name] = err
                return
            with self._lock:
                self.order.append(name)

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()
        # Arrival order is part of what is tested: the next waiter starts once this one queued.
        wait_for(lambda: sum(self.budget.queued().values()) > before, message=f"{name} queued", timeout=10)

    def granted(self) -> int:
        with self._lock:
            return len(self.order)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=10)
            assert not thread.is_alive()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def restore_settings() -> Iterator[None]:
    before = budget.settings()
    yield
    budget.configure(before)


def test_removals_go_first_then_deletes_then_registrations_then_reads(clock: FakeClock) -> None:
    spent = ProviderBudget("test:order", ProviderBudgetOptions(rate=1.0, burst=1), clock=clock)
    assert spent.spend(Priority.READ) == 0.0  # the one token of a full bucket
    waiters = Waiters(spent)
    arrivals = [
        ("read-1", Priority.READ),
        ("register-1", Priority.REGISTER),
        ("read-2", Priority.READ),
        ("remove-1", Priority.REMOVE_TRAFFIC),
        ("register-2", Priority.REGISTER),
        ("delete-1", Priority.DELETE),
        ("remove-2", Priority.REMOVE_TRAFFIC),
    ]
    for name, priority in arrivals:
        waiters.start(name, priority)
    assert spent.queued() == {
        Priority.REMOVE_TRAFFIC: 2,
        Priority.DELETE: 1,
        Priority.REGISTER: 2,
        Priority.READ: 2,
    }
    for granted in range(1, len(arrivals) + 1):
        clock.advance(1.0)  # one token
        wait_for(lambda n=granted: waiters.granted() >= n, message=f"{granted} granted", timeout=10)
        assert waiters.granted() == granted  # one token lets exactly one through
    waiters.join()
    assert waiters.order == [
        "remove-1",
        "remove-2",
        "delete-1",
        "register-1",
        "register-2",
        "read-1",
        "read-2",
    ]
    assert spent.queued() == dict.fromkeys(Priority, 0)
    stats = spent.snapshot()
    assert stats.waits[Priority.REMOVE_TRAFFIC] == 2 and stats.granted[Priority.READ] == 3


def test_burst_passes_at_once_then_the_rate_paces(clock: FakeClock) -> None:
    spent = ProviderBudget("test:rate", ProviderBudgetOptions(rate=2.0, burst=3), clock=clock)
    assert [spent.spend(Priority.REGISTER) for _ in range(3)] == [0.0, 0.0, 0.0]
    waiters = Waiters(spent)
    waiters.start("fourth", Priority.REGISTER)
    clock.advance(0.4)  # 0.8 of a token at 2/s
    with pytest.raises(TimeoutError):
        # A second waiter behind it proves no token is there yet (it gives up after 0 s).
        spent.spend(Priority.READ, timeout=0.0)
    assert waiters.granted() == 0
    clock.advance(0.1)
    wait_for(lambda: waiters.granted() == 1, message="the fourth request after 1/rate", timeout=10)
    waiters.join()
    # The bucket never holds more than the burst, however long it rested.
    clock.advance(3600)
    assert [spent.spend(Priority.READ) for _ in range(3)] == [0.0, 0.0, 0.0]
    with pytest.raises(TimeoutError, match="rate 2/s"):
        spent.spend(Priority.READ, timeout=0.0)


def test_retry_after_pauses_the_whole_account(clock: FakeClock) -> None:
    spent = ProviderBudget("test:retry-after", ProviderBudgetOptions(rate=100.0, burst=5), clock=clock)
    assert spent.throttled(Priority.REGISTER, retry_after=2.0) == 2.0
    waiters = Waiters(spent)
    waiters.start("drain", Priority.REMOVE_TRAFFIC)  # even the most urgent waits it out
    clock.advance(1.9)
    with pytest.raises(TimeoutError):
        spent.spend(Priority.REMOVE_TRAFFIC, timeout=0.0)
    assert waiters.granted() == 0
    clock.advance(0.11)  # past the pause, and one token refilled (the bucket was emptied)
    wait_for(lambda: waiters.granted() == 1, message="the drain after Retry-After", timeout=10)
    waiters.join()
    assert spent.snapshot().throttles[Priority.REGISTER] == 1


def test_throttles_without_retry_after_back_off_doubling_until_a_success(clock: FakeClock) -> None:
    spent = ProviderBudget("test:backoff", ProviderBudgetOptions(rate=10.0), clock=clock)
    pauses = [spent.throttled(Priority.READ) for _ in range(7)]
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 16.0]
    spent.succeeded()
    assert spent.throttled(Priority.READ) == 0.5


def test_a_throttle_halves_the_rate_and_successes_give_it_back(clock: FakeClock) -> None:
    spent = ProviderBudget("test:pace", ProviderBudgetOptions(rate=10.0, burst=1), clock=clock)
    spent.throttled(Priority.READ, retry_after=0.0)
    assert spent.snapshot().rate == 5.0
    clock.advance(0.2)  # one token at 5/s
    spent.spend(Priority.READ, timeout=0.0)
    clock.advance(0.1)  # half a token at 5/s: at 10/s it would be a whole one
    with pytest.raises(TimeoutError, match="rate 5/s"):
        spent.spend(Priority.READ, timeout=0.0)
    for _ in range(3):
        spent.throttled(Priority.READ, retry_after=0.0)
    assert spent.snapshot().rate == pytest.approx(10.0 / 16)  # never below a sixteenth
    spent.throttled(Priority.READ, retry_after=0.0)
    assert spent.snapshot().rate == pytest.approx(10.0 / 16)
    for _ in range(15):
        spent.succeeded()
    assert spent.snapshot().rate == 10.0
    spent.succeeded()
    assert spent.snapshot().rate == 10.0  # never above the configured rate


def test_a_throttle_is_noted_under_the_priority_of_the_pass(clock: FakeClock) -> None:
    spent = ProviderBudget("test:throttle-priority", ProviderBudgetOptions(rate=10.0), clock=clock)
    with spending_for(Priority.REMOVE_TRAFFIC):
        spent.throttled()
    assert spent.snapshot().throttles[Priority.REMOVE_TRAFFIC] == 1


def test_without_a_rate_every_request_passes_and_throttles_are_only_counted(clock: FakeClock) -> None:
    spent = ProviderBudget("test:unlimited", clock=clock)
    assert all(spent.spend(Priority.READ, timeout=0.0) == 0.0 for _ in range(1000))
    assert spent.throttled(Priority.READ, retry_after=30.0) == 0.0
    assert spent.spend(Priority.READ, timeout=0.0) == 0.0
    assert spent.snapshot().throttles[Priority.READ] == 1


def test_a_cancelled_pass_stops_waiting_and_leaves_the_queue(clock: FakeClock) -> None:
    spent = ProviderBudget("test:cancel", ProviderBudgetOptions(rate=1.0, burst=1), clock=clock)
    spent.spend(Priority.READ)
    cancellation = Cancellation()
    waiters = Waiters(spent)
    waiters.start("stopping", Priority.REMOVE_TRAFFIC, cancellation)
    waiters.start("behind", Priority.READ)
    cancellation.cancel()
    wait_for(lambda: "stopping" in waiters.errors, message="the cancelled waiter gave up", timeout=10)
    assert isinstance(waiters.errors["stopping"], PassCancelled)
    assert spent.queued()[Priority.REMOVE_TRAFFIC] == 0
    clock.advance(1.0)  # the token goes to the one still waiting, not to the one that left
    wait_for(lambda: waiters.order == ["behind"], message="the read after the cancelled drain", timeout=10)
    waiters.join()


def test_a_new_setting_applies_to_waiters_and_budgets_already_made(restore_settings: None) -> None:
    budget.configure(ProviderBudgetOptions(rate=1.0, burst=1))
    spent = budget.budget_for("test:configure")
    assert budget.budget_for("test:configure") is spent
    spent.spend(Priority.READ)
    waiters = Waiters(spent)
    waiters.start("waiting", Priority.READ)
    budget.configure(ProviderBudgetOptions())  # no limit: the waiter goes at once
    wait_for(lambda: waiters.granted() == 1, message="the waiter released by the new setting", timeout=10)
    waiters.join()
    assert spent.settings == ProviderBudgetOptions()
    with pytest.raises(ValueError, match="account"):
        budget.budget_for("")


def test_a_second_manager_with_other_settings_is_told_it_replaces_the_first(
    restore_settings: None, caplog: pytest.LogCaptureFixture
) -> None:
    client = KubeClient(None)  # never reaches an API server: only the budget's settings matter
    budget.configure(ProviderBudgetOptions())
    Manager(client, ManagerOptions(provider_budget=ProviderBudgetOptions(rate=5.0)))
    Manager(client, ManagerOptions(provider_budget=ProviderBudgetOptions(rate=5.0)))
    assert "replace another manager's" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="resourceconsist.runtime.manager"):
        Manager(client, ManagerOptions(provider_budget=ProviderBudgetOptions(rate=7.0)))
    assert "replace another manager's" in caplog.text
    assert budget.settings().rate == 7.0


def test_the_share_scales_the_rate() -> None:
    assert ProviderBudgetOptions(rate=10.0, share=0.25).effective_rate == 2.5
    assert ProviderBudgetOptions().effective_rate is None
    assert ManagerOptions().provider_budget == ProviderBudgetOptions()


@pytest.mark.parametrize(
    ("keywords", "field"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"burst": 0}, "burst"),
        ({"burst": True}, "burst"),
        ({"share": 0.0}, "share"),
        ({"share": 1.5}, "share"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(keywords: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidOptions) as caught:
        ProviderBudgetOptions(**keywords)  # type: ignore[arg-type]
    assert caught.value.fields == (field,)


def test_retry_after_values() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(" 0.5 ") == 0.5
    assert retry_after_seconds("-2") == 0.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    when = datetime(2030, 1, 1, 0, 0, 10, tzinfo=UTC)
    date = format_datetime(when, usegmt=True)
    assert retry_after_seconds(date, now=lambda: when.timestamp() - 10) == pytest.approx(10.0)


def test_the_priority_of_a_pass_reaches_the_adapter_threads() -> None:
    async def run() -> tuple[Priority, Priority]:
        with spending_for(Priority.REMOVE_TRAFFIC):
            inside = await call_adapter(current_priority)
        outside = await call_adapter(current_priority)
        return inside, outside

    assert asyncio.run(run()) == (Priority.REMOVE_TRAFFIC, Priority.READ)


def test_the_metrics_show_the_budgets_by_priority(restore_settings: None) -> None:
    budget.configure(ProviderBudgetOptions(rate=1000.0, burst=1))
    spent = budget.budget_for("test:metrics")
    spent.spend(Priority.REGISTER)
    spent.throttled(Priority.REMOVE_TRAFFIC, retry_after=0.0)
    text = Metrics().exposition().decode()
    series = "resourceconsist_provider_budget"
    assert f'{series}_granted_total{{account="test:metrics",priority="register"}} 1.0' in text
    assert f'{series}_throttles_total{{account="test:metrics",priority="remove_traffic"}} 1.0' in text
    assert f'{series}_queued{{account="test:metrics",priority="read"}} 0.0' in text
    assert "resourceconsist_provider_budget_wait_seconds_total" in text
    assert f'{series}_rate{{account="test:metrics"}} 500.0' in text  # halved by the throttle


class PriorityRecordingAdapter(DemoAdapter):
    """The demo adapter, noting the budget priority each provider call runs at (in its thread)."""

    def __init__(self) -> None:
        super().__init__(FakeProvider())
        self.seen: list[tuple[str, Priority, tuple[str, ...]]] = []
        self._lock = threading.Lock()

    def _note(self, what: str, items: list[Employee] | None = None) -> None:
        with self._lock:
            self.seen.append((what, current_priority(), tuple(i.id for i in items or [])))

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        self._note("read")
        return super().get_current_employee(ctx, employer)

    def create_employees(self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]) -> Any:
        self._note("create", to_create)
        return super().create_employees(ctx, employer, to_create)

    def update_employees(self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]) -> Any:
        self._note("update", to_update)
        return super().update_employees(ctx, employer, to_update)

    def delete_employees(self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]) -> Any:
        self._note("delete", to_delete)
        return super().delete_employees(ctx, employer, to_delete)

    def since(self, mark: int) -> list[tuple[str, Priority, tuple[str, ...]]]:
        with self._lock:
            return list(self.seen[mark:])


async def test_the_frame_gives_a_pass_that_removes_traffic_its_priority(
    cluster: Cluster, run_manager: Any
) -> None:
    """Reads of an ordinary pass spend as reads and its registrations as registrations; once a
    guarded pod is deleting, the pass's reads and the call that takes the pod out spend as
    traffic removals (docs/concepts.md, "The provider budget")."""
    for name in ("web-0", "web-1"):
        await cluster.pod(name, {"app": "web"})
        await cluster.set_status(name)
    await cluster.service("web")
    adapter = PriorityRecordingAdapter()
    held = lifecycle.lifecycle_finalizer("web")
    async with run_manager(adapter):

        async def guarded() -> bool:
            for name in ("web-0", "web-1"):
                pod = await cluster.get(kube.POD, name)
                if pod is None or held not in finalizers(pod):
                    return False
            return True

        await async_wait_for(guarded, timeout=60, message="both pods guarded")
        before = adapter.since(0)
        assert {p for what, p, _ in before if what == "read"} == {Priority.READ}
        assert {p for what, p, ids in before if what == "create" and ids} == {Priority.REGISTER}
        mark = len(adapter.seen)
        await cluster.delete(kube.POD, "web-0")
        await async_wait_for(lambda: _gone(cluster, "web-0"), timeout=60, message="web-0 taken out and gone")
        after = adapter.since(mark)
    assert ("read", Priority.REMOVE_TRAFFIC, ()) in after
    out = [(what, p) for what, p, ids in after if "web-0" in ids and what in ("update", "delete")]
    assert out and all(p is Priority.REMOVE_TRAFFIC for _, p in out), out


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.get(kube.POD, name) is None
