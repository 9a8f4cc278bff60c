"""A stateful emulator of the Alibaba Cloud SLB (CLB) RPC API, for tests only.

``SLBEmulator`` answers the real SDK's real signed HTTP requests: it intercepts the HTTP adapter
of the requests library vendored in ``aliyunsdkcore`` with ``responses`` and serves every
request to its endpoint host. It parses the RPC parameters (query string and form body), checks
the HMAC-SHA1 signature (RPC signature v1) against its own key pair, and answers in the API's JSON
shapes. It holds load balancers (listed page by page), VServer groups with their tags and backend
servers, and a health status per backend; writes change that state the way the service does
(adding a server already in the group, removing an absent one, a weight outside 0..100, more than
20 servers in a call, more than 20 tags on a group, or a second write on a load balancer while one
is in flight are all rejected). ``DescribeVServerGroups`` filters by the ``Tag.N`` parameters the
SDK sends, as the service does.

Tests steer it directly (load balancers, groups, backends, health, drift), inject faults
(throttling by seeded chance or for the next N calls, 5xx, dropped connections, latency, and
"carry the call out but report failure"; fixed counts or seeded rates; latency and hangs), and read
what happened: every call with its action and parameters (signature fields and the access key id
left out), what was executed, how often each server was added, and a wall-clock history of every
backend change (added, re-weighted, removed). The request log (``requests``, ``calls_in_flight``)
says who sent each call and when: the access key id that signed it (and, for an STS key, the role
session name it was issued to), when it reached the emulator and when it was answered, so that
calls can be counted per caller from the provider's side (docs/chaos.md, "Freezes").

It also plays STS for RRSA: ``AssumeRoleWithOIDC`` for the service-account tokens a test accepts,
answering temporary keys (AccessKeyId, AccessKeySecret, SecurityToken, Expiration) that the SLB
side then accepts until they expire on the emulator's clock (``InvalidSecurityToken.Expired``
after). The credentials library speaks HTTPS only, so STS is reached through the served
emulator below (docs/alibabacloudslb.md, "Credentials").

The same state machine is served over real HTTPS as its own process by ``slb_emulator_server``
(``python -m resourceconsist.adapters.alibabacloudslb.emulator_server``), with an admin HTTP API
for the same steering and reading; see docs/chaos.md.

    with SLBEmulator() as slb:
        lb = slb.add_load_balancer()
        client = SLBClient(slb.credentials(), sleep=lambda _: None)
        ...
        assert not slb.mutating_calls()

Error codes and messages follow Alibaba's published SLB error table; where it names no code
(a backend server already in the group), the emulator uses ``CODE_BACKEND_ALREADY_EXISTS``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Self
from urllib.parse import parse_qsl, quote, urlsplit

from pydantic import SecretStr

try:
    import responses
except ModuleNotFoundError as err:  # pragma: no cover - exercised by tests/api/test_production_imports.py
    raise ModuleNotFoundError(
        "the SLB emulator needs the testing extra: pip install 'resourceconsist[testing]'",
        name=err.name,
    ) from err

from resourceconsist.adapters.alibabacloudslb.credentials import AccessKey, SLBCredentials
from resourceconsist.adapters.alibabacloudslb.slbclient import (
    API_VERSION,
    MAX_BACKENDS_PER_CALL,
    MUTATING_ACTIONS,
    VSERVER_GROUP_RESOURCE_TYPE,
    BackendKey,
    BackendServer,
    BackendServerType,
    VServerGroup,
    backend_key,
)

__all__ = [
    "CODE_BACKEND_ALREADY_EXISTS",
    "CODE_BACKEND_NOT_IN_GROUP",
    "FAULT_KINDS",
    "KNOWN_ERRORS",
    "READ_ACTIONS",
    "SDK_SEND_TARGET",
    "SIGNATURE_PARAMS",
    "STS_API_VERSION",
    "STS_ASSUME_ROLE_WITH_OIDC",
    "STS_MIN_SESSION_SECONDS",
    "BackendChange",
    "CallInFlight",
    "HTTPAnswer",
    "RecordedCall",
    "SLBEmulator",
]

#: What ``responses`` patches: the send method of the SDK's vendored requests adapter.
SDK_SEND_TARGET: Final = "aliyunsdkcore.vendored.requests.adapters.HTTPAdapter.send"

#: Request parameters that belong to the signature, left out of recorded calls.
SIGNATURE_PARAMS: Final = frozenset(
    {
        "AccessKeyId",
        "Signature",
        "SignatureMethod",
        "SignatureNonce",
        "SignatureType",
        "SignatureVersion",
        "Timestamp",
        "SecurityToken",
    }
)

#: The STS action RRSA calls, the API version it speaks, and the Expiration format it answers.
STS_ASSUME_ROLE_WITH_OIDC: Final = "AssumeRoleWithOIDC"
STS_API_VERSION: Final = "2015-04-01"
_STS_EXPIRATION_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"
#: STS's shortest session; the longest is the role's maximum session duration.
STS_MIN_SESSION_SECONDS: Final = 900

#: Code for adding a server that is already in the VServer group.
CODE_BACKEND_ALREADY_EXISTS: Final = "BackendServer.AlreadyExist"
#: Code for removing or re-weighting a server that is not in the VServer group.
CODE_BACKEND_NOT_IN_GROUP: Final = "InvalidServerId.NotFound"

#: HTTP status and message of the codes the emulator answers with (Alibaba's SLB error table).
KNOWN_ERRORS: Final[Mapping[str, tuple[int, str]]] = {
    "Throttling": (400, "Request was denied due to request throttling."),
    "Throttling.User": (400, "Request was denied due to user flow control."),
    "Throttling.Api": (400, "Request was denied due to api flow control."),
    "ServiceUnavailable": (503, "The request has failed due to a temporary failure of the server."),
    "InternalError": (
        500,
        "The request processing has failed due to some unknown error, exception or failure.",
    ),
    "SystemBusy": (449, "The system is busy."),
    "OperationBusy": (400, "A previous operation is pending."),
    "ServiceIsConfiguring": (400, "A previous configuration is pending; please try again later."),
    "VServerGroupProcessing": (
        400,
        "A previous configuration of the VServer group is pending; please try again later.",
    ),
    "BackendServer.configuring": (
        409,
        "A previous configuration of the load balancer is pending; please try again later.",
    ),
    "ProcessingSameRequest": (400, "The same request is being processed. Please try later."),
    "InvalidLoadBalancerId.NotFound": (404, "The specified load balancer does not exist."),
    "InvalidAccessKeyId.NotFound": (404, "Specified access key is not found."),
    "InvalidSecurityToken.Expired": (400, "Specified SecurityToken is expired."),
    "InvalidSecurityToken.MismatchWithAccessKey": (
        400,
        "Specified SecurityToken mismatch with the AccessKey.",
    ),
    "AuthenticationFail.OIDCToken.Invalid": (400, "The specified OIDC token is invalid."),
    "EntityNotExist.Role": (404, "The specified Role not exists."),
    "EntityNotExist.OIDCProvider": (404, "The specified OIDC provider does not exist."),
    "InvalidParameter.DurationSeconds": (400, "The parameter DurationSeconds is out of range."),
    "SignatureDoesNotMatch": (400, "Specified signature is not matched with our calculation."),
    "SignatureNonceUsed": (400, "Specified signature nonce was used already."),
    "InvalidTimeStamp.Format": (400, "Specified time stamp or date value is not well formatted."),
    "InvalidTimeStamp.Expired": (400, "Specified time stamp or date value is expired."),
    "InvalidAction.NotFound": (404, "Specified api is not found, please check your url and method."),
    "InvalidVersion": (400, "Specified parameter Version is not valid."),
    "MissingParameter": (400, "A mandatory parameter is missing."),
    "InvalidParameter": (400, "The specified parameter is not valid."),
    "TooManyBackendServers": (
        400,
        f"The total number of input real servers exceeds max supported number: {MAX_BACKENDS_PER_CALL}",
    ),
    "InvalidWeight.Malformed": (400, "A specified weight is not valid."),
    "RspoolVipExist": (400, "there are vips associating with this vServer group."),
    CODE_BACKEND_ALREADY_EXISTS: (400, "The specified backend server already exists in the VServer group."),
    CODE_BACKEND_NOT_IN_GROUP: (400, "The specified server is not found."),
}

#: The read actions the emulator answers (every other action it answers is in ``MUTATING_ACTIONS``).
READ_ACTIONS: Final = frozenset(
    {
        "DescribeHealthStatus",
        "DescribeLoadBalancers",
        "DescribeVServerGroups",
        "DescribeVServerGroupAttribute",
    }
)
#: SLB's limits on tags: per resource, key and value length, and the page sizes it accepts.
MAX_TAGS_PER_RESOURCE: Final = 20
MAX_TAG_KEY_LENGTH: Final = 64
MAX_TAG_VALUE_LENGTH: Final = 128
_RESERVED_TAG_PREFIXES: Final = ("aliyun", "acs:", "http://", "https://")
_DEFAULT_PAGE_SIZE: Final = 10

#: Fault kinds settable as rates (``SLBEmulator.set_fault_rates``): the code answered, and whether
#: the call is carried out first ("did it but reported failure") or the connection dropped.
FAULT_KINDS: Final[Mapping[str, tuple[str, bool, bool]]] = {
    "throttle": ("Throttling", False, False),
    "5xx": ("ServiceUnavailable", False, False),
    "drop": ("ConnectionReset", False, True),
    "execute_fail": ("InternalError", True, False),
}

#: Longest a hung call waits for ``clear_faults`` before it goes on anyway.
HANG_LIMIT_SECONDS: Final = 3600.0

_VSERVER_GROUP_MISSING: Final = (404, "InvalidParameter", "The specified VServerGroupId does not exist.")
_HEALTH_STATES: Final = frozenset({"normal", "abnormal", "unavailable"})
_SERVER_TYPES: Final[Mapping[str, BackendServerType]] = {"ecs": "ecs", "eni": "eni", "eci": "eci", "ip": "ip"}
_TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class RecordedCall:
    """One request the emulator answered."""

    action: str
    #: Request parameters, without the signature fields and the access key id.
    params: Mapping[str, str]
    http_status: int
    #: Error code answered (injected or real), ``None`` on success.
    code: str | None
    #: Whether the call's effect was applied (true for "carried out, reported failed").
    executed: bool
    request_id: str
    #: The access key id the call was signed with ("" when it carried none), and the role session
    #: name an STS key was issued to ("" for the static pair and unknown keys).
    access_key_id: str = ""
    session: str = ""
    #: Wall-clock seconds (the emulator's clock) when the request reached the emulator and when
    #: it was answered.
    received: float = 0.0
    answered: float = 0.0
    #: Its place in the order of answers, from 1 (``SLBEmulator.requests`` pages on it).
    seq: int = 0

    @property
    def ok(self) -> bool:
        return self.code is None

    @property
    def backend_servers(self) -> list[dict[str, Any]]:
        """The call's ``BackendServers`` JSON, decoded (empty when absent or malformed)."""
        try:
            value = json.loads(self.params.get("BackendServers", "[]"))
        except ValueError:
            return []
        return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "request_id": self.request_id,
            "action": self.action,
            "access_key_id": self.access_key_id,
            "session": self.session,
            "received": self.received,
            "answered": self.answered,
            "http_status": self.http_status,
            "code": self.code,
            "executed": self.executed,
            "params": dict(self.params),
        }


