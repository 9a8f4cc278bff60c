"""HAProxy's runtime API (the stats socket), as the ``haproxy`` adapter speaks it.

``RuntimeAPI`` is one HAProxy instance: a unix socket, or a TCP socket with TLS client
certificates (HAProxy's runtime API has no authentication of its own: docs/haproxy.md,
"Securing the runtime API"). Each command is one connection in HAProxy's non-interactive mode:
the command line sent, the answer read to the end of the stream. Every command first takes a
token from the instance's API budget (``resourceconsist.budget``, account
``haproxy:<address>``) at its own priority, checks the pass's cancellation, and is bounded by a
deadline; every command is counted in the provider metrics (provider ``haproxy``).

Two kinds of failure, told apart because the adapter acts differently on each:

- ``RuntimeAPIUnavailable``: no answer (refused, reset, timed out, a TLS failure). A write's
  outcome is then unknown, and the adapter reads the instance again before it decides anything.
- ``RuntimeAPIRefused``: HAProxy answered with something else than the command's success
  answer; ``reason`` sorts the answers the adapter acts on (``Refusal``).

Why hand-written: the Python libraries for this API found (``haproxyadmin``, last released in
2021; ``haprapi`` 0.1) are small, unmaintained or young, speak no TLS, and would not take a
token from the budget or honour a pass's cancellation; the protocol itself is a line out and a
text back. ``show stat`` is parsed by its own header line, so a field HAProxy adds or moves is
harmless.
"""

from __future__ import annotations

import csv
import enum
import ipaddress
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, Literal

from resourceconsist.errors import ResourceConsistError
from resourceconsist.flow.budget import Priority, ProviderBudget, budget_for, current_priority
from resourceconsist.flow.cancellation import current_cancellation
from resourceconsist.flow.fence import check_fence
from resourceconsist.runtime.metrics import observe_provider_call, observe_provider_failure

#: The provider label of the metrics.
PROVIDER: Final = "haproxy"
#: Seconds one command may take, connection included, unless the client is told otherwise.
DEFAULT_TIMEOUT_SECONDS: Final = 5.0
#: The most an answer may hold (a ``show stat`` of tens of thousands of servers fits).
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024
#: What HAProxy allows in a proxy or server name (and nothing else reaches a command line).
NAME_RE: Final = re.compile(r"^[A-Za-z0-9._:-]+$")
#: One token of a server line's options: no space, no separator of commands (``;``), no quote.
OPTION_TOKEN_RE: Final = re.compile(r"^[A-Za-z0-9._:,/()+=@-]+$")


class RuntimeAPIError(ResourceConsistError):
    """A command of HAProxy's runtime API failed; ``address`` is the instance."""

    def __init__(self, address: str, command: str, message: str) -> None:
        super().__init__(f"HAProxy {address}: {command}: {message}")
        self.address = address
        self.command = command
        self.message = message


class RuntimeAPIUnavailable(RuntimeAPIError):
    """No answer from the instance: what a write did is unknown."""


class Refusal(enum.StrEnum):
    """Why HAProxy refused a command, for the answers the adapter acts on."""

    NO_SUCH_BACKEND = "NoSuchBackend"
    NO_SUCH_SERVER = "NoSuchServer"
    ALREADY_EXISTS = "ServerExists"
    STATIC_BACKEND = "StaticBalance"
    NOT_IN_MAINTENANCE = "NotInMaintenance"
    HAS_CONNECTIONS = "ServerHasConnections"
    PERMISSION_DENIED = "PermissionDenied"
    OTHER = "Refused"

    @property
    def transient(self) -> bool:
        """A later try may succeed without anyone changing HAProxy's configuration."""
        return self in (Refusal.HAS_CONNECTIONS, Refusal.NOT_IN_MAINTENANCE, Refusal.ALREADY_EXISTS)


#: HAProxy's answers (2.6), to the refusal they mean.
_REFUSALS: Final[tuple[tuple[str, Refusal], ...]] = (
    ("no such backend", Refusal.NO_SUCH_BACKEND),
    ("can't find backend", Refusal.NO_SUCH_BACKEND),
    ("no such server", Refusal.NO_SUCH_SERVER),
    ("already exists a server", Refusal.ALREADY_EXISTS),
    ("dynamic load balancing", Refusal.STATIC_BACKEND),
    ("only servers in maintenance", Refusal.NOT_IN_MAINTENANCE),
    ("still has connections", Refusal.HAS_CONNECTIONS),
    ("permission denied", Refusal.PERMISSION_DENIED),
)


