"""The scheduler on 11 blocks of 4 tokens: batching, budget, chunking, preemption, finishing."""

from __future__ import annotations

import random

import grpc
import pytest

from tensord.errors import InvalidArgumentError, ResourceExhaustedError
from tensord.generate.core.kv_cache_manager import KVCacheManager
from tensord.generate.core.outputs import EngineCoreOutput, TokenLogprob
from tensord.generate.core.request import Request, RequestStatus
from tensord.generate.core.scheduler import Scheduler, SchedulerConfig
from tensord.generate.core.scheduler_output import SchedulerOutput
from tests.unit.generate.helpers import make_request


def make(
    max_num_seqs: int = 8, budget: int = 64, max_model_len: int = 44, queue: int = 0
) -> Scheduler:
    config = SchedulerConfig(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_queue_size=queue,
    )
    return Scheduler(config, KVCacheManager(11, 4))


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run(scheduler: Scheduler, output: SchedulerOutput) -> list[EngineCoreOutput]:
    """Sample a distinct, non-eos token for every request that samples: 1000 * (seq) + n."""
    sampled = {
        item.request_id: 1000 + 10 * item.request.arrival_seq + item.request.num_output_tokens
        for item in output.scheduled
        if item.sample
    }
    return scheduler.update_from_output(output, sampled)


def step(scheduler: Scheduler, now: float = 0.0) -> SchedulerOutput:
    output = scheduler.schedule(now)
    run(scheduler, output)
    return output


def plan(output: SchedulerOutput) -> list[tuple[str, int, int, list[int], bool]]:
    """(id, start position, token count, block table, samples) per scheduled request."""
    return [
        (i.request_id, i.start_pos, i.num_tokens, i.block_ids, i.sample) for i in output.scheduled
    ]


def free_list(scheduler: Scheduler) -> list[int]:
    return scheduler.kv_cache_manager.block_pool.free_block_queue.block_ids()


def refs(scheduler: Scheduler) -> list[int]:
    return [block.ref_cnt for block in scheduler.kv_cache_manager.block_pool.blocks]


def assert_idle(scheduler: Scheduler) -> None:
    stats = scheduler.kv_cache_manager.stats()
    assert (stats.used_blocks, stats.free_blocks) == (0, 11)
    assert refs(scheduler) == [0] * 11
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.req_to_blocks == {}


def test_running_requests_decode_every_step_and_blocks_grow_on_demand() -> None:
    scheduler = make()
    scheduler.add_request(make_request("a", tokens(1, 6), max_tokens=3))
    scheduler.add_request(make_request("b", tokens(20, 3), max_tokens=5))
    first = step(scheduler)
    assert plan(first) == [("a", 0, 6, [0, 1], True), ("b", 0, 3, [2], True)]
    assert first.scheduled[0].token_ids == tokens(1, 6)
    second = scheduler.schedule(0.0)
    assert plan(second) == [("a", 6, 1, [0, 1], True), ("b", 3, 1, [2], True)]
    assert second.scheduled[0].token_ids == [1000]
    assert second.scheduled[1].token_ids == [1010]
    run(scheduler, second)
    third = scheduler.schedule(0.0)
    assert plan(third) == [("a", 7, 1, [0, 1], True), ("b", 4, 1, [2, 3], True)]
    outputs = run(scheduler, third)
    # a reached max_tokens=3: finished, blocks freed tail-first
    assert outputs[0] == EngineCoreOutput("a", [1002], RequestStatus.FINISHED_LENGTH)
    assert outputs[1] == EngineCoreOutput("b", [1012], None)
    assert free_list(scheduler) == [4, 5, 6, 7, 8, 9, 10, 1, 0]
    assert refs(scheduler)[:4] == [0, 0, 1, 1]
    fourth = scheduler.schedule(0.0)
    assert fourth.finished_req_ids == {"a"}
    assert plan(fourth) == [("b", 5, 1, [2, 3], True)]


