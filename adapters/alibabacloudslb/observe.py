"""Observe mode (the default; the Go adapter's behaviour): ``ObserveStrategy``.

Alibaba's cloud controller manager (CCM) owns the load balancer; this strategy only reads
``DescribeHealthStatus`` and never calls a mutating SLB API. A lifecycle-ready pod should be
listed (by pod IP), a pod that is not should not; until CCM has caught up the items are reported
"not done", so a pod's lifecycle finalizer follows what the load balancer really holds
(docs/alibabacloudslb.md, "Observe").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from resourceconsist.adapter import Employee, Employer, Outcome, PodEmployeeStatuses, pod_employee_statuses
from resourceconsist.cluster.kube import KubeObject

from .config import Mode
from .items import ObservedEmployee, Traffic
from .strategy import Change, ModeStrategy, pod_name


def _observed(pod: KubeObject, traffic_on: Callable[[PodEmployeeStatuses], bool]) -> Employee:
    statuses = pod_employee_statuses(pod)
    statuses.extra_status = Traffic(traffic_on=traffic_on(statuses))
    return ObservedEmployee(id=pod_name(pod), name=pod_name(pod), statuses=statuses)


def _listed(pod: KubeObject, listed: Mapping[str, bool]) -> Employee:
    """The current item of ``pod``: in the load balancer when its IP is listed, with its health."""
    statuses = pod_employee_statuses(pod)
    healthy = listed.get(statuses.ip) if statuses.ip else None
    statuses.extra_status = Traffic(traffic_on=healthy is not None, healthy=healthy)
    return ObservedEmployee(id=pod_name(pod), name=pod_name(pod), statuses=statuses)


@dataclass(eq=False)
class ObserveStrategy(ModeStrategy):
    """One item per pod on both sides: should it be in the load balancer, is it there. CCM owns
    everything on the load balancer: no employer, nothing left behind to collect."""

    mode = Mode.OBSERVE

    def read_settings(self) -> None:
        """Observe mode reads no annotation of its own."""

    # -- employer: none; CCM owns the load balancer ------------------------------------------------

    async def expected_employers(self) -> list[Employer]:
        return []

    async def current_employers(self) -> list[Employer]:
        return []

    async def create_employers(self, to_create: list[Employer]) -> Outcome[Employer]:
        if to_create:
            raise self.not_ours("create", to_create[0])
        return [], []

    async def delete_employers(self, to_delete: list[Employer]) -> Outcome[Employer]:
        if to_delete:
            raise self.not_ours("delete", to_delete[0])
        return [], []

    # -- employees ----------------------------------------------------------------------------------

    async def expected_employees(self) -> list[Employee]:
        if self.deleting:
            return []
        return [
            _observed(pod, lambda statuses: statuses.lifecycle_ready)
            for pod in self.ctx.reader.pods_selected_by(self.service)
        ]

    async def current_employees(self) -> list[Employee]:
        # Pods still holding our guard or finalizer matter whether selected or not: each is
        # released once the load balancer no longer lists its IP (a deleting Service selects none).
        reader = self.ctx.reader
        holding = {
            pod_name(pod): pod
            for finalizer in (self.finalizer, self.guard)
            for pod in reader.pods_with_finalizer(self.namespace, finalizer)
        }
        selected = [] if self.deleting else reader.pods_selected_by(self.service)
        selected_names = {pod_name(p) for p in selected}
        pods = [*selected, *(pod for name, pod in sorted(holding.items()) if name not in selected_names)]
        # No pod, no question to ask the load balancer.
        listed = await self._listed_ips() if pods else {}
        return [_listed(pod, listed) for pod in pods]

    async def change_employees(self, change: Change, items: list[Employee]) -> Outcome[Employee]:
        if change == "delete":
            # Deleting Service: a pod is released once CCM no longer lists its IP.
            off: list[Employee] = [
                item for item in items if isinstance(item, ObservedEmployee) and not item.traffic_on
            ]
            return off, [item for item in items if item not in off]
        return self._wait_for_ccm(change, items)

    # -- reading --------------------------------------------------------------------------------------

    async def _listed_ips(self) -> dict[str, bool]:
        """The IPs the load balancer lists, each with whether some listener reports it healthy
        (anything but ``abnormal``: ``unavailable`` means no health check, not a failed one)."""
        health = await self.read_load_balancer(
            self.tools.client.describe_health_status, "treating its pods as out of the load balancer"
        )
        # Any listed backend is registered, whatever its health: an "abnormal" one may turn
        # "normal" again while the pod still runs, so only absence means the pod is out of
        # rotation. Health only says whether it serves (the readiness gate).
        listed: dict[str, bool] = {}
        for backend in health or ():
            for ip in (backend.server_ip, backend.eni_host):
                if ip:
                    listed[ip] = listed.get(ip, False) or backend.health_status != "abnormal"
        return listed

    def _wait_for_ccm(self, what: str, items: list[Employee]) -> Outcome[Employee]:
        if items:
            self.log(
                logging.DEBUG,
                "waiting for CCM to %s %d backends: %s",
                what,
                len(items),
                ", ".join(item.id for item in items[:10]),
            )
        return [], list(items)
