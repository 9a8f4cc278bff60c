"""A small typed client for the Alibaba Cloud SLB (CLB) API, on the real Alibaba Cloud Python SDK.

``SLBClient`` drives ``aliyunsdkcore``'s ``AcsClient`` with the request classes of
``aliyunsdkslb.request.v20140515`` and gives callers pydantic models (``BackendServer``,
``BackendHealth``, ``VServerGroup``), never the SDK's raw JSON. On top of the SDK it adds what a
controller needs to talk to SLB safely:

* batches: at most ``MAX_BACKENDS_PER_CALL`` (20) backend servers per call, the API's limit;
* one writer per load balancer: SLB rejects a change while another one on the same instance is
  being applied (``ServiceIsConfiguring``, ``BackendServer.configuring``), so writes to one load
  balancer take a lock; the client can be shared between threads;
* retries with jittered exponential backoff, bounded in attempts and in total time, on the
  provider's transient codes (``TRANSIENT_CODES``) and on transport errors. The SDK's own retry
  is switched off: its retry table (``aliyunsdkcore/data/retry_config.json``) lists ECS actions
  only, so it never retried an SLB call anyway;
* no double writes after an ambiguous failure: a write that failed transiently may still have
  been carried out (a lost response, a 5xx after commit). Before every retry of a write the
  client re-reads the VServer group and sends only what is still missing, so a server is never
  added twice and an absent one is never removed;
* deadlines and cancellation: every operation (retries included) ends within
  ``call_deadline_seconds`` (``ALIYUN_SLB_CALL_DEADLINE_SECONDS``, default 10 s), and within the
  reconcile pass's ``current_cancellation()``: each HTTP request's timeouts are capped by the time
  left, backoff sleeps wake on a stop, and a cancelled pass gives up with ``SLBCancelled`` before
  its next request (docs/concepts.md, "Stopping within the shutdown timeout");
* one API budget per account (``resourceconsist.flow.budget``, docs/alibabacloudslb.md, "The API
  budget"): every request, the garbage search's included, takes a token first. Writes spend at
  their own priority (a removal or a drain to weight 0 first, a group's deletion next, adds,
  creates, tags and raised weights after), reads at the priority of what they serve (the pass's,
  or the write re-reading); a write takes its first token before its load balancer's write lock,
  so a registration waiting for the budget never holds a drain back. A throttling answer
  (``THROTTLING_CODES``) pauses the whole account. Time spent waiting for the budget does not
  count against ``call_deadline_seconds``, which bounds requests, not the queue;
* metrics: every request, retry and final failure is reported to ``resourceconsist.runtime.metrics``;
  a failed attempt that a retry fixes is logged at DEBUG only (the SDK's own ERROR line for it
  is lowered to DEBUG too), a call that fails for good after retries at WARNING;
* errors as ``SLBError`` (code, message, request id, HTTP status), ``SLBNotFound`` for a load
  balancer, VServer group or backend server that does not exist (re-read, don't retry), and
  ``SLBAuthError`` for rejected credentials. No credential ever appears in their text or in the
  SDK's log lines (a redacting filter is put on the SDK's loggers).

Weights are changed with ``SetVServerGroupAttribute``, the API Alibaba documents for changing
the weight of servers already in a group. ``ModifyVServerGroupBackendServers`` replaces servers
(old list out, new list in) and is meant for swapping a server or its port, not for re-weighting.
"""

from __future__ import annotations

import contextvars
import json
import logging
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal, Self, TypeVar
from urllib.parse import quote

from aliyunsdkcore.acs_exception.exceptions import ClientException, ServerException
from aliyunsdkcore.auth.credentials import AccessKeyCredential, StsTokenCredential
from aliyunsdkcore.client import AcsClient
from aliyunsdkslb.request.v20140515.AddVServerGroupBackendServersRequest import (
    AddVServerGroupBackendServersRequest,
)
from aliyunsdkslb.request.v20140515.CreateVServerGroupRequest import CreateVServerGroupRequest
from aliyunsdkslb.request.v20140515.DeleteVServerGroupRequest import DeleteVServerGroupRequest
from aliyunsdkslb.request.v20140515.DescribeHealthStatusRequest import DescribeHealthStatusRequest
from aliyunsdkslb.request.v20140515.DescribeLoadBalancersRequest import DescribeLoadBalancersRequest
from aliyunsdkslb.request.v20140515.DescribeVServerGroupAttributeRequest import (
    DescribeVServerGroupAttributeRequest,
)
from aliyunsdkslb.request.v20140515.DescribeVServerGroupsRequest import DescribeVServerGroupsRequest
from aliyunsdkslb.request.v20140515.RemoveVServerGroupBackendServersRequest import (
    RemoveVServerGroupBackendServersRequest,
)
from aliyunsdkslb.request.v20140515.SetVServerGroupAttributeRequest import SetVServerGroupAttributeRequest
from aliyunsdkslb.request.v20140515.TagResourcesRequest import TagResourcesRequest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from resourceconsist.errors import PassCancelled, ResourceConsistError
from resourceconsist.flow.budget import Priority, ProviderBudget, budget_for, current_priority, spending_for
from resourceconsist.flow.cancellation import current_cancellation
from resourceconsist.flow.fence import check_fence
from resourceconsist.runtime.metrics import (
    observe_provider_call,
    observe_provider_failure,
    observe_provider_retry,
)

from .credentials import AccessKey, CredentialsError, SLBAccess, SLBCredentials

__all__ = [
    "AUTH_CODES",
    "CALL_DEADLINE_ENV",
    "CREDENTIALS_UNAVAILABLE",
    "DEFAULT_CALL_DEADLINE_SECONDS",
    "MAX_BACKENDS_PER_CALL",
    "MAX_LOAD_BALANCERS_PER_PAGE",
    "MUTATING_ACTIONS",
    "NOT_FOUND_CODES",
    "THROTTLING_CODES",
    "TRANSIENT_CODES",
    "VSERVER_GROUP_RESOURCE_TYPE",
    "BackendHealth",
    "BackendKey",
    "BackendServer",
    "BackendServerType",
    "CallRecord",
    "LoadBalancerPage",
    "RetryPolicy",
    "SLBAuthError",
    "SLBCancelled",
    "SLBClient",
    "SLBDeadlineExceeded",
    "SLBError",
    "SLBNotFound",
    "VServerGroup",
    "backend_key",
    "call_deadline_from_env",
    "redact",
]

