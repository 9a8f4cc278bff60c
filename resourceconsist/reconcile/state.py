"""The state of one reconcile pass (``PassState``), begun by ``passes.PassFactory`` and kept by
the orchestrator (resourceconsist/reconcile/reconciler.py): what it read, and what each step
returned. The step modules never see it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resourceconsist.adapter import CUDResults, Employee, Employer, ReconcileContext
from resourceconsist.cluster.kube import EmployerKey, KubeObject
from resourceconsist.reconcile.failures import PassFailures
from resourceconsist.reconcile.finalizers import EntryPlan, PodOf
from resourceconsist.reconcile.guard import AfterCalls, GuardRecall, no_recall
from resourceconsist.reconcile.podwriter import EmployerEntry, PodWriter, PodWriteResult
from resourceconsist.reconcile.readiness import GateFacts, GateOutcome
from resourceconsist.reconcile.sync import is_clean
from resourceconsist.rules import lifecycle

#: The entry of an employer that does not follow PodOpsLifecycle: none.
NO_ENTRY = EmployerEntry("", "", "")


def employer_entry(employer: KubeObject) -> EmployerEntry:
    """The employer's entry in its pods' ``available-conditions`` and the finalizers it names."""
    meta = employer["metadata"]
    return EmployerEntry(
        key=lifecycle.expected_finalizer_key(
            employer.get("kind", ""), meta.get("namespace", ""), meta["name"]
        ),
        lifecycle_finalizer=lifecycle.lifecycle_finalizer(meta["name"]),
        guard_finalizer=lifecycle.guard_finalizer(meta["name"]),
    )


@dataclass
class PassState:
    """What one reconcile pass of one employer has read, and what its steps decided so far; the
    orchestrator keeps it, and hands each step the parts it needs."""

    employer: KubeObject
    ctx: ReconcileContext
    writer: PodWriter
    key: EmployerKey
    deleting: bool
    follows_lifecycle: bool
    #: A pod employee's freshest copy in the employer's namespace (``PodPlaces.get``).
    pod_of: PodOf
    #: This employer's entry and finalizers (``NO_ENTRY`` when it does not follow PodOpsLifecycle).
    entry: EmployerEntry = NO_ENTRY
    #: A pass over a stand-in of a gone employer (docs/lifecycle-hooks.md, "Orphans"): it
    #: writes nothing to the employer, whose name a new object may already carry.
    stand_in: bool = False
    selected: list[str] | None = None
    #: Step 3: the entries planned.
    entries: EntryPlan = field(default_factory=EntryPlan)
    #: Pods that carry (or may carry) this employer's guard or lifecycle finalizer.
    carriers: set[str] = field(default_factory=set)
    lifecycle_record: bool = False
    written: PodWriteResult = field(default_factory=PodWriteResult)
    #: After the writes (deleting): the employer's entries and finalizers are gone from its pods.
    expected_clean: bool = True
    employer_results: CUDResults[Employer] = field(default_factory=CUDResults)
    employee_results: CUDResults[Employee] = field(default_factory=CUDResults)
    #: Step 5, after the calls: what the provider confirmed of the pods (None: the employee
    #: sync did not run to its end, or the employees are not pods).
    confirmed: AfterCalls | None = None
    #: The provider's reason for each pod whose item it refused (for the readiness gates).
    refused: dict[str, str] = field(default_factory=dict)
    #: What the guard may take from the employer's last pass, and what it finds in this one.
    recall: GuardRecall = field(default_factory=no_recall)
    #: The readiness gates: when the fail-safe wants the employer looked at again, the failed writes.
    gates: GateOutcome = field(default_factory=GateOutcome)
    collected: bool = False
    #: How this pass reports its failures (set as the pass begins).
    failures: PassFailures = field(init=False)

    @property
    def any_failed(self) -> bool:
        """Some item of the employer's or the employees' sync failed (an error aside)."""
        return self.employer_results.any_failed or self.employee_results.any_failed

    @property
    def clean(self) -> bool:
        """Deleting, and clean on both sides: the provider holds nothing of the employer, and its
        entries and finalizers are gone from its pods (docs/concepts.md, "One reconcile", 6)."""
        provider_clean = is_clean(self.employer_results) and is_clean(self.employee_results)
        return self.deleting and provider_clean and self.expected_clean

    def gate_facts(self) -> GateFacts:
        """What the pass confirmed that the readiness gates follow (whom the employer employs
        is read by the gates themselves)."""
        confirmed = self.confirmed
        return GateFacts(
            deleting=self.deleting,
            synced=confirmed is not None,
            serving=confirmed.serving if confirmed else set(),
            unknown=confirmed.unknown if confirmed else set(),
            refused=self.refused,
        )