def test_token_budget_chunks_prefill_and_max_num_seqs_caps_running() -> None:
    scheduler = make(max_num_seqs=2, budget=8)
    for rid, start in (("a", 1), ("b", 20), ("c", 40)):
        scheduler.add_request(make_request(rid, tokens(start, 5)))
    first = step(scheduler)
    # a takes 5 tokens, b the 3 left in the budget (no sample); c has no seat
    assert plan(first) == [("a", 0, 5, [0, 1], True), ("b", 0, 3, [2], False)]
    assert [r.request_id for r in scheduler.waiting] == ["c"]
    second = step(scheduler)
    assert plan(second) == [("a", 5, 1, [0, 1], True), ("b", 3, 2, [2, 3], True)]
    third = step(scheduler)
    assert plan(third) == [("a", 6, 1, [0, 1], True), ("b", 5, 1, [2, 3], True)]
    scheduler.abort(["a"])
    # a's blocks went to the tail of the free list: c gets the least recently freed
    assert free_list(scheduler) == [4, 5, 6, 7, 8, 9, 10, 1, 0]
    fourth = step(scheduler)
    assert plan(fourth) == [("b", 6, 1, [2, 3], True), ("c", 0, 5, [4, 5], True)]


def test_a_long_prompt_is_prefilled_in_chunks_and_samples_once() -> None:
    scheduler = make(max_num_seqs=2, budget=4)
    scheduler.add_request(make_request("a", tokens(1, 10)))
    chunks = [plan(step(scheduler)) for _ in range(4)]
    assert chunks == [
        [("a", 0, 4, [0], False)],
        [("a", 4, 4, [0, 1], False)],
        [("a", 8, 2, [0, 1, 2], True)],
        [("a", 10, 1, [0, 1, 2], True)],
    ]
    request = scheduler.get_request("a")
    assert request is not None and request.output_token_ids == [1000, 1001]


def test_a_prefill_leaves_one_token_of_budget_for_each_decode() -> None:
    scheduler = make(max_num_seqs=3, budget=6)
    scheduler.add_request(make_request("a", tokens(1, 2)))
    scheduler.add_request(make_request("b", tokens(10, 2)))
    step(scheduler)  # both prefilled
    scheduler.add_request(make_request("c", tokens(30, 12)))
    second = step(scheduler)
    assert plan(second) == [
        ("a", 2, 1, [0], True),
        ("b", 2, 1, [1], True),
        ("c", 0, 4, [2], False),
    ]
    scheduler.add_request(make_request("d", tokens(60, 3)))
    third = step(scheduler)
    # c is mid-prefill and older than nothing after it: it takes what the decodes leave
    assert plan(third) == [
        ("a", 3, 1, [0], True),
        ("b", 3, 1, [1], True),
        ("c", 4, 4, [2, 3], False),
    ]


def test_first_come_first_served_no_overtaking() -> None:
    scheduler = make()
    scheduler.add_request(make_request("big", tokens(1, 40), max_tokens=1))
    step(scheduler)  # big holds 10 blocks and finishes
    scheduler.add_request(make_request("hog", tokens(100, 36), max_tokens=4))
    scheduler.add_request(make_request("next", tokens(200, 12)))
    scheduler.add_request(make_request("small", tokens(300, 2)))
    first = step(scheduler)
    # hog takes 9 of 11 blocks; next needs 3 and waits; small would fit but must not overtake
    assert [i.request_id for i in first.scheduled] == ["hog"]
    assert [r.request_id for r in scheduler.waiting] == ["next", "small"]


def test_the_newest_running_request_is_preempted_and_recomputes_later() -> None:
    scheduler = make(max_model_len=44)
    scheduler.add_request(make_request("a", tokens(1, 16)))
    scheduler.add_request(make_request("b", tokens(20, 16)))
    scheduler.add_request(make_request("c", tokens(40, 8)))
    first = step(scheduler)
    assert [i.block_ids for i in first.scheduled] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert free_list(scheduler) == [10]
    second = step(scheduler)
    # a takes block 10; b needs a block: c, the newest, is preempted and b gets block 9
    assert second.preempted_req_ids == ["c"]
    assert plan(second) == [
        ("a", 16, 1, [0, 1, 2, 3, 10], True),
        ("b", 16, 1, [4, 5, 6, 7, 9], True),
    ]
    c = scheduler.get_request("c")
    assert c is not None
    assert (c.status, c.num_computed_tokens, c.num_preemptions) == (RequestStatus.PREEMPTED, 0, 1)
    assert c.output_token_ids == [1020]  # its generated token stays
    assert free_list(scheduler) == [8]
    third = step(scheduler)
    # c needs 3 blocks (9 tokens); its first block 8 is still cached but 2 more do not fit
    assert [i.request_id for i in third.scheduled] == ["a", "b"]
    assert third.preempted_req_ids == []
    scheduler.abort(["a"])
    fourth = step(scheduler)
    # c resumes: block 8 is a prefix hit; it recomputes its prompt tail and its output token
    assert plan(fourth)[1] == ("c", 4, 5, [8, 10, 3], True)
    assert fourth.scheduled[1].token_ids == [*tokens(44, 4), 1020]
    assert c.output_token_ids == [1020, 1021]
    assert c.status == RequestStatus.RUNNING


