"""Adapters steer the frame with two errors (resourceconsist.errors): ``PermanentError`` (no
retry until the employer changes) and ``RetryAfter`` (try again after N seconds, not on the
backoff). Both still record a Warning Event and keep the guard."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from resourceconsist.adapter import Employee, ReconcileContext
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import PermanentError, ResourceConsistError, RetryAfter, steering
from resourceconsist.experimental.demo import DemoAdapter, FakeProvider
from resourceconsist.testing import Cluster, async_wait_for


class Steering(DemoAdapter):
    """Demo adapter whose current-employee read raises ``error`` while ``raising`` is set."""

    def __init__(self, error: Exception) -> None:
        super().__init__(FakeProvider())
        self.error = error
        self.raising = threading.Event()
        self.raising.set()
        self.attempts: list[float] = []
        self._last_pass: ReconcileContext | None = None

    def record_error_conditions(
        self, ctx: ReconcileContext, employer: KubeObject, err: BaseException
    ) -> None:
        """No condition on the Service: its write would itself bring the employer back."""

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        # One attempt a pass: a pass that creates the employer reads its employees again after
        # the create (sync.read_sides), and both reads raise here.
        if ctx is not self._last_pass:
            self._last_pass = ctx
            self.attempts.append(time.monotonic())
        if self.raising.is_set():
            raise self.error
        return super().get_current_employee(ctx, employer)


def test_errors_share_one_root_and_steering_reads_the_cause_chain() -> None:
    retry = RetryAfter(2.5, "later")
    assert isinstance(retry, ResourceConsistError) and isinstance(PermanentError(), ResourceConsistError)
    assert retry.seconds == 2.5 and str(retry) == "later"
    wrapped = RuntimeError("pass failed")
    wrapped.__cause__ = retry
    assert steering(wrapped) is retry
    assert steering(RuntimeError("plain")) is None
    with pytest.raises(ValueError, match="seconds >= 0"):
        RetryAfter(-1)


async def test_a_permanent_error_warns_once_and_waits_for_a_change(
    cluster: Cluster, run_manager: Any
) -> None:
    adapter = Steering(PermanentError("the Service names a load balancer that does not exist"))
    key = f"{cluster.namespace}/svc"
    await cluster.service("svc")
    async with run_manager(adapter) as manager:
        controller = manager.controllers["demo-controller"]
        await async_wait_for(lambda: adapter.attempts, timeout=20, message="a first attempt")
        await async_wait_for(
            lambda: not controller.queue.holds(key), timeout=20, message="the key left the queue"
        )
        assert controller.queue.num_requeues(key) == 0, "no backoff: a permanent error is not retried"
        events = await cluster.events("svc")
        assert any(kind == "Warning" and "does not exist" in message for kind, _, message in events), events
        attempts = len(adapter.attempts)
        adapter.raising.clear()
        await cluster.patch(kube.SERVICE, "svc", {"metadata": {"annotations": {"fixed": "yes"}}})
        await async_wait_for(
            lambda: len(adapter.attempts) > attempts, timeout=20, message="retried on change"
        )
        await async_wait_for(
            lambda: f"{cluster.namespace}/svc" in adapter.provider.vips, timeout=20, message="converged"
        )


async def test_retry_after_requeues_after_the_delay_not_the_backoff(
    cluster: Cluster, run_manager: Any
) -> None:
    adapter = Steering(RetryAfter(1.0, "provisioning"))
    await cluster.service("svc")
    async with run_manager(adapter) as manager:
        controller = manager.controllers["demo-controller"]
        await async_wait_for(lambda: adapter.attempts, timeout=20, message="a first attempt")
        first = adapter.attempts[0]
        await async_wait_for(lambda: len(adapter.attempts) >= 2, timeout=20, message="the retry")
        adapter.raising.clear()
        assert adapter.attempts[1] - first >= 1.0, "not before the adapter's delay"
        assert controller.queue.num_requeues(f"{cluster.namespace}/svc") == 0
        await async_wait_for(
            lambda: f"{cluster.namespace}/svc" in adapter.provider.vips, timeout=20, message="converged"
        )
