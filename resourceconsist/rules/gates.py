"""Readiness gates per employer: what the frame writes in each gated pod's gate condition.

Pure decisions over pod dicts; ``reconcile.Reconciler`` gathers the facts (the provider's
confirmed verdicts, which pods the employer employs, the employer's annotations) and writes the
conditions through the pods' status subresource. The rules are those of docs/zero-downtime.md:
True once the provider serves the pod, False with a reason while it does not, True with a
reason when the employer is deleted or no longer employs the pod, and, only when the employer
asks for the fail-safe, True after its timeout.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resourceconsist import wire
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules import lifecycle
from resourceconsist.wire import GateReason

Pod = Mapping[str, Any]
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


class InvalidAnnotation(ResourceConsistError, ValueError):
    """An employer annotation of the zero-downtime options holds a value the frame cannot read."""


#: The longest drain a Service may ask for: the pods' preStop sleep and the grace period grow by
#: it, and an hour already holds a rollout far longer than any load balancer needs to let go.
MAX_DRAIN_SECONDS = 3600.0
#: The longest fail-safe timeout of a readiness gate (a day).
MAX_GATE_TIMEOUT_SECONDS = 86400.0


def parse_duration(value: str, annotation: str, maximum: float) -> float:
    """Seconds of ``"90"``, ``"90s"``, ``"5m"`` or ``"1h"``, at most ``maximum``;
    ``InvalidAnnotation`` otherwise (a number too long for a float is over the maximum too)."""
    match = _DURATION.match(value)
    if match is None:
        raise InvalidAnnotation(
            f"annotation {annotation}: {value!r} is not a duration; "
            'write seconds or a number with a unit, e.g. "90", "90s" or "5m"'
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or ""]
    if not seconds <= maximum:
        shown = value if len(value) <= 20 else value[:17] + "..."
        raise InvalidAnnotation(
            f"annotation {annotation}: {shown!r} is longer than the {maximum:g} seconds allowed; "
            "write a shorter duration"
        )
    return seconds


def gate_timeout(employer: Pod) -> float | None:
    """The employer's fail-safe timeout in seconds, None when it asks for none (the default)."""
    value = lifecycle.get_annotations(employer).get(wire.READINESS_GATE_TIMEOUT_ANNOTATION)
    if value is None or not value.strip():
        return None
    return parse_duration(value, wire.READINESS_GATE_TIMEOUT_ANNOTATION, MAX_GATE_TIMEOUT_SECONDS)