_log = logging.getLogger(__name__)

#: The SLB API version the request classes speak.
API_VERSION: Final = "2014-05-15"
#: The most backend servers one SLB call accepts (``TooManyBackendServers`` beyond).
MAX_BACKENDS_PER_CALL: Final = 20
#: The largest page ``DescribeLoadBalancers`` returns.
MAX_LOAD_BALANCERS_PER_PAGE: Final = 100
#: ``TagResources``' name for a VServer group (``ResourceType``).
VSERVER_GROUP_RESOURCE_TYPE: Final = "vservergroup"
#: Provider name in the metrics.
PROVIDER: Final = "alibabacloudslb"
#: Seconds one SLB operation may take, retries included. Shorter than the default leader lease
#: (15 s), so a crashed leader's last request has ended before a new leader acts.
DEFAULT_CALL_DEADLINE_SECONDS: Final = 10.0
#: Environment variable overriding ``DEFAULT_CALL_DEADLINE_SECONDS`` for ``resourceconsist run``.
CALL_DEADLINE_ENV: Final = "ALIYUN_SLB_CALL_DEADLINE_SECONDS"
#: Below this many seconds left, a request is not sent at all (it could not get an answer).
_MIN_REQUEST_SECONDS: Final = 0.05
#: How often a thread waiting for a load balancer's write lock looks at its cancellation.
_LOCK_POLL_SECONDS: Final = 0.2

#: Provider codes that mean "try again later": throttling, a busy or reconfiguring instance.
TRANSIENT_CODES: Final = frozenset(
    {
        "Throttling",
        "Throttling.User",
        "Throttling.Api",
        "ServiceUnavailable",
        "InternalError",
        "SystemBusy",
        "OperationBusy",
        "ServiceIsConfiguring",
        "ServiceIsStopping",
        "VServerGroupProcessing",
        "BackendServer.configuring",
        "ProcessingSameRequest",
    }
)
#: The codes SLB answers a request over the account's quota with (HTTP 400): they pause the
#: account's API budget.
THROTTLING_CODES: Final = frozenset({"Throttling", "Throttling.User", "Throttling.Api"})
#: The key source could not answer credentials (STS unreachable, the key file unreadable): no
#: request was sent; retried like a transport error, since a renewal may just be late.
CREDENTIALS_UNAVAILABLE: Final = "CredentialsUnavailable"
#: SDK codes for a request whose response never arrived (connection refused, reset, timeout).
TRANSPORT_CODES: Final = frozenset({"SDK.HttpError", "SDK.ServerUnreachable"})
#: Codes that say the addressed object does not exist. SLB reports a missing VServer group as
#: ``InvalidParameter`` (HTTP 404) "The specified VServerGroupId does not exist.", matched apart.
NOT_FOUND_CODES: Final = frozenset(
    {"InvalidLoadBalancerId.NotFound", "InvalidServerId.NotFound", "InvalidVServerGroupId.NotFound"}
)
#: Codes that reject the caller's credentials or signature.
AUTH_CODES: Final = frozenset(
    {
        "InvalidAccessKeyId.NotFound",
        "InvalidAccessKeyId.Inactive",
        "InvalidAccessKeySecret",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "SignatureNonceUsed",
        "InvalidTimeStamp.Expired",
        "Forbidden",
        "Forbidden.RAM",
        "Forbbiden.SubUser",
        "InvalidSecurityToken.Expired",
        "InvalidSecurityToken.Malformed",
        "InvalidSecurityToken.MismatchWithAccessKey",
    }
)
#: Actions that change provider state (what "no mutating call" means in tests).
MUTATING_ACTIONS: Final = frozenset(
    {
        "CreateVServerGroup",
        "DeleteVServerGroup",
        "AddVServerGroupBackendServers",
        "RemoveVServerGroupBackendServers",
        "SetVServerGroupAttribute",
        "ModifyVServerGroupBackendServers",
        "TagResources",
    }
)

_VSERVER_GROUP_MISSING_RE: Final = re.compile(r"VServerGroupId does not exist", re.IGNORECASE)
_INVALID_RESPONSE: Final = "SDK.InvalidResponse"

BackendServerType = Literal["ecs", "eni", "eci", "ip"]
#: Identity of a backend server inside a VServer group: (ServerId, Port, ServerIp for ENI/ECI/IP).
BackendKey = tuple[str, int, str]
T = TypeVar("T")
# Given a batch and the group's current servers, the part of the batch a retry must still send.
_StillNeeded = Callable[[list["BackendServer"], Mapping[BackendKey, "BackendServer"]], list["BackendServer"]]


# --------------------------------------------------------------------------------------------
# Redaction: credentials never reach an error text or a log line.


class _Redactor:
    """The credential values this process holds, and their removal from arbitrary text."""

    _PARAM_RE: Final = re.compile(r"((?:AccessKeyId|Signature)(?:=|%3D|%253D))[^&\s\"']+")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: frozenset[str] = frozenset()

    def register(self, *values: str) -> None:
        variants = set()
        for value in values:
            if len(value) < 4:  # too short to replace without mangling ordinary text
                continue
            variants.update({value, quote(value, safe=""), quote(quote(value, safe=""), safe="")})
        with self._lock:
            self._values = self._values | variants

    def __call__(self, text: str) -> str:
        text = self._PARAM_RE.sub(r"\1***", text)
        for value in sorted(self._values, key=len, reverse=True):
            if value in text:
                text = text.replace(value, "***")
        return text


_REDACTOR: Final = _Redactor()


def redact(text: str) -> str:
    """``text`` with every registered credential, access key id and request signature masked."""
    return _REDACTOR(text)


