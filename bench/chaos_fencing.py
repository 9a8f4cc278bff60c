"""The fencing measurement of ``make chaos`` (docs/chaos.md, "Freezes"): which requests reached a
server after their sender's Lease deadline, counted from the servers' own records.

Every replica of the freeze phases runs under its own identity: its own ServiceAccount token at
the API server, its own STS key at the SLB emulator (issued for a role session named after it).
Two records are read, both kept by the servers, never by the replicas:

* the API server's audit log (``AuditTail``): per request its user, verb, object, response code
  and the moment the server received it; for Service patches also the body, by which a sharder's
  label write (an assignment, a drain) is told from a shard's (letting go);
* the SLB emulator's request log (``RequestLog``): per call the session of the key that signed
  it, the action and the moment it arrived.

``judge`` works out, per identity and per Lease it acts for, the Lease's deadline at any moment:
its last successful write of that Lease (a create, update or patch answered 2xx, as the API server
stamped its arrival) plus the lease duration. A request is late when it reached its server after
the deadline of the Lease it was made for: a shard's or leader's writes and provider calls for its
own shard or leader Lease; the sharder's Lease take-overs and deletions and its label writes for
the sharder's Lease. The Lease writes of its own elections are not counted (they are how a Lease
is held). Provider writes (the mutating actions) are what the target of 0 is about; provider reads
after the deadline are counted beside them (a read changes nothing, and the fence guards writes:
docs/concepts.md, "Fencing"). A late request is also marked when another identity had written
that Lease since the sender's own last write: it was sent while someone else owned the Lease (two
owners acting at once).

``takeovers`` gives, per freeze, who took over each Lease the frozen replica held when it was
stopped, and how many seconds after the SIGSTOP (the other's first accepted write of that Lease).
"""

from __future__ import annotations

import datetime
import json
import threading
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resourceconsist.adapters.alibabacloudslb.emulator_server import AdminError, EmulatorAdmin
from resourceconsist.adapters.alibabacloudslb.slbclient import MUTATING_ACTIONS
from resourceconsist.runtime.sharding.ring import drain_label, shard_label