class RuntimeAPIRefused(RuntimeAPIError):
    """HAProxy answered a command with an error; ``reason`` says which kind."""

    def __init__(self, address: str, command: str, message: str) -> None:
        super().__init__(address, command, message)
        lowered = message.lower()
        self.reason = next((r for text, r in _REFUSALS if text in lowered), Refusal.OTHER)


# -- addresses and TLS ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeAddress:
    """Where an instance's runtime API listens: ``unix:/run/haproxy/admin.sock`` (or a bare
    path), ``tcp://host:port``, or ``tls://host:port`` (TCP with TLS and a client certificate)."""

    scheme: Literal["unix", "tcp", "tls"]
    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str) -> RuntimeAddress:
        """``ValueError`` saying what is wrong and what to write."""
        value = text.strip()
        if value.startswith("unix:"):
            value = value[len("unix:") :]
        if value.startswith("/"):
            return cls("unix", path=value)
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in ("tcp", "tls"):
            raise ValueError(
                f"{text!r} is not a runtime API address: write unix:/path/to/admin.sock, "
                "tcp://host:port or tls://host:port"
            )
        host, _, port_text = rest.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{text!r}: give a host and a port, e.g. {scheme}://10.0.0.5:9999")
        return cls("tcp" if scheme == "tcp" else "tls", host=host, port=int(port_text))

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True)
class RuntimeTLS:
    """The client side of a ``tls://`` runtime API: the CA that signed HAProxy's certificate,
    this controller's certificate and key (HAProxy's ``stats socket ... ssl crt ... ca-file ...
    verify required``), and the name HAProxy's certificate carries (default: the host).

    The files are read again when one of them changes on disk, so a rotated certificate (a
    Secret mounted as files) is used without a restart."""

    ca_file: str
    cert_file: str
    key_file: str
    server_name: str | None = None


class _TLSContexts:
    """One ``ssl.SSLContext`` for a ``RuntimeTLS``, made again when its files change."""

    def __init__(self, tls: RuntimeTLS) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] = ()
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        files = (self.tls.ca_file, self.tls.cert_file, self.tls.key_file)
        stamp = tuple(os.stat(f).st_mtime_ns for f in files)
        with self._lock:
            if self._context is None or stamp != self._stamp:
                context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls.ca_file)
                context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                self._context, self._stamp = context, stamp
            return self._context


# -- what ``show stat`` says -----------------------------------------------------------------------


@dataclass(frozen=True)
class ServerStat:
    """One server as ``show stat`` reports it (HAProxy's own words kept where they matter)."""

    backend: str
    name: str
    #: ``UP``, ``UP 1/2``, ``DOWN``, ``DOWN 1/2``, ``NOLB``, ``DRAIN``, ``MAINT``, ``no check``, ...
    status: str
    #: ``ip:port`` (``[ip6]:port``), as HAProxy prints it.
    addr: str
    #: The weight set on the server (``uweight``); 0..256.
    weight: int
    #: Sessions on it now, and requests queued for it.
    sessions: int
    queued: int
    #: Its idle connections (they keep ``del server`` waiting too).
    idle: int
    #: ``L4OK``, ``L7OK``, ``L4CON``, ``INI`` (no result yet), ... ; empty without health checks.
    check_status: str
    #: The health check's counter and the successes needed to be up; None without checks.
    check_health: int | None
    check_rise: int | None
    #: Seconds since the last change of state.
    last_change: int | None

    @property
    def maintenance(self) -> bool:
        return self.status.startswith("MAINT")

    @property
    def draining(self) -> bool:
        return self.status.startswith("DRAIN")

    @property
    def down(self) -> bool:
        """HAProxy's checks found it down: it gets no new traffic whatever its admin state (and
        ``set state drain`` leaves its status ``DOWN``, so a drain is never seen there)."""
        return self.status.startswith("DOWN")

    @property
    def checked(self) -> bool:
        """Health checks run on it."""
        return self.check_health is not None and bool(self.check_status)

    @property
    def check_passed(self) -> bool:
        """Its health check has counted enough successes to call it up (in maintenance too,
        where checks go on while no traffic is sent)."""
        if not self.checked:
            return False
        rise = self.check_rise or 1
        return self.check_health is not None and self.check_health >= rise and self.check_status != "INI"

    @property
    def up(self) -> bool:
        """HAProxy may send it new traffic now: up, and neither in maintenance nor draining."""
        return self.status in ("no check", "UP") or self.status.startswith("UP ")

    @property
    def host_port(self) -> tuple[str, int | None]:
        host, _, port = self.addr.rpartition(":")
        if not host:
            return self.addr, None
        return host.strip("[]"), int(port) if port.isdigit() else None