class _RedactingFilter(logging.Filter):
    """Masks credentials in records of the SDK's loggers (they log request URLs and errors)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken record is the logging module's problem, not ours
            return True
        cleaned = _REDACTOR(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


# Logger-level filters apply only to records created on that very logger, so each SDK module
# logger that can print a URL, a request or a server message gets one.
_SDK_LOGGERS: Final = (
    "aliyunsdkcore",
    "aliyunsdkcore.client",
    "aliyunsdkcore.http.http_response",
    "aliyunsdkcore.retry.retry_condition",
    "aliyunsdkcore.auth.signers.access_key_signer",
    "aliyunsdkcore.vendored.requests.packages.urllib3.connectionpool",
    "aliyunsdkcore.vendored.requests.packages.urllib3.connection",
)
_FILTER: Final = _RedactingFilter()
#: The SDK logs every failed request at ERROR (``ServerException occurred``, ``HttpError
#: occurred``) and every unparsable body at WARNING, retried or not. This client reports what
#: matters itself (a WARNING when retries are exhausted), so the SDK's lines become DEBUG.
_SDK_CLIENT_LOGGER: Final = "aliyunsdkcore.client"


class _DemotingFilter(logging.Filter):
    """Lowers the SDK client's per-request ERROR and WARNING lines to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_DEMOTE: Final = _DemotingFilter()
_filter_installed = False
_filter_lock = threading.Lock()


def _install_log_redaction() -> None:
    global _filter_installed
    with _filter_lock:
        if _filter_installed:
            return
        for name in (*_SDK_LOGGERS, __name__):
            logging.getLogger(name).addFilter(_FILTER)
        # After the redaction filter: a demoted line that is still shown is redacted too.
        logging.getLogger(_SDK_CLIENT_LOGGER).addFilter(_DEMOTE)
        _filter_installed = True


# --------------------------------------------------------------------------------------------
# Errors.


class SLBError(ResourceConsistError):
    """An SLB call failed; ``code``, ``message`` and ``request_id`` are the provider's."""

    def __init__(
        self,
        action: str,
        code: str,
        message: str,
        *,
        request_id: str | None = None,
        http_status: int | None = None,
    ) -> None:
        self.action = action
        self.code = code
        self.message = redact(message)
        self.request_id = request_id
        self.http_status = http_status
        super().__init__(action, code, self.message, request_id, http_status)

    @property
    def transient(self) -> bool:
        """Whether the same call may succeed later (throttling, busy instance, lost response)."""
        return (
            self.code in TRANSIENT_CODES
            or self.code in TRANSPORT_CODES
            or self.code == CREDENTIALS_UNAVAILABLE
            or (self.http_status is not None and self.http_status >= 500)
        )

    def __str__(self) -> str:
        where = f"RequestId: {self.request_id}" if self.request_id else "no request id"
        status = f", HTTP {self.http_status}" if self.http_status is not None else ""
        return f"SLB {self.action} failed: {self.code}: {self.message} ({where}{status})"


class SLBNotFound(SLBError):
    """The load balancer, VServer group or backend server addressed does not exist."""


class SLBAuthError(SLBError):
    """The provider rejected the credentials or the request signature."""


class SLBCancelled(SLBError, PassCancelled):
    """The call gave up before its next request because the reconcile pass was cancelled.
    A request already sent may still have been carried out (an unknown outcome)."""

    @property
    def transient(self) -> bool:
        return False


class SLBDeadlineExceeded(SLBError):
    """The call gave up because its own deadline (``call_deadline_seconds``) passed; as with
    ``SLBCancelled``, a request already sent may have been carried out."""

    @property
    def transient(self) -> bool:
        return False


def call_deadline_from_env(environ: Mapping[str, str]) -> float:
    """``CALL_DEADLINE_ENV`` in seconds, else the default; ``ValueError`` naming the variable."""
    raw = (environ.get(CALL_DEADLINE_ENV) or "").strip()
    if not raw:
        return DEFAULT_CALL_DEADLINE_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(
            f"{CALL_DEADLINE_ENV}={raw!r} is not a positive number of seconds; set it to e.g. "
            f"{DEFAULT_CALL_DEADLINE_SECONDS:g} (less than the leader lease duration) or unset it"
        )
    return seconds


def _error(action: str, code: str, message: str, request_id: str | None, http_status: int | None) -> SLBError:
    cls: type[SLBError] = SLBError
    if code in NOT_FOUND_CODES or (
        code == "InvalidParameter" and _VSERVER_GROUP_MISSING_RE.search(message or "")
    ):
        cls = SLBNotFound
    elif code in AUTH_CODES:
        cls = SLBAuthError
    return cls(action, code, message or "", request_id=request_id, http_status=http_status)


# --------------------------------------------------------------------------------------------
# Models.


def backend_key(server_id: str, port: int, server_type: str, server_ip: str | None) -> BackendKey:
    """Identity of a backend server in a group: ENI, ECI and IP backends differ by IP too."""
    return (server_id, port, (server_ip or "") if server_type in ("eni", "eci", "ip") else "")