def test_a_request_that_is_itself_the_newest_preempts_itself() -> None:
    scheduler = make(max_model_len=44)
    scheduler.add_request(make_request("a", tokens(1, 18)))
    scheduler.add_request(make_request("b", tokens(30, 18)))
    first = step(scheduler)
    assert [i.block_ids for i in first.scheduled] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    # positions 18 and 19 fit in the last blocks
    assert not step(scheduler).preempted_req_ids
    assert not step(scheduler).preempted_req_ids
    # position 20 needs a sixth block: a takes block 10; b finds none and is the newest
    fourth = scheduler.schedule(0.0)
    assert plan(fourth) == [("a", 20, 1, [0, 1, 2, 3, 4, 10], True)]
    assert fourth.preempted_req_ids == ["b"]
    assert [r.request_id for r in scheduler.waiting] == ["b"]
    assert free_list(scheduler) == [9, 8, 7, 6, 5]


def test_preempted_requests_return_to_the_queue_in_arrival_order() -> None:
    scheduler = make(max_model_len=44)
    scheduler.add_request(make_request("a", tokens(1, 25)))  # 7 blocks: 0-6
    for rid, start in (("b", 40), ("c", 50), ("d", 60), ("e", 70)):
        scheduler.add_request(make_request(rid, tokens(start, 3)))  # 1 block each: 7-10
    first = step(scheduler)
    assert [i.block_ids for i in first.scheduled][1:] == [[7], [8], [9], [10]]
    assert not step(scheduler).preempted_req_ids  # everyone fits position 3 (or 25)
    scheduler.add_request(make_request("f", tokens(80, 1)))
    third = scheduler.schedule(0.0)
    # b and c need a block each at position 4: e, then d, are preempted for them
    assert third.preempted_req_ids == ["e", "d"]
    assert plan(third) == [
        ("a", 26, 1, [0, 1, 2, 3, 4, 5, 6], True),
        ("b", 4, 1, [7, 10], True),
        ("c", 4, 1, [8, 9], True),
    ]
    # no admissions on a step that preempted; the queue stays in arrival order
    assert [r.request_id for r in scheduler.waiting] == ["d", "e", "f"]


def test_a_lower_priority_value_joins_first_and_preempts_for_a_seat() -> None:
    scheduler = make(max_num_seqs=2)
    scheduler.add_request(make_request("low", tokens(1, 4), priority=5))
    scheduler.add_request(make_request("later", tokens(10, 4), priority=5))
    step(scheduler)
    # every seat is taken: "waits" ranks after both (same priority), "urgent" before
    scheduler.add_request(make_request("waits", tokens(20, 4), priority=5))
    scheduler.add_request(make_request("urgent", tokens(30, 4), priority=1))
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "waits"]
    second = step(scheduler)
    # the last-ranked running request (same priority: the newest) makes room
    assert second.preempted_req_ids == ["later"]
    assert [i.request_id for i in second.scheduled] == ["low", "urgent"]
    assert [r.request_id for r in scheduler.waiting] == ["later", "waits"]
    later = scheduler.get_request("later")
    assert later is not None and later.output_token_ids == [1010]  # kept for its return
    # an equal priority never preempts: "later" waits for a seat
    third = step(scheduler)
    assert not third.preempted_req_ids
    assert [i.request_id for i in third.scheduled] == ["urgent", "low"]  # in rank order
    scheduler.abort(["low"])
    fourth = step(scheduler)
    assert [i.request_id for i in fourth.scheduled] == ["urgent", "later"]
    assert plan(fourth)[1][:3] == ("later", 4, 1)  # its cached prompt block, then the rest


