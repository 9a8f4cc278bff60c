"""AdmissionReview ``admission.k8s.io/v1`` on the wire, and the pod mutation the webhook computes.

Pure code, no I/O: parsing and validating the review the API server sends (pydantic), checking
that the pod in it has the shape the mutation reads, building the answer (allowed with a
JSONPatch, allowed untouched, or denied with a ``metav1.Status``), and ``pod_mutation``, which
computes the patch from the employers through ``resourceconsist.lifecycle`` only, so the
webhook and the controller write byte-identical annotation values. The same patch carries what
the employers ask of the pod's spec (docs/zero-downtime.md): their readiness gates, and a
``preStop`` sleep of the longest drain time in every container without a preStop hook.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resourceconsist import lifecycle
from resourceconsist.errors import ResourceConsistError
from resourceconsist.kube import KubeObject
from resourceconsist.webhook.adapter import EmployerRef

ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
ADMISSION_KIND: Final = "AdmissionReview"


class _Model(BaseModel):
    # Unknown fields are kept: the API server adds fields over releases and they must not
    # turn a valid review into a 400.
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str


class AdmissionRequest(_Model):
    """The fields of ``request`` the webhook reads."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    sub_resource: str = Field("", alias="subResource")
    name: str = ""
    namespace: str = ""
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    object: dict[str, Any] | None = None
    dry_run: bool | None = Field(None, alias="dryRun")


class AdmissionReview(_Model):
    """An incoming review: only ``admission.k8s.io/v1`` is spoken (the manifests ask for it)."""

    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class _PodMetadata(_Model):
    name: str = ""
    generate_name: str = Field("", alias="generateName")
    namespace: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Pod(_Model):
    metadata: _PodMetadata


class BadReview(ResourceConsistError, ValueError):
    """The body is not an AdmissionReview this webhook can answer (answered with HTTP 400)."""


def _describe(err: ValidationError, prefix: str) -> str:
    parts = []
    for item in err.errors()[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "body"
        parts.append(f"{prefix}{where}: {item['msg']}")
    more = err.error_count() - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate a request body; ``BadReview`` names what is wrong."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            raise BadReview("the body is not JSON") from None
        raise BadReview(f"not an {ADMISSION_API_VERSION} {ADMISSION_KIND}: {_describe(err, '')}") from None


def validate_pod(obj: Mapping[str, Any] | None) -> None:
    """Raise ``ValueError`` unless ``obj`` has the pod shape the mutation reads."""
    if obj is None:
        raise ValueError("request.object is missing")
    try:
        _Pod.model_validate(obj)
    except ValidationError as err:
        raise ValueError(f"request.object is not a valid Pod: {_describe(err, '')}") from None


#: The grace period Kubernetes gives a pod that names none.
DEFAULT_TERMINATION_GRACE_SECONDS: Final = 30


def pod_mutation(pod: KubeObject, employers: Iterable[EmployerRef]) -> list[dict[str, Any]]:
    """The JSONPatch that merges the employers' entries into the pod's ``available-conditions``
    annotation, keeping the entries already there, and adds what they ask of the spec
    (``spec_mutation``); empty when nothing changes.

    Raises ``lifecycle.MalformedAvailableConditions`` when there are entries to add and the
    existing annotation cannot be read (merging into it would destroy it).
    """
    employers = list(employers)
    entries = {e.expected_finalizer_key: e.lifecycle_finalizer for e in employers}
    if not entries:
        return []
    value = lifecycle.updated_available_conditions(pod, add=entries)
    patch = [] if value is None else lifecycle.admission_patch(pod, value)
    return patch + spec_mutation(pod, employers)


def spec_mutation(pod: KubeObject, employers: Iterable[EmployerRef]) -> list[dict[str, Any]]:
    """JSON-patch operations for the spec: each gating employer's readiness gate (kept when
    present), and, when an employer names a drain time, a ``preStop`` sleep of the longest one in
    every container that has no preStop hook of its own, with the grace period raised by as
    much, so the containers keep their own shutdown time after the sleep."""
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = []
    have = set(lifecycle.readiness_gates(pod))
    wanted = [g for g in dict.fromkeys(e.gate for e in employers if e.readiness_gate) if g not in have]
    if wanted:
        if spec.get("readinessGates") is None:
            ops.append(
                {"op": "add", "path": "/spec/readinessGates", "value": [{"conditionType": g} for g in wanted]}
            )
        else:
            ops += [
                {"op": "add", "path": "/spec/readinessGates/-", "value": {"conditionType": g}} for g in wanted
            ]
    drain = max((e.drain_seconds for e in employers if e.drain_seconds), default=0)
    if drain <= 0:
        return ops
    hook = {"sleep": {"seconds": drain}}
    injected = False
    for i, container in enumerate(spec.get("containers") or []):
        hooks = container.get("lifecycle")
        if hooks is None:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/lifecycle", "value": {"preStop": hook}})
            injected = True
        elif hooks.get("preStop") is None:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/lifecycle/preStop", "value": hook})
            injected = True
    if injected:
        grace = spec.get("terminationGracePeriodSeconds")
        base = DEFAULT_TERMINATION_GRACE_SECONDS if grace is None else int(grace)
        op = "add" if grace is None else "replace"
        ops.append({"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": base + drain})
    return ops


@dataclass(frozen=True)
class Verdict:
    """The webhook's answer to one review, before it is put on the wire."""

    allowed: bool
    patch: tuple[dict[str, Any], ...] = ()
    code: int = HTTPStatus.OK
    message: str = ""

    @classmethod
    def allow(cls, message: str = "", patch: Iterable[dict[str, Any]] = ()) -> Verdict:
        return cls(True, tuple(patch), HTTPStatus.OK, message)

    @classmethod
    def deny(cls, code: int, message: str) -> Verdict:
        return cls(False, (), code, message)


def review_response(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview the API server reads back."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.patch:
        raw = json.dumps(list(verdict.patch), separators=(",", ":"), ensure_ascii=False).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(raw).decode()
    if not verdict.allowed:
        response["status"] = status_body(verdict.code, verdict.message, api_object=False)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": ADMISSION_KIND, "response": response}


#: ``metav1.StatusReason`` for the codes the webhook answers with.
_REASONS: Final = {
    HTTPStatus.BAD_REQUEST.value: "BadRequest",
    HTTPStatus.NOT_FOUND.value: "NotFound",
    HTTPStatus.METHOD_NOT_ALLOWED.value: "MethodNotAllowed",
    HTTPStatus.GATEWAY_TIMEOUT.value: "Timeout",
}


def status_body(code: int, message: str, *, api_object: bool = True) -> dict[str, Any]:
    """A ``metav1.Status`` failure; as a top-level body (``api_object``) the API server's
    client decodes it into the error it reports."""
    reason = _REASONS.get(code, "InternalError")
    body: dict[str, Any] = {"status": "Failure", "message": message, "reason": reason, "code": code}
    if api_object:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, **body}
    return body
