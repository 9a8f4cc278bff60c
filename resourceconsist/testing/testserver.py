"""The HTTP test server of the real-node tier: it answers with its Pod's name and stops like a
real server, logging each step with the time it happened (docs/testing.md, "A real node").

It is the program of the ``testserver`` image (``hack/build-node-images.sh``), standard library
only, so the image needs nothing but python3; it also runs on the host, for its own tests.

- ``GET /`` answers ``200`` with the Pod's name (``$POD_NAME``, else the host name) and a
  newline; ``GET /?id=N`` the same, logging the request's ``id`` (a load generator's count);
  ``GET /sleep?seconds=S`` answers after ``S`` seconds (an in-flight request across a stop);
  ``GET /healthz`` answers ``200`` (a readiness probe).
- It speaks HTTP/1.1 with keep-alive, so a load balancer reuses its connections to the Pod.
- On SIGTERM (or SIGINT) it stops accepting at once (the listening socket closes: a new
  connection is refused), closes its idle kept-alive connections, finishes the requests in
  flight (closing their connections once answered), then exits 0, as a real server does on
  the kubelet's SIGTERM.
- It writes one JSON object a line to stdout, and, when ``$LOG_DIR`` is set, appends the same to
  ``$LOG_DIR/<pod name>.log`` (a hostPath volume, so the log outlives the container):
  ``{"t": <unix time, float>, "pod": ..., "event": ...}`` with events ``listening`` (``port``),
  ``sleeping`` (a ``/sleep`` request began: ``seconds``, ``client``), ``served`` (``path``,
  ``id``, ``client``), ``sigterm``, ``stopped-accepting``, ``drained``
  (``in_flight``: how many requests were answered after the signal) and ``exit``.

``$PORT`` is the port (default 8080), on every address of the Pod's own network namespace;
``$LOG_SERVED=0`` leaves the ``served`` lines out (a load generator's hundreds a second).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: The signals that stop the server.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
#: Seconds a ``/sleep`` request may ask for at most.
MAX_SLEEP = 300.0


class Log:
    """JSON lines to stdout and, optionally, a file; one lock so lines never interleave."""

    def __init__(self, pod: str, directory: str | None) -> None:
        self.pod = pod
        self._lock = threading.Lock()
        self._file = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._file = open(Path(directory) / f"{pod}.log", "a", buffering=1)  # noqa: SIM115

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "pod": self.pod, "event": event, **fields})
        with self._lock:
            print(line, flush=True)
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()
                os.fsync(self._file.fileno())


class Server(ThreadingHTTPServer):
    """Counts the requests in flight and keeps the idle kept-alive connections, so a stop can
    close those and wait for these."""

    daemon_threads = True
    # The standard library's backlog of 5 drops connections under a few hundred requests a
    # second; the client's SYN is retried a second later, a timeout no production server's
    # backlog would cause.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], log: Log, *, log_served: bool = True) -> None:
        self.log = log
        self.log_served = log_served
        self.in_flight = 0
        #: Requests answered after the stop began (each with ``Connection: close``).
        self.answered_after_stop = 0
        self.stopping = False
        self._idle = threading.Condition()
        #: Connections waiting for their next request (HTTP/1.1 keep-alive).
        self._waiting: set[socket.socket] = set()
        super().__init__(address, Handler)

    def waiting(self, connection: socket.socket) -> bool:
        """The connection waits for a request; False once stopping (the handler closes it)."""
        with self._idle:
            if self.stopping:
                return False
            self._waiting.add(connection)
            return True

    def begin(self, connection: socket.socket) -> None:
        """A request arrived on the connection."""
        with self._idle:
            self._waiting.discard(connection)
            self.in_flight += 1

    def end(self, connection: socket.socket, answered: bool) -> None:
        """The connection's request was answered (``answered``), or it ended without one."""
        with self._idle:
            self._waiting.discard(connection)
            if answered:
                self.in_flight -= 1
            self._idle.notify_all()

    def answering(self) -> bool:
        """An answer is about to go out; True once stopping (its connection closes after it).
        Counted here, not when the handler ends: a handler that answered before the signal may
        reach its end after it, and that request was not one the stop had to wait for."""
        with self._idle:
            if self.stopping:
                self.answered_after_stop += 1
            return self.stopping

    def stop(self) -> None:
        """Stop accepting (close the listening socket), close the idle kept-alive connections,
        then wait for the requests in flight (each closes its connection once answered)."""
        with self._idle:
            self.stopping = True
        self.shutdown()  # the accept loop ends ...
        self.socket.close()  # ... and new connections are refused from here on
        with self._idle:
            waiting, self._waiting = list(self._waiting), set()
        for connection in waiting:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)  # its handler reads the end and leaves
        self.log("stopped-accepting", in_flight=self.in_flight)
        with self._idle:
            self._idle.wait_for(lambda: self.in_flight == 0)
        self.log("drained", in_flight=self.answered_after_stop)


class Handler(BaseHTTPRequestHandler):
    server: Server
    # Keep-alive, as production servers speak to a load balancer: HAProxy reuses its
    # connections to a pod instead of opening one a request (the cost of a connection a request,
    # at 500 requests a second, was CPU the node lacked).
    protocol_version = "HTTP/1.1"
    # The head and the body go out as two writes; on a kept-alive connection Nagle's algorithm
    # would hold the second until the client's delayed ACK, 40 ms later, on every answer.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Requests are logged as JSON by ``do_GET``, not in the base class's format."""

    def handle_one_request(self) -> None:
        if not self.server.waiting(self.connection):
            self.close_connection = True
            return
        self._began = False
        try:
            super().handle_one_request()
        finally:
            self.server.end(self.connection, self._began)

    def parse_request(self) -> bool:
        self._began = True
        self.server.begin(self.connection)
        return super().parse_request()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/sleep":
            seconds = min(float(query.get("seconds", ["1"])[0]), MAX_SLEEP)
            self.server.log("sleeping", seconds=seconds, client=self.client_address[0])
            time.sleep(seconds)
        elif url.path not in ("/", "/healthz"):
            self._answer(404, "not found\n")
            return
        self._answer(200, self.server.log.pod + "\n")
        if url.path != "/healthz" and self.server.log_served:
            request_id = query.get("id", [None])[0]
            self.server.log("served", path=url.path, id=request_id, client=self.client_address[0])

    def _answer(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if self.server.answering():
            # A stopping server closes each connection once its request is answered.
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    port = int(os.environ.get("PORT", "8080"))
    log = Log(pod, os.environ.get("LOG_DIR"))
    server = Server(("", port), log, log_served=os.environ.get("LOG_SERVED", "1") != "0")
    # The stop signals are blocked before any thread starts (each inherits the mask) and the main
    # thread takes them with sigwait. A Python handler would not do: the kernel may hand the
    # signal to any thread, and one that is not the main thread only sets a flag the main thread
    # reads when it next runs Python code, never while it blocks in a wait (seen: a stop missed
    # in 1 run of 25, the main thread still in its wait 10 s after the signal was taken).
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    accepting = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    accepting.start()
    log("listening", port=server.server_address[1])
    signal.sigwait(STOP_SIGNALS)
    log("sigterm")
    server.stop()
    accepting.join()
    log("exit")


if __name__ == "__main__":
    main()