class _APIModel(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")


class BackendServer(_APIModel):
    """A backend server of a VServer group (one entry of the API's ``BackendServers`` list)."""

    server_id: str = Field(validation_alias="ServerId", min_length=1)
    port: int = Field(validation_alias="Port", ge=1, le=65535)
    weight: int = Field(default=100, validation_alias="Weight", ge=0, le=100)
    server_type: BackendServerType = Field(default="ecs", validation_alias="Type")
    server_ip: str | None = Field(default=None, validation_alias="ServerIp")
    description: str | None = Field(default=None, validation_alias="Description")

    @property
    def key(self) -> BackendKey:
        return backend_key(self.server_id, self.port, self.server_type, self.server_ip)

    def to_api(self, *, weight: bool = True) -> dict[str, str | int]:
        """The entry as the API's ``BackendServers`` JSON expects it."""
        entry: dict[str, str | int] = {
            "ServerId": self.server_id,
            "Port": self.port,
            "Type": self.server_type,
        }
        if weight:
            entry["Weight"] = self.weight
        if self.server_ip:
            entry["ServerIp"] = self.server_ip
        if self.description is not None:
            entry["Description"] = self.description
        return entry


class BackendHealth(_APIModel):
    """Health of one backend server behind one listener (``DescribeHealthStatus``)."""

    server_id: str = Field(validation_alias="ServerId")
    port: int = Field(validation_alias="Port")
    health_status: str = Field(validation_alias="ServerHealthStatus")
    server_ip: str | None = Field(default=None, validation_alias="ServerIp")
    listener_port: int | None = Field(default=None, validation_alias="ListenerPort")
    protocol: str | None = Field(default=None, validation_alias="Protocol")
    server_type: str | None = Field(default=None, validation_alias="Type")
    eni_host: str | None = Field(default=None, validation_alias="EniHost")

    @property
    def healthy(self) -> bool:
        return self.health_status == "normal"


class VServerGroup(_APIModel):
    """A VServer group of a load balancer, with its tags (``DescribeVServerGroups`` lists them)."""

    id: str = Field(validation_alias="VServerGroupId", min_length=1)
    name: str = Field(default="", validation_alias="VServerGroupName")
    load_balancer_id: str | None = Field(default=None, validation_alias="LoadBalancerId")
    tags: Mapping[str, str] = Field(default_factory=dict, validation_alias="Tags")

    @field_validator("tags", mode="before")
    @classmethod
    def _tag_list(cls, value: Any) -> Any:
        # The API answers {"Tags": {"Tag": [{"TagKey": ..., "TagValue": ...}]}}.
        if isinstance(value, Mapping) and "Tag" in value:
            return {
                str(tag.get("TagKey")): str(tag.get("TagValue") or "")
                for tag in _items(value, "Tag", "Tag")
                if tag.get("TagKey")
            }
        return value


@dataclass(frozen=True)
class LoadBalancerPage:
    """One page of ``DescribeLoadBalancers``: the ids on it and how many there are in all."""

    load_balancer_ids: tuple[str, ...]
    page_number: int
    page_size: int
    total_count: int

    @property
    def last(self) -> bool:
        """No page follows this one."""
        return not self.load_balancer_ids or self.page_number * self.page_size >= self.total_count


@dataclass(frozen=True)
class CallRecord:
    """One HTTP attempt of an SLB action, as reported to ``SLBClient(on_call=...)``."""

    action: str
    attempt: int
    ok: bool
    code: str | None
    duration_seconds: float


@dataclass(frozen=True)
class RetryPolicy:
    """Jittered exponential backoff, bounded by attempts and by total elapsed time.

    The n-th retry waits between half and all of ``min(max_delay, base_delay * 2**(n-1))``
    ("equal jitter"): concurrent clients spread out, yet each one still backs off.
    """

    max_attempts: int = 6
    base_delay_seconds: float = 0.5
    max_delay_seconds: float = 10.0
    max_total_seconds: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base_delay_seconds < 0 or self.max_delay_seconds < 0 or self.max_total_seconds < 0:
            raise ValueError("retry delays must not be negative")

    def delay(self, retry: int, jitter: float) -> float:
        """Seconds to wait before retry number ``retry`` (1-based), ``jitter`` in [0, 1)."""
        step = min(self.max_delay_seconds, self.base_delay_seconds * 2.0 ** (retry - 1))
        return step / 2 + step / 2 * min(max(jitter, 0.0), 1.0)


# --------------------------------------------------------------------------------------------
# Response parsing.


def _items(response: Mapping[str, Any], outer: str, inner: str) -> list[Mapping[str, Any]]:
    # RPC JSON wraps lists as {"BackendServers": {"BackendServer": [...]}}; accept a bare list too.
    value: Any = response.get(outer)
    if isinstance(value, Mapping):
        value = value.get(inner)
    if value is None:
        return []
    if isinstance(value, Mapping):  # a lone element
        value = [value]
    if not isinstance(value, list):
        raise TypeError(f"{outer} is neither a list nor a {inner} wrapper")
    return [item for item in value if isinstance(item, Mapping)]


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    """Tags as the SDK's ``set_Tags`` sends them (``Tag.N.Key``, ``Tag.N.Value``), in key order."""
    return [{"Key": key, "Value": value} for key, value in sorted(tags.items())]


def _batches(items: Sequence[T], size: int = MAX_BACKENDS_PER_CALL) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _dedupe(servers: Iterable[BackendServer]) -> list[BackendServer]:
    # Like AddBackendServers, keep the first of several entries for one server.
    seen: dict[BackendKey, BackendServer] = {}
    for server in servers:
        seen.setdefault(server.key, server)
    return list(seen.values())


def _servers_json(servers: Iterable[BackendServer], *, weight: bool = True) -> str:
    return json.dumps([server.to_api(weight=weight) for server in servers], separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# The client.


@dataclass
class _Deadline:
    """When an SLB operation must end (``call_at``) and stop retrying (``retry_at``), ``clock``
    values; ``outer`` is the operation this one runs in (the re-reads of a write)."""

    call_at: float
    retry_at: float
    outer: _Deadline | None

    def extend(self, seconds: float) -> None:
        """Push this deadline and the outer ones back: time spent waiting for the budget."""
        deadline: _Deadline | None = self
        while deadline is not None:
            deadline.call_at += seconds
            deadline.retry_at += seconds
            deadline = deadline.outer


#: The deadline of the SLB operation running in this thread, if any.
_CALL_DEADLINE: contextvars.ContextVar[_Deadline | None] = contextvars.ContextVar(
    "slb_call_deadline", default=None
)
#: The next request of this thread already has its budget token (taken before a write lock).
_PREPAID: contextvars.ContextVar[bool] = contextvars.ContextVar("slb_budget_prepaid", default=False)


class SLBClient:
    """Typed, retrying, per-load-balancer-serialized access to the SLB API (thread-safe)."""

    def __init__(
        self,
        credentials: SLBCredentials | SLBAccess,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], object] | None = None,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        read_timeout_seconds: float = 10.0,
        connect_timeout_seconds: float = 5.0,
        call_deadline_seconds: float = DEFAULT_CALL_DEADLINE_SECONDS,
        protocol: Literal["https", "http"] = "https",
        on_call: Callable[[CallRecord], None] | None = None,
        budget: ProviderBudget | None = None,
    ) -> None:
        """``sleep`` waits between retries (default: the pass's ``Cancellation.wait``, which a stop
        interrupts); ``call_deadline_seconds`` bounds one operation, retries included; ``budget``
        is the account's API budget (default: the process's, ``budget_for(account_of(...))``)."""
        if not call_deadline_seconds > 0:
            raise ValueError("call_deadline_seconds must be above 0")
        access = (
            SLBAccess.from_credentials(credentials)
            if isinstance(credentials, SLBCredentials)
            else credentials
        )
        _install_log_redaction()
        self._source = access.source
        self._endpoint = access.endpoint
        self._region_id = access.region_id
        self._protocol = protocol
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        self._rand = rand
        self._clock = clock
        self._on_call = on_call
        self._read_timeout = read_timeout_seconds
        self._connect_timeout = connect_timeout_seconds
        self._call_deadline = call_deadline_seconds
        self.budget = budget or budget_for(account_of(access.region_id, access.endpoint))
        self._acs_lock = threading.Lock()
        self._key: AccessKey | None = None
        self._acs: Any = None
        if isinstance(credentials, SLBCredentials):
            self._signing_client()  # a static pair needs no request to be known
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._group_lb: dict[str, str] = {}
        self._stats_lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"SLBClient(endpoint={self._endpoint!r}, region_id={self._region_id!r})"

    def close(self) -> None:
        """Release the HTTP connection pool."""
        with self._acs_lock:
            if self._acs is not None:
                self._acs.session.close()

    def _signing_client(self) -> Any:
        """The SDK client signing with the source's current credentials. The SDK takes fixed
        credentials only, so a client is built again whenever the source answers different ones
        (a renewed STS key, a rewritten key file); comparing them costs nothing."""
        key = self._source.current()
        with self._acs_lock:
            if key == self._key and self._acs is not None:
                return self._acs
            _REDACTOR.register(
                *(v for v in (key.access_key_id, key.access_key_secret, key.security_token) if v)
            )
            credential: Any
            if key.security_token:
                credential = StsTokenCredential(key.access_key_id, key.access_key_secret, key.security_token)
            else:
                credential = AccessKeyCredential(key.access_key_id, key.access_key_secret)
            # auto_retry=False: SLB actions are not in the SDK's retry table, and this client's
            # own retry must be the only one so that it can re-read state between attempts.
            client = AcsClient(
                region_id=self._region_id,
                auto_retry=False,
                max_retry_time=0,
                timeout=self._read_timeout,
                connect_timeout=self._connect_timeout,
                credential=credential,
            )
            if self._key is not None:
                # Requests in flight keep the old client; its pool goes with it.
                _log.info("SLB credentials renewed (%s); signing with the new ones", self._source.kind)
            self._acs, self._key = client, key
            return client

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- observation --------------------------------------------------------------------

    def call_counts(self) -> dict[str, int]:
        """HTTP attempts made so far, per action name (retries and re-reads included)."""
        with self._stats_lock:
            return dict(self._counts)

    def reset_call_counts(self) -> None:
        with self._stats_lock:
            self._counts.clear()

    # ---- reads --------------------------------------------------------------------------

    def describe_health_status(
        self, load_balancer_id: str, *, listener_port: int | None = None
    ) -> list[BackendHealth]:
        """Health of every backend server behind the load balancer's listeners."""

        def build() -> Any:
            request = DescribeHealthStatusRequest()
            request.set_LoadBalancerId(load_balancer_id)
            if listener_port is not None:
                request.set_ListenerPort(listener_port)
            return request

        action = "DescribeHealthStatus"
        response = self._retrying(action, lambda attempt: self._call(action, build(), attempt))
        return self._parse(
            action,
            lambda: [
                BackendHealth.model_validate(item)
                for item in _items(response, "BackendServers", "BackendServer")
            ],
        )

    def describe_load_balancers(
        self, page_number: int = 1, *, page_size: int = MAX_LOAD_BALANCERS_PER_PAGE
    ) -> LoadBalancerPage:
        """One page (1-based) of the region's load balancers (``DescribeLoadBalancers``)."""

        def build() -> Any:
            request = DescribeLoadBalancersRequest()
            request.set_PageNumber(page_number)
            request.set_PageSize(page_size)
            return request

        action = "DescribeLoadBalancers"
        response = self._retrying(action, lambda attempt: self._call(action, build(), attempt))

        def parse() -> LoadBalancerPage:
            ids = tuple(
                str(item["LoadBalancerId"])
                for item in _items(response, "LoadBalancers", "LoadBalancer")
                if item.get("LoadBalancerId")
            )
            total = response.get("TotalCount", len(ids))
            if isinstance(total, bool) or not isinstance(total, int):
                raise TypeError("TotalCount is not an integer")
            return LoadBalancerPage(ids, page_number, page_size, total)

        return self._parse(action, parse)

    def describe_vserver_groups(
        self, load_balancer_id: str, *, tags: Mapping[str, str] | None = None
    ) -> list[VServerGroup]:
        """The load balancer's VServer groups; with ``tags``, only those carrying all of them
        (filtered by SLB itself)."""

        def build() -> Any:
            request = DescribeVServerGroupsRequest()
            request.set_LoadBalancerId(load_balancer_id)
            if tags:
                request.set_Tags(_tag_list(tags))
            return request

        action = "DescribeVServerGroups"
        response = self._retrying(action, lambda attempt: self._call(action, build(), attempt))
        groups = self._parse(
            action,
            lambda: [
                VServerGroup.model_validate({**item, "LoadBalancerId": load_balancer_id})
                for item in _items(response, "VServerGroups", "VServerGroup")
            ],
        )
        with self._locks_guard:
            self._group_lb.update({group.id: load_balancer_id for group in groups})
        return groups

    def describe_vserver_group(self, vserver_group_id: str) -> tuple[VServerGroup, list[BackendServer]]:
        """A VServer group and its backend servers (``DescribeVServerGroupAttribute``)."""
        action = "DescribeVServerGroupAttribute"
        response = self._retrying(
            action, lambda attempt: self._call(action, self._attribute_request(vserver_group_id), attempt)
        )
        return self._parse_group(response, vserver_group_id)

    def describe_vserver_group_backends(self, vserver_group_id: str) -> list[BackendServer]:
        """The backend servers of a VServer group."""
        return self.describe_vserver_group(vserver_group_id)[1]

    # ---- writes -------------------------------------------------------------------------

    def create_vserver_group(
        self, load_balancer_id: str, name: str, *, tags: Mapping[str, str] | None = None
    ) -> str:
        """Create an empty VServer group carrying ``tags`` (set in the same call) and return its id.

        CreateVServerGroup has no idempotency token, so the client lists the groups of that name
        (and tags) first; when a create fails ambiguously, such a group that was not there before
        is the one this call created, and it is adopted instead of creating a second one.
        """
        action = "CreateVServerGroup"
        with spending_for(Priority.REGISTER), self._write_lock(load_balancer_id):
            before = {
                g.id for g in self.describe_vserver_groups(load_balancer_id, tags=tags) if g.name == name
            }

            def attempt(number: int) -> str:
                if number > 1:
                    created = sorted(
                        g.id
                        for g in self.describe_vserver_groups(load_balancer_id, tags=tags)
                        if g.name == name and g.id not in before
                    )
                    if created:
                        if len(created) > 1:
                            _log.warning(
                                "several new VServer groups named %r on %s: %s; adopting %s",
                                name,
                                load_balancer_id,
                                created,
                                created[0],
                            )
                        return created[0]
                request = CreateVServerGroupRequest()
                request.set_LoadBalancerId(load_balancer_id)
                request.set_VServerGroupName(name)
                if tags:
                    request.set_Tags(_tag_list(tags))
                response = self._call(action, request, number)
                group_id = response.get("VServerGroupId")
                if not isinstance(group_id, str) or not group_id:
                    raise SLBError(
                        action,
                        _INVALID_RESPONSE,
                        "response carries no VServerGroupId",
                        request_id=_request_id(response),
                    )
                return group_id

            group_id = self._retrying(action, attempt)
        with self._locks_guard:
            self._group_lb[group_id] = load_balancer_id
        return group_id

    def tag_vserver_group(
        self, vserver_group_id: str, tags: Mapping[str, str], *, load_balancer_id: str | None = None
    ) -> None:
        """Set ``tags`` on a VServer group (``TagResources``: a key it already has takes the new
        value, its other tags stay). Repeating it changes nothing, so it is simply retried."""
        action = "TagResources"

        def attempt(number: int) -> None:
            request = TagResourcesRequest()
            request.set_ResourceType(VSERVER_GROUP_RESOURCE_TYPE)
            request.set_ResourceIds([vserver_group_id])
            request.set_Tags(_tag_list(tags))
            self._call(action, request, number)

        with spending_for(Priority.REGISTER):
            lb = load_balancer_id or self._load_balancer_of(vserver_group_id)
            with self._write_lock(lb):
                self._retrying(action, attempt)

    def delete_vserver_group(self, vserver_group_id: str, *, load_balancer_id: str | None = None) -> None:
        """Delete a VServer group; ``SLBNotFound`` if it was already gone before this call."""
        action = "DeleteVServerGroup"

        def attempt(number: int) -> None:
            if number > 1:
                try:
                    self._call("DescribeVServerGroupAttribute", self._attribute_request(vserver_group_id), 1)
                except SLBNotFound:
                    return  # the failed attempt did delete it
            request = DeleteVServerGroupRequest()
            request.set_VServerGroupId(vserver_group_id)
            self._call(action, request, number)

        with spending_for(Priority.DELETE):
            lb = load_balancer_id or self._load_balancer_of(vserver_group_id)
            with self._write_lock(lb):
                self._retrying(action, attempt)
        with self._locks_guard:
            self._group_lb.pop(vserver_group_id, None)

    def add_backend_servers(
        self,
        vserver_group_id: str,
        servers: Iterable[BackendServer],
        *,
        load_balancer_id: str | None = None,
    ) -> None:
        """Add servers to a VServer group, at most 20 per call.

        After an ambiguous failure the group is re-read and servers already in it are not sent
        again; a server counts as present by its identity (``BackendServer.key``), whatever its
        weight.
        """
        self._write_backends(
            "AddVServerGroupBackendServers",
            vserver_group_id,
            servers,
            load_balancer_id,
            still_needed=lambda batch, current: [s for s in batch if s.key not in current],
        )

    def set_backend_weights(
        self,
        vserver_group_id: str,
        servers: Iterable[BackendServer],
        *,
        load_balancer_id: str | None = None,
    ) -> None:
        """Set the weight (and description, when given) of servers already in the group.

        Uses ``SetVServerGroupAttribute``, the API for changing servers in place; after an
        ambiguous failure, servers that already carry the wanted weight are not sent again.
        """

        def still_needed(
            batch: list[BackendServer], current: Mapping[BackendKey, BackendServer]
        ) -> list[BackendServer]:
            return [s for s in batch if s.key not in current or current[s.key].weight != s.weight]

        self._write_backends(
            "SetVServerGroupAttribute", vserver_group_id, servers, load_balancer_id, still_needed=still_needed
        )

    def remove_backend_servers(
        self,
        vserver_group_id: str,
        servers: Iterable[BackendServer],
        *,
        load_balancer_id: str | None = None,
    ) -> None:
        """Remove servers from a VServer group, at most 20 per call.

        A server not in the group makes the provider fail the call (``SLBNotFound``); after an
        ambiguous failure the group is re-read and servers already gone are not sent again.
        """
        self._write_backends(
            "RemoveVServerGroupBackendServers",
            vserver_group_id,
            servers,
            load_balancer_id,
            still_needed=lambda batch, current: [s for s in batch if s.key in current],
        )

    # ---- internals ----------------------------------------------------------------------

    def _write_backends(
        self,
        action: str,
        vserver_group_id: str,
        servers: Iterable[BackendServer],
        load_balancer_id: str | None,
        *,
        still_needed: _StillNeeded,
    ) -> None:
        pending = _dedupe(servers)
        if not pending:
            return
        # Drains (weight 0) before raised weights; each batch takes the write lock on its own,
        # so a batch waiting for the budget never holds the lock a more urgent one needs.
        parts = [(_write_priority(action, pending), pending)]
        if action == "SetVServerGroupAttribute":
            drains = [s for s in pending if s.weight == 0]
            parts = [
                (Priority.REMOVE_TRAFFIC, drains),
                (Priority.REGISTER, [s for s in pending if s.weight != 0]),
            ]
        for priority, part in parts:
            if not part:
                continue
            with spending_for(priority):
                lb = load_balancer_id or self._load_balancer_of(vserver_group_id)
                for batch in _batches(part):
                    with self._write_lock(lb):
                        self._write_batch(action, vserver_group_id, batch, still_needed)

    def _write_batch(
        self,
        action: str,
        vserver_group_id: str,
        batch: list[BackendServer],
        still_needed: _StillNeeded,
    ) -> None:
        def attempt(number: int) -> None:
            todo = batch
            if number > 1:
                # Every retry follows a failure that may have been carried out: send only the rest.
                _, current = self._parse_group(
                    self._call("DescribeVServerGroupAttribute", self._attribute_request(vserver_group_id), 1),
                    vserver_group_id,
                )
                todo = still_needed(batch, {server.key: server for server in current})
                if not todo:
                    _log.info("SLB %s on %s: the failed attempt had taken effect", action, vserver_group_id)
                    return
            self._call(action, self._backends_request(action, vserver_group_id, todo), number)

        self._retrying(action, attempt)

    def _backends_request(self, action: str, vserver_group_id: str, servers: list[BackendServer]) -> Any:
        request: Any
        if action == "AddVServerGroupBackendServers":
            request = AddVServerGroupBackendServersRequest()
            request.set_BackendServers(_servers_json(servers))
        elif action == "SetVServerGroupAttribute":
            request = SetVServerGroupAttributeRequest()
            request.set_BackendServers(_servers_json(servers))
        elif action == "RemoveVServerGroupBackendServers":
            request = RemoveVServerGroupBackendServersRequest()
            request.set_BackendServers(_servers_json(servers, weight=False))
        else:  # pragma: no cover - internal misuse
            raise ValueError(f"not a backend write: {action}")
        request.set_VServerGroupId(vserver_group_id)
        return request

    @staticmethod
    def _attribute_request(vserver_group_id: str) -> Any:
        request = DescribeVServerGroupAttributeRequest()
        request.set_VServerGroupId(vserver_group_id)
        return request

    def _parse_group(
        self, response: Mapping[str, Any], vserver_group_id: str
    ) -> tuple[VServerGroup, list[BackendServer]]:
        action = "DescribeVServerGroupAttribute"
        group = self._parse(
            action, lambda: VServerGroup.model_validate({"VServerGroupId": vserver_group_id, **response})
        )
        servers = self._parse(
            action,
            lambda: [
                BackendServer.model_validate(item)
                for item in _items(response, "BackendServers", "BackendServer")
            ],
        )
        if group.load_balancer_id:
            with self._locks_guard:
                self._group_lb[group.id] = group.load_balancer_id
        return group, servers

    def _load_balancer_of(self, vserver_group_id: str) -> str:
        with self._locks_guard:
            known = self._group_lb.get(vserver_group_id)
        if known:
            return known
        group, _ = self.describe_vserver_group(vserver_group_id)
        # Without a load balancer id in the answer, serialize on the group at least.
        return group.load_balancer_id or f"vserver-group:{vserver_group_id}"

    @contextmanager
    def _write_lock(self, load_balancer_id: str) -> Iterator[None]:
        # The first request's token comes before the lock (see the module's docstring).
        self._spend("write lock", f"waiting for the API budget to write to {load_balancer_id}")
        prepaid = _PREPAID.set(True)
        try:
            with self._locked(load_balancer_id):
                yield
        finally:
            _PREPAID.reset(prepaid)

    @contextmanager
    def _locked(self, load_balancer_id: str) -> Iterator[None]:
        with self._locks_guard:
            lock = self._locks.setdefault(load_balancer_id, threading.Lock())
        # Another thread may hold the lock in a hung request: keep checking for a stop meanwhile.
        while not lock.acquire(timeout=_LOCK_POLL_SECONDS):
            if current_cancellation().cancelled:
                raise self._cancelled("write lock", f"waiting for the write lock of {load_balancer_id}")
        try:
            yield
        finally:
            lock.release()

    def _retrying(self, action: str, attempt: Callable[[int], T]) -> T:
        policy = self._retry
        now = self._clock()
        outer = _CALL_DEADLINE.get()
        # The operation's own deadline; an operation nested in another one (the re-reads of a
        # write) never outlives its caller's.
        call_at = now + self._call_deadline
        if outer is not None:
            call_at = min(outer.call_at, call_at)
        deadline = _Deadline(call_at, min(now + policy.max_total_seconds, call_at), outer)
        token = _CALL_DEADLINE.set(deadline)
        try:
            number = 1
            while True:
                try:
                    return attempt(number)
                except SLBError as err:
                    if not err.transient:
                        if not isinstance(err, (SLBCancelled, SLBDeadlineExceeded)):
                            observe_provider_failure(PROVIDER, action, err.code)
                        raise
                    delay = policy.delay(number, self._rand())
                    if number >= policy.max_attempts or self._clock() + delay > deadline.retry_at:
                        self._give_up(action, err, number)
                        raise
                    _log.debug(
                        "SLB %s failed with %s (attempt %d of %d); retrying in %.2fs",
                        action,
                        err.code,
                        number,
                        policy.max_attempts,
                        delay,
                    )
                    observe_provider_retry(PROVIDER, action, err.code)
                    if self._pause(delay):
                        raise self._cancelled(action, f"while waiting to retry after {err.code}") from None
                    number += 1
        finally:
            _CALL_DEADLINE.reset(token)

    @staticmethod
    def _give_up(action: str, err: SLBError, attempts: int) -> None:
        observe_provider_failure(PROVIDER, action, err.code)
        _log.warning("SLB %s failed after %d attempt(s), giving up: %s", action, attempts, err)

    def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before a retry; whether the pass was cancelled meanwhile."""
        cancellation = current_cancellation()
        if self._sleep is None:
            return cancellation.wait(seconds)
        self._sleep(seconds)
        return cancellation.cancelled

    def _cancelled(self, action: str, when: str) -> SLBError:
        error: SLBError
        if current_cancellation().cancelled:
            why = "the reconcile pass was cancelled (the controller is stopping or its deadline passed)"
            error = SLBCancelled(action, "Cancelled", f"gave up {when}: {why}")
        else:
            why = f"the call's deadline of {self._call_deadline:g}s passed"
            error = SLBDeadlineExceeded(action, "DeadlineExceeded", f"gave up {when}: {why}")
        observe_provider_failure(PROVIDER, action, error.code)
        _log.warning("SLB %s %s", action, error.message)
        return error

    def _request_timeouts(self, action: str) -> tuple[float, float]:
        """(connect, read) timeouts of the next request: the configured ones, capped by the time
        left to the operation's deadline and to the pass's; ``SLBCancelled`` when none is left."""
        if current_cancellation().cancelled:
            raise self._cancelled(action, "before sending the request")
        left = [self._read_timeout]
        deadline = _CALL_DEADLINE.get()
        if deadline is not None:
            left.append(deadline.call_at - self._clock())
        remaining = current_cancellation().remaining()
        if remaining is not None:
            left.append(remaining)
        budget = min(left)
        if budget < _MIN_REQUEST_SECONDS:
            raise self._cancelled(action, "before sending the request")
        return min(self._connect_timeout, budget), budget

    def _spend(self, action: str, when: str) -> float:
        """Take a budget token for the next request (at the current priority); the seconds waited.
        ``SLBCancelled`` when the pass is cancelled meanwhile."""
        try:
            return self.budget.spend(current_priority())
        except PassCancelled:
            raise self._cancelled(action, when) from None

    def _call(self, action: str, request: Any, attempt: int) -> dict[str, Any]:
        if _PREPAID.get():
            _PREPAID.set(False)
        else:
            waited = self._spend(action, "waiting for the API budget")
            deadline = _CALL_DEADLINE.get()
            if waited > 0 and deadline is not None:
                deadline.extend(waited)
        connect_timeout, read_timeout = self._request_timeouts(action)
        request.set_connect_timeout(connect_timeout)
        request.set_read_timeout(read_timeout)
        request.set_endpoint(self._endpoint)
        request.set_protocol_type(self._protocol)
        request.set_accept_format("JSON")
        started = self._clock()
        error: SLBError | None = None
        body: Any = None
        try:
            client = self._signing_client()
            if action in MUTATING_ACTIONS:
                # A change sent for a Lease no longer surely held could undo what its new
                # holder did: checked here, in the step that sends it (resourceconsist/flow/fence.py).
                check_fence()
            body = client.do_action_with_exception(request)
        except CredentialsError as exc:
            error = SLBError(action, CREDENTIALS_UNAVAILABLE, str(exc))
        except ServerException as exc:
            error = _error(
                action,
                str(exc.get_error_code()),
                str(exc.get_error_msg() or ""),
                exc.get_request_id(),
                exc.get_http_status(),
            )
            # The SDK's frame that raised it still holds it, and its traceback that frame: a
            # cycle per failed call. Read, not chained: its traceback is not needed.
            exc.__traceback__ = None
        except ClientException as exc:
            error = _error(action, str(exc.get_error_code()), str(exc.get_error_msg() or ""), None, None)
            exc.__traceback__ = None  # as above
        except Exception as exc:
            # The SDK has its own bugs (e.g. IndexError on a SignatureDoesNotMatch message without
            # a colon); callers still get an SLBError. Not chained: the SDK's text may hold a URL.
            error = SLBError(action, "SDK.UnexpectedError", f"{type(exc).__name__}: {exc}")
        response: dict[str, Any] = {}
        if error is None:
            try:
                parsed = json.loads(body)
            except (TypeError, ValueError):
                parsed = None
            if isinstance(parsed, dict):
                response = parsed
            else:
                error = SLBError(action, _INVALID_RESPONSE, "response body is not a JSON object")
        self._record(
            CallRecord(action, attempt, error is None, error.code if error else None, self._clock() - started)
        )
        if error is None:
            self.budget.succeeded()
        elif error.code in THROTTLING_CODES:
            # SLB's throttling answer carries no Retry-After (and the SDK shows no headers): the
            # budget backs off on its own (docs/alibabacloudslb.md, "The API budget").
            self.budget.throttled()
        if error is not None:
            try:
                raise error
            finally:
                # This frame, which the error's traceback keeps, lets go of the error: else
                # each failed call is a reference cycle (docs/benchmarks.md, "Garbage a pass leaves").
                error = None
        return response

    def _record(self, record: CallRecord) -> None:
        with self._stats_lock:
            self._counts[record.action] += 1
        _log.debug("SLB %s attempt %d: %s", record.action, record.attempt, record.code or "ok")
        observe_provider_call(PROVIDER, record.action, record.code, record.duration_seconds)
        if self._on_call is not None:
            self._on_call(record)

    @staticmethod
    def _parse(action: str, parse: Callable[[], T]) -> T:
        try:
            return parse()
        except (ValidationError, TypeError) as exc:
            raise SLBError(action, _INVALID_RESPONSE, f"unexpected response shape: {exc}") from None


def account_of(region_id: str, endpoint: str) -> str:
    """The API budget's account name of an SLB client: one process signs for one Alibaba Cloud
    account, whose quota is per region (and endpoint); a client for another account is given
    its own ``ProviderBudget``."""
    return f"{PROVIDER}:{region_id}@{endpoint}"


def _write_priority(action: str, servers: Sequence[BackendServer]) -> Priority:
    """The budget priority of a backend write: a removal takes traffic off, the rest registers."""
    if action == "RemoveVServerGroupBackendServers":
        return Priority.REMOVE_TRAFFIC
    if action == "SetVServerGroupAttribute" and all(s.weight == 0 for s in servers):
        return Priority.REMOVE_TRAFFIC
    return Priority.REGISTER


def _request_id(response: Mapping[str, Any]) -> str | None:
    value = response.get("RequestId")
    return value if isinstance(value, str) else None