@dataclass(frozen=True)
class CallInFlight:
    """A request the emulator is working on (not answered yet): who sent it and since when."""

    request_id: str
    action: str
    access_key_id: str
    session: str
    received: float

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "action": self.action,
            "access_key_id": self.access_key_id,
            "session": self.session,
            "received": self.received,
        }


ChangeKind = Literal["added", "weight", "description", "removed"]


@dataclass(frozen=True)
class BackendChange:
    """One change of a backend in a VServer group, stamped with the emulator's clock (wall time)."""

    seq: int
    time: float
    load_balancer_id: str
    vserver_group_id: str
    change: ChangeKind
    #: The backend after the change (before it, for ``removed``).
    backend: BackendServer
    #: The weight before the change (``None`` for ``added``).
    old_weight: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "load_balancer_id": self.load_balancer_id,
            "vserver_group_id": self.vserver_group_id,
            "change": self.change,
            "old_weight": self.old_weight,
            **_backend_json(self.backend),
        }


@dataclass(frozen=True)
class HTTPAnswer:
    """What to send back for one SDK request: status, headers and JSON body."""

    status: int
    headers: Mapping[str, str]
    body: str


@dataclass(frozen=True)
class _TemporaryKey:
    key: AccessKey
    expires_at: float
    #: The RoleSessionName it was issued for (who asked for it).
    session: str = ""


class _APIError(Exception):
    def __init__(self, code: str, message: str | None = None, status: int | None = None) -> None:
        known_status, known_message = KNOWN_ERRORS.get(code, (400, code))
        self.code = code
        self.status = status if status is not None else known_status
        self.message = message if message is not None else known_message
        super().__init__(code, self.message)


@dataclass
class _Fault:
    code: str
    status: int
    message: str
    actions: frozenset[str] | None
    remaining: int | None
    probability: float
    execute: bool
    drop_connection: bool
    #: Set by ``set_fault_rates`` (replaced as a whole by the next call).
    rated: bool = False

    def matches(self, action: str) -> bool:
        return (self.actions is None or action in self.actions) and (
            self.remaining is None or self.remaining > 0
        )


class _Injected(Exception):
    def __init__(self, fault: _Fault) -> None:
        super().__init__(fault.code)
        self.fault = fault


@dataclass
class _LoadBalancer:
    id: str
    name: str
    region_id: str


@dataclass
class _Group:
    id: str
    name: str
    load_balancer_id: str
    listener_ports: tuple[int, ...]
    backends: dict[BackendKey, BackendServer] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _WireServer:
    server_id: str
    port: int
    weight: int | None
    server_type: BackendServerType
    server_ip: str | None
    description: str | None

    @property
    def key(self) -> BackendKey:
        return backend_key(self.server_id, self.port, self.server_type, self.server_ip)

    def to_backend(self, default_weight: int = 100) -> BackendServer:
        return BackendServer(
            server_id=self.server_id,
            port=self.port,
            weight=self.weight if self.weight is not None else default_weight,
            server_type=self.server_type,
            server_ip=self.server_ip,
            description=self.description,
        )


def _percent_encode(value: str) -> str:
    # RFC 3986 unreserved characters stay, everything else is %XX of its UTF-8 bytes.
    return quote(value, safe="-_.~")


def string_to_sign(method: str, params: Mapping[str, str]) -> str:
    """The RPC signature v1 string to sign for ``params`` (``Signature`` itself excluded)."""
    canonical = "&".join(
        f"{_percent_encode(key)}={_percent_encode(value)}"
        for key, value in sorted(params.items())
        if key != "Signature"
    )
    return f"{method.upper()}&{_percent_encode('/')}&{_percent_encode(canonical)}"


