"""What the built-in adapters read on a Service and its pods to build a pod's backend: the port
(an annotation, else the Service's only ``targetPort``; a number or a container port name) and
a per-pod weight (the pod's annotation, else the Service's). Each adapter names its own
annotations and turns ``BackendSettingError`` into its own error type.
"""

from __future__ import annotations

from typing import Any

from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError


class BackendSettingError(ResourceConsistError, ValueError):
    """A port or weight annotation (or the Service's ports) that no backend can be built from."""


def where(obj: KubeObject) -> str:
    """``Kind namespace/name`` of an object, for messages."""
    meta: dict[str, Any] = obj.get("metadata") or {}
    return f"{obj.get('kind') or 'object'} {meta.get('namespace', '')}/{meta.get('name', '')}"


def annotation(obj: KubeObject, name: str) -> str | None:
    """The annotation's value stripped; None when absent."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(name)
    return None if value is None else str(value).strip()


def target_port(service: KubeObject, port_annotation: str) -> str | int:
    """The Service's backend port: its ``port_annotation``, else the ``targetPort`` of its only port."""
    value = annotation(service, port_annotation)
    if value:
        return int(value) if value.isdigit() else value
    ports = (service.get("spec") or {}).get("ports") or []
    if len(ports) != 1:
        raise BackendSettingError(
            f"{where(service)} has {len(ports)} ports; annotation {port_annotation} must name the "
            "backend port (a number or a container port name)"
        )
    target: str | int = ports[0].get("targetPort") or ports[0].get("port") or 0
    if isinstance(target, str) and target.isdigit():
        return int(target)
    return target


def backend_port(service: KubeObject, pod: KubeObject, port_annotation: str) -> int | None:
    """The backend port for ``pod``: a number, or the pod's container port of that name.

    ``None`` when the port is a name the pod does not declare. ``BackendSettingError`` when the
    Service does not say which port (several ports and no annotation) or says a number out of range.
    """
    target = target_port(service, port_annotation)
    if isinstance(target, int):
        if not 1 <= target <= 65535:
            raise BackendSettingError(f"{where(service)}: backend port {target} is not within 1..65535")
        return target
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def backend_weight(
    service: KubeObject, pod: KubeObject, weight_annotation: str, highest: int, default: int
) -> int:
    """The pod's ``weight_annotation``, else the Service's, else ``default``; 0..``highest``."""
    for obj in (pod, service):
        value = annotation(obj, weight_annotation)
        if value is None or value == "":
            continue
        if not value.isdigit() or not 0 <= int(value) <= highest:
            raise BackendSettingError(
                f"{where(obj)}: annotation {weight_annotation}={value!r} is not an integer "
                f"within 0..{highest}"
            )
        return int(value)
    return default


def pod_ip(pod: KubeObject) -> str:
    return str((pod.get("status") or {}).get("podIP") or "")
