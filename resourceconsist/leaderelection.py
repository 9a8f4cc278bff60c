"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

Replicas of a manager compete for one Lease; the holder renews it every ``retry_period`` and
runs the controllers, the others keep their caches warm and retry. A holder that cannot renew
within ``renew_deadline`` steps down (its controllers stop) before the lease can expire for
the others, so two replicas never reconcile at once. Stepping down gracefully releases the
lease so a standby takes over at once instead of after ``lease_duration``.
Every update carries the Lease's resourceVersion: two candidates never both win.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from resourceconsist import kube
from resourceconsist.kube import Conflict, KubeClient, KubeObject, NotFound

log = logging.getLogger(__name__)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


#: Seconds a stopping leader spends at most on releasing its Lease.
RELEASE_TIMEOUT = 1.0
DEFAULT_LEASE_DURATION = 15.0
DEFAULT_RENEW_DEADLINE = 10.0
DEFAULT_RETRY_PERIOD = 2.0


@dataclass
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str = field(
        default_factory=lambda: f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    )
    #: Seconds a standby waits after the last renewal before it takes the Lease over: the
    #: longest a crashed leader leaves the controllers unattended (docs/concepts.md).
    lease_duration: float = DEFAULT_LEASE_DURATION
    #: Seconds the leader keeps trying to renew before it steps down; shorter than the lease,
    #: so a leader cut off from the API server stops before anyone else may start.
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    #: Seconds between two attempts to acquire or renew.
    retry_period: float = DEFAULT_RETRY_PERIOD

    def __post_init__(self) -> None:
        check_timings(self.lease_duration, self.renew_deadline, self.retry_period)


def check_timings(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """``ValueError`` saying which timing is wrong unless lease > renew deadline > retry > 0."""
    if not retry_period > 0:
        raise ValueError(f"retry period must be above 0 seconds (got {retry_period:g})")
    if not renew_deadline > retry_period:
        raise ValueError(
            f"renew deadline ({renew_deadline:g}s) must be longer than the retry period "
            f"({retry_period:g}s), so the leader gets more than one try to renew before stepping down"
        )
    if not lease_duration > renew_deadline:
        raise ValueError(
            f"lease duration ({lease_duration:g}s) must be longer than the renew deadline "
            f"({renew_deadline:g}s), so a leader that cannot renew steps down before a standby takes over"
        )


class LeaderElector:
    """Campaigns for the Lease and calls back when leadership starts and stops."""

    def __init__(self, client: KubeClient, config: LeaderElectionConfig) -> None:
        check_timings(config.lease_duration, config.renew_deadline, config.retry_period)
        self.client = client
        self.config = config
        self.leading = False
        #: Campaign rounds so far (acquire or renew attempts).
        self.attempts = 0

    def _try_acquire_or_renew(self) -> bool:
        c = self.config
        now = _now()
        lease = self.client.get_or_none(kube.LEASE, c.namespace, c.name)
        spec: dict[str, Any] = {
            "holderIdentity": c.identity,
            "leaseDurationSeconds": max(1, round(c.lease_duration)),
            "renewTime": _stamp(now),
        }
        if lease is None:
            spec["acquireTime"] = _stamp(now)
            spec["leaseTransitions"] = 0
            body = {"metadata": {"name": c.name, "namespace": c.namespace}, "spec": spec}
            try:
                self.client.create(kube.LEASE, c.namespace, body)
                return True
            except Conflict:  # AlreadyExists: somebody else was quicker
                return False
        current = lease.get("spec", {})
        holder = current.get("holderIdentity") or ""
        if holder and holder != c.identity and not self._expired(current, now):
            return False
        if holder != c.identity:
            spec["acquireTime"] = _stamp(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        return self._update(lease, spec)

    @staticmethod
    def _expired(spec: dict[str, Any], now: datetime.datetime) -> bool:
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        if renewed is None:
            return True
        return now > renewed + datetime.timedelta(seconds=float(spec.get("leaseDurationSeconds") or 0))

    def _update(self, lease: KubeObject, spec: dict[str, Any]) -> bool:
        body = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec}
        try:
            self.client.patch(kube.LEASE, self.config.namespace, self.config.name, body)
            return True
        except (Conflict, NotFound):
            return False

    def _release(self) -> None:
        lease = self.client.get_or_none(kube.LEASE, self.config.namespace, self.config.name)
        if lease is None or lease.get("spec", {}).get("holderIdentity") != self.config.identity:
            return
        self._update(lease, {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _stamp(_now())})

    async def run(
        self,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
        stop: asyncio.Event,
    ) -> None:
        """Campaign until ``stop`` is set; lead while renewals succeed; release on the way out."""
        c = self.config
        last_renew = 0.0
        try:
            while not stop.is_set():
                self.attempts += 1
                try:
                    # An attempt that outlives the renew deadline counts as failed (its thread is
                    # abandoned), so a hung API server cannot keep a leader from stepping down.
                    won = await asyncio.wait_for(
                        asyncio.to_thread(self._try_acquire_or_renew), timeout=c.renew_deadline
                    )
                except TimeoutError:
                    log.warning("lease %s/%s: no answer within %gs", c.namespace, c.name, c.renew_deadline)
                    won = False
                except Exception as err:
                    # An unreachable API server is logged once per outage by the client.
                    quiet = kube.is_unreachable(err) or self.client.reachability.down
                    log.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "lease %s/%s: %s",
                        c.namespace,
                        c.name,
                        err,
                    )
                    won = False
                now = time.monotonic()
                if won:
                    last_renew = now
                    if not self.leading:
                        self.leading = True
                        log.info("became leader of lease %s/%s as %s", c.namespace, c.name, c.identity)
                        await on_started_leading()
                elif self.leading and now - last_renew > c.renew_deadline:
                    self.leading = False
                    log.warning("lost lease %s/%s: stepping down", c.namespace, c.name)
                    await on_stopped_leading()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=c.retry_period)
        finally:
            if self.leading:
                self.leading = False
                await on_stopped_leading()
                try:
                    # Bounded: a stop must not wait on an API server that does not answer; an
                    # unreleased lease only makes the standby wait for it to expire.
                    await asyncio.wait_for(asyncio.to_thread(self._release), timeout=RELEASE_TIMEOUT)
                except Exception as err:
                    log.warning("could not release lease %s/%s: %r", c.namespace, c.name, err)
