"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

Replicas of a manager compete for one Lease; the holder renews it every ``retry_period`` and
runs the controllers, the others keep their caches warm and retry. A holder that cannot renew
within ``renew_deadline`` steps down (its controllers stop) before the lease can expire for
the others, so two replicas never reconcile at once. Stepping down gracefully releases the
lease so a standby takes over at once instead of after ``lease_duration``.
Every update carries the Lease's resourceVersion: two candidates never both win. The elector's
``fence`` (resourceconsist/flow/fence.py) says until when the Lease is surely held, on a clock
that runs while the process is stopped: every write made for it is refused past that moment,
whatever the process believes (docs/concepts.md, "Fencing").

As client-go's, the leader renews on the Lease it last wrote (its resourceVersion) without
reading it first: one request a renewal. When that write fails (someone else wrote the Lease
meanwhile: a 409), it takes the slow path, reading the Lease and deciding again, and counts it
(``on_slowpath``: client-go's ``leader_election_slowpath_total``, docs/observability.md).
Which Lease and the timings: ``LeaderElectionOptions`` (in ``resourceconsist.options``), part of
``ManagerOptions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import Conflict, KubeClient, KubeObject, NotFound
from resourceconsist.flow.cancellation import DaemonThreadExecutor
from resourceconsist.flow.fence import Fence, fence_clock
from resourceconsist.options import LeaderElectionOptions

log = logging.getLogger(__name__)
T = TypeVar("T")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def lease_time(moment: datetime.datetime) -> str:
    """A Lease's time field (``MicroTime``) for ``moment``."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_lease_time(value: str | None) -> datetime.datetime | None:
    """A Lease's time field as a datetime; None when unset."""
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


#: Seconds a stopping leader spends at most on releasing its Lease.
RELEASE_TIMEOUT = 1.0


class LeaderElector:
    """Campaigns for the Lease and calls back when leadership starts and stops."""

    def __init__(
        self,
        client: KubeClient,
        options: LeaderElectionOptions,
        *,
        labels: Mapping[str, str] | None = None,
        release_on_cancel: bool = True,
        on_slowpath: Callable[[], None] | None = None,
    ) -> None:
        """``on_slowpath``: told each time a renewal on the Lease last written fails and the
        elector reads the Lease again (the slow path)."""
        self.client = client
        self.options = options
        #: Labels the Lease carries (a shard Lease names its ring; docs/scaling.md).
        self.labels = dict(labels or {})
        #: Release the Lease when the campaign stops (False: it is left to expire).
        self.release_on_cancel = release_on_cancel
        #: The Lease's namespace, resolved once (``LeaderElectionOptions.namespace``).
        self.namespace = kube.pod_namespace(options.namespace)
        self.leading = False
        #: Campaign rounds so far (acquire or renew attempts).
        self.attempts = 0
        #: ``fence_clock()`` until which no one else can hold the Lease: the start of the last
        #: successful renewal plus the lease duration (the renew time written is later).
        self.held_until = 0.0
        #: Until when this process surely holds the Lease: the start of the last successful
        #: renewal plus the renew deadline; the writes made for the Lease check it.
        self.fence = Fence(f"{self.namespace}/{options.name}")
        #: The Lease as this candidate last wrote it (the fast path renews on it); None: unknown.
        self._observed: KubeObject | None = None
        self._on_slowpath = on_slowpath
        #: Renewals that took the slow path so far.
        self.slowpaths = 0
        # The Lease's own threads: a renewal never queues behind the frame's calls on the loop's
        # executor (a pass waiting for a cache, a burst of writes at a cold start), or it could
        # miss the renew deadline while the process is busy, not cut off (docs/concepts.md,
        # "Leader election timings"). Two: one call abandoned to a hung API server leaves one.
        self._threads = DaemonThreadExecutor(2, name=f"lease-{options.name}")

    def _try_acquire_or_renew(self) -> bool:
        c = self.options
        now = _now()
        spec: dict[str, Any] = {
            "holderIdentity": c.identity,
            "leaseDurationSeconds": max(1, round(c.lease_duration)),
            "renewTime": lease_time(now),
        }
        observed = self._observed
        if observed is not None and self.leading and fence_clock() < self.held_until:
            # The fast path: the leader's Lease as it wrote it, renewed without a read (its
            # acquire time and transitions stay as they are: a merge patch keeps them).
            if self._update(observed, spec):
                return True
            self.slowpaths += 1
            if self._on_slowpath is not None:
                self._on_slowpath()
            log.info(
                "lease %s/%s: renewing on the Lease last written failed; reading it again",
                self.namespace,
                c.name,
            )
        lease = self.client.get_or_none(kube.LEASE, self.namespace, c.name)
        if lease is None:
            spec["acquireTime"] = lease_time(now)
            spec["leaseTransitions"] = 0
            meta: dict[str, Any] = {"name": c.name, "namespace": self.namespace}
            if self.labels:
                meta["labels"] = self.labels
            body = {"metadata": meta, "spec": spec}
            try:
                self._observed = self.client.create(kube.LEASE, self.namespace, body)
                return True
            except Conflict:  # AlreadyExists: somebody else was quicker
                self._observed = None
                return False
        current = lease.get("spec", {})
        holder = current.get("holderIdentity") or ""
        if holder and holder != c.identity and not self._expired(current, now):
            return False
        if holder != c.identity:
            spec["acquireTime"] = lease_time(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        return self._update(lease, spec)

    def holder(self) -> str | None:
        """Who holds the Lease now: its holder while renewed in time, None when nobody does
        (no Lease, released, or expired)."""
        lease = self.client.get_or_none(kube.LEASE, self.namespace, self.options.name)
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if not holder or self._expired(spec, _now()):
            return None
        return str(holder)

    @staticmethod
    def _expired(spec: dict[str, Any], now: datetime.datetime) -> bool:
        renewed = parse_lease_time(spec.get("renewTime")) or parse_lease_time(spec.get("acquireTime"))
        if renewed is None:
            return True
        return now > renewed + datetime.timedelta(seconds=float(spec.get("leaseDurationSeconds") or 0))

    def _update(self, lease: KubeObject, spec: dict[str, Any]) -> bool:
        meta: dict[str, Any] = {"resourceVersion": lease["metadata"]["resourceVersion"]}
        held = lease["metadata"].get("labels") or {}
        if any(held.get(k) != v for k, v in self.labels.items()):
            meta["labels"] = self.labels
        body = {"metadata": meta, "spec": spec}
        try:
            written = self.client.patch(kube.LEASE, self.namespace, self.options.name, body)
        except (Conflict, NotFound):
            self._observed = None
            return False
        except BaseException:
            self._observed = None
            raise
        self._observed = (
            written if written.get("spec", {}).get("holderIdentity") == self.options.identity else None
        )
        return True

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn)

    def lease_left(self) -> float:
        """Seconds until another candidate could hold the Lease (0 or less: it may already)."""
        return self.held_until - fence_clock()

    def _held_from(self, began: float) -> None:
        """An acquire or renew sent at ``began`` (``fence_clock``) succeeded."""
        self.held_until = began + self.options.lease_duration
        self.fence.hold_until(began + self.options.renew_deadline)

    def _renew(self) -> bool:
        """Renew the Lease if this candidate still holds it (never acquires it)."""
        lease = self.client.get_or_none(kube.LEASE, self.namespace, self.options.name)
        if lease is None or lease.get("spec", {}).get("holderIdentity") != self.options.identity:
            return False
        return self._try_acquire_or_renew()

    async def _keep_renewing(self) -> None:
        """Renew every retry period until cancelled (while a stopping leader's passes end)."""
        c = self.options
        while True:
            await asyncio.sleep(c.retry_period)
            try:
                began = fence_clock()
                if await asyncio.wait_for(self._call(self._renew), timeout=c.renew_deadline):
                    self._held_from(began)
            except TimeoutError:
                log.debug(
                    "lease %s/%s: no answer within %gs while stopping",
                    self.namespace,
                    c.name,
                    c.renew_deadline,
                )
            except Exception as err:
                log.debug("lease %s/%s: renewal while stopping: %s", self.namespace, c.name, err)

    def _release(self) -> None:
        self.fence.drop()
        lease = self.client.get_or_none(kube.LEASE, self.namespace, self.options.name)
        if lease is None or lease.get("spec", {}).get("holderIdentity") != self.options.identity:
            return
        released = {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": lease_time(_now())}
        self._update(lease, released)

    async def run(
        self,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
        stop: asyncio.Event,
    ) -> None:
        """Campaign until ``stop`` is set; lead while renewals succeed; release on the way out."""
        c = self.options
        last_renew = 0.0
        #: ``on_started_leading`` runs beside the campaign: the Lease is renewed while the
        #: controllers wait for their caches (a first list of 100k pods can take minutes).
        starting: asyncio.Future[None] | None = None
        try:
            while not stop.is_set():
                self.attempts += 1
                if starting is not None and starting.done() and not starting.cancelled():
                    failed = starting.exception()
                    starting = None
                    if failed is not None and self.leading:
                        # Never a replica that holds its Lease and runs nothing: step down and
                        # let another one, or this one again, try (docs/concepts.md).
                        log.error(
                            "lease %s/%s: starting to lead failed (%s); stepping down and releasing it",
                            self.namespace,
                            c.name,
                            failed,
                        )
                        self.leading = False
                        self.fence.drop()
                        await on_stopped_leading()
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(self._call(self._release), timeout=RELEASE_TIMEOUT)
                # The renew time written is taken after this moment: the renew deadline counts
                # from here, so a slow attempt cannot stretch the time the Lease is believed held.
                began = fence_clock()
                try:
                    # An attempt that outlives the renew deadline counts as failed (its thread is
                    # abandoned), so a hung API server cannot keep a leader from stepping down.
                    won = await asyncio.wait_for(
                        self._call(self._try_acquire_or_renew), timeout=c.renew_deadline
                    )
                except TimeoutError:
                    log.warning("lease %s/%s: no answer within %gs", self.namespace, c.name, c.renew_deadline)
                    won = False
                except Exception as err:
                    # An unreachable API server is logged once per outage by the client.
                    quiet = kube.is_unreachable(err) or self.client.reachability.down
                    log.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "lease %s/%s: %s",
                        self.namespace,
                        c.name,
                        err,
                    )
                    won = False
                now = fence_clock()
                if won:
                    last_renew = began
                    self._held_from(began)
                    if not self.leading:
                        self.leading = True
                        log.info("became leader of lease %s/%s as %s", self.namespace, c.name, c.identity)
                        starting = asyncio.ensure_future(on_started_leading())
                elif self.leading and now - last_renew > c.renew_deadline:
                    self.leading = False
                    self.fence.drop()
                    log.warning("lost lease %s/%s: stepping down", self.namespace, c.name)
                    await _cancelled(starting)
                    starting = None
                    await on_stopped_leading()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=c.retry_period)
        finally:
            await _cancelled(starting)
            was_leading = self.leading
            if was_leading:
                self.leading = False
                # The Lease stays renewed while the controllers end their passes in flight, so
                # nobody can take it over while one still runs (docs/scaling.md, "Stopping").
                keeping = asyncio.create_task(self._keep_renewing())
                try:
                    await on_stopped_leading()
                finally:
                    keeping.cancel()
                    await asyncio.gather(keeping, return_exceptions=True)
                    # Nothing acts for the Lease any more, whether it is released or left to expire.
                    self.fence.drop()
            if was_leading and self.release_on_cancel:
                try:
                    # Bounded: a stop must not wait on an API server that does not answer; an
                    # unreleased lease only makes the standby wait for it to expire.
                    await asyncio.wait_for(self._call(self._release), timeout=RELEASE_TIMEOUT)
                except Exception as err:
                    log.warning("could not release lease %s/%s: %r", self.namespace, c.name, err)


async def _cancelled(task: asyncio.Future[None] | None) -> None:
    """Cancel ``task`` (a start still under way) and wait until it has ended."""
    if task is not None and not task.done():
        task.cancel()
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)
