"""AdmissionReview ``admission.k8s.io/v1`` on the wire, and the pod mutation the webhook computes.

Pure code, no I/O: parsing and validating the review the API server sends (pydantic), reading
the fields of the pod the mutation uses (``read_pod``: the one place their shapes are checked),
building the answer (allowed with a JSONPatch, allowed untouched, or denied with a
``metav1.Status``), and ``pod_mutation``, which computes the patch from the employers through
``resourceconsist.rules.lifecycle`` only, so the webhook and the controller write byte-identical
annotation values. The same patch carries what the employers ask of the pod's spec
(docs/zero-downtime.md): their readiness gates, and a ``preStop`` hook in every container without
one, a sleep of the longest drain time or a call to the drain waiter sidecar it adds. When asked
(``WebhookOptions.pod_employer_label``), it also stamps sharding's employer label
(``wire.EMPLOYER_LABEL``; docs/scaling.md, "Pods selected by the API server").

What bad input gets (docs/webhook.md, "Bad input"): a body that is not a v1 AdmissionReview
raises ``BadReview`` (HTTP 400); a pod whose fields the mutation reads have the wrong shape
raises ``MalformedPod``, naming each field by its path (``spec.readinessGates[0]``), and is
denied with code 400, never admitted without its entries, gates and hooks.

``decide`` is the webhook's decision on one review: which requests it leaves untouched, what the
adapter's employers make of the pod, and how an adapter's failure or overrun is told to the user
creating the pod. It asks for the employers through the function the server gives it (the
server's side: calling the adapter within a deadline), so the decision holds no I/O of its own.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from resourceconsist import wire
from resourceconsist.cluster import kube
from resourceconsist.cluster.kube import KubeObject
from resourceconsist.errors import ResourceConsistError
from resourceconsist.rules import lifecycle, marks
from resourceconsist.webhook.adapter import EmployerRef
from resourceconsist.webhook.options import DrainWaiterOptions

ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
ADMISSION_KIND: Final = "AdmissionReview"


class _Model(BaseModel):
    # Unknown fields are kept: the API server adds fields over releases and they must not
    # turn a valid review into a 400. Strict: the API server writes a bool as a bool, so
    # ``"dryRun": "yes"`` is a broken review, not a dry run.
    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)


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


# -- the pod, as far as the webhook reads it -------------------------------------------------------

#: Go's int64, the type of every integer in a Pod.
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class _PodPart(BaseModel):
    # Only the fields below are read, and only they are checked; the rest of the pod is the
    # API server's to validate.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)


class PodMetadata(_PodPart):
    name: str = ""
    generate_name: str = Field("", alias="generateName")
    namespace: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ReadinessGate(_PodPart):
    condition_type: str = Field(alias="conditionType", min_length=1)


class ContainerLifecycle(_PodPart):
    #: Only its presence is read: a container with a hook of its own keeps it.
    pre_stop: dict[str, Any] | None = Field(None, alias="preStop")


class Container(_PodPart):
    name: str = ""
    lifecycle: ContainerLifecycle | None = None


class PodSpec(_PodPart):
    readiness_gates: list[ReadinessGate] | None = Field(None, alias="readinessGates")
    containers: list[Container] | None = None
    init_containers: list[Container] | None = Field(None, alias="initContainers")
    # Any int64: the API server decides what it accepts (it has turned negative ones into 1).
    termination_grace_period_seconds: int | None = Field(
        None, alias="terminationGracePeriodSeconds", ge=_INT64_MIN, le=_INT64_MAX
    )


class PodFields(_PodPart):
    """The fields of a pod the webhook reads, with the shapes it reads them in."""

    metadata: PodMetadata
    #: Required: the patch writes into it (every pod has one; the API server requires containers).
    spec: PodSpec


class BadReview(ResourceConsistError, ValueError):
    """The body is not an AdmissionReview this webhook can answer (answered with HTTP 400)."""


class MalformedPod(ResourceConsistError, ValueError):
    """A field of the pod the webhook reads has the wrong shape (denied with code 400).

    ``problems`` are ``(path, what is wrong)`` pairs, the path relative to the pod
    (``spec.readinessGates[0]``); ``path`` is the first one's."""

    #: How many problems the message lists; the rest are counted.
    SHOWN: Final = 3

    def __init__(self, problems: Sequence[tuple[str, str]], *, message: str = "") -> None:
        self.problems = tuple(problems)
        self.path = self.problems[0][0] if self.problems else ""
        super().__init__(
            message or f"request.object is not a valid Pod: {_listed(self.problems, self.SHOWN)}"
        )

    @classmethod
    def from_annotation(cls, err: lifecycle.MalformedAvailableConditions) -> MalformedPod:
        """The unreadable ``available-conditions`` annotation, named by its path."""
        path = "metadata.annotations" + _segment(wire.AVAILABLE_CONDITIONS_ANNOTATION, first=False)
        return cls([(path, str(err))])


