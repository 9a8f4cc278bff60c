"""The SLB emulator served as its own process: the SDK's real HTTPS path plus an admin HTTP API.

``SLBEmulator`` (slb_emulator.py) is the one state machine; this module puts two loopback HTTP
servers around it, so that provider state outlives the controllers that talk to it:

* the SLB endpoint, HTTPS with a certificate from a CA made at start (its PEM is written to the
  work directory; the SDK trusts it through ``ALIBABA_CLOUD_CA_BUNDLE``), reached by the real SDK
  with ``ALIYUN_SLB_ENDPOINT=127.0.0.1:<port>``;
* the same HTTPS endpoint answers STS's ``AssumeRoleWithOIDC`` (RRSA: the credentials library
  speaks HTTPS only), and the SLB side accepts the temporary keys it issued until they expire;
* the admin API, plain HTTP, to create load balancers, set faults (rates per kind for reads
  and/or writes, latency, hang), throttle the account at a rate with SLB's own answer
  (``PUT /rate-limit``), and read the state, the timestamped backend history and the request log
  (each call's sender, by access key id and STS session, and when it arrived).

Run it as ``python -m resourceconsist.adapters.alibabacloudslb.emulator_server --port 0``; it
prints one JSON line (endpoint, admin URL, CA bundle, region, key pair) once it listens and serves
until SIGTERM. ``EmulatorAdmin`` is a client of the admin API. Usage: docs/chaos.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from resourceconsist.adapters.alibabacloudslb.emulator import FAULT_KINDS, READ_ACTIONS, SLBEmulator
from resourceconsist.adapters.alibabacloudslb.slbclient import MUTATING_ACTIONS
from resourceconsist.cluster import certs

__all__ = ["ACTION_SCOPES", "AdminError", "EmulatorAdmin", "EmulatorServer", "main"]

#: Names the admin API accepts for a set of actions, besides an explicit list.
ACTION_SCOPES: Final[Mapping[str, frozenset[str] | None]] = {
    "all": None,
    "reads": READ_ACTIONS,
    "writes": MUTATING_ACTIONS,
}

_JSON: Final = "application/json"
_MAX_BODY: Final = 1 << 20


class AdminError(Exception):
    """The admin API refused a request (bad input) or could not be reached."""


def _actions(value: Any) -> frozenset[str] | None:
    if value is None or isinstance(value, str):
        name = value or "all"
        if name not in ACTION_SCOPES:
            raise ValueError(
                f"actions {name!r} is none of {sorted(ACTION_SCOPES)} nor a list of action names"
            )
        return ACTION_SCOPES[name]
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return frozenset(value)
    raise ValueError('actions must be "all", "reads", "writes" or a list of action names')


def _number(body: Mapping[str, Any], name: str) -> float:
    value = body.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def apply_faults(emulator: SLBEmulator, body: Mapping[str, Any]) -> None:
    """Replace every fault of ``emulator`` with the admin API's fault document ``body``.

    ``{"rates": {"throttle": 0.1, "5xx": 0.1, "drop": 0.05, "execute_fail": 0.05},
    "actions": "all" | "reads" | "writes" | [names], "latency_seconds": 0.0, "hang": false}``
    """
    unknown = sorted(set(body) - {"rates", "actions", "latency_seconds", "hang"})
    if unknown:
        raise ValueError(f"unknown fault settings {unknown}: use rates, actions, latency_seconds, hang")
    rates = body.get("rates") or {}
    if not isinstance(rates, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in rates.values()
    ):
        raise ValueError(f"rates must map fault kinds {sorted(FAULT_KINDS)} to fractions")
    actions = _actions(body.get("actions"))
    latency = _number(body, "latency_seconds")
    hang = body.get("hang", False)
    if not isinstance(hang, bool):
        raise ValueError("hang must be true or false")
    emulator.clear_faults()
    emulator.set_fault_rates({str(k): float(v) for k, v in rates.items()}, actions=actions)
    if latency > 0:
        for action in sorted(actions) if actions is not None else [None]:
            emulator.set_latency(latency, action)
    if hang:
        emulator.hang(actions)


class _Quiet:
    """Request handlers that log nothing per request (a chaos run makes tens of thousands)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the base class names it so)
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        emulator: SLBEmulator,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.emulator = emulator
        self.tls = tls
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        # The handshake runs in the request's own thread, so a slow client holds up nobody.
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that reset or time out mid-request are part of the weather here, not errors.
        pass