@dataclass(frozen=True)
class Stat:
    """One instance's backends (name -> balance algorithm) and servers, from one ``show stat``."""

    backends: Mapping[str, str]
    servers: tuple[ServerStat, ...]


def _int(value: str | None) -> int | None:
    return int(value) if value and value.lstrip("-").isdigit() else None


def parse_stat(text: str) -> Stat:
    """Parse ``show stat`` CSV by its header line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not a show stat answer: {text[:200]!r}")
    header = lines[0][2:].split(",")
    backends: dict[str, str] = {}
    servers: list[ServerStat] = []
    for row in csv.reader(lines[1:]):
        rec = dict(zip(header, row, strict=False))
        name = rec.get("svname", "")
        if name == "BACKEND":
            backends[rec.get("pxname", "")] = rec.get("algo", "")
        elif name and name != "FRONTEND":
            servers.append(
                ServerStat(
                    backend=rec.get("pxname", ""),
                    name=name,
                    status=rec.get("status", ""),
                    addr=rec.get("addr", ""),
                    weight=_int(rec.get("uweight")) or _int(rec.get("weight")) or 0,
                    sessions=_int(rec.get("scur")) or 0,
                    queued=_int(rec.get("qcur")) or 0,
                    idle=_int(rec.get("idle_conn_cur")) or 0,
                    check_status=rec.get("check_status", ""),
                    check_health=_int(rec.get("check_health")),
                    check_rise=_int(rec.get("check_rise")),
                    last_change=_int(rec.get("lastchg")),
                )
            )
    return Stat(backends=backends, servers=tuple(servers))


# -- the client -------------------------------------------------------------------------------------


def check_name(kind: str, name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(
            f"{kind} name {name!r} has characters HAProxy does not allow (letters, digits, . _ : -)"
        )
    return name


def server_address(ip: str, port: int) -> str:
    """``ip:port`` as a server line takes it (``[ip6]:port`` for IPv6)."""
    parsed = ipaddress.ip_address(ip)
    return f"[{parsed}]:{port}" if parsed.version == 6 else f"{parsed}:{port}"


ServerState = Literal["ready", "drain", "maint"]


class RuntimeAPI:
    """One HAProxy instance's runtime API (thread-safe: every command has its own connection)."""

    def __init__(
        self,
        address: RuntimeAddress | str,
        *,
        tls: RuntimeTLS | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        budget: ProviderBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address if isinstance(address, RuntimeAddress) else RuntimeAddress.parse(address)
        if self.address.scheme == "tls" and tls is None:
            raise ValueError(f"{self.address} needs the TLS client settings (CA, certificate, key)")
        self._tls = _TLSContexts(tls) if tls is not None and self.address.scheme == "tls" else None
        if not timeout > 0:
            raise ValueError(f"timeout {timeout!r} must be a number of seconds above 0")
        self.timeout = timeout
        self.budget = budget or budget_for(f"{PROVIDER}:{self.address}")
        self._clock = clock

    def __repr__(self) -> str:
        return f"RuntimeAPI({str(self.address)!r})"

    @property
    def name(self) -> str:
        return str(self.address)

    # -- commands ---------------------------------------------------------------------------------

    def stat(self) -> Stat:
        """Every backend and server of the instance (``show stat -1 6 -1``: backends and servers)."""
        answer = self.run("show stat -1 6 -1", operation="show stat")
        try:
            return parse_stat(answer)
        except ValueError as err:
            raise RuntimeAPIRefused(self.name, "show stat", answer.strip() or str(err)) from None

    def add_server(self, backend: str, server: str, addr: str, options: Sequence[str]) -> None:
        """``add server``: the server starts in maintenance (HAProxy's rule)."""
        for token in options:
            if not OPTION_TOKEN_RE.match(token):
                raise ValueError(f"server option {token!r} has characters a command line cannot carry")
        line = " ".join(["add server", f"{_checked(backend, server)} {addr}", *options])
        self._write(line, "add server", "New server registered.", Priority.REGISTER)

    def enable_health(self, backend: str, server: str) -> None:
        self._write(f"enable health {_checked(backend, server)}", "enable health", "", Priority.REGISTER)

    def set_state(self, backend: str, server: str, state: ServerState) -> None:
        """``set server ... state``: ``ready`` sends it traffic, ``drain`` no new traffic,
        ``maint`` none at all (established connections go on in both)."""
        priority = Priority.REGISTER if state == "ready" else Priority.REMOVE_TRAFFIC
        self._write(
            f"set server {_checked(backend, server)} state {state}", f"set state {state}", "", priority
        )

    def set_weight(self, backend: str, server: str, weight: int) -> None:
        if not 0 <= weight <= 256:
            raise ValueError(f"weight {weight} is not within 0..256")
        priority = Priority.REMOVE_TRAFFIC if weight == 0 else Priority.REGISTER
        self._write(f"set server {_checked(backend, server)} weight {weight}", "set weight", "", priority)

    def shutdown_sessions(self, backend: str, server: str) -> None:
        line = f"shutdown sessions server {_checked(backend, server)}"
        self._write(line, "shutdown sessions", "", Priority.REMOVE_TRAFFIC)

    def del_server(self, backend: str, server: str) -> None:
        self._write(
            f"del server {_checked(backend, server)}",
            "del server",
            "Server deleted.",
            Priority.REMOVE_TRAFFIC,
        )

    def info(self) -> dict[str, str]:
        """``show info``: the process's facts (``Pid``, ``Uptime_sec``, ``Version``, ...)."""
        answer = self.run("show info", operation="show info")
        found: dict[str, str] = {}
        for line in answer.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                found[key.strip()] = value.strip()
        return found

    def _write(self, line: str, operation: str, success: str, priority: Priority) -> None:
        answer = self.run(line, priority=priority, operation=operation).strip()
        if answer != success:
            observe_provider_failure(PROVIDER, operation, "refused")
            raise RuntimeAPIRefused(self.name, line, answer or "(empty answer)")

    # -- the wire ---------------------------------------------------------------------------------

    def run(self, line: str, *, priority: Priority | None = None, operation: str = "") -> str:
        """Send one command line and return HAProxy's whole answer (text)."""
        if "\n" in line or ";" in line or "\r" in line:
            raise ValueError(f"one command a line, without ';': {line!r}")
        operation = operation or line.split(" ", 1)[0]
        cancellation = current_cancellation()
        # A stop ends the wait for the budget (PassCancelled), and nothing is sent after it.
        self.budget.spend(current_priority() if priority is None else priority)
        cancellation.check()
        remaining = cancellation.remaining()
        timeout = self.timeout if remaining is None else min(self.timeout, remaining)
        started = self._clock()
        code: str | None = None
        try:
            with self._connection(timeout) as sock:
                if not line.startswith("show "):
                    # A change sent for a Lease no longer surely held could undo what its new
                    # holder did: checked in the step that sends it (resourceconsist/flow/fence.py).
                    check_fence()
                sock.sendall(line.encode() + b"\n")
                chunks: list[bytes] = []
                size = 0
                deadline = started + timeout
                while True:
                    left = deadline - self._clock()
                    if left <= 0:
                        raise TimeoutError("no complete answer in time")
                    sock.settimeout(left)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise OSError(f"answer longer than {MAX_ANSWER_BYTES} bytes")
            if not chunks:
                # HAProxy ends every answer with a newline, an empty one too: nothing at all is a
                # connection that broke before the answer, whatever the command did.
                raise ConnectionAbortedError("the connection closed without an answer")
            return b"".join(chunks).decode("utf-8", "replace")
        except (OSError, ssl.SSLError) as err:
            code = type(err).__name__
            observe_provider_failure(PROVIDER, operation, code)
            raise RuntimeAPIUnavailable(self.name, line, _describe(err)) from None
        finally:
            observe_provider_call(PROVIDER, operation, code, self._clock() - started)

    @contextmanager
    def _connection(self, timeout: float) -> Iterator[socket.socket]:
        address = self.address
        sock: socket.socket
        if address.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(address.path)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection((address.host, address.port), timeout=timeout)
            if self._tls is not None:
                try:
                    context = self._tls.context()
                    server_name = self._tls.tls.server_name or address.host
                    sock = context.wrap_socket(sock, server_hostname=server_name)
                except BaseException:
                    sock.close()
                    raise
        try:
            yield sock
        finally:
            sock.close()


def _checked(backend: str, server: str) -> str:
    return f"{check_name('backend', backend)}/{check_name('server', server)}"


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (is HAProxy running, and is this its stats socket?)"
    if isinstance(err, FileNotFoundError):
        return "no such socket (is HAProxy running, and is this its stats socket?)"
    if isinstance(err, PermissionError):
        return "permission denied on the socket (its mode and owner must let this controller connect)"
    return f"{type(err).__name__}: {err}"


@dataclass
class Instances:
    """The HAProxy instances one adapter keeps in step (an HA pair, or one)."""

    apis: tuple[RuntimeAPI, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        names = [api.name for api in self.apis]
        if len(set(names)) != len(names):
            raise ValueError(f"an instance is named twice: {', '.join(names)}")

    def __iter__(self) -> Iterator[RuntimeAPI]:
        return iter(self.apis)

    def __len__(self) -> int:
        return len(self.apis)
