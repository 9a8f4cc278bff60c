"""The demo's tables name each finalizer by kind, so a reader tells the guard from the lifecycle
finalizer (docs/concepts.md, "The guard")."""

from __future__ import annotations

from resourceconsist.commands.showcase import _finalizer_words
from resourceconsist.rules import lifecycle


def test_the_pods_table_names_the_guard_and_the_lifecycle_finalizer() -> None:
    pod = {
        "metadata": {
            "name": "web-0",
            "finalizers": [
                lifecycle.guard_finalizer("web"),
                lifecycle.lifecycle_finalizer("web"),
                "example.com/foreign",
            ],
        }
    }
    assert _finalizer_words(pod) == "guard, lifecycle, example.com/foreign"
    assert _finalizer_words({"metadata": {"name": "web-1"}}) == "-"