def test_priority_orders_the_queue_and_preemption_for_blocks() -> None:
    scheduler = make(max_model_len=44)
    scheduler.add_request(make_request("bulk", tokens(1, 20), priority=3))  # 5 blocks
    scheduler.add_request(make_request("vip", tokens(30, 20), priority=0))  # 5 blocks
    first = step(scheduler)
    assert [i.request_id for i in first.scheduled] == ["vip", "bulk"]
    # 1 block left: a newcomer of priority 1 needs 2 and outranks bulk, which gives way
    scheduler.add_request(make_request("mid", tokens(60, 6), priority=1))
    second = step(scheduler)
    assert second.preempted_req_ids == ["bulk"]
    assert [i.request_id for i in second.scheduled] == ["vip", "mid"]
    assert [r.request_id for r in scheduler.waiting] == ["bulk"]


def test_deadline_expiry_finishes_and_frees() -> None:
    scheduler = make()
    scheduler.add_request(make_request("a", tokens(1, 6), deadline=5.0))
    scheduler.add_request(make_request("b", tokens(20, 6), deadline=50.0))
    scheduler.add_request(make_request("w", tokens(40, 40), deadline=5.0))  # cannot fit yet
    first = step(scheduler, now=1.0)
    assert [i.request_id for i in first.scheduled] == ["a", "b"]
    a = scheduler.get_request("a")
    assert a is not None
    later = scheduler.schedule(now=5.0)
    assert later.expired_req_ids == ["a", "w"]
    assert later.finished_req_ids == {"a", "w"}
    assert a.status == RequestStatus.FINISHED_DEADLINE
    assert plan(later) == [("b", 6, 1, [2, 3], True)]
    assert refs(scheduler)[:4] == [0, 0, 1, 1]
    run(scheduler, later)
    scheduler.schedule(now=60.0)
    assert_idle(scheduler)


def test_abort_frees_at_once_even_mid_step() -> None:
    scheduler = make()
    scheduler.add_request(make_request("a", tokens(1, 6)))
    scheduler.add_request(make_request("b", tokens(20, 6)))
    output = scheduler.schedule(0.0)
    assert scheduler.abort(["a", "nope"]) == ["a"]
    assert refs(scheduler)[:4] == [0, 0, 1, 1]
    assert free_list(scheduler)[-2:] == [1, 0]
    outputs = run(scheduler, output)  # the step finishes after the abort
    assert [o.request_id for o in outputs] == ["b"]
    assert scheduler.abort(["a"]) == []
    scheduler.add_request(make_request("w", tokens(40, 40)))
    assert scheduler.abort(["w"]) == ["w"]
    assert scheduler.abort(["b"]) == ["b"]
    assert scheduler.schedule(0.0).finished_req_ids == {"a", "b", "w"}
    assert_idle(scheduler)


def test_token_level_stops() -> None:
    scheduler = make(max_model_len=32)
    scheduler.add_request(make_request("eos", tokens(1, 3)))
    scheduler.add_request(make_request("ignore", tokens(1, 3), ignore_eos=True))
    scheduler.add_request(make_request("stopid", tokens(1, 3), stop_token_ids=frozenset({77})))
    scheduler.add_request(make_request("ctx", tokens(1, 30)))
    output = scheduler.schedule(0.0)
    sampled = {"eos": 0, "ignore": 0, "stopid": 77, "ctx": 5}
    logprob = TokenLogprob(0, -0.5, ((0, -0.5), (3, -1.0)))
    outputs = scheduler.update_from_output(output, sampled, {"eos": logprob})
    assert [(o.request_id, o.finish_status, o.stop_reason) for o in outputs] == [
        ("eos", RequestStatus.FINISHED_STOPPED, None),
        ("ignore", None, None),
        ("stopid", RequestStatus.FINISHED_STOPPED, 77),
        ("ctx", None, None),
    ]
    assert outputs[0].new_logprobs == [logprob]
    assert outputs[1].new_logprobs is None
    # ctx has 31 tokens; the next makes 32 = max_model_len
    outputs = run(scheduler, scheduler.schedule(0.0))
    assert [(o.request_id, o.finish_status) for o in outputs] == [
        ("ignore", None),
        ("ctx", RequestStatus.FINISHED_LENGTH),
    ]


def test_finish_requests_from_outside_the_step() -> None:
    scheduler = make()
    scheduler.add_request(make_request("a", tokens(1, 6)))
    step(scheduler)
    assert scheduler.finish_requests(["a"], RequestStatus.FINISHED_STOPPED) == ["a"]
    with pytest.raises(ValueError, match="RUNNING is not a finished state"):
        scheduler.finish_requests(["a"], RequestStatus.RUNNING)
    assert_idle(scheduler)