#: Verbs that change something at the API server.
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def audit_policy(namespace: str) -> dict[str, Any]:
    """The chaos run's audit policy: nothing of the admin certificate's users (the driver, the
    observers, the other phases' controllers), the bodies of the replicas' Service patches, the
    rest of the replicas' requests at Metadata level."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [
            {"level": "None", "userGroups": ["system:masters"]},
            {
                "level": "Request",
                "userGroups": [f"system:serviceaccounts:{namespace}"],
                "verbs": ["patch", "update"],
                "resources": [{"group": "", "resources": ["services"]}],
            },
            {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{namespace}"]},
            {"level": "None"},
        ],
    }


def _stamp(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class ApiRequest:
    """One request of a replica as the API server's audit log has it."""

    identity: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    #: Wall-clock seconds when the API server received it.
    received: float
    body: Mapping[str, Any] | None = None

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def accepted(self) -> bool:
        return 200 <= self.code < 300

    def describe(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        changed = ""
        if self.body is not None:
            meta = self.body.get("metadata") or {}
            labels = meta.get("labels") or {}
            parts = [f"{k.rsplit('/', 1)[0].split('.', 1)[0]}={v}" for k, v in labels.items()]
            parts += [k for k in ("annotations", "finalizers") if k in meta]
            changed = f" [{', '.join(parts)}]" if parts else ""
        return f"{self.verb} {what} {self.name}{changed} ({self.code})"


class AuditTail:
    """The API server's audit log, read as it grows; keeps the requests of the users named
    ``system:serviceaccount:<namespace>:<identity>``."""

    def __init__(self, path: Path, namespace: str) -> None:
        self.path = path
        self.prefix = service_account_user(namespace, "")
        self._needle = f'"username":"{self.prefix}'.encode()
        self._offset = 0
        self._partial = b""
        self.requests: list[ApiRequest] = []

    def read(self) -> list[ApiRequest]:
        """The requests logged since the last read (also appended to ``requests``)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        new = [r for line in lines if self._needle in line and (r := self._parse(line)) is not None]
        self.requests.extend(new)
        return new

    def _parse(self, line: bytes) -> ApiRequest | None:
        event = json.loads(line)
        user = str((event.get("user") or {}).get("username") or "")
        if not user.startswith(self.prefix):
            return None
        ref = event.get("objectRef") or {}
        body = event.get("requestObject")
        return ApiRequest(
            identity=user[len(self.prefix) :],
            verb=str(event.get("verb") or ""),
            resource=str(ref.get("resource") or ""),
            subresource=str(ref.get("subresource") or ""),
            namespace=str(ref.get("namespace") or ""),
            name=str(ref.get("name") or ""),
            code=int((event.get("responseStatus") or {}).get("code") or 0),
            received=_stamp(str(event["requestReceivedTimestamp"])),
            body=body if isinstance(body, dict) else None,
        )


@dataclass(frozen=True)
class ProviderCall:
    """One SLB call of a replica as the emulator's request log has it."""

    identity: str
    action: str
    received: float
    code: str | None
    group: str

    @property
    def write(self) -> bool:
        return self.action in MUTATING_ACTIONS

    def describe(self) -> str:
        return f"{self.action} {self.group} ({self.code or 'ok'})"


class RequestLog:
    """The SLB emulator's request log, fetched in the background (the emulator keeps the newest
    calls only): the calls signed by STS keys, by the session they were issued for."""

    def __init__(self, admin: EmulatorAdmin, interval: float = 0.5) -> None:
        self.admin = admin
        self.interval = interval
        self.calls: list[ProviderCall] = []
        #: Calls the emulator dropped before they were fetched (a gap in the sequence).
        self.missed = 0
        self._last = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)

    @property
    def last(self) -> int:
        """The sequence number of the last call fetched."""
        return self._last

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.fetch()

    def fetch(self) -> None:
        with self._lock:
            try:
                entries, _, last = self.admin.requests(self._last)
            except AdminError:
                return
            if entries and entries[0]["seq"] > self._last + 1:
                self.missed += entries[0]["seq"] - self._last - 1
            self._last = last
            self.calls.extend(
                ProviderCall(
                    str(e["session"]),
                    str(e["action"]),
                    float(e["received"]),
                    e["code"],
                    str((e.get("params") or {}).get("VServerGroupId") or ""),
                )
                for e in entries
                if e["session"]
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.fetch()


# ---- the judgement -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """A replica of a freeze phase: its name (ServiceAccount, STS session, POD_NAME), the phase,
    and the Leases it acts for."""

    name: str
    phase: str
    #: The Lease its controllers act for (leader election's, or its shard Lease).
    controller_lease: str
    #: The sharder's Lease, when it may run the sharder.
    sharder_lease: str | None = None
    #: The ring whose labels its sharder writes.
    ring: str | None = None

    @property
    def own_leases(self) -> set[str]:
        return {self.controller_lease} | ({self.sharder_lease} if self.sharder_lease else set())


@dataclass(frozen=True)
class Freeze:
    """One SIGSTOP ... SIGCONT of a replica, wall-clock seconds."""

    identity: str
    phase: str
    role: str
    aim: str
    stopped: float
    resumed: float


@dataclass
class Late:
    """A request that reached its server after its sender's deadline for the Lease it acted for."""

    identity: str
    where: str  # "api" or "provider"
    lease: str
    what: str
    kind: str
    received: float
    #: Seconds past the deadline; None: the identity never held that Lease before.
    past_deadline: float | None
    #: Seconds after the sender's last SIGCONT before it (None: never frozen before it).
    after_resume: float | None
    accepted: bool
    write: bool
    #: Another identity had written the Lease since the sender's own last write of it.
    after_takeover: bool = False


@dataclass
class Verdict:
    """One identity's requests, and the late ones."""

    identity: str
    phase: str
    frozen: int = 0
    lease_writes: int = 0
    api_writes: int = 0
    provider_writes: int = 0
    provider_reads: int = 0
    late: list[Late] = field(default_factory=list)

    def count(
        self,
        where: str,
        *,
        write: bool = True,
        accepted: bool | None = None,
        after_takeover: bool | None = None,
    ) -> int:
        return sum(
            1
            for item in self.late
            if item.where == where
            and item.write == write
            and (accepted is None or item.accepted == accepted)
            and (after_takeover is None or item.after_takeover == after_takeover)
        )

    def sharder(self, kind: str, *, accepted: bool | None = None) -> int:
        return sum(
            1 for item in self.late if item.kind == kind and (accepted is None or item.accepted == accepted)
        )


def sharder_act(request: ApiRequest, identity: Identity) -> str | None:
    """What sharder write ``request`` is ("assign", "drain", "take-over", "delete-lease"), None:
    not one. A shard lets go of a Service by removing both labels: not a sharder write."""
    if identity.sharder_lease is None or identity.ring is None:
        return None
    if request.resource == "leases" and request.name not in identity.own_leases:
        return "delete-lease" if request.verb == "delete" else "take-over"
    if request.resource == "services" and request.verb in ("patch", "update") and request.body:
        labels = (request.body.get("metadata") or {}).get("labels") or {}
        if labels.get(shard_label(identity.ring)):
            return "assign"
        if labels.get(drain_label(identity.ring)) == "true":
            return "drain"
    return None


def lease_writes(api: Iterable[ApiRequest]) -> dict[str, list[tuple[float, str]]]:
    """Per Lease name: its accepted writes (create, update, patch) by any replica, as (moment
    received, identity), in time order."""
    writes: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in api:
        if r.resource == "leases" and r.verb in ("create", "update", "patch") and r.accepted:
            writes[r.name].append((r.received, r.identity))
    for line in writes.values():
        line.sort()
    return writes


def _last_writer(line: list[tuple[float, str]], moment: float) -> str | None:
    """Who wrote the Lease last before ``moment`` (None: nobody)."""
    at = bisect_right(line, (moment, "\uffff")) - 1
    return None if at < 0 else line[at][1]


@dataclass(frozen=True)
class Takeover:
    """A Lease the frozen replica acted for and held when it was stopped, and who took it over."""

    identity: str
    role: str
    lease: str
    #: "leader", "shard" (the replica's own shard Lease) or "sharder".
    kind: str
    stopped: float
    #: The identity whose accepted write of the Lease came first after the SIGSTOP (None: none).
    by: str | None
    #: Seconds from the SIGSTOP to that write.
    seconds: float | None


def takeovers(
    identities: Iterable[Identity], api: Iterable[ApiRequest], freezes: Iterable[Freeze]
) -> list[Takeover]:
    """Per freeze, each Lease its replica acts for (a leader's, its own shard Lease, the
    sharder's) that it had written last before the SIGSTOP, and the first accepted write of it
    by another identity after."""
    writes = lease_writes(api)
    known = {identity.name: identity for identity in identities}
    found: list[Takeover] = []
    for freeze in freezes:
        identity = known.get(freeze.identity)
        if identity is None:
            continue
        for lease in sorted(identity.own_leases):
            line = writes.get(lease, [])
            if _last_writer(line, freeze.stopped) != freeze.identity:
                continue
            kind = "sharder" if lease == identity.sharder_lease else ("shard" if identity.ring else "leader")
            after = [(t, who) for t, who in line if t > freeze.stopped and who != freeze.identity]
            by, seconds = (after[0][1], after[0][0] - freeze.stopped) if after else (None, None)
            found.append(Takeover(freeze.identity, freeze.role, lease, kind, freeze.stopped, by, seconds))
    return found


class _Deadlines:
    """When each Lease of an identity was last written successfully, at any moment."""

    def __init__(self, requests: Iterable[ApiRequest], identity: Identity, lease_seconds: float) -> None:
        self.seconds = lease_seconds
        stamps: dict[str, list[float]] = defaultdict(list)
        for r in requests:
            if (
                r.resource == "leases"
                and r.name in identity.own_leases
                and r.verb in ("create", "update", "patch")
                and r.accepted
            ):
                stamps[r.name].append(r.received)
        self.stamps = {lease: sorted(times) for lease, times in stamps.items()}

    def past(self, lease: str, moment: float) -> tuple[bool, float | None]:
        """(late, seconds past the deadline) for a request of ``lease`` received at ``moment``."""
        times = self.stamps.get(lease, [])
        at = bisect_right(times, moment) - 1
        if at < 0:
            return True, None
        over = moment - (times[at] + self.seconds)
        return over > 0, over


def judge(
    identities: Iterable[Identity],
    api: Iterable[ApiRequest],
    provider: Iterable[ProviderCall],
    freezes: Iterable[Freeze],
    lease_seconds: float,
) -> list[Verdict]:
    """Per identity: its requests, and those that reached a server after its deadline."""
    by_identity: dict[str, list[ApiRequest]] = defaultdict(list)
    calls: dict[str, list[ProviderCall]] = defaultdict(list)
    for call in provider:
        calls[call.identity].append(call)
    resumes: dict[str, list[float]] = defaultdict(list)
    frozen: dict[str, int] = defaultdict(int)
    for freeze in freezes:
        resumes[freeze.identity].append(freeze.resumed)
        frozen[freeze.identity] += 1
    every = list(api)
    owners = lease_writes(every)
    for request in every:
        by_identity[request.identity].append(request)

    def taken(lease: str, sender: str, moment: float) -> bool:
        writer = _last_writer(owners.get(lease, []), moment)
        return writer is not None and writer != sender

    verdicts: list[Verdict] = []
    for identity in identities:
        mine = sorted(by_identity.get(identity.name, []), key=lambda r: r.received)
        deadlines = _Deadlines(mine, identity, lease_seconds)
        verdict = Verdict(identity.name, identity.phase, frozen=frozen[identity.name])
        thawed = sorted(resumes[identity.name])
        for request in mine:
            if not request.write:
                continue
            if request.resource == "leases" and request.name in identity.own_leases:
                verdict.lease_writes += 1
                continue
            verdict.api_writes += 1
            act = sharder_act(request, identity)
            lease = identity.controller_lease
            if act is not None and identity.sharder_lease is not None:
                lease = identity.sharder_lease
            late, over = deadlines.past(lease, request.received)
            if late:
                verdict.late.append(
                    Late(
                        identity.name,
                        "api",
                        lease,
                        request.describe(),
                        act or request.resource,
                        request.received,
                        over,
                        _after(thawed, request.received),
                        request.accepted,
                        True,
                        taken(lease, identity.name, request.received),
                    )
                )
        for call in sorted(calls.get(identity.name, []), key=lambda c: c.received):
            if call.write:
                verdict.provider_writes += 1
            else:
                verdict.provider_reads += 1
            late, over = deadlines.past(identity.controller_lease, call.received)
            if late:
                verdict.late.append(
                    Late(
                        identity.name,
                        "provider",
                        identity.controller_lease,
                        call.describe(),
                        call.action,
                        call.received,
                        over,
                        _after(thawed, call.received),
                        call.code is None,
                        call.write,
                        taken(identity.controller_lease, identity.name, call.received),
                    )
                )
        verdicts.append(verdict)
    return verdicts


def after_freeze(verdicts: Iterable[Verdict], freeze: Freeze, following: float | None) -> list[Late]:
    """The late requests of ``freeze``'s replica that reached a server from its SIGCONT until its
    next freeze's SIGSTOP (``following``; None: the end of the run)."""
    return [
        item
        for verdict in verdicts
        if verdict.identity == freeze.identity
        for item in verdict.late
        if item.received >= freeze.resumed and (following is None or item.received < following)
    ]


def _after(resumes: list[float], moment: float) -> float | None:
    """Seconds from the last of ``resumes`` (sorted) before ``moment`` to it; None: none before."""
    at = bisect_right(resumes, moment) - 1
    return None if at < 0 else moment - resumes[at]


def as_json(verdicts: list[Verdict], freezes: list[Freeze], taken: list[Takeover]) -> dict[str, Any]:
    return {
        "freezes": [asdict(f) for f in freezes],
        "takeovers": [asdict(t) for t in taken],
        "identities": [asdict(v) for v in verdicts],
    }