def rpc_signature(method: str, params: Mapping[str, str], secret: str) -> str:
    """HMAC-SHA1 of the string to sign with key ``secret + "&"``, base64-encoded."""
    digest = hmac.new(f"{secret}&".encode(), string_to_sign(method, params).encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _backend_json(server: BackendServer) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "ServerId": server.server_id,
        "Port": server.port,
        "Weight": server.weight,
        "Type": server.server_type,
    }
    if server.server_ip:
        entry["ServerIp"] = server.server_ip
    if server.description is not None:
        entry["Description"] = server.description
    return entry


def _wrap(outer_items: list[dict[str, Any]], inner: str) -> dict[str, list[dict[str, Any]]]:
    return {inner: outer_items}


def _int_field(entry: Mapping[str, Any], name: str) -> int | None:
    value = entry.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(name)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    raise ValueError(name)


class SLBEmulator:
    """A fake SLB endpoint with state, signature checking, fault injection and a call record."""

    def __init__(
        self,
        *,
        access_key_id: str = "emulated-access-key-id",
        access_key_secret: str = "emulated-access-key-secret",
        endpoint: str = "slb.cn-hangzhou.aliyuncs.com",
        region_id: str = "cn-hangzhou",
        seed: int = 0,
        default_health: str = "normal",
        reject_concurrent_writes: bool = True,
        timestamp_tolerance_seconds: float = 900.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], object] = time.sleep,
        max_recorded_calls: int | None = None,
        role_arn: str = "acs:ram::1234567890123456:role/resourceconsist",
        oidc_provider_arn: str = "acs:ram::1234567890123456:oidc-provider/ack-rrsa-emulated",
        max_session_seconds: int = 3600,
    ) -> None:
        if default_health not in _HEALTH_STATES:
            raise ValueError(f"default_health must be one of {sorted(_HEALTH_STATES)}")
        self.endpoint = endpoint
        self.region_id = region_id
        self._key_id = access_key_id
        self._secret = access_key_secret
        self._default_health = default_health
        self._reject_concurrent_writes = reject_concurrent_writes
        self._tolerance = timestamp_tolerance_seconds
        self._clock = clock
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._load_balancers: dict[str, _LoadBalancer] = {}
        self._groups: dict[str, _Group] = {}
        self._health: dict[tuple[str, str, int], str] = {}
        self._faults: list[_Fault] = []
        self._latency: dict[str | None, float] = {}
        # A long-running server keeps the newest calls only; ``call_counts`` counts them all.
        self._calls: deque[RecordedCall] = deque(maxlen=max_recorded_calls)
        self._call_counts: Counter[tuple[str, str]] = Counter()
        self._answered = 0
        self._pending: dict[str, CallInFlight] = {}
        self._changes: list[BackendChange] = []
        # The account's flow control (``rate_limit``): calls a second, burst, tokens, last refill.
        self._rate: tuple[float, int] | None = None
        self._rate_tokens = 0.0
        self._rate_refilled = 0.0
        self._hang_actions: frozenset[str] | None = None
        self._hanging = False
        self._released = threading.Event()
        self._nonces: set[str] = set()
        self._add_counts: Counter[tuple[str, BackendKey]] = Counter()
        self._rejected_duplicates: list[tuple[str, BackendKey]] = []
        self._in_flight: Counter[str] = Counter()
        self._max_in_flight: Counter[str] = Counter()
        self._write_conflicts = 0
        # The STS side (docs/alibabacloudslb.md, "Testing RRSA"): which role and OIDC provider
        # exist, which service-account tokens are valid, and the temporary keys issued so far.
        self.role_arn = role_arn
        self.oidc_provider_arn = oidc_provider_arn
        self._max_session = max_session_seconds
        self._oidc_tokens: set[str] = set()
        self._temporary: dict[str, _TemporaryKey] = {}
        self._issued: list[str] = []
        self._key_uses: Counter[str] = Counter()
        self._mock: responses.RequestsMock | None = None
        #: Called with the action of every authenticated call just before it executes (writes are
        #: in flight by then); tests use it to hold a call while another one arrives.
        self.before_execute: Callable[[str], None] | None = None

    def __repr__(self) -> str:
        return f"SLBEmulator(endpoint={self.endpoint!r}, region_id={self.region_id!r})"

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Self:
        """Start answering the SDK's requests to ``endpoint`` (other hosts get a connection error)."""
        if self._mock is not None:
            return self
        mock = responses.RequestsMock(target=SDK_SEND_TARGET, assert_all_requests_are_fired=False)
        host = re.compile(rf"https?://{re.escape(self.endpoint)}(?::\d+)?/", re.IGNORECASE)
        for method in (responses.GET, responses.POST):
            mock.add_callback(method, host, callback=self._handle)
        mock.start()
        self._mock = mock
        return self

    def stop(self) -> None:
        if self._mock is not None:
            self._mock.stop(allow_assert=False)
            self._mock.reset()
            self._mock = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def credentials(
        self, *, access_key_id: str | None = None, access_key_secret: str | None = None
    ) -> SLBCredentials:
        """Credentials for this endpoint: the emulator's own pair unless overridden (to test rejection)."""
        return SLBCredentials(
            access_key_id=SecretStr(self._key_id if access_key_id is None else access_key_id),
            access_key_secret=SecretStr(self._secret if access_key_secret is None else access_key_secret),
            region_id=self.region_id,
            endpoint=self.endpoint,
        )

    def rotate_access_key(self, access_key_id: str, access_key_secret: str) -> None:
        """Replace the emulator's key pair, as rotating a RAM user's key does: the old pair is
        refused from now on (``InvalidAccessKeyId.NotFound``)."""
        with self._lock:
            self._key_id, self._secret = access_key_id, access_key_secret

    # ---- STS (RRSA) ---------------------------------------------------------------------

    def accept_oidc_token(self, token: str) -> None:
        """Make ``token`` a valid service-account token for ``AssumeRoleWithOIDC``."""
        with self._lock:
            self._oidc_tokens.add(token.strip())

    def revoke_oidc_token(self, token: str) -> None:
        """Refuse ``token`` from now on (an expired projected token looks like this to STS)."""
        with self._lock:
            self._oidc_tokens.discard(token.strip())

    def issue_temporary_key(self, duration_seconds: int = 3600, session: str = "") -> tuple[AccessKey, float]:
        """A new STS key valid for ``duration_seconds`` on the emulator's clock, and its expiry
        (seconds since the epoch, whole seconds as STS's ``Expiration`` carries them); ``session``
        is the role session name it is issued for (the request log names its calls' sender)."""
        with self._lock:
            number = len(self._issued) + 1
            key = AccessKey(
                f"STS.emulated{number:06d}{self._rng.randrange(16**8):08x}",
                f"emulated-sts-secret-{self._rng.randrange(16**16):016x}",
                f"emulated-security-token-{self._rng.randrange(16**24):024x}",
            )
            expires_at = float(int(self._clock() + duration_seconds))
            self._temporary[key.access_key_id] = _TemporaryKey(key, expires_at, session)
            self._issued.append(key.access_key_id)
            return key, expires_at

    def expire_temporary_key(self, access_key_id: str) -> None:
        """End an issued key's validity now, as if its ``Expiration`` had passed."""
        with self._lock:
            held = self._temporary[access_key_id]
            self._temporary[access_key_id] = _TemporaryKey(held.key, self._clock(), held.session)

    def issued_temporary_keys(self) -> list[str]:
        """Access key ids of the STS keys issued so far, oldest first."""
        with self._lock:
            return list(self._issued)

    def key_uses(self) -> dict[str, int]:
        """Authenticated SLB calls per access key id (the static pair's and every STS key's)."""
        with self._lock:
            return dict(self._key_uses)

    def _assume_role_with_oidc(self, params: Mapping[str, str]) -> dict[str, Any]:
        if params.get("Version") != STS_API_VERSION:
            raise _APIError("InvalidVersion")
        for name in ("RoleArn", "OIDCProviderArn", "OIDCToken", "RoleSessionName"):
            if not params.get(name):
                raise _APIError("MissingParameter", f"{name} is mandatory for this action.")
        if params["RoleArn"] != self.role_arn:
            raise _APIError("EntityNotExist.Role")
        if params["OIDCProviderArn"] != self.oidc_provider_arn:
            raise _APIError("EntityNotExist.OIDCProvider")
        with self._lock:
            valid = params["OIDCToken"].strip() in self._oidc_tokens
        if not valid:
            raise _APIError("AuthenticationFail.OIDCToken.Invalid")
        try:
            duration = int(params.get("DurationSeconds") or "3600")
        except ValueError:
            raise _APIError("InvalidParameter.DurationSeconds") from None
        if not STS_MIN_SESSION_SECONDS <= duration <= self._max_session:
            raise _APIError("InvalidParameter.DurationSeconds")
        session = params["RoleSessionName"]
        key, expires_at = self.issue_temporary_key(duration, session)
        return {
            "AssumedRoleUser": {"Arn": f"{self.role_arn}/{session}", "AssumedRoleId": f"emulated:{session}"},
            "OIDCTokenInfo": {"ClientIds": "sts.aliyuncs.com", "Issuer": "https://oidc-ack.emulated"},
            "Credentials": {
                "AccessKeyId": key.access_key_id,
                "AccessKeySecret": key.access_key_secret,
                "SecurityToken": key.security_token,
                "Expiration": datetime.fromtimestamp(expires_at, UTC).strftime(_STS_EXPIRATION_FORMAT),
            },
        }

    # ---- state, set up and read by tests ------------------------------------------------

    def add_load_balancer(self, load_balancer_id: str | None = None, *, name: str = "") -> str:
        with self._lock:
            lb_id = load_balancer_id or self._new_id("lb-")
            if lb_id in self._load_balancers:
                raise ValueError(f"load balancer {lb_id} exists")
            self._load_balancers[lb_id] = _LoadBalancer(lb_id, name, self.region_id)
            return lb_id

    def remove_load_balancer(self, load_balancer_id: str) -> None:
        with self._lock:
            del self._load_balancers[load_balancer_id]
            for group_id in [g.id for g in self._groups.values() if g.load_balancer_id == load_balancer_id]:
                self._drop_group(group_id)
            for key in [k for k in self._health if k[0] == load_balancer_id]:
                del self._health[key]

    def load_balancers(self) -> list[str]:
        with self._lock:
            return list(self._load_balancers)

    def add_vserver_group(
        self,
        load_balancer_id: str,
        name: str = "",
        *,
        backends: Iterable[BackendServer] = (),
        listener_ports: Iterable[int] = (),
        vserver_group_id: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> str:
        """Create a VServer group directly; ``listener_ports`` are the listeners that use it."""
        with self._lock:
            if load_balancer_id not in self._load_balancers:
                raise KeyError(load_balancer_id)
            group_id = vserver_group_id or self._new_id("rsp-")
            group = _Group(group_id, name, load_balancer_id, tuple(listener_ports), tags=dict(tags or {}))
            self._groups[group_id] = group
            self._replace_backends(group, backends)
            return group_id

    def remove_vserver_group(self, vserver_group_id: str) -> None:
        with self._lock:
            self._drop_group(vserver_group_id)

    def vserver_groups(self, load_balancer_id: str) -> list[VServerGroup]:
        with self._lock:
            return [
                VServerGroup(id=g.id, name=g.name, load_balancer_id=g.load_balancer_id, tags=dict(g.tags))
                for g in self._groups.values()
                if g.load_balancer_id == load_balancer_id
            ]

    def vserver_group_tags(self, vserver_group_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._groups[vserver_group_id].tags)

    def backends(self, vserver_group_id: str) -> list[BackendServer]:
        with self._lock:
            return list(self._groups[vserver_group_id].backends.values())

    def set_backends(self, vserver_group_id: str, servers: Iterable[BackendServer]) -> None:
        """Replace a group's servers behind the controller's back (drift)."""
        with self._lock:
            self._replace_backends(self._groups[vserver_group_id], servers)

    def state(self) -> dict[str, Any]:
        """Load balancers and VServer groups with their backends, as JSON-ready data."""
        with self._lock:
            return {
                "load_balancers": [
                    {"id": lb.id, "name": lb.name, "region_id": lb.region_id}
                    for lb in self._load_balancers.values()
                ],
                "groups": [
                    {
                        "id": g.id,
                        "name": g.name,
                        "load_balancer_id": g.load_balancer_id,
                        "listener_ports": list(g.listener_ports),
                        "backends": [_backend_json(b) for b in g.backends.values()],
                        "tags": dict(g.tags),
                    }
                    for g in self._groups.values()
                ],
            }

    def backend_changes(self, since: int = 0) -> list[BackendChange]:
        """Every backend change with a sequence number above ``since``, oldest first."""
        with self._lock:
            start = max(0, min(since, len(self._changes)))
            return self._changes[start:]

    def _note(
        self, group: _Group, change: ChangeKind, backend: BackendServer, old_weight: int | None = None
    ) -> None:
        # Sequence numbers are 1-based positions in the list, so ``backend_changes`` slices.
        self._changes.append(
            BackendChange(
                len(self._changes) + 1,
                self._clock(),
                group.load_balancer_id,
                group.id,
                change,
                backend,
                old_weight,
            )
        )

    def _replace_backends(self, group: _Group, servers: Iterable[BackendServer]) -> None:
        wanted = {server.key: server for server in servers}
        for key, old in list(group.backends.items()):
            if key not in wanted:
                del group.backends[key]
                self._note(group, "removed", old, old.weight)
        for new in wanted.values():
            self._put(group, new)

    def _put(self, group: _Group, new: BackendServer) -> None:
        """Store ``new`` in the group and note what changed (add, weight, description)."""
        old = group.backends.get(new.key)
        group.backends[new.key] = new
        if old is None:
            self._note(group, "added", new)
        elif old.weight != new.weight:
            self._note(group, "weight", new, old.weight)
        elif old.description != new.description:
            self._note(group, "description", new, old.weight)

    def _drop_group(self, group_id: str) -> None:
        group = self._groups.pop(group_id)
        for backend in group.backends.values():
            self._note(group, "removed", backend, backend.weight)

    def set_health(self, load_balancer_id: str, server_id: str, port: int, status: str) -> None:
        """Health reported for a backend (``normal``, ``abnormal``, ``unavailable``)."""
        if status not in _HEALTH_STATES:
            raise ValueError(f"status must be one of {sorted(_HEALTH_STATES)}")
        with self._lock:
            self._health[(load_balancer_id, server_id, port)] = status

    # ---- faults -------------------------------------------------------------------------

    def fail_next(
        self,
        action: str | Iterable[str] | None = None,
        times: int = 1,
        *,
        code: str = "Throttling",
        status: int | None = None,
        message: str | None = None,
        execute: bool = False,
    ) -> None:
        """Fail the next ``times`` calls of ``action`` (any action when None) with ``code``.

        With ``execute=True`` the call is carried out first and then reported as failed.
        """
        self._add_fault(action, times, code, status, message, execute=execute)

    def fail_after_executing(
        self, action: str | Iterable[str], times: int = 1, *, code: str = "ServiceUnavailable"
    ) -> None:
        """Carry out the next ``times`` calls of ``action`` but answer with an error."""
        self._add_fault(action, times, code, None, None, execute=True)

    def return_5xx(
        self, action: str | Iterable[str] | None = None, times: int = 1, *, status: int = 503
    ) -> None:
        """Answer the next ``times`` calls with a 5xx (``ServiceUnavailable`` or ``InternalError``)."""
        code = "ServiceUnavailable" if status == 503 else "InternalError"
        self._add_fault(action, times, code, status, None, execute=False)

    def drop_connection(
        self, action: str | Iterable[str] | None = None, times: int = 1, *, execute: bool = False
    ) -> None:
        """Reset the connection instead of answering; with ``execute=True`` after carrying the call out."""
        self._add_fault(action, times, "ConnectionReset", 0, None, execute=execute, drop=True)

    def throttle(
        self, fraction: float, *, actions: Iterable[str] | None = None, code: str = "Throttling"
    ) -> None:
        """From now on, reject a seeded-random ``fraction`` of calls (of ``actions``) with ``code``."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fraction must be within [0, 1]")
        status, message = KNOWN_ERRORS.get(code, (400, code))
        with self._lock:
            self._faults.append(
                _Fault(
                    code,
                    status,
                    message,
                    None if actions is None else frozenset(actions),
                    None,
                    fraction,
                    execute=False,
                    drop_connection=False,
                )
            )

    def rate_limit(self, calls_per_second: float | None, *, burst: int = 1) -> None:
        """From now on, answer authenticated calls beyond ``calls_per_second`` (a token bucket
        holding ``burst``) as SLB answers a user over its quota: HTTP 400, ``Throttling.User``,
        "Request was denied due to user flow control."; None: no limit. Such a call executes
        nothing and is recorded with its code."""
        if calls_per_second is not None and not 0 < calls_per_second < float("inf"):
            raise ValueError(f"calls_per_second must be a positive number, not {calls_per_second!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a whole number >= 1, not {burst!r}")
        with self._lock:
            self._rate = None if calls_per_second is None else (float(calls_per_second), burst)
            self._rate_tokens = float(burst)
            self._rate_refilled = time.monotonic()

    def _over_rate(self) -> bool:
        """Whether this call goes over the account's rate (and takes a token when it does not)."""
        with self._lock:
            if self._rate is None:
                return False
            rate, burst = self._rate
            now = time.monotonic()
            self._rate_tokens = min(float(burst), self._rate_tokens + (now - self._rate_refilled) * rate)
            self._rate_refilled = now
            if self._rate_tokens < 1.0:
                return True
            self._rate_tokens -= 1.0
            return False

    def set_fault_rates(self, rates: Mapping[str, float], *, actions: Iterable[str] | None = None) -> None:
        """From now on, fail a seeded-random share of calls (of ``actions``) per fault kind.

        ``rates`` maps kinds of ``FAULT_KINDS`` to fractions whose sum is at most 1; each call
        draws at most one of them, so ``{"throttle": 0.1, "5xx": 0.2}`` fails 30% of calls.
        Replaces the rates set before; ``fail_next`` and ``throttle`` faults stay.
        """
        unknown = sorted(set(rates) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {sorted(FAULT_KINDS)}")
        if any(not 0.0 <= r <= 1.0 for r in rates.values()) or sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates must each be within [0, 1] and sum to at most 1")
        scope = None if actions is None else frozenset(actions)
        faults: list[_Fault] = []
        left = 1.0
        for kind, rate in rates.items():
            if rate <= 0.0:
                continue
            code, execute, drop = FAULT_KINDS[kind]
            status, message = KNOWN_ERRORS.get(code, (0, code))
            # Faults are tried in turn, so each one's chance is conditioned on the earlier misses.
            chance = min(1.0, rate / left) if left > 0 else 1.0
            left -= rate
            faults.append(_Fault(code, status, message, scope, None, chance, execute, drop, rated=True))
        with self._lock:
            self._faults = [f for f in self._faults if not f.rated] + faults

    def hang(self, actions: Iterable[str] | None = None) -> None:
        """Hold calls (of ``actions``, or all) unanswered until ``clear_faults``."""
        with self._lock:
            self._hang_actions = None if actions is None else frozenset(actions)
            self._hanging = True
            self._released.clear()

    def set_latency(self, seconds: float, action: str | None = None) -> None:
        """Delay answers (of ``action``, or all) by ``seconds`` of real time."""
        with self._lock:
            self._latency[action] = seconds

    def clear_faults(self) -> None:
        """Drop every fault, latency and hang; hung calls go on at once."""
        with self._lock:
            self._faults.clear()
            self._latency.clear()
            self._hanging = False
            self._released.set()

    def _add_fault(
        self,
        action: str | Iterable[str] | None,
        times: int,
        code: str,
        status: int | None,
        message: str | None,
        *,
        execute: bool,
        drop: bool = False,
    ) -> None:
        if times < 1:
            raise ValueError("times must be at least 1")
        known_status, known_message = KNOWN_ERRORS.get(code, (400, code))
        actions = None if action is None else frozenset([action] if isinstance(action, str) else action)
        with self._lock:
            self._faults.append(
                _Fault(
                    code,
                    known_status if status is None else status,
                    message or known_message,
                    actions,
                    times,
                    1.0,
                    execute=execute,
                    drop_connection=drop,
                )
            )

    # ---- the record ---------------------------------------------------------------------

    @property
    def calls(self) -> list[RecordedCall]:
        """Every request answered, in order (rejected ones included)."""
        with self._lock:
            return list(self._calls)

    def calls_of(self, action: str) -> list[RecordedCall]:
        with self._lock:
            return [call for call in self._calls if call.action == action]

    def mutating_calls(self) -> list[RecordedCall]:
        """Calls of a state-changing action, whether or not they succeeded."""
        with self._lock:
            return [call for call in self._calls if call.action in MUTATING_ACTIONS]

    def requests(self, since: int = 0) -> list[RecordedCall]:
        """The calls answered after the ``since``-th (``RecordedCall.seq``), oldest first, as far
        as the record keeps them (``max_recorded_calls``: a gap in ``seq`` says some were
        dropped): the request log, with each call's sender and arrival time."""
        with self._lock:
            return [call for call in self._calls if call.seq > since]

    def calls_in_flight(self) -> list[CallInFlight]:
        """The calls received and not answered yet, oldest first (a write held by latency, a
        hang or the state machine)."""
        with self._lock:
            return sorted(self._pending.values(), key=lambda call: call.received)

    def call_counts(self) -> dict[tuple[str, str], int]:
        """Calls answered per (action, code), ``"ok"`` for success; never trimmed."""
        with self._lock:
            return dict(self._call_counts)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._call_counts.clear()
            self._add_counts.clear()
            self._rejected_duplicates.clear()
            self._write_conflicts = 0
            self._max_in_flight.clear()

    def add_counts(self, vserver_group_id: str) -> dict[BackendKey, int]:
        """How many times each server was actually added to the group."""
        with self._lock:
            return {key: n for (group, key), n in self._add_counts.items() if group == vserver_group_id}

    @property
    def rejected_duplicate_adds(self) -> list[tuple[str, BackendKey]]:
        """(group, server) pairs of adds refused because the server was already in the group."""
        with self._lock:
            return list(self._rejected_duplicates)

    @property
    def write_conflicts(self) -> int:
        """Writes refused because another write on the same load balancer was in flight."""
        with self._lock:
            return self._write_conflicts

    def max_concurrent_writes(self, load_balancer_id: str) -> int:
        with self._lock:
            return self._max_in_flight[load_balancer_id]

    # ---- HTTP ---------------------------------------------------------------------------

    def _handle(self, request: Any) -> Exception | tuple[int, Mapping[str, str], str]:
        """The ``responses`` callback: one intercepted SDK request."""
        content_type = str(request.headers.get("Content-Type", ""))
        answer = self.answer(str(request.method or "GET"), str(request.url), content_type, request.body)
        if answer is None:
            # Worded like urllib3's error, which quotes the request URL (key id included).
            split = urlsplit(str(request.url))
            return ConnectionResetError(
                f"HTTPSConnectionPool(host={split.hostname!r}): Max retries exceeded with url: "
                f"{split.path}?{split.query} (Caused by connection reset by the SLB emulator)"
            )
        return answer.status, answer.headers, answer.body

    def answer(self, method: str, url: str, content_type: str, body: bytes | str | None) -> HTTPAnswer | None:
        """Answer one RPC request, whatever carried it; ``None``: drop the connection unanswered."""
        received = self._clock()
        params = self._params(url, content_type, body)
        action = params.get("Action", "")
        recorded = {k: v for k, v in params.items() if k not in SIGNATURE_PARAMS and k != "OIDCToken"}
        key_id = params.get("AccessKeyId", "")
        with self._lock:
            request_id = self._new_request_id()
            held = self._temporary.get(key_id)
            arrival = CallInFlight(request_id, action, key_id, held.session if held else "", received)
            self._pending[request_id] = arrival
        try:
            return self._answer(method, params, action, recorded, arrival)
        finally:
            with self._lock:
                self._pending.pop(request_id, None)

    def _answer(
        self,
        method: str,
        params: dict[str, str],
        action: str,
        recorded: dict[str, str],
        arrival: CallInFlight,
    ) -> HTTPAnswer | None:
        request_id = arrival.request_id
        executed = False
        try:
            try:
                if action == STS_ASSUME_ROLE_WITH_OIDC:
                    # Anonymous: the OIDC token is the proof of identity, nothing is signed.
                    payload = self._assume_role_with_oidc(params)
                    recorded.pop("OIDCToken", None)
                    self._record(action, recorded, status=200, code=None, executed=False, arrival=arrival)
                    return HTTPAnswer(
                        200,
                        {"Content-Type": "application/json;charset=utf-8", "x-acs-request-id": request_id},
                        json.dumps({"RequestId": request_id, **payload}),
                    )
                self._authenticate(method, params)
                if self._over_rate():
                    raise _APIError("Throttling.User")
                fault = self._take_fault(action)
                if fault is not None and not fault.execute:
                    raise _Injected(fault)
                with self._writing(action, params):
                    self._pause(action)
                    payload = self._dispatch(action, params)
                executed = action in MUTATING_ACTIONS
                if fault is not None:
                    raise _Injected(fault)
            except _Injected as injected:
                fault = injected.fault
                executed = executed or (fault.execute and action in MUTATING_ACTIONS)
                self._record(
                    action, recorded, status=fault.status, code=fault.code, executed=executed, arrival=arrival
                )
                if fault.drop_connection:
                    return None
                return self._error_response(_APIError(fault.code, fault.message, fault.status), request_id)
        except _APIError as err:
            self._record(
                action, recorded, status=err.status, code=err.code, executed=executed, arrival=arrival
            )
            return self._error_response(err, request_id)
        self._record(action, recorded, status=200, code=None, executed=executed, arrival=arrival)
        text = json.dumps({"RequestId": request_id, **payload})
        return HTTPAnswer(
            200, {"Content-Type": "application/json;charset=utf-8", "x-acs-request-id": request_id}, text
        )

    @staticmethod
    def _params(url: str, content_type: str, body: bytes | str | None) -> dict[str, str]:
        params = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
        if body and "application/x-www-form-urlencoded" in content_type:
            text = body.decode() if isinstance(body, bytes) else str(body)
            params.update(parse_qsl(text, keep_blank_values=True))
        return params

    def _error_response(self, err: _APIError, request_id: str) -> HTTPAnswer:
        body = json.dumps(
            {
                "RequestId": request_id,
                "HostId": self.endpoint,
                "Code": err.code,
                "Message": err.message,
                "Recommend": f"https://api.aliyun.com/troubleshoot?q={err.code}&product=Slb",
            }
        )
        return HTTPAnswer(err.status, {"Content-Type": "application/json;charset=utf-8"}, body)

    def _record(
        self,
        action: str,
        params: dict[str, str],
        *,
        status: int,
        code: str | None,
        executed: bool,
        arrival: CallInFlight,
    ) -> None:
        with self._lock:
            self._answered += 1
            self._calls.append(
                RecordedCall(
                    action,
                    params,
                    status,
                    code,
                    executed,
                    arrival.request_id,
                    access_key_id=arrival.access_key_id,
                    session=arrival.session,
                    received=arrival.received,
                    answered=self._clock(),
                    seq=self._answered,
                )
            )
            self._call_counts[(action, code or "ok")] += 1

    def _authenticate(self, method: str, params: Mapping[str, str]) -> None:
        key_id = params.get("AccessKeyId", "")
        if not key_id:
            raise _APIError("MissingParameter", "AccessKeyId is mandatory for this action.")
        with self._lock:
            temporary = self._temporary.get(key_id)
            static_id, static_secret = self._key_id, self._secret
        if temporary is not None:
            secret = temporary.key.access_key_secret
        elif hmac.compare_digest(key_id.encode(), static_id.encode()):
            secret = static_secret
        else:
            raise _APIError("InvalidAccessKeyId.NotFound")
        if params.get("SignatureMethod") != "HMAC-SHA1" or params.get("SignatureVersion") != "1.0":
            raise _APIError("InvalidParameter", "Only SignatureMethod HMAC-SHA1, SignatureVersion 1.0.")
        try:
            stamp = datetime.strptime(params.get("Timestamp", ""), _TIMESTAMP_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            raise _APIError("InvalidTimeStamp.Format") from None
        if abs(self._clock() - stamp.timestamp()) > self._tolerance:
            raise _APIError("InvalidTimeStamp.Expired")
        expected = rpc_signature(method, params, secret)
        if not hmac.compare_digest(expected.encode(), params.get("Signature", "").encode()):
            # The real service quotes its string to sign; the SDK compares it with its own to
            # tell a wrong secret (InvalidAccessKeySecret) from a malformed request.
            raise _APIError(
                "SignatureDoesNotMatch",
                "Specified signature is not matched with our calculation. server string to sign is:"
                + string_to_sign(method, params),
            )
        if temporary is not None:
            token = params.get("SecurityToken", "")
            if not hmac.compare_digest(token.encode(), str(temporary.key.security_token).encode()):
                raise _APIError("InvalidSecurityToken.MismatchWithAccessKey")
            if self._clock() >= temporary.expires_at:
                raise _APIError("InvalidSecurityToken.Expired")
        nonce = params.get("SignatureNonce", "")
        with self._lock:
            if not nonce or nonce in self._nonces:
                raise _APIError("SignatureNonceUsed")
            self._nonces.add(nonce)
            self._key_uses[key_id] += 1
        if params.get("Version") != API_VERSION:
            raise _APIError("InvalidVersion")

    def _take_fault(self, action: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if not fault.matches(action):
                    continue
                if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                return fault
            self._faults = [f for f in self._faults if f.remaining is None or f.remaining > 0]
            return None

    def _pause(self, action: str) -> None:
        hook = self.before_execute
        if hook is not None:
            hook(action)
        with self._lock:
            delay = self._latency.get(action, self._latency.get(None, 0.0))
            hung = self._hanging and (self._hang_actions is None or action in self._hang_actions)
        if hung:
            self._released.wait(HANG_LIMIT_SECONDS)
        if delay > 0:
            self._sleep(delay)

    @contextmanager
    def _writing(self, action: str, params: Mapping[str, str]) -> Iterator[None]:
        """Mark a write in flight on its load balancer; refuse it if another one already is."""
        if action not in MUTATING_ACTIONS:
            yield
            return
        with self._lock:
            lb_id = params.get("LoadBalancerId") or ""
            group = self._groups.get(params.get("VServerGroupId") or params.get("ResourceId.1") or "")
            if group is not None:
                lb_id = group.load_balancer_id
            if not lb_id:
                lb_id = "?"
            if self._in_flight[lb_id] and self._reject_concurrent_writes:
                self._write_conflicts += 1
                raise _APIError("BackendServer.configuring")
            self._in_flight[lb_id] += 1
            self._max_in_flight[lb_id] = max(self._max_in_flight[lb_id], self._in_flight[lb_id])
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[lb_id] -= 1

    # ---- the API ------------------------------------------------------------------------

    def _dispatch(self, action: str, params: Mapping[str, str]) -> dict[str, Any]:
        handlers: dict[str, Callable[[Mapping[str, str]], dict[str, Any]]] = {
            "DescribeHealthStatus": self._describe_health_status,
            "DescribeLoadBalancers": self._describe_load_balancers,
            "TagResources": self._tag_resources,
            "DescribeVServerGroups": self._describe_vserver_groups,
            "DescribeVServerGroupAttribute": self._describe_vserver_group_attribute,
            "CreateVServerGroup": self._create_vserver_group,
            "DeleteVServerGroup": self._delete_vserver_group,
            "AddVServerGroupBackendServers": self._add_backends,
            "RemoveVServerGroupBackendServers": self._remove_backends,
            "SetVServerGroupAttribute": self._set_vserver_group_attribute,
            "ModifyVServerGroupBackendServers": self._modify_backends,
        }
        handler = handlers.get(action)
        if handler is None:
            raise _APIError("InvalidAction.NotFound")
        with self._lock:
            return handler(params)

    def _load_balancer(self, params: Mapping[str, str]) -> _LoadBalancer:
        lb_id = params.get("LoadBalancerId", "")
        if not lb_id:
            raise _APIError("MissingParameter", "The input parameter LoadBalancerId is mandatory.")
        lb = self._load_balancers.get(lb_id)
        if lb is None or lb.region_id != params.get("RegionId", lb.region_id):
            raise _APIError("InvalidLoadBalancerId.NotFound")
        return lb

    def _group(self, params: Mapping[str, str]) -> _Group:
        group_id = params.get("VServerGroupId", "")
        if not group_id:
            raise _APIError("MissingParameter", "The input parameter VServerGroupId is mandatory.")
        group = self._groups.get(group_id)
        lb = self._load_balancers.get(group.load_balancer_id) if group is not None else None
        if group is None or lb is None or lb.region_id != params.get("RegionId", lb.region_id):
            status, code, message = _VSERVER_GROUP_MISSING
            raise _APIError(code, message, status)
        return group

    def _parse_servers(self, raw: str | None, *, required: bool) -> list[_WireServer]:
        if raw is None or raw == "":
            if required:
                raise _APIError("MissingParameter", "The input parameter BackendServers is mandatory.")
            return []
        try:
            entries = json.loads(raw)
        except ValueError:
            raise _APIError("InvalidParameter", "The specified BackendServers is invalid.") from None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise _APIError("InvalidParameter", "The specified BackendServers is invalid.")
        if len(entries) > MAX_BACKENDS_PER_CALL:
            raise _APIError("TooManyBackendServers")
        servers: list[_WireServer] = []
        keys: set[BackendKey] = set()
        for entry in entries:
            server_id = entry.get("ServerId")
            if not isinstance(server_id, str) or not server_id:
                raise _APIError("InvalidParameter", "The VmName is emtpy.")
            try:
                port = _int_field(entry, "Port")
            except ValueError:
                port = -1
            if port is None or not 1 <= port <= 65535:
                raise _APIError(
                    "InvalidParameter",
                    "The specified BackendServers is invalid, as the Port value should be in [1, 65535].",
                )
            try:
                weight = _int_field(entry, "Weight")
            except ValueError:
                raise _APIError("InvalidWeight.Malformed") from None
            if weight is not None and not 0 <= weight <= 100:
                raise _APIError("InvalidWeight.Malformed")
            server_type = _SERVER_TYPES.get(str(entry.get("Type") or "ecs"))
            if server_type is None:
                raise _APIError("InvalidParameter", "The type is invalid.")
            server_ip = entry.get("ServerIp")
            if server_ip is not None and not isinstance(server_ip, str):
                raise _APIError("InvalidParameter", "The specified BackendServers is invalid.")
            if server_type in ("eni", "eci", "ip") and not server_ip:
                raise _APIError("InvalidParameter", "The Rs IP is empty.")
            description = entry.get("Description")
            server = _WireServer(
                server_id,
                port,
                weight,
                server_type,
                server_ip or None,
                None if description is None else str(description),
            )
            if server.key in keys:
                raise _APIError("InvalidParameter", "The RsList is illegal.")
            keys.add(server.key)
            servers.append(server)
        return servers

    def _health_entries(self, lb: _LoadBalancer, listener_port: int | None) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for group in self._groups.values():
            if group.load_balancer_id != lb.id:
                continue
            ports: tuple[int | None, ...] = group.listener_ports or (None,)
            for port in ports:
                if listener_port is not None and port != listener_port:
                    continue
                for server in group.backends.values():
                    entry: dict[str, Any] = {
                        "ServerId": server.server_id,
                        "Port": server.port,
                        "ServerHealthStatus": self._health.get(
                            (lb.id, server.server_id, server.port), self._default_health
                        ),
                        "Type": server.server_type,
                    }
                    if server.server_ip:
                        entry["ServerIp"] = server.server_ip
                        if server.server_type == "eni":
                            entry["EniHost"] = server.server_ip
                    if port is not None:
                        entry["ListenerPort"] = port
                        entry["Protocol"] = "tcp"
                    entries.append(entry)
        return entries

    def _describe_health_status(self, params: Mapping[str, str]) -> dict[str, Any]:
        lb = self._load_balancer(params)
        try:
            listener_port = _int_field(params, "ListenerPort")
        except ValueError:
            raise _APIError("InvalidParameter", "The specified port is not valid.") from None
        return {"BackendServers": _wrap(self._health_entries(lb, listener_port), "BackendServer")}

    def _describe_vserver_groups(self, params: Mapping[str, str]) -> dict[str, Any]:
        lb = self._load_balancer(params)
        wanted = self._parse_tags(params, values_required=False)
        groups = [
            {
                "VServerGroupId": g.id,
                "VServerGroupName": g.name,
                "ServerCount": len(g.backends),
                "AssociatedObjects": {
                    "Listeners": {"Listener": [{"Port": p, "Protocol": "tcp"} for p in g.listener_ports]},
                    "Rules": {"Rule": []},
                },
                "Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in g.tags.items()]},
            }
            for g in self._groups.values()
            if g.load_balancer_id == lb.id
            # A tag given without a value matches any value of that key.
            and all(k in g.tags and (v is None or g.tags[k] == v) for k, v in wanted.items())
        ]
        return {"VServerGroups": _wrap(groups, "VServerGroup")}

    def _group_payload(self, group: _Group, servers: Iterable[BackendServer] | None = None) -> dict[str, Any]:
        listed = group.backends.values() if servers is None else servers
        return {
            "VServerGroupId": group.id,
            "BackendServers": _wrap([_backend_json(s) for s in listed], "BackendServer"),
        }

    def _describe_vserver_group_attribute(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        return {
            **self._group_payload(group),
            "VServerGroupName": group.name,
            "LoadBalancerId": group.load_balancer_id,
        }

    def _create_vserver_group(self, params: Mapping[str, str]) -> dict[str, Any]:
        lb = self._load_balancer(params)
        servers = self._parse_servers(params.get("BackendServers"), required=False)
        tags = self._parse_tags(params, values_required=True)
        if len(tags) > MAX_TAGS_PER_RESOURCE:
            raise _APIError("InvalidParameter", f"A resource can have at most {MAX_TAGS_PER_RESOURCE} tags.")
        group = _Group(
            self._new_id("rsp-"),
            params.get("VServerGroupName", ""),
            lb.id,
            (),
            tags={k: v or "" for k, v in tags.items()},
        )
        self._groups[group.id] = group
        return self._group_payload(group, self._insert(group, servers))

    def _delete_vserver_group(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        if group.listener_ports:
            raise _APIError("RspoolVipExist")
        self._drop_group(group.id)
        return {}

    def _describe_load_balancers(self, params: Mapping[str, str]) -> dict[str, Any]:
        try:
            number = _int_field(params, "PageNumber") or 1
            size = _int_field(params, "PageSize") or _DEFAULT_PAGE_SIZE
        except ValueError:
            raise _APIError("InvalidParameter", "The specified PageNumber or PageSize is invalid.") from None
        if number < 1 or not 1 <= size <= 100:
            raise _APIError("InvalidParameter", "The specified PageNumber or PageSize is invalid.")
        region = params.get("RegionId", self.region_id)
        listed = [lb for lb in self._load_balancers.values() if lb.region_id == region]
        page = listed[(number - 1) * size : number * size]
        return {
            "LoadBalancers": _wrap(
                [
                    {"LoadBalancerId": lb.id, "LoadBalancerName": lb.name, "RegionId": lb.region_id}
                    for lb in page
                ],
                "LoadBalancer",
            ),
            "TotalCount": len(listed),
            "PageNumber": number,
            "PageSize": size,
        }

    def _parse_tags(self, params: Mapping[str, str], *, values_required: bool) -> dict[str, str | None]:
        """``Tag.N.Key`` / ``Tag.N.Value`` (N from 1); a value without its key is refused."""
        tags: dict[str, str | None] = {}
        numbers = sorted(
            {int(m.group(1)) for k in params if (m := re.fullmatch(r"Tag\.(\d+)\.(?:Key|Value)", k))}
        )
        for n in numbers:
            key, value = params.get(f"Tag.{n}.Key"), params.get(f"Tag.{n}.Value")
            if not key:
                raise _APIError("InvalidParameter", f"Tag.{n}.Value is set without Tag.{n}.Key.")
            if len(key) > MAX_TAG_KEY_LENGTH or key.lower().startswith(_RESERVED_TAG_PREFIXES):
                raise _APIError("InvalidParameter", f"The specified tag key {key!r} is invalid.")
            if value is not None and (
                len(value) > MAX_TAG_VALUE_LENGTH or value.lower().startswith(_RESERVED_TAG_PREFIXES[:2])
            ):
                raise _APIError("InvalidParameter", f"The specified tag value {value!r} is invalid.")
            tags[key] = value if value is not None or not values_required else ""
        return tags

    def _tag_resources(self, params: Mapping[str, str]) -> dict[str, Any]:
        if params.get("ResourceType") != VSERVER_GROUP_RESOURCE_TYPE:
            # Load balancers, certificates and ACLs can be tagged too; the emulator holds none of them.
            raise _APIError("InvalidParameter", "The specified ResourceType is invalid.")
        ids = [params[k] for k in sorted(params) if re.fullmatch(r"ResourceId\.\d+", k)]
        tags = self._parse_tags(params, values_required=True)
        if not ids or not tags:
            raise _APIError("MissingParameter", "The input parameters ResourceId and Tag are mandatory.")
        groups = [self._group({**params, "VServerGroupId": group_id}) for group_id in ids]
        too_many = f"A resource can have at most {MAX_TAGS_PER_RESOURCE} tags."
        if any(len({**group.tags, **tags}) > MAX_TAGS_PER_RESOURCE for group in groups):
            raise _APIError("InvalidParameter", too_many)
        for group in groups:
            group.tags.update({k: v or "" for k, v in tags.items()})
        return {}

    def _insert(self, group: _Group, servers: list[_WireServer]) -> list[BackendServer]:
        for server in servers:
            if server.key in group.backends:
                self._rejected_duplicates.append((group.id, server.key))
                raise _APIError(CODE_BACKEND_ALREADY_EXISTS)
        added = [server.to_backend() for server in servers]
        for backend in added:
            self._put(group, backend)
            self._add_counts[(group.id, backend.key)] += 1
        return added

    def _add_backends(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        servers = self._parse_servers(params.get("BackendServers"), required=True)
        return self._group_payload(group, self._insert(group, servers))

    def _require_present(self, group: _Group, servers: Iterable[_WireServer]) -> None:
        for server in servers:
            if server.key not in group.backends:
                raise _APIError(CODE_BACKEND_NOT_IN_GROUP)

    def _remove_backends(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        servers = self._parse_servers(params.get("BackendServers"), required=True)
        self._require_present(group, servers)
        for server in servers:
            removed = group.backends.pop(server.key)
            self._note(group, "removed", removed, removed.weight)
        return self._group_payload(group)

    def _set_vserver_group_attribute(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        servers = self._parse_servers(params.get("BackendServers"), required=False)
        self._require_present(group, servers)
        if "VServerGroupName" in params:
            group.name = params["VServerGroupName"]
        for server in servers:
            current = group.backends[server.key]
            update: dict[str, Any] = {}
            if server.weight is not None:
                update["weight"] = server.weight
            if server.description is not None:
                update["description"] = server.description
            self._put(group, current.model_copy(update=update))
        return {**self._group_payload(group), "VServerGroupName": group.name}

    def _modify_backends(self, params: Mapping[str, str]) -> dict[str, Any]:
        group = self._group(params)
        old = self._parse_servers(params.get("OldBackendServers"), required=True)
        new = self._parse_servers(params.get("NewBackendServers"), required=True)
        self._require_present(group, old)
        leaving = {s.key for s in old}
        for server in new:
            if server.key in group.backends and server.key not in leaving:
                self._rejected_duplicates.append((group.id, server.key))
                raise _APIError(CODE_BACKEND_ALREADY_EXISTS)
        for key in leaving:
            removed = group.backends.pop(key)
            self._note(group, "removed", removed, removed.weight)
        return self._group_payload(group, self._insert(group, new))

    # ---- ids ----------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        return prefix + "".join(self._rng.choice(alphabet) for _ in range(20))

    def _new_request_id(self) -> str:
        digits = f"{self._rng.getrandbits(128):032X}"
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
