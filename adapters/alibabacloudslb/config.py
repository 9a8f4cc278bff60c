"""What the SLB adapter reads on Services and pods: label and annotation names, and their parsing.

The label naming the load balancer (``LOAD_BALANCER_ID_LABEL``) is shared with the Go adapter and
Alibaba's cloud controller manager: a wire name, pinned by tests/api/test_wire.py. The
annotations here belong to this adapter alone (manage mode has no Go counterpart); they share the
``resource-consist.kusionstack.io/`` domain of the frame's own employer annotations.

Every parser raises ``SLBConfigError`` with the object, the annotation and the value at fault, so
a typo surfaces as a Warning event on the Service instead of as silently wrong backends.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

from resourceconsist import wire
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules import lifecycle

from .slbclient import BackendServerType

#: Service label holding the id of the load balancer (the Go adapter's and the CCM's name).
LOAD_BALANCER_ID_LABEL: Final = "service.k8s.alibaba/loadbalancer-id"
#: Service annotation choosing the mode: ``observe`` (default, the Go adapter's behaviour) or
#: ``manage`` (this adapter owns one VServer group of the load balancer).
MODE_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-mode"
#: Weight (0..100) of a ready pod's backend; on the pod, else on the Service; default 100.
WEIGHT_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-backend-weight"
DEFAULT_WEIGHT: Final = 100
#: Service annotation: the backend port, a number or a container port name. Without it the
#: Service must have exactly one port, whose ``targetPort`` is used.
PORT_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-backend-port"
#: Backend type: ``eni`` (default: pod IPs on elastic network interfaces, terway) or ``eci``
#: (elastic container instances); on the pod, else on the Service.
BACKEND_TYPE_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-backend-type"
DEFAULT_BACKEND_TYPE: Final[BackendServerType] = "eni"
#: Pod annotation: the SLB ``ServerId`` of the pod's backend: the ENI id holding the pod IP
#: (``eni-...``) or the ECI instance id (``eci-...``). SLB needs it beside the IP.
SERVER_ID_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-backend-server-id"
#: Service annotation: seconds a leaving backend stays at weight 0 before it is removed; default 0
#: (removed on the pass after its weight 0 was seen).
DRAIN_ANNOTATION: Final = "resource-consist.kusionstack.io/slb-drain-seconds"
MAX_DRAIN_SECONDS: Final = 3600.0

#: Prefix of the VServer group this adapter owns: ``resourceconsist/<namespace>/<service>``. CCM
#: only claims groups named ``k8s/<port>/<service>/<namespace>/<cluster id>``, so it leaves ours
#: alone, and we only ever touch the group of exactly our name.
GROUP_NAME_PREFIX: Final = "resourceconsist/"
#: Prefix of the ``Description`` this adapter writes on its backends: ``resourceconsist/<pod>``.
#: A backend in our group without it was put there by someone else and is never touched.
MEMBER_DESCRIPTION_PREFIX: Final = "resourceconsist/"
#: Tags on every VServer group this adapter creates (docs/alibabacloudslb.md, "Tags"): the
#: cluster that made it, and the Service it was made for. They are how the garbage pass finds the
#: groups of a Service that is gone, and how two clusters sharing a load balancer tell their groups
#: apart. Keys under the project's own prefix; wire names, pinned by tests/api/test_wire.py.
TAG_PREFIX: Final = "resource-consist.kusionstack.io/"
CLUSTER_TAG: Final = TAG_PREFIX + "cluster"
SERVICE_NAMESPACE_TAG: Final = TAG_PREFIX + "service-namespace"
SERVICE_NAME_TAG: Final = TAG_PREFIX + "service-name"
SERVICE_UID_TAG: Final = TAG_PREFIX + "service-uid"
#: What a cluster name may be: it is a tag value, and operators type it in flags.
_CLUSTER_NAME_RE: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
#: SLB's limit on VServer group names and backend descriptions.
MAX_NAME_LENGTH: Final = 80

_MANAGED_TYPES: Final[dict[str, BackendServerType]] = {"eni": "eni", "eci": "eci"}


class Mode(StrEnum):
    OBSERVE = "observe"
    MANAGE = "manage"


class SLBConfigError(ResourceConsistError, ValueError):
    """A label or annotation on a Service or pod that the adapter cannot act on."""


def _meta(obj: KubeObject) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


def _where(obj: KubeObject) -> str:
    meta = _meta(obj)
    return f"{obj.get('kind') or 'object'} {meta.get('namespace', '')}/{meta.get('name', '')}"


def _annotation(obj: KubeObject, name: str) -> str | None:
    value = (_meta(obj).get("annotations") or {}).get(name)
    return None if value is None else str(value).strip()


def load_balancer_id(service: KubeObject) -> str:
    """The load balancer named by the Service's label; empty when the label is absent."""
    return str((_meta(service).get("labels") or {}).get(LOAD_BALANCER_ID_LABEL, "")).strip()


def is_slb_service(service: KubeObject | None) -> bool:
    """Controlled (``kusionstack.io/control: "true"``) and naming a load balancer."""
    if service is None:
        return False
    labels = _meta(service).get("labels") or {}
    return labels.get(wire.CONTROL_LABEL) == wire.CONTROL_LABEL_VALUE and bool(load_balancer_id(service))


def mode_of(service: KubeObject) -> Mode:
    value = _annotation(service, MODE_ANNOTATION)
    if not value:
        return Mode.OBSERVE
    try:
        return Mode(value.lower())
    except ValueError:
        raise SLBConfigError(
            f"{_where(service)}: annotation {MODE_ANNOTATION}={value!r} is neither "
            f"{Mode.OBSERVE.value!r} nor {Mode.MANAGE.value!r}"
        ) from None