def _listed(problems: Sequence[tuple[str, str]], shown: int) -> str:
    text = "; ".join(f"{path}: {what}" for path, what in problems[:shown])
    more = len(problems) - shown
    return text + (f"; and {more} more" if more > 0 else "")


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _segment(part: str | int, *, first: bool) -> str:
    if isinstance(part, int):
        return f"[{part}]"
    if _IDENTIFIER.match(part):
        return part if first else f".{part}"
    # Label and annotation keys hold dots and slashes: quoted, so the path stays unambiguous.
    return f"[{json.dumps(part)}]"


def field_path(loc: Sequence[str | int], root: str) -> str:
    """A JSON path for a pydantic error location: ``spec.readinessGates[0].conditionType``,
    ``metadata.labels["kusionstack.io/control"]``; ``root`` for the top level."""
    return "".join(_segment(part, first=i == 0) for i, part in enumerate(loc)) or root


#: What each pydantic error type means, in the words of the message.
_EXPECTED: Final = {
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_too_short": "must not be empty",
}
_SHOWN_INPUT: Final = 60


def _shown(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= _SHOWN_INPUT else text[: _SHOWN_INPUT - 3] + "..."


def _problem(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is missing"
    ctx = error.get("ctx") or {}
    if kind in _EXPECTED:
        what = _EXPECTED[kind]
    elif kind == "literal_error":
        what = f"must be {ctx.get('expected')}"
    elif kind == "greater_than_equal":
        what = f"must be at least {ctx.get('ge')}"
    elif kind == "less_than_equal":
        what = f"must be at most {ctx.get('le')}"
    else:
        what = error["msg"]
    return f"{what}, got {_shown(error['input'])}"


def _problems(err: ValidationError, root: str) -> list[tuple[str, str]]:
    return [(field_path(item["loc"], root), _problem(item)) for item in err.errors()]


def parse_review(body: bytes) -> AdmissionReview:
    """Parse and validate a request body; ``BadReview`` names what is wrong, by its path."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as err:
        if any(e["type"] == "json_invalid" for e in err.errors()):
            raise BadReview("the body is not JSON") from None
        raise BadReview(
            f"not an {ADMISSION_API_VERSION} {ADMISSION_KIND}: {_listed(_problems(err, 'the body'), 5)}"
        ) from None


def read_pod(obj: Mapping[str, Any] | None) -> PodFields:
    """The fields of ``obj`` the webhook reads, checked; ``MalformedPod`` names each one that
    has the wrong shape."""
    if obj is None:
        missing = "is missing: a pod CREATE carries the pod"
        raise MalformedPod([("request.object", missing)], message=f"request.object {missing}")
    try:
        return PodFields.model_validate(obj)
    except ValidationError as err:
        raise MalformedPod(_problems(err, "request.object")) from None


def validate_pod(obj: Mapping[str, Any] | None) -> None:
    """Raise ``MalformedPod`` unless ``obj`` has the pod shape the mutation reads."""
    read_pod(obj)


#: The grace period Kubernetes gives a pod that names none.
DEFAULT_TERMINATION_GRACE_SECONDS: Final = 30


def pod_mutation(
    pod: KubeObject,
    employers: Iterable[EmployerRef],
    waiter: DrainWaiterOptions | None = None,
    *,
    employer_label: bool = False,
) -> list[dict[str, Any]]:
    """The JSONPatch that merges the employers' entries into the pod's ``available-conditions``
    annotation, keeping the entries already there, and adds what they ask of the spec
    (``spec_mutation``, with the drain ``waiter`` the webhook is configured with); with
    ``employer_label``, it also widens the pod's employer label to cover its Service employers
    (``employer_label_patch``). Empty when nothing changes.

    Raises ``MalformedPod`` when a field it reads has the wrong shape, and
    ``lifecycle.MalformedAvailableConditions`` when there are entries to add and the existing
    annotation cannot be read (merging into it would destroy it).
    """
    fields = read_pod(pod)
    employers = list(employers)
    entries = {e.expected_finalizer_key: e.lifecycle_finalizer for e in employers}
    if not entries:
        return []
    value = lifecycle.updated_available_conditions(pod, add=entries)
    if value is not None and not _is_unicode(value):
        # JSON allows an escaped lone surrogate ("\ud800"); no UTF-8 text, hence no patch, holds one.
        raise lifecycle.MalformedAvailableConditions(
            fields.metadata.name or fields.metadata.generate_name,
            (fields.metadata.annotations or {}).get(wire.AVAILABLE_CONDITIONS_ANNOTATION, ""),
            "it escapes a lone surrogate, which is not a Unicode character",
        )
    patch = [] if value is None else lifecycle.admission_patch(pod, value)
    if employer_label:
        patch += employer_label_patch(pod, employers)
    return patch + _spec_ops(fields, employers, waiter)


def employer_label_patch(pod: KubeObject, employers: Iterable[EmployerRef]) -> list[dict[str, Any]]:
    """JSON-patch operations that set the pod's employer label (``wire.EMPLOYER_LABEL``) to
    ``marks.widened_employer_label`` of the label it carries and the names of its employers of
    kind Service, so the shards of those Services see its watch events (docs/scaling.md, "Pods
    selected by the API server"); none when the label already covers them (other employer kinds
    do not count). A pod without labels gets the whole map."""
    names = [e.name for e in employers if e.kind == kube.SERVICE.kind]
    current = marks.employer_label(pod)
    value = marks.widened_employer_label(current, names)
    if value is None or value == current:
        return []
    if not pod.get("metadata", {}).get("labels"):
        return [{"op": "add", "path": "/metadata/labels", "value": {wire.EMPLOYER_LABEL: value}}]
    op = "add" if current is None else "replace"
    path = "/metadata/labels/" + lifecycle.json_pointer_escape(wire.EMPLOYER_LABEL)
    return [{"op": op, "path": path, "value": value}]


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def spec_mutation(
    pod: KubeObject, employers: Iterable[EmployerRef], waiter: DrainWaiterOptions | None = None
) -> list[dict[str, Any]]:
    """JSON-patch operations for the spec: each gating employer's readiness gate (kept when
    present), and, when an employer names a drain time, a ``preStop`` hook in every container
    that has no preStop hook of its own, with the grace period raised by the longest drain time,
    so the containers keep their own shutdown time after it. The hook sleeps that long, or, when
    an employer asks for the ``wait`` drain and ``waiter`` is given, asks the drain waiter sidecar
    added beside the containers (``drain_waiter_container``), which answers once no provider
    routes to the pod, at the latest after that long (docs/zero-downtime.md).

    Raises ``MalformedPod`` when a field it reads has the wrong shape."""
    return _spec_ops(read_pod(pod), list(employers), waiter)


#: What the drain waiter asks of its node: a Python process that waits (measured about 20 MiB).
WAITER_RESOURCES: Final = {"requests": {"cpu": "5m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}


def drain_waiter_container(waiter: DrainWaiterOptions, bound: int) -> dict[str, Any]:
    """The drain waiter: a native sidecar (an init container that keeps running, stopped only
    after the pod's containers) running ``resourceconsist drain-waiter`` from the manager's image,
    which answers the containers' ``preStop`` once a manager at ``waiter.endpoints`` says no
    provider routes to the pod, or after ``bound`` seconds (``resourceconsist.commands.drainwaiter``)."""
    fields = {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "POD_UID": "metadata.uid"}
    return {
        "name": wire.DRAIN_WAITER_CONTAINER,
        "image": waiter.image,
        "restartPolicy": "Always",
        "args": [
            "drain-waiter",
            f"--port={waiter.port}",
            f"--bound={bound}",
            *(f"--endpoint={e}" for e in waiter.endpoints),
        ],
        "env": [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}} for k, v in fields.items()],
        "resources": WAITER_RESOURCES,
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _spec_ops(
    pod: PodFields, employers: Sequence[EmployerRef], waiter: DrainWaiterOptions | None
) -> list[dict[str, Any]]:
    spec = pod.spec
    ops: list[dict[str, Any]] = []
    have = {g.condition_type for g in spec.readiness_gates or ()}
    wanted = [g for g in dict.fromkeys(e.gate for e in employers if e.readiness_gate) if g not in have]
    if wanted:
        if spec.readiness_gates is None:
            ops.append(
                {"op": "add", "path": "/spec/readinessGates", "value": [{"conditionType": g} for g in wanted]}
            )
        else:
            ops += [
                {"op": "add", "path": "/spec/readinessGates/-", "value": {"conditionType": g}} for g in wanted
            ]
    draining = [e for e in employers if e.drain_seconds]
    drain = max((e.drain_seconds or 0 for e in draining), default=0)
    if drain <= 0:
        return ops
    hook: dict[str, Any] = {"sleep": {"seconds": drain}}
    waits = any(e.drain_mode == "wait" for e in draining)
    if waits and waiter is None:
        log.warning(
            "pod %s/%s: an employer asks for the wait drain, but the webhook has no drain waiter "
            "(--drain-waiter-image, --drain-waiter-endpoint); the preStop sleeps %ss",
            pod.metadata.namespace,
            pod.metadata.name or pod.metadata.generate_name,
            drain,
        )
    elif waits and waiter is not None:
        hook = {"httpGet": {"path": wire.DRAIN_WAITER_PATH, "port": waiter.port, "scheme": "HTTP"}}
        present = [c.name for c in spec.init_containers or ()]
        if wire.DRAIN_WAITER_CONTAINER not in present:
            sidecar = drain_waiter_container(waiter, drain)
            if spec.init_containers is None:
                ops.append({"op": "add", "path": "/spec/initContainers", "value": [sidecar]})
            else:
                ops.append({"op": "add", "path": "/spec/initContainers/-", "value": sidecar})
    injected = False
    for i, container in enumerate(spec.containers or ()):
        if container.lifecycle is None:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/lifecycle", "value": {"preStop": hook}})
            injected = True
        elif container.lifecycle.pre_stop is None:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/lifecycle/preStop", "value": hook})
            injected = True
    if injected:
        grace = spec.termination_grace_period_seconds
        base = DEFAULT_TERMINATION_GRACE_SECONDS if grace is None else grace
        op = "add" if grace is None else "replace"
        # Capped at int64, what the API server can store; only an absurd grace period reaches it.
        ops.append(
            {"op": op, "path": "/spec/terminationGracePeriodSeconds", "value": min(base + drain, _INT64_MAX)}
        )
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


# -- the decision ------------------------------------------------------------------------------

log = logging.getLogger("resourceconsist.webhook")

#: Asks the adapter for the employers of a pod, within the server's deadline; raises
#: ``TimeoutError`` only when that deadline passed (``AdapterTimeout`` when the adapter raised one).
EmployersOf = Callable[[KubeObject], Awaitable[tuple[EmployerRef, ...]]]


@dataclass
class Outcome:
    """What the webhook decided on one review, and the employers it asked the adapter for."""

    verdict: Verdict
    employers: tuple[EmployerRef, ...] = field(default=())


class AdapterTimeout(RuntimeError):
    """An adapter raised TimeoutError itself (e.g. a cache that did not sync): an adapter
    failure, not the server's deadline."""


def error_text(err: BaseException) -> str:
    """An error as the user reads it in a denial: its type and message (an adapter's own
    TimeoutError, not the wrapper that tells it from the deadline)."""
    shown = err.__cause__ if isinstance(err, AdapterTimeout) and err.__cause__ else err
    return f"{type(shown).__name__}: {shown}" if str(shown) else type(shown).__name__


def display_name(request: AdmissionRequest) -> tuple[str, str]:
    """The namespace and name of the pod a review is about; ``<generateName>*`` when the API
    server has not named it yet."""
    obj = request.object or {}
    found = obj.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    namespace = request.namespace or str(meta.get("namespace") or "")
    name = request.name or str(meta.get("name") or "")
    if not name and meta.get("generateName"):
        name = f"{meta['generateName']}*"
    return namespace, name


async def decide(
    req: AdmissionRequest,
    adapter: str,
    employers_of: EmployersOf,
    limit: float,
    waiter: DrainWaiterOptions | None = None,
    *,
    employer_label: bool = False,
) -> Outcome:
    """The webhook's answer to one review for the adapter named ``adapter`` (docs/webhook.md):
    pod CREATEs get their employers' entries, gates and hooks (the drain ``waiter`` for those
    whose employer asks for it), and with ``employer_label`` sharding's employer label;
    anything else passes untouched; bad input and adapter failures are denied with the cause.
    ``limit`` is the deadline ``employers_of`` keeps, as the denial of an overrun says."""
    if req.dry_run:
        return Outcome(Verdict.allow("dry run: not mutated"))
    if req.kind.group or req.kind.kind != "Pod" or req.sub_resource:
        what = "/".join(p for p in (req.kind.group, req.kind.kind) if p)
        sub = f" ({req.sub_resource})" if req.sub_resource else ""
        return Outcome(Verdict.allow(f"{what}{sub} is not mutated"))
    if req.operation != "CREATE":
        return Outcome(Verdict.allow(f"pod {req.operation} is not mutated"))
    try:
        # Every field the adapter and the mutation read, checked here, before either runs.
        read_pod(req.object)
    except MalformedPod as err:
        return Outcome(Verdict.deny(HTTPStatus.BAD_REQUEST, str(err)))
    assert req.object is not None  # read_pod checked it
    pod = req.object
    if req.namespace and pod["metadata"].get("namespace") != req.namespace:
        # A pod posted without metadata.namespace gets it later in the API server;
        # adapters look employers up by namespace, so give them the request's.
        pod = {**pod, "metadata": {**pod["metadata"], "namespace": req.namespace}}
    namespace, name = display_name(req)
    try:
        employers = await employers_of(pod)
    except TimeoutError:
        return Outcome(
            Verdict.deny(
                HTTPStatus.GATEWAY_TIMEOUT,
                f"webhook adapter {adapter} did not find the employers of pod "
                f"{namespace}/{name} within {limit:.1f}s",
            )
        )
    except Exception as err:
        log.debug("webhook adapter %s failed", adapter, exc_info=True)
        return Outcome(
            Verdict.deny(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                f"webhook adapter {adapter} failed to get the employers of pod "
                f"{namespace}/{name}: {error_text(err)}",
            )
        )
    try:
        patch = pod_mutation(pod, employers, waiter, employer_label=employer_label)
    except lifecycle.MalformedAvailableConditions as err:
        return Outcome(
            Verdict.deny(HTTPStatus.BAD_REQUEST, str(MalformedPod.from_annotation(err))), employers
        )
    if patch:
        message = f"expected finalizers of {len(employers)} employer(s) merged"
    elif employers:
        message = "the entries of every employer are already present"
    else:
        message = "no employers"
    return Outcome(Verdict.allow(message, patch), employers)
