"""The diff: expected vs current provider items, by id, into create / update / delete / unchanged.

A pure function (no I/O, no adapter calls besides the items' own ``equal``), as in the Go
original: missing from current -> create; present but unequal -> update (the expected item);
present in current only -> delete (the current item); equal -> unchanged (the expected item).
Outputs keep the input order so logs and provider calls are deterministic.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from resourceconsist.errors import ResourceConsistError


class Item(Protocol):
    """An employer or employee item: an id and an equality test against the provider's item."""

    @property
    def id(self) -> str: ...

    def equal(self, other: Any) -> bool: ...


ItemT = TypeVar("ItemT", bound=Item)

#: An item's id, as a C-level getter.
_id = operator.attrgetter("id")


class DuplicateIdError(ResourceConsistError, ValueError):
    """Two items on one side share an id: the adapter's list is ambiguous."""


@dataclass
class Diff(Generic[ItemT]):
    to_create: list[ItemT] = field(default_factory=list)
    to_update: list[ItemT] = field(default_factory=list)
    to_delete: list[ItemT] = field(default_factory=list)
    unchanged: list[ItemT] = field(default_factory=list)


def by_id(items: Sequence[ItemT], side: str) -> dict[str, ItemT]:
    """``items`` by id; two items with one id raise ``DuplicateIdError`` (``side`` names the list)."""
    # Every pass indexes every item (docs/benchmarks.md, "A pass's fixed cost"): built in C, and
    # the duplicate looked for only when the count says there is one.
    found = dict(zip(map(_id, items), items, strict=True))
    if len(found) != len(items):
        seen: set[str] = set()
        for item in items:
            if item.id in seen:
                raise DuplicateIdError(f"{side} items hold the id {item.id!r} twice")
            seen.add(item.id)
    return found


def diff(expected: Sequence[ItemT], current: Sequence[ItemT]) -> Diff[ItemT]:
    """Split ``expected`` and ``current`` into what to create, update, delete and leave alone."""
    expected_by_id = by_id(expected, "expected")
    current_by_id = by_id(current, "current")
    result: Diff[ItemT] = Diff()
    to_create, to_update, unchanged = result.to_create, result.to_update, result.unchanged
    for item_id, want in expected_by_id.items():
        have = current_by_id.get(item_id)
        if have is None:
            to_create.append(want)
        elif want.equal(have):
            unchanged.append(want)
        else:
            to_update.append(want)
    result.to_delete = [have for item_id, have in current_by_id.items() if item_id not in expected_by_id]
    return result
