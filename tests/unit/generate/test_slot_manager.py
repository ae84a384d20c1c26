"""SlotManager: slots packed low, the top sequence moved into a hole, exact ids."""

from __future__ import annotations

from tensord.generate.core.request import Request
from tensord.generate.core.slot_manager import SlotManager, SlotMove
from tests.unit.generate.helpers import make_request


def _request(rid: str, computed: int = 0) -> Request:
    request = make_request(rid, [5, 6, 7])
    request.num_computed_tokens = computed
    return request


def test_slots_are_handed_out_lowest_first_and_refused_when_all_are_held() -> None:
    slots = SlotManager(3, 16)
    a, b, c, d = (_request(x) for x in "abcd")
    assert [slots.allocate_slots(r, 3) for r in (a, b, c)] == [[], [], []]
    assert [slots.get_block_ids(x) for x in "abc"] == [[0], [1], [2]]
    assert slots.allocate_slots(d, 3) is None  # every slot held: d waits
    assert slots.get_block_ids("d") == []
    assert slots.allocate_slots(a, 1) == []  # a decode step of a holder
    assert (slots.stats().used_blocks, slots.stats().free_blocks) == (3, 0)


def test_a_sequence_that_would_overrun_its_slot_gets_no_room() -> None:
    slots = SlotManager(2, 16)
    assert slots.allocate_slots(_request("a", computed=10), 7) is None
    assert slots.allocate_slots(_request("b", computed=10), 6) == []


def test_the_top_sequences_move_into_the_holes_so_slots_stay_packed() -> None:
    slots = SlotManager(5, 16)
    requests = {x: _request(x) for x in "abcde"}
    for request in requests.values():
        slots.allocate_slots(request, 3)
    slots.free(requests["b"])  # hole at 1: e (slot 4) moves down
    assert slots.take_moves() == [SlotMove(4, 1)]
    assert [slots.get_block_ids(x) for x in "acde"] == [[0], [2], [3], [1]]
    slots.free(requests["d"])  # the top itself leaves: nothing moves
    assert slots.take_moves() == []
    # Two leave in one step, one of them the top: one move, not two.
    slots.free(requests["a"])
    slots.free(requests["c"])
    assert slots.take_moves() == [SlotMove(1, 0)]
    assert slots.get_block_ids("e") == [0] and slots.num_used == 1
    assert slots.moves_made == 2
    slots.free(requests["a"])  # freeing twice changes nothing
    assert slots.take_moves() == [] and slots.num_used == 1
    late = _request("f")
    assert slots.allocate_slots(late, 3) == [] and slots.get_block_ids("f") == [1]


def test_a_request_admitted_before_the_moves_keeps_its_slot() -> None:
    """Between a free and take_moves a newcomer takes the lowest free row (the hole)."""
    slots = SlotManager(3, 16)
    requests = {x: _request(x) for x in "abc"}
    for request in requests.values():
        slots.allocate_slots(request, 3)
    slots.free(requests["a"])
    newcomer = _request("d")
    assert slots.allocate_slots(newcomer, 3) == [] and slots.get_block_ids("d") == [0]
    assert slots.take_moves() == []