class _SLBHandler(_Quiet, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._serve(None)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._serve(self.rfile.read(min(length, _MAX_BODY)))

    def _serve(self, body: bytes | None) -> None:
        answer = self.server.emulator.answer(
            self.command, self.path, self.headers.get("Content-Type", ""), body
        )
        if answer is None:
            self._reset()
            return
        data = answer.body.encode()
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reset(self) -> None:
        """Close with a TCP reset and no answer, as a dropped connection looks to the client."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass


class _AdminHandler(_Quiet, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        split = urlsplit(self.path)
        routes: dict[tuple[str, str], Callable[[Mapping[str, Any], Mapping[str, list[str]]], Any]] = {
            ("GET", "/healthz"): lambda _b, _q: {"ok": True},
            ("GET", "/state"): lambda _b, _q: self.server.emulator.state(),
            ("GET", "/history"): self._history,
            ("GET", "/calls"): self._calls,
            ("GET", "/requests"): self._requests,
            ("POST", "/load-balancers"): self._add_load_balancer,
            ("POST", "/vserver-groups"): self._add_vserver_group,
            ("PUT", "/faults"): self._set_faults,
            ("DELETE", "/faults"): self._clear_faults,
            ("PUT", "/rate-limit"): self._set_rate_limit,
            ("POST", "/sts/oidc-tokens"): self._accept_oidc_token,
            ("DELETE", "/sts/oidc-tokens"): self._revoke_oidc_token,
            ("GET", "/sts/keys"): lambda _b, _q: {
                "issued": self.server.emulator.issued_temporary_keys(),
                "uses": self.server.emulator.key_uses(),
            },
            ("POST", "/sts/expire"): self._expire_key,
            ("PUT", "/access-key"): self._rotate_access_key,
        }
        route = routes.get((method, split.path))
        if route is None:
            known = ", ".join(f"{m} {p}" for m, p in routes)
            self._send(404, {"error": f"no route {method} {split.path}; known: {known}"})
            return
        try:
            result = route(self._body(), parse_qs(split.query))
        except (ValueError, KeyError) as err:
            self._send(400, {"error": str(err).strip("'\"")})
            return
        self._send(200, result)

    def _body(self) -> Mapping[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            body = json.loads(self.rfile.read(min(length, _MAX_BODY)))
        except ValueError:
            raise ValueError("request body is not JSON") from None
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        return body

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _history(self, _body: Mapping[str, Any], query: Mapping[str, list[str]]) -> Any:
        raw = (query.get("since") or ["0"])[0]
        if not raw.isdigit():
            raise ValueError(f"since must be a change sequence number >= 0, not {raw!r}")
        changes = self.server.emulator.backend_changes(int(raw))
        return {"changes": [c.to_json() for c in changes], "last": changes[-1].seq if changes else int(raw)}

    def _requests(self, _body: Mapping[str, Any], query: Mapping[str, list[str]]) -> Any:
        raw = (query.get("since") or ["0"])[0]
        if not raw.isdigit():
            raise ValueError(f"since must be a request sequence number >= 0, not {raw!r}")
        emulator = self.server.emulator
        in_flight = emulator.calls_in_flight()
        calls = emulator.requests(int(raw))
        return {
            "requests": [c.to_json() for c in calls],
            "in_flight": [c.to_json() for c in in_flight],
            "last": calls[-1].seq if calls else int(raw),
        }

    def _calls(self, _body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        counts = self.server.emulator.call_counts()
        return {"counts": [{"action": a, "code": c, "count": n} for (a, c), n in sorted(counts.items())]}

    def _add_load_balancer(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        lb_id = body.get("id")
        if lb_id is not None and (not isinstance(lb_id, str) or not lb_id):
            raise ValueError("id must be a non-empty string (or absent for a generated one)")
        return {"id": self.server.emulator.add_load_balancer(lb_id, name=str(body.get("name") or ""))}

    def _add_vserver_group(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        lb_id, name, tags = body.get("load_balancer_id"), body.get("name", ""), body.get("tags") or {}
        if not isinstance(lb_id, str) or lb_id not in self.server.emulator.load_balancers():
            raise ValueError(f"load_balancer_id {lb_id!r} is not a load balancer of the emulator")
        if not isinstance(name, str):
            raise ValueError("name must be a string")
        if not isinstance(tags, dict) or not all(isinstance(v, str) for v in [*tags, *tags.values()]):
            raise ValueError("tags must be an object of strings")
        return {"id": self.server.emulator.add_vserver_group(lb_id, name, tags=tags)}

    def _set_faults(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        apply_faults(self.server.emulator, body)
        return {"ok": True}

    def _set_rate_limit(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        unknown = sorted(set(body) - {"calls_per_second", "burst"})
        if unknown:
            raise ValueError(f"unknown rate limit settings {unknown}: use calls_per_second, burst")
        rate = body.get("calls_per_second")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
            raise ValueError(f"calls_per_second must be a number or null, not {rate!r}")
        burst = body.get("burst", 1)
        self.server.emulator.rate_limit(None if rate is None else float(rate), burst=burst)
        return {"ok": True}

    def _clear_faults(self, _body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        self.server.emulator.clear_faults()
        return {"ok": True}

    @staticmethod
    def _text(body: Mapping[str, Any], name: str) -> str:
        value = body.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string")
        return value

    def _accept_oidc_token(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        self.server.emulator.accept_oidc_token(self._text(body, "token"))
        return {"ok": True}

    def _revoke_oidc_token(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        self.server.emulator.revoke_oidc_token(self._text(body, "token"))
        return {"ok": True}

    def _expire_key(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        key_id = self._text(body, "access_key_id")
        if key_id not in self.server.emulator.issued_temporary_keys():
            raise ValueError(f"access_key_id {key_id!r} is not an STS key the emulator issued")
        self.server.emulator.expire_temporary_key(key_id)
        return {"ok": True}

    def _rotate_access_key(self, body: Mapping[str, Any], _query: Mapping[str, list[str]]) -> Any:
        self.server.emulator.rotate_access_key(
            self._text(body, "access_key_id"), self._text(body, "access_key_secret")
        )
        return {"ok": True}


class EmulatorServer:
    """``emulator`` served on loopback: HTTPS for the SDK, plain HTTP for the admin API."""

    def __init__(
        self,
        emulator: SLBEmulator,
        workdir: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        admin_port: int = 0,
    ) -> None:
        self.emulator = emulator
        self.workdir = workdir
        self._host = host
        self._port = port
        self._admin_port = admin_port
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    @property
    def ca_bundle(self) -> Path:
        return self.workdir / "slb-emulator-ca.crt"

    def start(self) -> None:
        ca = certs.make_ca("resourceconsist-slb-emulator-ca")
        serving = certs.make_signed(ca, "slb-emulator", hosts=(self._host, "localhost"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ca_bundle.write_bytes(ca.cert_pem)
        key_file = self.workdir / "slb-emulator.key"
        cert_file = self.workdir / "slb-emulator.crt"
        key_file.write_bytes(serving.key_pem)
        key_file.chmod(0o600)
        cert_file.write_bytes(serving.cert_pem)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(cert_file), str(key_file))
        self._servers = [
            _Server((self._host, self._port), _SLBHandler, self.emulator, tls),
            _Server(("127.0.0.1", self._admin_port), _AdminHandler, self.emulator),
        ]
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, name="slb-emulator", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.emulator.clear_faults()  # lets hung calls finish
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    @property
    def endpoint(self) -> str:
        """``host:port`` of the SLB endpoint, for ``ALIYUN_SLB_ENDPOINT``."""
        return f"{self._host}:{self._servers[0].server_address[1]}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def info(self) -> dict[str, str]:
        """Where and how to reach the server; the key pair is the emulator's own (not a secret)."""
        credentials = self.emulator.credentials()
        return {
            "endpoint": self.endpoint,
            "admin_url": self.admin_url,
            "ca_bundle": str(self.ca_bundle),
            "region_id": self.emulator.region_id,
            "access_key_id": credentials.access_key_id.get_secret_value(),
            "access_key_secret": credentials.access_key_secret.get_secret_value(),
            # The same HTTPS endpoint answers STS's AssumeRoleWithOIDC (RRSA).
            "sts_endpoint": self.endpoint,
            "role_arn": self.emulator.role_arn,
            "oidc_provider_arn": self.emulator.oidc_provider_arn,
        }


class EmulatorAdmin:
    """Client of the admin API of a served emulator (``info()["admin_url"]``)."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=data, method=method, headers={"Content-Type": _JSON}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            try:
                message = json.loads(err.read()).get("error", "")
            except ValueError:
                message = ""
            raise AdminError(f"{method} {path}: HTTP {err.code}: {message}") from None
        except (urllib.error.URLError, OSError) as err:
            raise AdminError(f"{method} {path}: emulator admin API unreachable: {err}") from None

    def healthy(self) -> bool:
        try:
            return bool(self._call("GET", "/healthz").get("ok"))
        except AdminError:
            return False

    def add_load_balancer(self, load_balancer_id: str | None = None, *, name: str = "") -> str:
        body = {"name": name} if load_balancer_id is None else {"id": load_balancer_id, "name": name}
        return str(self._call("POST", "/load-balancers", body)["id"])

    def add_vserver_group(
        self, load_balancer_id: str, name: str, *, tags: Mapping[str, str] | None = None
    ) -> str:
        """A VServer group made behind the controllers' backs (e.g. by another cluster); its id."""
        body = {"load_balancer_id": load_balancer_id, "name": name, "tags": dict(tags or {})}
        return str(self._call("POST", "/vserver-groups", body)["id"])

    def state(self) -> dict[str, Any]:
        return dict(self._call("GET", "/state"))

    def history(self, since: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Backend changes after sequence number ``since``, and the last sequence number."""
        answer = self._call("GET", f"/history?since={since}")
        return list(answer["changes"]), int(answer["last"])

    def requests(self, since: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """The request log: calls answered after sequence number ``since`` (each with ``seq``,
        ``action``, ``access_key_id``, ``session``, ``received``, ``answered``, ``code``,
        ``params``), the calls in flight now, and the last sequence number."""
        answer = self._call("GET", f"/requests?since={since}")
        return list(answer["requests"]), list(answer["in_flight"]), int(answer["last"])

    def call_counts(self) -> dict[tuple[str, str], int]:
        """Calls answered per (action, code), ``"ok"`` for success."""
        return {(c["action"], c["code"]): int(c["count"]) for c in self._call("GET", "/calls")["counts"]}

    def set_faults(
        self,
        rates: Mapping[str, float] | None = None,
        *,
        actions: str | Iterable[str] = "all",
        latency_seconds: float = 0.0,
        hang: bool = False,
    ) -> None:
        """Replace every fault: ``rates`` per kind (throttle, 5xx, drop, execute_fail)."""
        scope: str | list[str] = actions if isinstance(actions, str) else list(actions)
        body = {
            "rates": dict(rates or {}),
            "actions": scope,
            "latency_seconds": latency_seconds,
            "hang": hang,
        }
        self._call("PUT", "/faults", body)

    def clear_faults(self) -> None:
        self._call("DELETE", "/faults")

    def rate_limit(self, calls_per_second: float | None, *, burst: int = 1) -> None:
        """Throttle calls beyond ``calls_per_second`` (burst ``burst``) with SLB's
        ``Throttling.User`` answer; None: no limit (``SLBEmulator.rate_limit``)."""
        self._call("PUT", "/rate-limit", {"calls_per_second": calls_per_second, "burst": burst})

    def accept_oidc_token(self, token: str) -> None:
        self._call("POST", "/sts/oidc-tokens", {"token": token})

    def revoke_oidc_token(self, token: str) -> None:
        self._call("DELETE", "/sts/oidc-tokens", {"token": token})

    def sts_keys(self) -> tuple[list[str], dict[str, int]]:
        """(STS keys issued, oldest first; authenticated SLB calls per access key id)."""
        answer = self._call("GET", "/sts/keys")
        return list(answer["issued"]), {str(k): int(v) for k, v in answer["uses"].items()}

    def expire_key(self, access_key_id: str) -> None:
        self._call("POST", "/sts/expire", {"access_key_id": access_key_id})

    def rotate_access_key(self, access_key_id: str, access_key_secret: str) -> None:
        self._call(
            "PUT", "/access-key", {"access_key_id": access_key_id, "access_key_secret": access_key_secret}
        )


@contextlib.contextmanager
def served_emulator(
    workdir: Path, *load_balancers: str, start_timeout: float = 30.0, host: str = "127.0.0.1"
) -> Iterator[tuple[dict[str, str], EmulatorAdmin]]:
    """The emulator served as its own process
    (``python -m resourceconsist.adapters.alibabacloudslb.emulator_server``) with state in
    ``workdir`` and these load balancers, its SLB endpoint on ``host`` (e.g. a real node's bridge
    address, where Pods reach it): its start-up line (endpoint, admin URL, CA bundle, keys)
    and a client of its admin API. Stopped with SIGTERM on exit."""
    argv = [
        sys.executable,
        "-m",
        "resourceconsist.adapters.alibabacloudslb.emulator_server",
        "--dir",
        str(workdir),
        "--host",
        host,
    ]
    for load_balancer in load_balancers:
        argv += ["--load-balancer", load_balancer]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], start_timeout)
        line = proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the SLB emulator server did not start within {start_timeout:g}s")
        info: dict[str, str] = json.loads(line)
        yield info, EmulatorAdmin(info["admin_url"])
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m resourceconsist.adapters.alibabacloudslb.emulator_server",
        description="Serve the SLB emulator over HTTPS (SDK) plus an admin HTTP API, on loopback.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address of the SLB endpoint (default: %(default)s)"
    )
    parser.add_argument("--port", type=int, default=0, help="SLB endpoint port (0: a free one)")
    parser.add_argument(
        "--admin-port", type=int, default=0, help="admin API port on 127.0.0.1 (0: a free one)"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="work directory for the CA bundle (default: a temp dir)"
    )
    parser.add_argument(
        "--load-balancer", action="append", default=[], help="create this load balancer id (repeatable)"
    )
    parser.add_argument("--region", default="cn-hangzhou", help="region id (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draws and generated ids")
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="CALLS_PER_SECOND",
        help="answer calls beyond this rate with SLB's Throttling.User (default: no limit)",
    )
    parser.add_argument("--rate-burst", type=int, default=1, help="calls the rate limit lets through at once")
    parser.add_argument("--info-file", type=Path, default=None, help="also write the start-up JSON line here")
    args = parser.parse_args(argv)

    emulator = SLBEmulator(region_id=args.region, seed=args.seed, max_recorded_calls=10_000)
    for lb_id in args.load_balancer:
        emulator.add_load_balancer(lb_id)
    if args.rate_limit is not None:
        try:
            emulator.rate_limit(args.rate_limit, burst=args.rate_burst)
        except ValueError as err:
            parser.error(str(err))
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="slb-emulator-"))
    server = EmulatorServer(emulator, workdir, host=args.host, port=args.port, admin_port=args.admin_port)
    try:
        server.start()
    except OSError as err:
        parser.exit(2, f"cannot listen on {args.host}:{args.port} / 127.0.0.1:{args.admin_port}: {err}\n")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    line = json.dumps(server.info())
    if args.info_file is not None:
        args.info_file.write_text(line + "\n")
    print(line, flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
