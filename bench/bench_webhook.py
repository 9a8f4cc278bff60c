"""Memory of the webhook server under the connections that used to grow it (issue 12).

The server runs in a child process (this script with ``--serve``) so the client's own memory
does not count; it answers ``rss`` on stdin with its resident set size and connection figures.
Phases, each followed by the server's RSS:

1. 10,000 plain TCP connect/close cycles (what port scanners and TCP health checks do);
2. 2,000 idle TCP connections that never send a byte, held until the server cuts them
   (handshake timeout);
3. 2,000 TLS connections that finish the handshake and then say nothing, held until the
   server cuts them (header timeout);
4. 2,000 TLS handshakes abandoned after the ClientHello.

After every phase a valid HTTPS request must still succeed. The figure that matters is the
growth from "before" to "after" once the connections are gone: it must stay under 20 MB
(exit status 1 otherwise). The server runs with the default deadlines; the run takes a minute or two.

Run: ``python bench/bench_webhook.py`` (``make bench``); ``--python`` picks the interpreter of
the server, e.g. ``~/.pyenv/versions/3.13.0/bin/python`` with the project installed;
``--event-loop asyncio`` serves on the standard library's loop instead of uvloop's, which
``resourceconsist webhook`` serves on (docs/webhook.md, "Connections and memory").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from resourceconsist.commands import cli
from resourceconsist.webhook import ConnectionLimits

GROWTH_LIMIT_MB = 20.0
#: The default deadlines (handshake and headers: 10 s), as a deployment runs them.
LIMITS = ConnectionLimits()


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the server process -----------------------------------------------------------------------


async def _serve(cert_dir: Path) -> None:
    from resourceconsist.cluster.cache import InformerFactory
    from resourceconsist.cluster.kube import KubeClient
    from resourceconsist.webhook import WebhookOptions, WebhookServer

    server = WebhookServer(
        [],
        WebhookOptions(host="127.0.0.1", port=0, cert_dir=cert_dir, bootstrap=None, limits=LIMITS),
        # No adapters, so the informers are never started and the client never used.
        informers=InformerFactory(KubeClient(None)),
    )
    await server.start()
    loop = asyncio.get_running_loop()
    print(json.dumps({"port": server.port, "python": sys.version.split()[0]}), flush=True)
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "quit":
            break
        stats = server.connections
        print(json.dumps({"rss": _rss_mb(), "open": stats.open, "accepted": stats.accepted}), flush=True)
    await server.stop()


# -- the client -------------------------------------------------------------------------------


class Server:
    def __init__(self, python: str, cert_dir: Path, event_loop: str) -> None:
        self.process = subprocess.Popen(
            [python, __file__, "--serve", str(cert_dir), "--event-loop", event_loop],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._read()
        self.port = int(hello["port"])
        self.python = str(hello["python"])

    def _read(self) -> dict[str, Any]:
        out: IO[str] | None = self.process.stdout
        assert out is not None
        line = out.readline()
        if not line:
            raise RuntimeError(f"the server process exited ({self.process.wait()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def figures(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write("rss\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
        self.process.wait(timeout=30)


def _connect_close(port: int, count: int) -> None:
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)):
            pass


def _hold(port: int, count: int, context: ssl.SSLContext | None) -> list[socket.socket]:
    held: list[socket.socket] = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if context is not None:
            try:
                sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
            except OSError:  # a machine this busy can take longer than the handshake timeout
                sock.close()
                continue
        held.append(sock)
    return held


def _abandoned_handshakes(port: int, count: int) -> None:
    context = ssl.create_default_context()
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = context.wrap_bio(incoming, outgoing, server_hostname="webhook")
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())  # the ClientHello, and then nothing
        raw.close()


def _all_closed_by_server(held: list[socket.socket], deadline: float) -> bool:
    """Wait until the server has closed every held connection (EOF or reset on read)."""
    pending = list(held)
    while pending and time.monotonic() < deadline:
        still = []
        for sock in pending:
            sock.settimeout(0.01)
            try:
                if sock.recv(1) == b"":
                    continue
            except (TimeoutError, ssl.SSLWantReadError):
                still.append(sock)
                continue
            except OSError:
                continue
        pending = still
    for sock in held:
        sock.close()
    return not pending


def _valid_request(port: int, context: ssl.SSLContext) -> int:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--python", default=sys.executable, help="interpreter of the server process")
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--idle", type=int, default=2_000)
    parser.add_argument(
        "--event-loop",
        choices=cli.EVENT_LOOPS,
        default=cli.EVENT_LOOPS[0],
        help="the server's event loop (default uvloop, as `resourceconsist webhook` serves)",
    )
    args = parser.parse_args()
    _raise_fd_limit()
    if args.serve is not None:
        # As `resourceconsist webhook` makes its loop.
        with asyncio.Runner(loop_factory=cli.loop_factory(args.event_loop)) as runner:
            runner.run(_serve(args.serve))
        return 0

    from resourceconsist.cluster import certs

    with tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp:
        cert_dir = Path(tmp)
        ca = certs.make_ca("bench-webhook-ca")
        serving = certs.make_signed(ca, "bench-webhook", hosts=("127.0.0.1",))
        (cert_dir / "tls.crt").write_bytes(serving.cert_pem)
        (cert_dir / "tls.key").write_bytes(serving.key_pem)
        os.chmod(cert_dir / "tls.key", 0o600)
        trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
        server = Server(args.python, cert_dir, args.event_loop)
        port = server.port
        failures: list[str] = []

        def report(label: str) -> float:
            figures = server.figures()
            print(f"  {label:<48} RSS {figures['rss']:7.1f} MB   open connections {figures['open']}")
            return float(figures["rss"])

        def settle(what: str) -> None:
            """Wait until the server has dealt with every connection (a busy machine lags)."""
            deadline = time.monotonic() + 3 * LIMITS.handshake_timeout + 30
            while server.figures()["open"] > 0:
                if time.monotonic() > deadline:
                    failures.append(f"connections still open long after {what}")
                    return
                time.sleep(0.2)
            time.sleep(2.0)  # the server hands freed memory back a second after a burst

        def still_serves(after: str) -> None:
            if _valid_request(port, trust) != 200:
                failures.append(f"no valid answer after {after}")

        try:
            print(
                f"webhook server memory (Python {server.python}, {args.event_loop} loop, handshake and "
                f"header timeouts {LIMITS.handshake_timeout:.0f}s/{LIMITS.header_timeout:.0f}s)"
            )
            still_serves("start")
            before = report("before")

            workers = 4
            per_round = args.cycles // 5
            with ThreadPoolExecutor(workers) as pool:
                for done in range(per_round, args.cycles + 1, per_round):
                    list(pool.map(_connect_close, [port] * workers, [per_round // workers] * workers))
                    report(f"during: {done} TCP connect/close")
            settle("connect/close")
            still_serves("connect/close")
            report(f"after {args.cycles} TCP connect/close")

            for label, context in (("idle TCP", None), ("idle TLS (after handshake)", trust)):
                held = _hold(port, args.idle, context)
                report(f"during: {args.idle} {label} connections")
                if not _all_closed_by_server(
                    held, time.monotonic() + 3 * max(LIMITS.handshake_timeout, LIMITS.header_timeout)
                ):
                    failures.append(f"the server did not close every {label} connection")
                settle(label)
                still_serves(label)
                report(f"after the server cut the {label} connections")

            threads = [
                threading.Thread(target=_abandoned_handshakes, args=(port, args.idle // 4)) for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            settle("abandoned handshakes")
            still_serves("abandoned handshakes")
            report(f"after {args.idle} abandoned TLS handshakes")

            settle("the last request")
            after = report("after (all connections gone)")
        finally:
            server.close()
    growth = after - before
    verdict = "ok" if growth < GROWTH_LIMIT_MB else "TOO MUCH"
    print(
        f"growth once the connections are gone: {growth:+.1f} MB (limit {GROWTH_LIMIT_MB:.0f} MB): {verdict}"
    )
    for failure in failures:
        print(f"FAILED: {failure}")
    return 0 if growth < GROWTH_LIMIT_MB and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
