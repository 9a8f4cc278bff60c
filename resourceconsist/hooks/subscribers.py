"""Lifecycle subscribers: user code told when a pod is guarded, served, drained or released and
when an employer converges, fails or is deleted (docs/lifecycle-hooks.md, "Subscribers").

The reconcile decides these at the points where its writes made them true and hands them to a
``SubscriberBus`` without waiting: a bounded queue per controller, drained by one task that
calls each subscriber in turn. A subscriber that raises is logged; one that takes longer than
the bus's timeout is abandoned for that notification; a full queue drops notifications (logged,
counted in ``resourceconsist_subscriber_dropped_total``). None of it can block or fail a pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from resourceconsist.adapter import MaybeAwaitable
from resourceconsist.cluster.kube import EmployerKey
from resourceconsist.flow.cancellation import call_adapter

log = logging.getLogger(__name__)

#: What a notification can say; each is the name of a ``LifecycleSubscriber`` method.
EVENTS: Final = (
    "pod_guarded",
    "pod_served",
    "pod_drained",
    "pod_released",
    "employer_converged",
    "employer_failing",
    "employer_deleted",
)


@dataclass(frozen=True)
class LifecycleEvent:
    """One notification: ``what`` happened to ``pod`` (``namespace/name``; "" for an employer
    event) of ``employer`` (``namespace/name``) in ``controller``, noticed at ``at`` (epoch
    seconds, ``time.time()``)."""

    controller: str
    what: str
    employer: str
    pod: str = ""
    at: float = field(default_factory=time.time)


class LifecycleSubscriber:
    """Override the methods you need; the others do nothing. Each may be a plain function (run
    in a worker thread) or a coroutine (awaited on the frame's loop: never block in one)."""

    def pod_guarded(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """The pod got the employer's guard before the provider was asked to register it."""

    def pod_served(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """The provider confirmed it routes to the ready pod (its lifecycle finalizer is on)."""

    def pod_drained(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """A served pod is still registered but no longer ready (e.g. weight 0): draining."""

    def pod_released(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """The provider confirmed it holds nothing for the pod, and its finalizers are off."""

    def employer_converged(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """A pass ended with nothing left to do for the employer."""

    def employer_failing(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """A pass failed (it is retried with backoff)."""

    def employer_deleted(self, event: LifecycleEvent) -> MaybeAwaitable[None]:
        """The provider holds nothing for a deleting (or gone) employer any more."""


class SubscriberBus:
    """Delivers one controller's notifications to its subscribers, off the reconcile path."""

    def __init__(
        self,
        controller: str,
        *,
        maxsize: int = 1000,
        timeout: float = 5.0,
        on_drop: Callable[[], None] = lambda: None,
    ) -> None:
        if maxsize < 1 or timeout <= 0:
            raise ValueError(f"subscriber queue size {maxsize} and timeout {timeout}s must be positive")
        self.controller = controller
        self.subscribers: list[LifecycleSubscriber] = []
        self.timeout = timeout
        self.dropped = 0
        self._on_drop = on_drop
        self._queue: asyncio.Queue[LifecycleEvent] = asyncio.Queue(maxsize)
        self._task: asyncio.Task[None] | None = None

    def add(self, subscriber: LifecycleSubscriber) -> None:
        if not isinstance(subscriber, LifecycleSubscriber):
            raise TypeError(
                f"{type(subscriber).__name__} is not a LifecycleSubscriber: subclass "
                "resourceconsist.hooks.subscribers.LifecycleSubscriber and override what you need"
            )
        self.subscribers.append(subscriber)

    def publish(self, what: str, employer: str, pod: str = "") -> None:
        """Queue a notification about the employer ``employer`` (its key; ``pod`` is a pod name in
        its namespace); never waits."""
        if not self.subscribers:
            return
        key = EmployerKey(employer)
        event = LifecycleEvent(self.controller, what, key, f"{key.namespace}/{pod}" if pod else "")
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            self._on_drop()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "%s: subscribers fall behind, %d notifications dropped so far (latest: %s %s)",
                    self.controller,
                    self.dropped,
                    what,
                    event.pod or employer,
                )

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._deliver(), name=f"{self.controller}-subscribers")

    async def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued within ``timeout``, then stop."""
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
        except TimeoutError:
            log.warning("%s: %d notifications undelivered at stop", self.controller, self._queue.qsize())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _deliver(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                for subscriber in list(self.subscribers):
                    method = getattr(subscriber, event.what)
                    try:
                        await asyncio.wait_for(call_adapter(method, event), self.timeout)
                    except TimeoutError:
                        log.warning(
                            "%s: subscriber %s.%s took over %.3gs; abandoned",
                            self.controller,
                            type(subscriber).__name__,
                            event.what,
                            self.timeout,
                        )
                    except Exception:
                        log.exception(
                            "%s: subscriber %s.%s failed",
                            self.controller,
                            type(subscriber).__name__,
                            event.what,
                        )
            finally:
                self._queue.task_done()
