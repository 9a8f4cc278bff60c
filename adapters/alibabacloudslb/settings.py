"""The SLB adapter's process-wide settings: the cluster name it tags its VServer groups with, the
load balancers its garbage search is narrowed to, and the search's call budget per garbage pass.

Like the credentials, they come from the environment when the registry builds the adapter
(``controller_from_env``); ``resourceconsist run --slb-cluster-name NAME --slb-load-balancer ID``
sets the same variables for the adapter it builds, so there is one way in. In Python, pass them
to ``SLBAdapter`` directly. docs/alibabacloudslb.md, "Tags and the garbage search".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Self

from .config import SLBConfigError, check_cluster_name

#: The name of this Kubernetes cluster, written on every VServer group the adapter creates
#: (the AWS Load Balancer Controller's ``--cluster-name``). Required for manage mode.
CLUSTER_NAME_ENV: Final = "ALIYUN_SLB_CLUSTER_NAME"
#: Comma-separated load balancer ids: the garbage search looks only at these (and at the ones
#: live Services name) instead of every load balancer of the account's region.
LOAD_BALANCERS_ENV: Final = "ALIYUN_SLB_LOAD_BALANCERS"
#: The most SLB calls one garbage pass's search makes; the next pass goes on where it stopped.
GARBAGE_CALL_BUDGET_ENV: Final = "ALIYUN_SLB_GARBAGE_CALL_BUDGET"
#: Two hundred calls: 100 pages of 100 load balancers, or 200 load balancers looked through,
#: per pass (every 10 minutes by default), far below SLB's per-account API rate.
DEFAULT_GARBAGE_CALL_BUDGET: Final = 200

#: What a manage-mode Service is told while no cluster name is set.
MISSING_CLUSTER_NAME: Final = (
    "manage mode needs the cluster name this controller tags its VServer groups with: set "
    f"{CLUSTER_NAME_ENV} (resourceconsist run --slb-cluster-name NAME), or pass "
    "SLBAdapter(cluster_name=...); nothing is changed until then"
)


def check_call_budget(value: int, *, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SLBConfigError(f"{source}={value!r} is not a number of SLB calls of at least 1")
    return value


@dataclass(frozen=True)
class SLBSettings:
    """The adapter's settings besides the credentials (all optional; see the module doc)."""

    cluster_name: str = ""
    load_balancers: tuple[str, ...] = ()
    garbage_call_budget: int = DEFAULT_GARBAGE_CALL_BUDGET

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the settings from ``environ`` (default: the process environment);
        ``SLBConfigError`` naming the variable at fault."""
        env = os.environ if environ is None else environ
        budget_text = (env.get(GARBAGE_CALL_BUDGET_ENV) or "").strip()
        budget = DEFAULT_GARBAGE_CALL_BUDGET
        if budget_text:
            if not budget_text.isdigit():
                raise SLBConfigError(
                    f"{GARBAGE_CALL_BUDGET_ENV}={budget_text!r} is not a number of SLB calls of at least 1"
                )
            budget = check_call_budget(int(budget_text), source=GARBAGE_CALL_BUDGET_ENV)
        return cls(
            cluster_name=check_cluster_name(env.get(CLUSTER_NAME_ENV) or "", source=CLUSTER_NAME_ENV),
            load_balancers=tuple(
                lb.strip() for lb in (env.get(LOAD_BALANCERS_ENV) or "").split(",") if lb.strip()
            ),
            garbage_call_budget=budget,
        )