def vserver_group_name(service: KubeObject) -> str:
    """The name of the VServer group this adapter owns for ``service``.

    ``resourceconsist/<namespace>/<name>``; past SLB's 80 characters, the two parts are cut and
    a hash of the full name keeps it unique.
    """
    meta = _meta(service)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    full = f"{GROUP_NAME_PREFIX}{namespace}/{name}"
    if len(full) <= MAX_NAME_LENGTH:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    room = MAX_NAME_LENGTH - len(GROUP_NAME_PREFIX) - len(digest) - 2  # two separators
    half = room // 2
    return f"{GROUP_NAME_PREFIX}{namespace[:half]}/{name[: room - half]}-{digest}"


def check_cluster_name(value: str, *, source: str) -> str:
    """``value`` stripped, when it is a usable cluster name; ``SLBConfigError`` naming ``source``
    (where it was set) otherwise. Empty stays empty (not set)."""
    name = value.strip()
    if name and not _CLUSTER_NAME_RE.fullmatch(name):
        raise SLBConfigError(
            f"{source}={value!r} is not a cluster name: use 1 to 63 letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    return name


def group_tags(cluster_name: str, service: KubeObject) -> dict[str, str]:
    """The tags the VServer group of ``service`` carries in cluster ``cluster_name``."""
    meta = _meta(service)
    return {
        CLUSTER_TAG: cluster_name,
        SERVICE_NAMESPACE_TAG: str(meta.get("namespace") or ""),
        SERVICE_NAME_TAG: str(meta.get("name") or ""),
        SERVICE_UID_TAG: str(meta.get("uid") or ""),
    }


def tagged_owner(tags: Mapping[str, str]) -> str | None:
    """The key (``namespace/name``) of the Service a group's tags name, if they name one."""
    namespace, name = tags.get(SERVICE_NAMESPACE_TAG, ""), tags.get(SERVICE_NAME_TAG, "")
    return f"{namespace}/{name}" if namespace and name else None


def member_description(pod_name: str) -> str:
    """The ``Description`` that marks a backend as ours (SLB allows letters, digits, ``-/._``)."""
    return (MEMBER_DESCRIPTION_PREFIX + pod_name)[:MAX_NAME_LENGTH]


def is_our_member_description(description: str | None) -> bool:
    return bool(description) and str(description).startswith(MEMBER_DESCRIPTION_PREFIX)


def drain_seconds(service: KubeObject) -> float:
    value = _annotation(service, DRAIN_ANNOTATION)
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_DRAIN_SECONDS:
        raise SLBConfigError(
            f"{_where(service)}: annotation {DRAIN_ANNOTATION}={value!r} is not a number of seconds "
            f"within 0..{MAX_DRAIN_SECONDS:.0f}"
        )
    return seconds


def backend_weight(service: KubeObject, pod: KubeObject) -> int:
    """The pod's weight annotation, else the Service's, else 100."""
    for obj in (pod, service):
        value = _annotation(obj, WEIGHT_ANNOTATION)
        if value is None or value == "":
            continue
        if not value.isdigit() or not 0 <= int(value) <= 100:
            raise SLBConfigError(
                f"{_where(obj)}: annotation {WEIGHT_ANNOTATION}={value!r} is not an integer within 0..100"
            )
        return int(value)
    return DEFAULT_WEIGHT


def backend_type(service: KubeObject, pod: KubeObject) -> BackendServerType:
    for obj in (pod, service):
        value = _annotation(obj, BACKEND_TYPE_ANNOTATION)
        if not value:
            continue
        found = _MANAGED_TYPES.get(value.lower())
        if found is None:
            raise SLBConfigError(
                f"{_where(obj)}: annotation {BACKEND_TYPE_ANNOTATION}={value!r} is not one of "
                f"{', '.join(sorted(_MANAGED_TYPES))} (ECS backends stand for a whole node, not a pod; "
                "see docs/alibabacloudslb.md)"
            )
        return found
    return DEFAULT_BACKEND_TYPE


def _target_port(service: KubeObject) -> str | int:
    value = _annotation(service, PORT_ANNOTATION)
    if value:
        return int(value) if value.isdigit() else value
    ports = (service.get("spec") or {}).get("ports") or []
    if len(ports) != 1:
        raise SLBConfigError(
            f"{_where(service)} has {len(ports)} ports; annotation {PORT_ANNOTATION} must name the "
            "backend port (a number or a container port name)"
        )
    target: str | int = ports[0].get("targetPort") or ports[0].get("port") or 0
    if isinstance(target, str) and target.isdigit():
        return int(target)
    return target


def backend_port(service: KubeObject, pod: KubeObject) -> int | None:
    """The backend port for ``pod``: a number, or the pod's container port of that name.

    ``None`` when the port is a name the pod does not declare. ``SLBConfigError`` when the
    Service does not say which port (several ports and no annotation) or says a number out of range.
    """
    target = _target_port(service)
    if isinstance(target, int):
        if not 1 <= target <= 65535:
            raise SLBConfigError(f"{_where(service)}: backend port {target} is not within 1..65535")
        return target
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def pod_ip(pod: KubeObject) -> str:
    return str((pod.get("status") or {}).get("podIP") or "")


def carries_finalizer(pod: KubeObject, *finalizers: str) -> bool:
    """The pod holds any of ``finalizers`` (our Service's lifecycle finalizer or guard)."""
    held = lifecycle.get_finalizers(pod)
    return any(f in held for f in finalizers)
