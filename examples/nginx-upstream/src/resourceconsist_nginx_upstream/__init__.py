"""An nginx upstream file per controlled Service: an example of a third-party adapter package.

``register`` is this distribution's entry point in the ``resourceconsist.adapters`` group, so
installing the package makes ``resourceconsist run --adapter nginx-upstream`` work. The
provider is a directory (``$NGINX_UPSTREAM_DIR``) holding ``<namespace>_<service>.conf``::

    upstream shop_web {
        server 10.0.0.7;  # web-0
        server 10.0.0.8 down;  # web-1
    }

A pod that is not lifecycle-ready stays in the file as ``down`` (nginx stops sending it
requests) until it leaves the Service; the frame keeps the pod's lifecycle finalizer while the
file still names it (docs/reference/adapter.md says what the frame reads from these items).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from resourceconsist.adapter import (
    Employee,
    Employer,
    Outcome,
    PodEmployeeStatuses,
    ReconcileAdapter,
    ReconcileContext,
    pod_employee_statuses,
)
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.registry import AdapterRegistry
from resourceconsist.webhook import ControlledServiceAdapter

NAME = "nginx-upstream"
DIR_ENV = "NGINX_UPSTREAM_DIR"
_SERVER = re.compile(r"^\s*server\s+(?P<ip>\S+?)(?P<down>\s+down)?;\s*#\s*(?P<pod>\S+)\s*$")


class UpstreamFiles:
    """The provider: one upstream file per Service, replaced atomically on every write."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, namespace: str, service: str) -> Path:
        return self.root / f"{namespace}_{service}.conf"

    def read(self, namespace: str, service: str) -> dict[str, tuple[str, bool]] | None:
        """``{pod: (ip, down)}`` of the Service's file, None when there is no file."""
        try:
            text = self.path(namespace, service).read_text()
        except FileNotFoundError:
            return None
        servers: dict[str, tuple[str, bool]] = {}
        for line in text.splitlines():
            found = _SERVER.match(line)
            if found:
                servers[found["pod"]] = (found["ip"], bool(found["down"]))
        return servers

    def write(self, namespace: str, service: str, servers: Mapping[str, tuple[str, bool]]) -> None:
        lines = [f"upstream {namespace}_{service} {{"]
        for pod, (ip, down) in sorted(servers.items()):
            lines.append(f"    server {ip}{' down' if down else ''};  # {pod}")
        lines.append("}")
        # nginx may reload while we write: it must see the old file or the new one, never half.
        with tempfile.NamedTemporaryFile("w", dir=self.root, suffix=".tmp", delete=False) as f:
            f.write("\n".join(lines) + "\n")
        os.replace(f.name, self.path(namespace, service))

    def remove(self, namespace: str, service: str) -> None:
        self.path(namespace, service).unlink(missing_ok=True)


class Server(Employee):
    """One ``server`` line. Equal when the file already says what the pod needs: its IP, and
    ``down`` exactly when the pod is not lifecycle-ready (the file cannot hold more)."""

    def equal(self, other: Employee) -> bool:
        return self.id == other.id and _line(self) == _line(other)


def _line(item: Employee) -> tuple[str, bool]:
    statuses = item.statuses
    assert isinstance(statuses, PodEmployeeStatuses)
    return statuses.ip, bool(statuses.extra_status["down"])


def _where(employer: KubeObject) -> tuple[str, str]:
    meta = employer["metadata"]
    return str(meta["namespace"]), str(meta["name"])


def _deleting(obj: KubeObject) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


class NginxUpstreamAdapter(ReconcileAdapter):
    """Employer: the Service's upstream file. Employees: its selected pods' ``server`` lines."""

    def __init__(self, files: UpstreamFiles) -> None:
        self.files = files

    def get_controller_name(self) -> str:
        return NAME

    def get_expected_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        # Nothing is expected of a deleting Service: that is what releases its clean finalizer.
        return [] if _deleting(employer) else [Employer(id=_where(employer)[1])]

    def get_current_employer(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employer]:
        namespace, service = _where(employer)
        return [] if self.files.read(namespace, service) is None else [Employer(id=service)]

    def create_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employer]
    ) -> Outcome[Employer]:
        self.files.write(*_where(employer), {})
        return to_create, []

    def update_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employer]
    ) -> Outcome[Employer]:
        return to_update, []  # the file has no settings of its own that could drift

    def delete_employer(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employer]
    ) -> Outcome[Employer]:
        self.files.remove(*_where(employer))
        return to_delete, []

    def get_expected_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        if _deleting(employer):
            return []
        expected: list[Employee] = []
        for pod in ctx.reader.pods_selected_by(employer):
            statuses = pod_employee_statuses(pod)  # lifecycle_ready read from the pod, for the frame
            if _deleting(pod) or not statuses.ip:
                continue
            statuses.extra_status = {"down": not statuses.lifecycle_ready}
            name = pod["metadata"]["name"]
            expected.append(Server(id=name, name=name, statuses=statuses))
        return expected

    def get_current_employee(self, ctx: ReconcileContext, employer: KubeObject) -> list[Employee]:
        servers = self.files.read(*_where(employer)) or {}
        return [
            Server(id=pod, name=pod, statuses=PodEmployeeStatuses(ip=ip, extra_status={"down": down}))
            for pod, (ip, down) in servers.items()
        ]

    def create_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_create: list[Employee]
    ) -> Outcome[Employee]:
        return self._edit(employer, put=to_create)

    def update_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_update: list[Employee]
    ) -> Outcome[Employee]:
        return self._edit(employer, put=to_update)

    def delete_employees(
        self, ctx: ReconcileContext, employer: KubeObject, to_delete: list[Employee]
    ) -> Outcome[Employee]:
        return self._edit(employer, drop=to_delete)

    def _edit(
        self, employer: KubeObject, put: list[Employee] | None = None, drop: list[Employee] | None = None
    ) -> Outcome[Employee]:
        namespace, service = _where(employer)
        servers = self.files.read(namespace, service)
        if servers is None:  # the employer side has not created the file: nothing done, try again
            return [], list(put or drop or [])
        for item in put or []:
            servers[item.id] = _line(item)
        for item in drop or []:
            servers.pop(item.id, None)
        self.files.write(namespace, service, servers)
        return list(put or drop or []), []


def from_env(environ: Mapping[str, str]) -> NginxUpstreamAdapter:
    """The adapter for ``$NGINX_UPSTREAM_DIR``; a clear error when it is unset or missing."""
    root = environ.get(DIR_ENV, "")
    if not root:
        raise ValueError(f"set {DIR_ENV} to the directory nginx includes its upstream files from")
    if not Path(root).is_dir():
        raise ValueError(f"{DIR_ENV}={root} is not a directory; create it or point {DIR_ENV} elsewhere")
    return NginxUpstreamAdapter(UpstreamFiles(Path(root)))


def _webhook(environ: Mapping[str, str]) -> Any:
    return ControlledServiceAdapter(NAME)


def register(registry: AdapterRegistry) -> None:
    """The ``resourceconsist.adapters`` entry point: add this adapter to ``registry``."""
    registry.register(
        NAME,
        controller=from_env,
        webhook=_webhook,
        description="nginx upstream file per controlled Service (example third-party package)",
    )