def test_a_full_waiting_queue_refuses_with_resource_exhausted() -> None:
    # Two seats and room for two waiting: a burst into an idle engine takes four, since
    # the two the next step seats are not waiting.
    scheduler = make(max_num_seqs=2, queue=2)
    for rid in "abcd":
        scheduler.add_request(make_request(rid, tokens(1, 4)))
    with pytest.raises(ResourceExhaustedError) as caught:
        scheduler.add_request(make_request("e", tokens(1, 4)))
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue is full (2 requests waiting)" in caught.value.message
    step(scheduler)  # a and b run, c and d wait: still full
    with pytest.raises(ResourceExhaustedError):
        scheduler.add_request(make_request("e", tokens(1, 4)))
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_STOPPED)  # a seat is free
    scheduler.add_request(make_request("e", tokens(1, 4)))
    assert scheduler.stats().num_rejected == 2
    with pytest.raises(ValueError, match="already queued"):
        scheduler.add_request(make_request("e", tokens(1, 4)))


def test_a_request_larger_than_the_pool_is_refused() -> None:
    scheduler = make(max_model_len=64)
    with pytest.raises(
        InvalidArgumentError, match="needs 45 tokens of KV cache; the pool holds 44"
    ):
        scheduler.add_request(make_request("a", tokens(1, 5), max_tokens=40))


def test_config_limits() -> None:
    with pytest.raises(ValueError, match="must be at least max_num_seqs"):
        SchedulerConfig(max_model_len=64, max_num_seqs=8, max_num_batched_tokens=4)
    with pytest.raises(ValueError, match="max_model_len must be >= 2"):
        SchedulerConfig(max_model_len=1)


def test_the_pool_returns_to_idle_after_a_random_workload() -> None:
    rng = random.Random(7)
    scheduler = make(max_num_seqs=4, budget=12)
    live: list[str] = []
    preemptions = 0
    for n in range(300):
        if n < 200 and rng.random() < 0.3:
            rid = f"r{n}"
            prompt = [rng.randrange(1, 5) for _ in range(rng.randrange(1, 20))]
            deadline = rng.choice([None, None, 0.5 * n + rng.randrange(1, 20)])
            scheduler.add_request(
                make_request(rid, prompt, max_tokens=rng.randrange(1, 20), deadline=deadline)
            )
            live.append(rid)
        if live and rng.random() < 0.05:
            scheduler.abort([rng.choice(live)])
        output = scheduler.schedule(0.5 * n)
        preemptions += len(output.preempted_req_ids)
        check_tables(scheduler, output)
        run(scheduler, output)
    while scheduler.has_unfinished_requests():
        run(scheduler, scheduler.schedule(1000.0 - 1))
    assert preemptions > 0
    assert scheduler.stats().kv_cache.prefix_hits > 0
    assert_idle(scheduler)


def check_tables(scheduler: Scheduler, output: SchedulerOutput) -> None:
    """Every scheduled request's table covers its tokens, with at most one spare slot
    block; blocks are shared only as prefix blocks; budgets hold."""
    assert output.num_scheduled_tokens <= scheduler.config.max_num_batched_tokens
    assert len(scheduler.running) <= scheduler.config.max_num_seqs
    for item in output.scheduled:
        assert len(item.block_ids) == -(-item.seq_len // 4)
        assert item.token_ids == item.request.all_token_ids[item.start_pos : item.seq_len]
    owners: dict[int, list[Request]] = {}
    for request in scheduler.running:
        for j, block in enumerate(scheduler.kv_cache_manager.get_block_ids(request.request_id)):
            owners.setdefault(block, []).append(request)
            if len(owners[block]) > 1:
                first = owners[block][0]
                assert first.all_token_ids[: 4 * (j + 1)] == request.all_token_ids[: 4 * (j + 1)]


def test_a_request_the_runner_gave_no_token_ends_with_an_error() -> None:
    scheduler = make()
    scheduler.add_request(make_request("a", tokens(1, 6)))
    scheduler.add_request(make_request("b", tokens(20, 6)))
    output = scheduler.schedule(0.0)
    outputs = scheduler.update_from_output(output, {"b": 7})
    assert outputs == [
        EngineCoreOutput("a", [], RequestStatus.FINISHED_ERROR),
        EngineCoreOutput("b", [7], None),
    ]
    assert refs(scheduler)[:4] == [0, 0, 1, 1]
    assert scheduler.abort(["b"]) == ["b"]
    assert_idle(scheduler)
