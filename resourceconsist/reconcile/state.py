"""The state of one reconcile pass (``PassState``), kept by the orchestrator
(resourceconsist/reconcile/reconciler.py); the step modules never see it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resourceconsist.adapter import CUDResults, Employee, Employer, ReconcileContext
from resourceconsist.kube import KubeObject
from resourceconsist.podwriter import EmployerEntry, PodWriter, PodWriteResult
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.guard import Verdict


@dataclass
class PassState:
    """What one reconcile pass of one employer has read, planned and learnt so far; the
    orchestrator keeps it, and hands each step the parts it needs."""

    employer: KubeObject
    ctx: ReconcileContext
    writer: PodWriter
    key: str
    deleting: bool
    follows_lifecycle: bool
    expected_key: str = ""
    lifecycle_finalizer: str = ""
    guard_finalizer: str = ""
    selected: list[str] | None = None
    expected_clean: bool = True
    expected_added_record: list[str] | None = None
    expected_adds: set[str] = field(default_factory=set)
    expected_removes: set[str] = field(default_factory=set)
    #: Pods that carry (or may carry) this employer's guard or lifecycle finalizer.
    carriers: set[str] = field(default_factory=set)
    lifecycle_record: bool = False
    written: PodWriteResult = field(default_factory=PodWriteResult)
    employer_results: CUDResults[Employer] = field(default_factory=CUDResults)
    employee_results: CUDResults[Employee] = field(default_factory=CUDResults)
    #: Readiness gates: whether the employee sync ran to its end, the names it employs, the
    #: pods the provider confirmed it serves, those whose outcome is unknown, and when the
    #: fail-safe wants the employer looked at again.
    employees_synced: bool = False
    employed: set[str] = field(default_factory=set)
    serving: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    gate_recheck: float | None = None
    gate_failures: dict[str, BaseException] = field(default_factory=dict)
    #: A pass over a stand-in of a gone employer (docs/lifecycle-hooks.md, "Orphans"): it
    #: writes nothing to the employer, whose name a new object may already carry.
    stand_in: bool = False
    collected: bool = False
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    #: The provider's reason for each pod whose item it refused (for the readiness gates).
    refused: dict[str, str] = field(default_factory=dict)
    #: How this pass reports its failures (set as the pass begins).
    failures: PassFailures = field(init=False)

    @property
    def entry(self) -> EmployerEntry:
        """This employer's entry and finalizers ("" each when it does not follow PodOpsLifecycle)."""
        return EmployerEntry(self.expected_key, self.lifecycle_finalizer, self.guard_finalizer)
