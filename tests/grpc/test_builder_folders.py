"""Model-builder folders (ONNX Runtime GenAI's genai_config.json layout) served on KV slots.

Each family is a tiny random-weight checkpoint run through onnxruntime-genai's model
builder and dropped into the repository as the builder wrote it (tests/genai_models.py).
Every greedy token is compared with transformers', each prompt alone and with streams of
different prompt lengths joining in waves; Info shows the slot path and sequences sharing
decode passes. A folder built for CUDA in bfloat16 is refused on the CPU with that reason;
a model with two slots queues a third stream and a cancelled stream gives its slot back.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import pytest

from tests.conftest import ServerThread, serve
from tests.genai_models import NEW_TOKENS, BuiltModel, build_families
from tests.generate_reference import ReferenceRun
from tests.generate_streams import greedy_tokens, in_waves, model_status

SERVED = ["llama", "qwen2", "qwen3", "mistral_sw16", "qwen2_sw8", "phi3", "gemma2", "gemma3"]
"""mistral_sw16 windows every layer (16), qwen2_sw8 and gemma2 one layer (8), gemma3 its
sliding layers: all shorter than the longest sequences here."""
RINGS = {"mistral_sw16", "qwen2_sw8", "gemma2", "gemma3"}
"""Their window-sized ring caches hold positions as they are for fewer than two blocks of
the prefix store: their prefixes are not reused."""
TWO_SLOTS = "llama_2slots"
CHUNKED = "gemma2_chunked"
"""gemma2 (a window of 8 on layer 0) with a step budget of 8 tokens: prompts longer than
the budget and than the window prefill into their slots in chunks."""


@pytest.fixture(scope="module")
def built() -> dict[str, BuiltModel]:
    return build_families()


@pytest.fixture(scope="module")
def server(
    built: dict[str, BuiltModel], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    repo = tmp_path_factory.mktemp("builder-repo")
    for name in [*SERVED, "llama_bf16_cuda"]:
        shutil.copytree(built[name].path, repo / name)
    shutil.copytree(built["llama"].path, repo / TWO_SLOTS)
    (repo / TWO_SLOTS / "model.toml").write_text(
        "[generator]\nmax_num_seqs = 2\nmax_model_len = 128\n"
    )
    shutil.copytree(built["gemma2"].path, repo / CHUNKED)
    (repo / CHUNKED / "model.toml").write_text(
        "[generator]\nmax_num_seqs = 4\nmax_num_batched_tokens = 8\n"
    )
    srv = serve(repo)
    yield srv
    srv.stop()


def _in_waves(client, name: str, runs: list[ReferenceRun], waves: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Every run's prompt as a stream, started in `waves` waves; stream i asks for its
    reference's length less 2i tokens, so streams leave at different steps and slots free
    below others."""
    requests = [(run.prompt, len(run.tokens) - 2 * i) for i, run in enumerate(runs)]
    per_wave = -(-len(runs) // waves)
    sizes = [min(per_wave, len(runs) - start) for start in range(0, len(runs), per_wave)]
    return in_waves(client, name, requests, sizes)


@pytest.mark.parametrize("name", SERVED)
def test_transformers_tokens_alone_and_in_waves(
    server: ServerThread, built: dict[str, BuiltModel], name: str
) -> None:
    from tensord_client import Client

    runs = built[name].reference_runs()
    assert len({len(r.prompt) for r in runs}) == len(runs) >= 6  # lengths all differ
    with Client(server.target, timeout=60, retries=0) as client:
        status = model_status(client, name).generator
        assert (status.kv_path, status.batch_layout) == ("slots", "ragged"), status
        assert status.slot_bytes > 0 and status.kv_cache.total_blocks >= 6
        compared = sum(
            run.check(
                greedy_tokens(client, name, list(run.prompt), len(run.tokens), threading.Event())
            )
            for run in runs
        )
        # Near ties are rare on these weights: nearly every token is compared.
        assert compared >= 0.75 * NEW_TOKENS * len(runs), compared
        # Streams started at once do not always reach the server in one step on a loaded
        # host: up to three tries for a pass that three of them share.
        for _ in range(3):
            before = model_status(client, name).generator
            streams = _in_waves(client, name, runs, waves=2)
            after = model_status(client, name).generator
            lengths = [len(r.tokens) - 2 * i for i, r in enumerate(runs)]
            assert [len(s) for s in streams] == lengths
            for run, tokens in zip(runs, streams, strict=True):
                run.check(tokens)  # the reference's tokens, as far as each stream went
            passes = after.model_passes - before.model_passes
            sequences = after.pass_sequences - before.pass_sequences
            if sequences > passes and after.max_pass_sequences >= 3:
                break
        assert sequences > passes > 0, (sequences, passes)
        assert after.max_pass_sequences >= 3  # three streams decoded in one pass
        assert after.kv_cache.used_blocks == 0  # every slot given back
        # The waves repeat the prompts: their stored blocks were copied into the slots
        # (not on models whose ring caches of a sliding window hold under two blocks).
        if name in RINGS:
            assert "prefixes not reused: a slot holds positions" in status.kv_path_reason
        else:
            assert status.kv_path_reason.count("prefixes not reused") == 0
            assert after.prefix_hit_tokens > before.prefix_hit_tokens
            assert after.prefix_bytes_loaded > before.prefix_bytes_loaded
        assert after.model_seconds > 0 and after.step_seconds >= after.model_seconds


def test_cuda_only_folder_is_refused_on_the_cpu(server: ServerThread) -> None:
    from tensord_client import Client

    with Client(server.target, timeout=60, retries=0) as client:
        model = model_status(client, "llama_bf16_cuda")
        assert "built for cuda" in model.reason, model
        with pytest.raises(grpc.RpcError) as caught:
            list(client.generate("llama_bf16_cuda", token_ids=[5, 6], max_tokens=2))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "built for cuda" in (caught.value.details() or "")


def test_more_streams_than_slots_queue_and_all_finish(
    server: ServerThread, built: dict[str, BuiltModel]
) -> None:
    """Two slots, six streams: every stream gets transformers' tokens, none fails, and no
    pass carries more than two sequences."""
    from tensord_client import Client

    runs = built["llama"].reference_runs()[:6]
    with Client(server.target, timeout=60, retries=0) as client:
        status = model_status(client, TWO_SLOTS).generator
        assert status.kv_cache.total_blocks == 2 and status.max_model_len == 128
        compared_alone = [
            run.check(
                greedy_tokens(
                    client, TWO_SLOTS, list(run.prompt), len(run.tokens), threading.Event()
                )
            )
            for run in runs
        ]
        streams = _in_waves(client, TWO_SLOTS, runs, waves=1)
        for run, tokens in zip(runs, streams, strict=True):
            run.check(tokens)
        assert all(compared_alone)
        after = model_status(client, TWO_SLOTS).generator
        assert after.max_pass_sequences == 2
        assert after.kv_cache.used_blocks == 0


def _prioritised(  # type: ignore[no-untyped-def]
    client,
    prompt: Sequence[int],
    tokens: int,
    priority: int,
    out: list[int],
    first: threading.Event,
) -> None:
    """A greedy stream of `priority` on the two-slot model: its tokens into `out`."""
    for chunk in client.generate(
        TWO_SLOTS,
        token_ids=list(prompt),
        max_tokens=tokens,
        temperature=0,
        ignore_eos=True,
        priority=priority,
    ):
        out.extend(chunk.token_ids)
        first.set()


def test_a_higher_priority_stream_preempts_and_the_preempted_resume_as_alone(
    server: ServerThread, built: dict[str, BuiltModel]
) -> None:
    """Both slots hold priority-5 streams when a priority-0 one arrives: the later of them
    is preempted, the urgent stream starts at once with transformers' tokens, and the
    preempted one resumes over its stored prefix with the tokens it gets alone."""
    from tensord_client import Client

    runs = built["llama"].reference_runs()
    low, urgent = [runs[2], runs[5]], runs[4]  # prompts of 40 and 31 tokens; 22
    with Client(server.target, timeout=60, retries=0) as client:
        alone = [
            greedy_tokens(client, TWO_SLOTS, list(run.prompt), 80, threading.Event()) for run in low
        ]
        for run, tokens in zip(low, alone, strict=True):
            run.check(tokens)
        for _ in range(3):  # a loaded host may finish the low streams before the urgent one
            before = model_status(client, TWO_SLOTS).generator
            got: list[list[int]] = [[], [], []]
            firsts = [threading.Event() for _ in range(3)]
            threads = [
                threading.Thread(
                    target=_prioritised, args=(client, run.prompt, 80, 5, got[i], firsts[i])
                )
                for i, run in enumerate(low)
            ]
            for thread in threads:
                thread.start()
            assert firsts[0].wait(30) and firsts[1].wait(30)
            _prioritised(client, urgent.prompt, len(urgent.tokens), 0, got[2], firsts[2])
            for thread in threads:
                thread.join(60)
            after = model_status(client, TWO_SLOTS).generator
            assert got[0] == alone[0] and got[1] == alone[1]
            urgent.check(got[2])
            assert len(got[2]) == len(urgent.tokens)
            if after.preemptions > before.preemptions:
                break
        assert after.preemptions > before.preemptions
        # Each low stream joined over its stored prompt blocks (32 + 16 tokens), and the
        # preempted one came back over at least one more block of its own.
        assert after.prefix_hit_tokens - before.prefix_hit_tokens >= 32 + 16 + 16
        assert after.kv_cache.used_blocks == 0


def test_a_sequence_moved_into_a_freed_slot_goes_on_as_alone(server: ServerThread) -> None:
    """Slot 0's stream is cancelled once slot 1's has started: slot 1's sequence moves
    into slot 0 and its tokens stay those of the same request alone."""
    from tensord_client import Client

    prompt = [11, 23, 35, 47, 59]
    with Client(server.target, timeout=60, retries=0) as client:
        alone = greedy_tokens(client, TWO_SLOTS, prompt, 100, threading.Event())
        moves = model_status(client, TWO_SLOTS).generator.slot_moves
        first = client.generate(TWO_SLOTS, token_ids=[5, 6, 7], max_tokens=120, ignore_eos=True)
        next(first)  # slot 0 held
        second = client.generate(TWO_SLOTS, token_ids=prompt, max_tokens=100, ignore_eos=True)
        tokens = list(next(second).token_ids)  # slot 1 held, 100 tokens to go
        first.close()  # type: ignore[attr-defined]  # a generator: the call is cancelled
        tokens += [token for chunk in second for token in chunk.token_ids]
        assert tokens == alone
        assert model_status(client, TWO_SLOTS).generator.slot_moves == moves + 1


def test_a_cancelled_stream_gives_its_slot_back(server: ServerThread) -> None:
    from tensord_client import Client

    with Client(server.target, timeout=60, retries=0) as client:
        streams = [
            client.generate(TWO_SLOTS, token_ids=[5, 6, 7], max_tokens=120, ignore_eos=True)
            for _ in range(2)
        ]
        for stream in streams:
            next(stream)
            stream.close()  # type: ignore[attr-defined]  # a generator: the call is cancelled
        deadline = time.monotonic() + 10
        while model_status(client, TWO_SLOTS).generator.kv_cache.used_blocks and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert model_status(client, TWO_SLOTS).generator.kv_cache.used_blocks == 0
        assert len(greedy_tokens(client, TWO_SLOTS, [5, 6, 7], 4, threading.Event())) == 4


def test_sampling_logprobs_and_stop_strings_on_slots(server: ServerThread) -> None:
    """Seeded sampling repeats itself, logprobs come with each token, and a stop string
    ends the text before it, on the slot path as on the paged one."""
    from tensord_client import Client

    def chunks(**sampling: object) -> list:  # type: ignore[type-arg]
        return list(client.generate("llama", "Once upon a time", **sampling))

    with Client(server.target, timeout=60, retries=0) as client:
        sampled = [
            chunks(max_tokens=12, temperature=0.9, seed=7, logprobs=2, ignore_eos=True)
            for _ in range(2)
        ]
        tokens = [[t for c in run for t in c.token_ids] for run in sampled]
        assert tokens[0] == tokens[1] and len(tokens[0]) == 12
        logprobs = [lp for c in sampled[0] for lp in c.logprobs]
        assert len(logprobs) == 12 and all(len(lp.top) == 2 for lp in logprobs)
        greedy = "".join(c.text for c in chunks(max_tokens=12, temperature=0, ignore_eos=True))
        stop = greedy[len(greedy) // 2 :][:3]
        assert stop.strip(), greedy
        stopped = chunks(max_tokens=12, temperature=0, ignore_eos=True, stop=[stop])
        text = "".join(c.text for c in stopped)
        assert greedy.startswith(text) and stop not in text
        assert stopped[-1].finish_reason is not None
        assert stopped[-1].finish_reason.name.lower().endswith("stop")


def test_long_prompts_prefill_into_their_slots_in_chunks(
    server: ServerThread, built: dict[str, BuiltModel]
) -> None:
    """Prompts of 13 to 40 tokens with a step budget of 8: chunks over several steps (the
    window-sized layer's cache wraps inside a prompt), alone and three at once, each with
    transformers' tokens."""
    from tensord_client import Client

    runs = [r for r in built["gemma2"].reference_runs() if len(r.prompt) > 8]
    with Client(server.target, timeout=60, retries=0) as client:
        assert model_status(client, CHUNKED).generator.max_num_batched_tokens == 8
        for run in runs:
            tokens = greedy_tokens(
                client, CHUNKED, list(run.prompt), len(run.tokens), threading.Event()
            )
            assert len(tokens) == len(run.tokens) and run.check(tokens) > 0
        streams = _in_waves(client, CHUNKED, runs, waves=1)
        for run, tokens in zip(runs, streams, strict=True):
            run.check(tokens)
