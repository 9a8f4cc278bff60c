"""The webhook's TLS reloader writes nothing to any filesystem, so the webhook runs with a
read-only root filesystem (docs/webhook.md, "Certificate bootstrap"): every file the process
opens for writing, and every directory or temporary file it makes, is seen by an audit hook
(PEP 578) while the reloader loads and reloads a certificate."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resourceconsist.cluster import certs
from resourceconsist.cluster.certwatcher import CertificateReloader

#: Audit events that create or write something on a filesystem.
_WRITING_EVENTS = frozenset(
    {"os.mkdir", "tempfile.mkstemp", "tempfile.mkdtemp", "os.rename", "shutil.copyfile"}
)
_recording: list[list[tuple[str, str]]] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _recording:
        return
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        if writes:
            _recording[-1].append((event, str(path)))
    elif event in _WRITING_EVENTS:
        _recording[-1].append((event, str(args[0]) if args else ""))


sys.addaudithook(_hook)  # hooks cannot be removed; it records only inside ``_writes``


@contextmanager
def _writes() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    _recording.append(seen)
    try:
        yield seen
    finally:
        _recording.pop()


def _write_pair(cert_dir: Path, pair: certs.KeyPair) -> None:
    (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
    (cert_dir / "tls.key").write_bytes(pair.key_pem)


def test_loading_and_reloading_a_certificate_writes_nothing(tmp_path: Path) -> None:
    ca = certs.make_ca("test-ca")
    _write_pair(tmp_path, certs.make_signed(ca, "webhook", hosts=("127.0.0.1",)))
    reloader = CertificateReloader(tmp_path / "tls.crt", tmp_path / "tls.key")
    with _writes() as seen:
        assert reloader.load()
    assert seen == []

    _write_pair(tmp_path, certs.make_signed(ca, "webhook-rotated", hosts=("127.0.0.1",)))
    with _writes() as seen:
        assert reloader.load()
        assert not reloader.load()  # unchanged files: nothing to do
    assert seen == []
    assert reloader.reloads == 2


def test_the_audit_hook_sees_the_writes_it_is_meant_to_catch(tmp_path: Path) -> None:
    # The check above can fail: a temporary copy of the key, as the reloader once made, is seen.
    import tempfile

    with _writes() as seen, tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        (Path(tmp) / "tls.key").write_bytes(b"key")
    assert {event for event, _ in seen} == {"tempfile.mkdtemp", "os.mkdir", "open"}


def test_every_read_of_the_files_is_counted_as_controller_runtimes_certwatcher(tmp_path: Path) -> None:
    """``certwatcher_read_certificate_total`` counts each read (each poll), and
    ``certwatcher_read_certificate_errors_total`` those that did not load: a half-written pair,
    a missing file. The previous certificate keeps serving meanwhile."""
    from resourceconsist.runtime.metrics import Metrics

    metrics = Metrics()

    def counted() -> tuple[float, float]:
        sample = metrics.registry.get_sample_value
        return (
            sample("certwatcher_read_certificate_total") or 0.0,
            sample("certwatcher_read_certificate_errors_total") or 0.0,
        )

    assert counted() == (0, 0)
    ca = certs.make_ca("test-ca")
    _write_pair(tmp_path, certs.make_signed(ca, "webhook", hosts=("127.0.0.1",)))
    reloader = CertificateReloader(
        tmp_path / "tls.crt", tmp_path / "tls.key", on_read=metrics.standard.certificate_read
    )
    assert reloader.load()
    assert not reloader.load()  # a poll that finds the same pair is a read too
    assert counted() == (2, 0)
    (tmp_path / "tls.key").write_bytes(b"half-written")
    assert not reloader.load()
    assert counted() == (3, 1)
    (tmp_path / "tls.key").unlink()
    assert not reloader._poll()  # the watcher's own poll: a missing file is logged, not raised
    assert counted() == (4, 2)
    assert reloader.loaded and reloader.reloads == 1
