"""Unit tests for ``resourceconsist.rules.diff``: expected vs current items, by id."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from resourceconsist.rules.diff import Diff, DuplicateIdError, diff


@dataclass
class Item:
    """An item whose equality is its ``value`` (the id is not compared)."""

    id: str
    value: int = 0

    def equal(self, other: Any) -> bool:
        return isinstance(other, Item) and self.value == other.value


@dataclass
class SpyItem:
    """An item with a caller-chosen equality verdict that records what it was compared with."""

    id: str
    verdict: bool
    compared_with: list[Any] = field(default_factory=list)

    def equal(self, other: Any) -> bool:
        self.compared_with.append(other)
        return self.verdict


def ids(items: list[Any]) -> list[str]:
    return [item.id for item in items]


def test_each_category() -> None:
    create = Item("create", 1)
    update_want, update_have = Item("update", 2), Item("update", 3)
    same_want, same_have = Item("same", 4), Item("same", 4)
    delete = Item("delete", 5)

    result = diff([create, update_want, same_want], [update_have, same_have, delete])

    assert isinstance(result, Diff)
    assert result.to_create == [create]
    assert result.to_update == [update_want]
    assert result.to_delete == [delete]
    assert result.unchanged == [same_want]


def test_update_and_unchanged_hold_the_expected_item_delete_holds_the_current_item() -> None:
    update_want, update_have = Item("u", 1), Item("u", 2)
    same_want, same_have = Item("s", 7), Item("s", 7)
    delete = Item("d", 9)

    result = diff([update_want, same_want], [update_have, same_have, delete])

    assert result.to_update[0] is update_want
    assert result.unchanged[0] is same_want
    assert result.to_delete[0] is delete


def test_order_of_inputs_is_kept() -> None:
    expected = [
        Item("e-create-3"),
        Item("b-update", 1),
        Item("z-same"),
        Item("a-create-1"),
        Item("y-update", 1),
        Item("c-same"),
        Item("m-create-2"),
    ]
    current = [
        Item("q-delete"),
        Item("c-same"),
        Item("y-update", 2),
        Item("b-delete"),
        Item("z-same"),
        Item("b-update", 2),
        Item("a-delete"),
    ]

    result = diff(expected, current)

    assert ids(result.to_create) == ["e-create-3", "a-create-1", "m-create-2"]
    assert ids(result.to_update) == ["b-update", "y-update"]
    assert ids(result.unchanged) == ["z-same", "c-same"]
    assert ids(result.to_delete) == ["q-delete", "b-delete", "a-delete"]


def test_custom_equality_is_used_and_called_as_expected_equal_current() -> None:
    # Ids and every attribute match except the verdict: only ``equal`` decides.
    unequal_want, unequal_have = SpyItem("a", verdict=False), SpyItem("a", verdict=True)
    equal_want, equal_have = SpyItem("b", verdict=True), SpyItem("b", verdict=False)

    result = diff([unequal_want, equal_want], [unequal_have, equal_have])

    assert result.to_update == [unequal_want]
    assert result.unchanged == [equal_want]
    # The expected item is asked, with the current item as argument; never the other way round.
    assert unequal_want.compared_with == [unequal_have]
    assert equal_want.compared_with == [equal_have]
    assert unequal_have.compared_with == []
    assert equal_have.compared_with == []


def test_equal_is_not_called_for_items_on_one_side_only() -> None:
    only_expected = SpyItem("x", verdict=True)
    only_current = SpyItem("y", verdict=True)

    result = diff([only_expected], [only_current])

    assert result.to_create == [only_expected]
    assert result.to_delete == [only_current]
    assert only_expected.compared_with == []
    assert only_current.compared_with == []


def test_equality_that_ignores_a_field() -> None:
    @dataclass
    class Weighted:
        id: str
        weight: int
        note: str

        def equal(self, other: Any) -> bool:
            return self.weight == other.weight  # ``note`` does not matter

    want = Weighted("rs-1", 100, "wanted")
    have = Weighted("rs-1", 100, "seen")

    result = diff([want], [have])

    assert result.unchanged == [want]
    assert result.to_update == []


@pytest.mark.parametrize(
    ("expected", "current", "side"),
    [
        ([Item("a"), Item("b"), Item("a", 1)], [], "expected"),
        ([], [Item("a"), Item("a")], "current"),
        ([Item("a")], [Item("b"), Item("a"), Item("b")], "current"),
    ],
)
def test_duplicate_ids_are_rejected_on_either_side(
    expected: list[Item], current: list[Item], side: str
) -> None:
    with pytest.raises(DuplicateIdError) as excinfo:
        diff(expected, current)
    message = str(excinfo.value)
    assert side in message
    assert "'a'" in message or "'b'" in message


def test_duplicate_id_error_is_a_value_error() -> None:
    assert issubclass(DuplicateIdError, ValueError)


def test_same_id_on_both_sides_is_not_a_duplicate() -> None:
    result = diff([Item("a")], [Item("a")])
    assert ids(result.unchanged) == ["a"]


def test_both_empty() -> None:
    result = diff([], [])
    assert result == Diff()
    assert (result.to_create, result.to_update, result.to_delete, result.unchanged) == ([], [], [], [])


def test_only_expected_creates_everything() -> None:
    expected = [Item("b"), Item("a"), Item("c")]
    result = diff(expected, [])
    assert result.to_create == expected
    assert result.to_update == result.to_delete == result.unchanged == []


def test_only_current_deletes_everything() -> None:
    current = [Item("b"), Item("a"), Item("c")]
    result = diff([], current)
    assert result.to_delete == current
    assert result.to_create == result.to_update == result.unchanged == []


def test_accepts_tuples_and_does_not_mutate_inputs() -> None:
    expected = (Item("a", 1), Item("b", 1))
    current = (Item("b", 2), Item("c", 3))
    before = (list(expected), list(current))

    result = diff(expected, current)

    assert (list(expected), list(current)) == before
    assert ids(result.to_create) == ["a"]
    assert ids(result.to_update) == ["b"]
    assert ids(result.to_delete) == ["c"]


def test_result_lists_are_independent_per_call() -> None:
    first = diff([Item("a")], [])
    second = diff([], [Item("b")])
    assert ids(first.to_create) == ["a"]
    assert first.to_delete == []
    assert second.to_create == []
    assert ids(second.to_delete) == ["b"]
