"""A real HAProxy for tests, the pods' HTTP servers it checks and routes to, and a fault proxy in
front of its runtime API (docs/testing.md, "A real HAProxy").

- ``LocalHAProxy``: Debian's ``haproxy`` binary (``apt-get install haproxy``; ``.ci/run`` and
  ``make setup`` install it) started in the foreground on loopback, with a generated
  configuration in its own temporary directory: one HTTP frontend per backend on a free port,
  its runtime API on a unix socket of mode 600 (``level admin``) and, with ``tls=True``, also
  over TLS on a TCP port that asks for a client certificate signed by its own CA
  (``client_files()``): a ``listen`` section of mode tcp terminating TLS and relaying to the unix
  socket (Debian's 2.6 accepts ``ssl`` on a ``stats socket`` line but speaks plain text there).
  ``restart()`` stops and starts it again on the same sockets and ports: a new process that lost
  every server added at runtime, as a reload does. ``stop()`` removes everything; the process is
  killed with the test process too.
- ``PodServers``: small real HTTP/1.1 servers, one per pod IP on loopback (``127.0.0.x``, routed
  by Linux without any set-up), answering ``/`` with 200 and the pod's name, ``/sleep/<s>`` the
  same after ``s`` seconds (a long request), and ``/healthz`` with 200 or 503 (``set_healthy``);
  ``stop(ip)`` closes one, so HAProxy's checks really fail.
- ``SocketProxy``: a unix socket that forwards each runtime API connection to HAProxy's, and on
  demand delays it, refuses it, drops it before or after HAProxy acted, or never answers; it
  records every command it saw.

Nothing here imports an adapter: an adapter author's tests may use it for any HAProxy client.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from resourceconsist.cluster import certs
from resourceconsist.testing.controlplane import ControlPlaneError, _die_with_parent, free_port, set_priority

#: The Debian package that brings the binary.
HAPROXY_PACKAGE = "haproxy"
_TMP_PREFIX = "resourceconsist-haproxy-"


class HAProxyMissing(ControlPlaneError):
    """No ``haproxy`` binary on this machine."""


def find_haproxy() -> Path:
    """The ``haproxy`` binary: ``$HAPROXY_BIN``, else the one on ``PATH`` or in ``/usr/sbin``."""
    explicit = os.environ.get("HAPROXY_BIN")
    found = (
        explicit
        or shutil.which("haproxy")
        or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    )
    if not found or not Path(found).exists():
        raise HAProxyMissing(
            "no haproxy binary: install Debian's package (apt-get install haproxy; make setup and "
            ".ci/run do), or point HAPROXY_BIN at one"
        )
    return Path(found)


@dataclass(frozen=True)
class Backend:
    """One backend of the generated configuration, with an HTTP frontend of its own."""

    name: str
    balance: str = "roundrobin"
    #: ``option httpchk GET <path>`` when set: health checks ask the pods' ``/healthz``.
    httpchk: str | None = "/healthz"


class LocalHAProxy:
    """A real HAProxy on loopback (see the module doc); ``with LocalHAProxy(["web"]) as h:``."""

    def __init__(
        self,
        backends: list[str | Backend] | None = None,
        *,
        tls: bool = False,
        retries: int = 0,
        log_failures: bool = False,
        start_timeout: float = 20.0,
        niceness: int = 0,
    ) -> None:
        self.backends = [b if isinstance(b, Backend) else Backend(b) for b in backends or ["web"]]
        self.tls = tls
        self.retries = retries
        self.log_failures = log_failures
        self.start_timeout = start_timeout
        #: HAProxy's scheduling priority (``set_priority``): a negative value, under a benchmark,
        #: lets it stand for a load balancer on a machine of its own, which the node's work never
        #: delays.
        self.niceness = niceness
        self.ports: dict[str, int] = {}
        self.tls_port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- where things are -----------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise ControlPlaneError("HAProxy is not started")
        return self._dir

    @property
    def socket(self) -> Path:
        """The runtime API's unix socket."""
        return self.dir / "admin.sock"

    @property
    def address(self) -> str:
        """The runtime API as an address: ``unix:<socket>``."""
        return f"unix:{self.socket}"

    @property
    def tls_address(self) -> str:
        if self.tls_port is None:
            raise ControlPlaneError("HAProxy was started without tls=True")
        return f"tls://127.0.0.1:{self.tls_port}"

    def client_files(self, name: str = "controller") -> tuple[Path, Path, Path]:
        """(CA, certificate, key) of a client certificate the TLS runtime API accepts."""
        pair = certs.make_signed(self._ca(), name, server=False, client=True)
        cert, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        key.chmod(0o600)
        return self.dir / "ca.crt", cert, key

    def url(self, backend: str = "web", path: str = "/") -> str:
        """The HTTP frontend of ``backend``."""
        return f"http://127.0.0.1:{self.ports[backend]}{path}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    # -- life ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration (first start: new ports and certificates) and start HAProxy;
        returns once its runtime API answers."""
        binary = find_haproxy()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-"))
            self.ports = {b.name: free_port() for b in self.backends}
            if self.tls:
                self.tls_port = free_port()
                self._write_tls()
            (self.dir / "haproxy.cfg").write_text(self._config())
        self._log = open(self.dir / "haproxy.log", "ab")  # noqa: SIM115 - closed in _terminate
        self._proc = subprocess.Popen(
            [str(binary), "-db", "-f", str(self.dir / "haproxy.cfg")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.dir,
            start_new_session=True,
            preexec_fn=self._prepare_child,  # noqa: PLW1509 - death signal and priority only
        )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                raise ControlPlaneError(
                    f"haproxy exited at start ({self._proc.returncode}):\n{self.log_tail()}"
                )
            try:
                if self.command("show info").startswith("Name: HAProxy"):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self._terminate()
                raise ControlPlaneError(
                    f"haproxy did not answer within {self.start_timeout:g}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop HAProxy and remove its directory."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self) -> None:
        """Stop HAProxy and start it again with the same configuration, sockets and ports: the new
        process knows only the configuration's servers (as after a reload)."""
        self._terminate()
        self.start()

    def kill(self) -> None:
        """SIGKILL HAProxy and leave it down (``start()`` brings it back)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
        self._terminate()

    def _terminate(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_lines(self, start: int = 0) -> tuple[list[str], int]:
        """HAProxy's log from byte ``start`` on, and the offset after it: with
        ``log_failures=True``, one line per request that did not end normally (``failed_requests``
        reads them)."""
        try:
            with open(self.dir / "haproxy.log", "rb") as log:
                log.seek(start)
                data = log.read()
        except OSError:
            return [], start
        return data.decode(errors="replace").splitlines(), start + len(data)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.dir / "haproxy.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- the runtime API, for the tests' own looks ------------------------------------------------------

    def _prepare_child(self) -> None:
        _die_with_parent()
        if self.niceness:
            set_priority(self.niceness)

    def command(self, line: str, timeout: float = 5.0) -> str:
        """One runtime API command on the unix socket; HAProxy's whole answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self, backend: str | None = None) -> list[dict[str, str]]:
        """Every server (of ``backend``, when given) as ``show stat`` reports it, by field name."""
        import csv

        lines = [line for line in self.command("show stat -1 4 -1").splitlines() if line.strip()]
        header = lines[0][2:].split(",")
        rows = [dict(zip(header, row, strict=False)) for row in csv.reader(lines[1:])]
        return [r for r in rows if backend is None or r.get("pxname") == backend]

    # -- configuration --------------------------------------------------------------------------------------

    def _ca(self) -> certs.KeyPair:
        return certs.KeyPair((self.dir / "ca.crt").read_bytes(), (self.dir / "ca.key").read_bytes())

    def _write_tls(self) -> None:
        ca = certs.make_ca("resourceconsist-haproxy-test-ca")
        server = certs.make_signed(ca, "haproxy", hosts=("127.0.0.1", "localhost"))
        (self.dir / "ca.crt").write_bytes(ca.cert_pem)
        (self.dir / "ca.key").write_bytes(ca.key_pem)
        (self.dir / "server.pem").write_bytes(server.cert_pem + server.key_pem)
        for name in ("ca.key", "server.pem"):
            (self.dir / name).chmod(0o600)

    def _config(self) -> str:
        lines = [
            "global",
            f"    stats socket {self.dir / 'admin.sock'} mode 600 level admin",
        ]
        lines += [
            "    stats timeout 30s",
            "    maxconn 4096",
            "defaults",
            "    mode http",
            "    timeout connect 1s",
            "    timeout client 10s",
            "    timeout server 10s",
            f"    retries {self.retries}",
        ]
        if self.retries == 0:
            # Said out loud: no second try of any kind, so HAProxy hides no failure of a server.
            lines += ["    retry-on none", "    no option redispatch"]
        if self.log_failures:
            # Only the requests that did not end normally (an error status, a refused or reset
            # connection, no server), one line each, with HAProxy's termination state.
            lines[1:1] = ["    log stdout format raw local0"]
            lines += ["    log global", "    option httplog", "    option dontlog-normal"]
        if self.tls_port is not None:
            # Debian's 2.6 takes "ssl" on a "stats socket" line without a word and then speaks
            # plain text on it: TLS is terminated by a listener of its own that relays to the
            # unix socket (docs/haproxy.md, "Securing the runtime API").
            lines += [
                "listen runtime_api_tls",
                "    mode tcp",
                f"    bind 127.0.0.1:{self.tls_port} ssl crt {self.dir / 'server.pem'} "
                f"ca-file {self.dir / 'ca.crt'} verify required",
                f"    server cli unix@{self.dir / 'admin.sock'}",
            ]
        for backend in self.backends:
            lines += [
                f"frontend fe_{backend.name}",
                f"    bind 127.0.0.1:{self.ports[backend.name]}",
                f"    default_backend {backend.name}",
                f"backend {backend.name}",
                f"    balance {backend.balance}",
            ]
            if backend.httpchk:
                lines.append(f"    option httpchk GET {backend.httpchk}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FailedRequest:
    """One request HAProxy logged as not ended normally (``LocalHAProxy(log_failures=True)``): the
    server it went to (``<NOSRV>``: none was available), the status sent back, and HAProxy's
    termination state (``SC--``: the server refused the connection, or none was there; ``SH--``:
    the server closed it before answering; ``sH--``: it did not answer in time)."""

    backend: str
    server: str
    status: int
    state: str


_FAILED_LINE = re.compile(
    r"\] \S+ (?P<backend>[^/\s]+)/(?P<server>\S+) \S+ (?P<status>-?\d+) \S+ \S+ \S+ (?P<state>\S{4}) "
)


def failed_requests(lines: list[str]) -> list[FailedRequest]:
    """The requests of HAProxy's log lines (``LocalHAProxy.log_lines``); other lines are skipped."""
    found = []
    for line in lines:
        match = _FAILED_LINE.search(line)
        if match is not None:
            found.append(
                FailedRequest(match["backend"], match["server"], int(match["status"]), match["state"])
            )
    return found


# -- the pods' HTTP servers -------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _PodServer

    def do_GET(self) -> None:
        healthy = self.server.healthy
        if self.path.startswith("/healthz"):
            status, body = (200, b"ok") if healthy else (503, b"unhealthy")
        elif self.path.startswith("/sleep/"):
            # A long request: answered after the seconds the path names.
            time.sleep(float(self.path.rsplit("/", 1)[1]))
            self.server.served += 1
            status, body = 200, self.server.pod.encode()
        else:
            self.server.served += 1
            status, body = 200, self.server.pod.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the standard library's name
        """Quiet."""

    def handle(self) -> None:
        # A client (HAProxy shutting a connection) may go away mid-request.
        with contextlib.suppress(OSError):
            super().handle()


class _PodServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The standard library's backlog of 5 drops connections under a burst; their retries come
    # a second later, as timeouts no server of a real pod would cause.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], pod: str) -> None:
        super().__init__(address, _Handler)
        self.pod = pod
        self.healthy = True
        self.served = 0


class PodServers:
    """Real HTTP servers standing for pods, one per loopback IP, all on ``port``."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._servers: dict[str, tuple[_PodServer, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._next = 2

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_ip(self) -> str:
        """A loopback IP no server of this object used yet (``127.0.<n>.<m>``, beyond 127.0.0.1)."""
        with self._lock:
            n = self._next
            self._next += 1
        return f"127.0.{n // 250}.{n % 250 + 2}"

    def start(self, ip: str, pod: str = "") -> None:
        """Serve on ``ip:port`` (answers 200 with ``pod``'s name)."""
        server = _PodServer((ip, self.port), pod or ip)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        with self._lock:
            self._servers[ip] = (server, thread)

    def stop(self, ip: str) -> None:
        """Stop serving on ``ip``: connections are refused, so HAProxy's checks fail."""
        with self._lock:
            found = self._servers.pop(ip, None)
        if found is not None:
            server, thread = found
            server.shutdown()
            server.server_close()
            thread.join(5)

    def set_healthy(self, ip: str, healthy: bool) -> None:
        """``/healthz`` answers 200 (True) or 503 (False); ``/`` goes on answering 200."""
        with self._lock:
            self._servers[ip][0].healthy = healthy

    def served(self, ip: str) -> int:
        """Requests ``/`` that ``ip`` answered."""
        with self._lock:
            found = self._servers.get(ip)
        return found[0].served if found is not None else 0

    def close(self) -> None:
        for ip in list(self._servers):
            self.stop(ip)


# -- a fault proxy in front of the runtime API -------------------------------------------------------------

FaultMode = Literal["delay", "refuse", "drop", "drop_answer", "hang"]


@dataclass
class _Fault:
    mode: FaultMode
    match: str | None
    times: int | None
    seconds: float


@dataclass
class ProxiedCommand:
    """One command the proxy saw, and what it did with it (``forwarded``, or a fault's mode)."""

    line: str
    outcome: str
    at: float = field(default_factory=time.monotonic)


class SocketProxy:
    """A unix socket forwarding runtime API connections to ``target`` (a unix socket path), with
    faults on demand (``fault``); ``path`` is where clients connect."""

    def __init__(self, target: str | Path, path: str | Path | None = None) -> None:
        self.target = str(target)
        self._dir = (
            None if path is not None else tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}proxy-{os.getpid()}-")
        )
        self.path = str(path) if path is not None else os.path.join(self._dir or "", "proxy.sock")
        self.commands: list[ProxiedCommand] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._open()

    @property
    def address(self) -> str:
        return f"unix:{self.path}"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fault(
        self, mode: FaultMode, *, match: str | None = None, times: int | None = None, seconds: float = 0.0
    ) -> None:
        """From now on, commands starting with ``match`` (every one when None), ``times`` of them
        (every one when None): ``delay`` them ``seconds``, ``refuse`` connections (the socket is
        gone: no command reaches HAProxy), ``drop`` them unsent, send them and ``drop_answer``
        (HAProxy acted; the client gets no answer), or ``hang`` (never answer). ``refuse``
        applies to every connection, whatever ``match``."""
        with self._lock:
            self._faults.append(_Fault(mode, match, times, seconds))
        if mode == "refuse":
            self._close_listener()

    def clear(self) -> None:
        """No fault any more; a refusing proxy listens again."""
        with self._lock:
            self._faults.clear()
        if self._listener is None:
            self._open()

    def close(self) -> None:
        self._stop.set()
        self._close_listener()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def lines(self, outcome: str | None = "forwarded") -> list[str]:
        """The commands seen (with that outcome, when given), in order."""
        with self._lock:
            return [c.line for c in self.commands if outcome is None or c.outcome == outcome]

    def _open(self) -> None:
        with self._lock:
            if os.path.exists(self.path):
                os.unlink(self.path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            listener.listen(64)
            listener.settimeout(0.1)
            self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()

    def _close_listener(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _take(self, line: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.mode == "refuse" or (fault.match is not None and not line.startswith(fault.match)):
                    continue
                if fault.times is not None:
                    if fault.times <= 0:
                        continue
                    fault.times -= 1
                return fault
        return None

    def _record(self, line: str, outcome: str) -> None:
        with self._lock:
            self.commands.append(ProxiedCommand(line, outcome))

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            data = b""
            try:
                while b"\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
            except OSError:
                return
            line = data.split(b"\n", 1)[0].decode(errors="replace")
            fault = self._take(line)
            if fault is not None and fault.mode == "drop":
                self._record(line, "drop")
                return
            if fault is not None and fault.mode == "hang":
                self._record(line, "hang")
                self._stop.wait(60)
                return
            if fault is not None and fault.mode == "delay":
                self._stop.wait(fault.seconds)
            try:
                answer = _forward(self.target, data)
            except OSError:
                self._record(line, "target unreachable")
                return
            if fault is not None and fault.mode == "drop_answer":
                self._record(line, "drop_answer")
                return
            self._record(line, "forwarded")
            try:
                conn.sendall(answer)
            except OSError:
                return


def _forward(target: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        upstream.settimeout(30)
        upstream.connect(target)
        upstream.sendall(data)
        chunks = []
        while chunk := upstream.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