def drain_seconds(employer: Pod) -> int | None:
    """The employer's drain time in whole seconds (rounded up), None when it names none."""
    value = lifecycle.get_annotations(employer).get(wire.DRAIN_SECONDS_ANNOTATION)
    if value is None or not value.strip():
        return None
    seconds = parse_duration(value, wire.DRAIN_SECONDS_ANNOTATION, MAX_DRAIN_SECONDS)
    return int(-(-seconds // 1))


def drain_mode(employer: Pod) -> str:
    """How the employer's drain ends: ``sleep`` (the default) or ``wait`` (docs/zero-downtime.md,
    "A drain that waits for the provider"); ``InvalidAnnotation`` for any other value."""
    value = lifecycle.get_annotations(employer).get(wire.DRAIN_MODE_ANNOTATION)
    if value is None or not value.strip():
        return "sleep"
    mode = value.strip().lower()
    if mode not in wire.DRAIN_MODES:
        raise InvalidAnnotation(
            f"annotation {wire.DRAIN_MODE_ANNOTATION}: {value[:40]!r} is not a drain mode; "
            f"write {' or '.join(repr(m) for m in wire.DRAIN_MODES)}"
        )
    return mode


def gates_enabled(employer: Pod) -> bool:
    """Whether the employer asks the webhook to gate the pods it selects."""
    value = lifecycle.get_annotations(employer).get(wire.READINESS_GATE_ANNOTATION, "")
    return value.strip().lower() == "true"


@dataclass(frozen=True)
class GateState:
    """The condition the frame wants on a pod for one employer's gate."""

    status: bool
    reason: GateReason
    message: str

    def matches(self, condition: Mapping[str, Any] | None) -> bool:
        """Whether the pod's condition already says this (no write needed)."""
        return condition is not None and (
            condition.get("status") == ("True" if self.status else "False")
            and condition.get("reason") == self.reason
            and condition.get("message", "") == self.message
        )


def _time(stamp: Any) -> datetime.datetime | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def waiting_since(pod: Pod, gate: str) -> datetime.datetime | None:
    """Since when the pod has been ready for the provider to serve it without being served:
    the later of its containers turning ready and the gate turning False (a pod served before
    and taken out again counts from then). None when unknown."""
    moments = []
    containers = lifecycle.pod_condition(pod, "ContainersReady")
    if containers is not None and containers.get("status") == "True":
        moments.append(_time(containers.get("lastTransitionTime")))
    condition = lifecycle.pod_condition(pod, gate)
    if condition is not None and condition.get("status") != "True":
        moments.append(_time(condition.get("lastTransitionTime")))
    found = [m for m in moments if m is not None]
    if not found:
        return _time((pod.get("metadata") or {}).get("creationTimestamp"))
    return max(found)


@dataclass(frozen=True)
class Decision:
    """What to write (None: leave the condition as it is) and when to look again (seconds)."""

    want: GateState | None
    recheck_after: float | None = None


def decide(
    pod: Pod,
    gate: str,
    *,
    employer: str,
    employer_deleting: bool,
    employed: bool | None,
    serving: bool | None,
    timeout: float | None,
    now: datetime.datetime,
    refused: str | None = None,
) -> Decision:
    """The gate condition one pod should carry.

    ``employed``/``serving`` are None when this pass could not tell (the provider's state is
    unknown: a call failed or the pass stopped early); a True gate then stays True, except for
    the fail-safe, which exists for exactly that case, and a gate that is not True says why it
    waits. ``refused`` is the provider's reason (code and message) when it refused, in this
    pass, the call that would serve the pod.
    """
    condition = lifecycle.pod_condition(pod, gate)
    if employer_deleting:
        return Decision(GateState(True, GateReason.EMPLOYER_DELETED, f"{employer} is being deleted"))
    if employed is False:
        return Decision(GateState(True, GateReason.NOT_SELECTED, f"{employer} no longer employs the pod"))
    if serving:
        return Decision(GateState(True, GateReason.SERVING, f"the provider of {employer} serves the pod"))
    if (
        condition is not None
        and condition.get("status") == "True"
        and condition.get("reason") == GateReason.TIMEOUT
    ):
        return Decision(None)  # the fail-safe let it go; it stays so until the provider serves it
    ready = lifecycle.is_lifecycle_ready(pod)
    not_serving: GateState | None = None
    said_true = condition is not None and condition.get("status") == "True"
    if serving is False or (serving is None and not said_true):
        # Unknown leaves a True gate as it is (a failed call does not take a served pod out);
        # a gate that is not True says why, in the terms of docs/zero-downtime.md.
        not_serving = _not_serving(employer, ready=ready, serving=serving, refused=refused)
    if timeout is None or not ready:
        return Decision(not_serving)
    since = waiting_since(pod, gate)
    left = timeout if since is None else timeout - (now - since).total_seconds()
    if left <= 0:
        return Decision(
            GateState(
                True,
                GateReason.TIMEOUT,
                f"the provider of {employer} did not serve the pod within {timeout:g}s; the fail-safe "
                "let the pod become Ready without it",
            )
        )
    return Decision(not_serving, recheck_after=left)


def registering(employer: str) -> GateState:
    """A ready pod the provider has not registered yet, or whose registration is in flight."""
    return GateState(
        False, GateReason.NOT_SERVING, f"waiting for the provider of {employer} to register the pod"
    )


def not_serving_yet(employer: str) -> GateState:
    """A ready pod the provider holds and does not serve (yet), or whose change is in flight."""
    return GateState(False, GateReason.NOT_SERVING, f"the provider of {employer} does not serve the pod yet")


def _not_serving(employer: str, *, ready: bool, serving: bool | None, refused: str | None) -> GateState:
    """Why a gate is False: the pod is not ready, the provider refused it, or it has not (yet)
    registered and served it."""
    if not ready:
        return GateState(
            False,
            GateReason.CONTAINERS_NOT_READY,
            f"the pod's containers or its other readiness gates are not ready; the provider of {employer} "
            "is not asked to serve it yet",
        )
    if refused:
        return GateState(
            False,
            GateReason.PROVIDER_REFUSED,
            f"the provider of {employer} refused the change that would serve the pod: {refused}",
        )
    if serving is None:
        return registering(employer)
    return not_serving_yet(employer)


def condition_patch(pod: Pod, gate: str, want: GateState, now: datetime.datetime) -> dict[str, Any]:
    """The strategic-merge patch of the pod's status that sets the gate condition (conditions
    merge by type, so the kubelet's and other gates' conditions stay). It names the pod's uid:
    a pod re-created under the same name is not written on an older pod's behalf."""
    status = "True" if want.status else "False"
    condition: dict[str, Any] = {
        "type": gate,
        "status": status,
        "reason": str(want.reason),
        "message": want.message,
    }
    current = lifecycle.pod_condition(pod, gate)
    if current is None or current.get("status") != status:
        condition["lastTransitionTime"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    body: dict[str, Any] = {"status": {"conditions": [condition]}}
    uid = (pod.get("metadata") or {}).get("uid")
    if uid:
        body["metadata"] = {"uid": uid}
    return body
