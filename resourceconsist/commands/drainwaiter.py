"""The drain waiter: the sidecar the webhook gives the pods of an employer that asks for the
``wait`` drain (``resourceconsist drain-waiter``; docs/zero-downtime.md, "A drain that waits for
the provider").

It listens on the pod's network (``port``). Each container's ``preStop`` hook is an ``httpGet``
the kubelet sends to ``/wait`` when the pod is deleted; the answer comes once a manager's drain
endpoint (``endpoints``: every replica's, or a Service in front of them; resourceconsist/runtime/
drain.py) says no provider routes to the pod any more, or after ``bound`` seconds (the employer's
drain time), whichever is first. So the containers get SIGTERM as soon as the load balancer let
go, and never later than the sleep of the ``sleep`` drain would have ended: a manager that is
down, frozen or out of reach costs the bound, never an early stop. Each question asks every
endpoint at once and waits at most ``ASK_WAIT`` seconds for a yes (the endpoint holds the answer
until then); the first yes ends the wait.

A native sidecar (an init container with ``restartPolicy: Always``) starts before the pod's
containers and is stopped only after them, so it is there for every container's hook. Standard
library only (it runs for every such pod); its log is one JSON object a line on stdout.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from resourceconsist import wire

#: The longest one question to the endpoints waits for a yes (seconds).
ASK_WAIT: Final = 5.0
#: A question's network allowance beyond its wait.
ASK_SLACK: Final = 2.0
#: The pause after a round that no endpoint answered (seconds).
RETRY_AFTER: Final = 0.5


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 3), "event": event, **fields}), flush=True)


@dataclass(frozen=True)
class Waiter:
    """Waits for the pod ``namespace/pod`` (of ``uid``) to be released (see the module doc)."""

    namespace: str
    pod: str
    uid: str
    endpoints: tuple[str, ...]
    bound: float

    def ask(self, endpoint: str, wait: float) -> bool | None:
        """One endpoint's answer: released (True), not yet (False), or none (None)."""
        query = urllib.parse.urlencode(
            {"namespace": self.namespace, "pod": self.pod, "uid": self.uid, "wait": f"{wait:.1f}"}
        )
        url = f"{endpoint.rstrip('/')}{wire.DRAIN_RELEASED_PATH}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=wait + ASK_SLACK) as answer:
                return bool(json.loads(answer.read())["released"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            log("no-answer", endpoint=endpoint, error=str(err)[:200])
            return None

    def wait(self) -> str:
        """Block until the pod is released (``released``) or the bound passed (``bound``). Each
        endpoint is asked on its own thread, again and again, so one that hangs (a frozen
        manager) never delays the others' yes."""
        started = time.monotonic()
        deadline = started + self.bound
        released = threading.Event()

        def keep_asking(endpoint: str) -> None:
            while not released.is_set() and (left := deadline - time.monotonic()) > 0.05:
                said = self.ask(endpoint, min(ASK_WAIT, left))
                if said:
                    released.set()
                elif said is None:
                    released.wait(min(RETRY_AFTER, max(deadline - time.monotonic(), 0.0)))

        log("waiting", bound=self.bound)
        for endpoint in self.endpoints:
            threading.Thread(target=keep_asking, args=(endpoint,), daemon=True).start()
        outcome = "released" if released.wait(self.bound) else "bound"
        released.set()  # the threads still asking stop
        log(outcome, seconds=round(time.monotonic() - started, 3))
        return outcome


def serve(waiter: Waiter, port: int) -> None:
    """Answer ``GET /wait`` (the preStop hooks) and ``GET /healthz`` on every address of the pod
    until SIGTERM."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            """Events are logged as JSON by the waiter."""

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path == wire.DRAIN_WAITER_PATH:
                body = waiter.wait() + "\n"
            elif path == "/healthz":
                body = "ok\n"
            else:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("", port), Handler)
    server.daemon_threads = True
    # SIGTERM is blocked before any thread starts (each inherits the mask) and taken by the main
    # thread with sigwait: with a Python handler, a signal the kernel hands to another thread
    # is not run while the main thread blocks, and the pod would wait out its grace period.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    log("listening", port=port, pod=f"{waiter.namespace}/{waiter.pod}", endpoints=list(waiter.endpoints))
    signal.sigwait(stop_signals)
    # The pod's containers have stopped (a native sidecar is stopped after them): nothing waits.
    server.shutdown()
    log("exit")
    sys.stdout.flush()
