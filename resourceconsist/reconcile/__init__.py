"""One reconcile pass of one employer: ``Reconciler`` (resourceconsist/reconcile/reconciler.py,
the orchestrator) over its steps, each a module of its own (docs/concepts.md, "One reconcile"):

- ``finalizers``    the employer's clean finalizer, its entries in the pods, its record annotations;
- ``guard``         the guard before the calls, each pod's verdict after them, the swaps;
- ``readiness``     the readiness gates;
- ``sync``          the provider sync of the employer and of its employees;
- ``statuses``      the adapter's statuses or error conditions, and the requeue of failed items;
- ``telling``       what the adapter's subscribers are told;
- ``failures``      how a pass reports what failed (a Warning, or a retry first);
- ``profile``       the adapter as the frame reads it, resolved once: its watch options, settings and
  optional protocols, and their defaults;
- ``passes``        how a pass begins: its context, its state, what it reads before the calls;
- ``state``, ``pods``  the pass's state, and where pod employees live;
- ``memory``        what is kept of an employer between passes (one record);
- ``outcome``       what a pass ends with (``Result``, its errors, the retry numbers).
"""

from __future__ import annotations

from resourceconsist.options import DEFAULT_FULL_PASS_EVERY
from resourceconsist.reconcile.memory import EmployerMemory
from resourceconsist.reconcile.outcome import (
    DEFAULT_WARN_AFTER_PASSES,
    DEFAULT_WARN_AFTER_SECONDS,
    MAX_CONFLICT_RETRY_SECONDS,
    MAX_ITEM_WARNINGS,
    ReconcileError,
    Result,
    SyncFailedExist,
)
from resourceconsist.reconcile.reconciler import Reconciler

__all__ = [
    "DEFAULT_FULL_PASS_EVERY",
    "DEFAULT_WARN_AFTER_PASSES",
    "DEFAULT_WARN_AFTER_SECONDS",
    "MAX_CONFLICT_RETRY_SECONDS",
    "MAX_ITEM_WARNINGS",
    "EmployerMemory",
    "ReconcileError",
    "Reconciler",
    "Result",
    "SyncFailedExist",
]
