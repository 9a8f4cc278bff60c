"""A TLS server's certificate that follows the files on disk: the webhook's serving certificate,
and the metrics endpoint's (controller-runtime's ``certwatcher``).

``CertificateReloader`` reads ``tls.crt``/``tls.key``, builds a fresh ``SSLContext`` from them
and serves it from then on; it polls the files' contents, so it sees every way a certificate
can be replaced (rewritten in place, renamed over, or swapped through the symlinks of a
mounted Secret volume, which inotify-based watchers miss). A new context is only taken once it
loads completely (certificate and matching key), so a half-written pair keeps the old one
serving until the next poll sees both halves.

The context handed to the listener never changes; its SNI callback, which OpenSSL runs for
every ClientHello (also when the client sends no server name, as the API server does for an
IP address), points each new connection at the current context. Connections already open
keep the certificate they started with. A fresh context per load matters: loading a new chain
into a live context would keep the old certificate of another key type (say EC) next to a
new RSA one, and clients could still be served the old one.

Every read of the files is told to ``on_read`` (ok or not), which a manager counts as
controller-runtime's ``certwatcher_read_certificate_total`` and
``certwatcher_read_certificate_errors_total`` (docs/observability.md). ``self_signed_context``
is the metrics endpoint's certificate when it is given none: made in memory at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

from resourceconsist.cluster.certs import make_ca, make_signed

log = logging.getLogger(__name__)


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A TLS server context for one certificate and key, TLS 1.2 at least."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx


def self_signed_context(common_name: str, hosts: tuple[str, ...]) -> ssl.SSLContext:
    """A server context for a certificate made now, in memory, signed by a CA made for it and
    forgotten: for clients that do not verify it (kubebuilder's metrics scrape with
    ``insecureSkipVerify``), so that the bearer token they send is at least encrypted."""
    ca = make_ca(f"{common_name}-ca")
    pair = make_signed(ca, common_name, hosts=hosts)
    return _context_from_bytes(pair.cert_pem + ca.cert_pem, pair.key_pem)


def _context_from_bytes(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    # ssl loads chains from paths only. Anonymous in-memory files (memfd) guarantee that the
    # certificate and key loaded are the pair that was read, even if the originals change in
    # between, and write nothing to any filesystem: the webhook runs with a read-only root
    # filesystem, and the key never lands on a disk (docs/webhook.md, "Certificates").
    with _memory_file("tls.crt", cert_pem) as cert, _memory_file("tls.key", key_pem) as key:
        return server_context(cert, key)


@contextlib.contextmanager
def _memory_file(name: str, content: bytes) -> Iterator[Path]:
    """``content`` in an anonymous in-memory file, as a path OpenSSL can open while it lasts."""
    fd = os.memfd_create(f"resourceconsist-{name}", os.MFD_CLOEXEC)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


class CertificateReloader:
    """Serves the certificate in ``cert_file``/``key_file`` and follows changes to them."""

    def __init__(
        self,
        cert_file: Path | str,
        key_file: Path | str,
        *,
        interval: float = 2.0,
        name: str = "webhook",
        on_read: Callable[[bool], None] | None = None,
    ) -> None:
        """``name``: what the log lines call the certificate; ``on_read``: told of every read of
        the files, True when they loaded (or had not changed), False when they could not be
        read or did not load."""
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.interval = interval
        self.name = name
        self._on_read = on_read
        self._fingerprint = ""
        self._current: ssl.SSLContext | None = None
        self._listener = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._listener.minimum_version = ssl.TLSVersion.TLSv1_2
        self._listener.sni_callback = self._select
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0

    @property
    def listener_context(self) -> ssl.SSLContext:
        """The context to give the listening socket (it delegates to the current one)."""
        return self._listener

    @property
    def loaded(self) -> bool:
        return self._current is not None

    def _select(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self._current
        if current is not None:
            sslobj.context = current

    def _read(self) -> tuple[bytes, bytes]:
        return self.cert_file.read_bytes(), self.key_file.read_bytes()

    def _told(self, ok: bool) -> None:
        if self._on_read is not None:
            self._on_read(ok)

    def load(self) -> bool:
        """Load the files if they changed since the last load; True when a new certificate
        is now served. Raises when there is no valid certificate at all yet."""
        try:
            cert_pem, key_pem = self._read()
        except OSError:
            self._told(False)
            raise
        fingerprint = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
        if fingerprint == self._fingerprint:
            self._told(True)
            return False
        try:
            fresh = _context_from_bytes(cert_pem, key_pem)
        except (ssl.SSLError, ValueError):
            self._told(False)
            if self._current is None:
                raise
            # Possibly a pair caught between its two writes: keep serving the old one and
            # look again at the next poll (the fingerprint is not recorded).
            log.warning(
                "%s certificate %s / %s does not load; still serving the previous one",
                self.name,
                self.cert_file,
                self.key_file,
                exc_info=True,
            )
            return False
        self._told(True)
        first = self._current is None
        self._current = fresh
        self._fingerprint = fingerprint
        self.reloads += 1
        log.info(
            "%s serving certificate %s from %s",
            self.name,
            "loaded" if first else "reloaded",
            self.cert_file,
        )
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                # Reading and parsing are quick, but they are file I/O: kept off the loop.
                changed = await asyncio.to_thread(self._poll)
            except Exception:
                log.warning("checking the %s certificate files failed", self.name, exc_info=True)
                continue
            if changed:
                log.debug("%s certificate changed on disk", self.name)

    def _poll(self) -> bool:
        try:
            return self.load()
        except FileNotFoundError:
            log.warning("%s certificate file missing; still serving the previous certificate", self.name)
            return False

    def start(self) -> None:
        """Follow the files from now on, loading the certificate first if ``load`` has not
        (which raises when there is none)."""
        if not self.loaded:
            self.load()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._watch(), name=f"{self.name}-certificate-reloader"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
