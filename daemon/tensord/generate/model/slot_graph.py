"""The session a model on KV slots serves with, and the checks before READY.

  1. open the session (the provider plan as for every model): a model-builder folder's
     graph, or an Optimum export's rewritten onto GroupQueryAttention
     (attention_rewrite.py; open_export_slots); a folder whose operators have no kernels
     on the provider it got (a CUDA build on a host without a GPU) is refused with the
     providers genai_config.json names;
  2. size the slots: per layer, max_model_len positions, or the window for a layer with a
     window-sized cache;
  3. check_slots: a sequence's logits when it decodes beside a longer one equal its
     logits alone, computed in one prompt pass; a graph that disagrees is refused; for a
     rewritten export, check_against_export: every step's logits equal the export's own.

Used by the loader and by `tensord inspect`, so both reach the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from tensord.backends.base import DeviceOptions
from tensord.backends.onnxruntime import OnnxRuntimeBackend, available_providers
from tensord.backends.ort_session import usable_providers
from tensord.backends.providers import plan_providers
from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.model.attention_rewrite import (
    RewriteDeclined,
    layer_windows_of,
    rewrite_export,
)
from tensord.generate.model.model_dir import GeneratorSpec
from tensord.generate.worker.kv_slots import SlotLayout, SlotStorage
from tensord.generate.worker.model_runner import PassStats
from tensord.generate.worker.slot_runner import SlotRunner
from tensord.modelconfig.model import ModelConfig

log = structlog.get_logger("tensord.generate")

_DEVICE_PROVIDERS = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}
DEVICE_KV_FRACTION = 0.5
"""Of the device memory free once the session is open, the share the KV slots take when
kv_cache_bytes is not set."""

REWRITE_REASON = (
    "the export's attention was rewritten at load onto GroupQueryAttention, with its own "
    "rotary, and matched the export's logits: each sequence owns a KV slot bound in place, "
    "and a step moves only tokens, masks and logits"
)
RAGGED_REASON = (
    "each row attends over its own KV slot, bounded by its own length: sequences of any "
    "lengths share every decode pass, with no padding"
)
SLOTS_REASON = (
    "the graph's attention is GroupQueryAttention with past and present in one buffer: each "
    "sequence owns a KV slot bound in place, and a step moves only tokens, masks and logits"
)


@dataclass(slots=True)
class SlotSession:
    """An open session and where its KV slots live."""

    backend: OnnxRuntimeBackend
    device: str
    """"cpu", or "cuda" when the session runs on a CUDA device."""
    logits_dtype: np.dtype
    kv_budget_bytes: int | None
    """The slots' default budget on a device (a share of its free memory); None on the
    CPU, where [generator] kv_cache_bytes or its default sizes them."""


def slot_layout(spec: GeneratorSpec, max_model_len: int, device: str = "cpu") -> SlotLayout:
    """One slot of `spec`: max_model_len positions per layer, and for a layer the builder
    gave a window-sized cache (GroupQueryAttention's sliding_window_cache: the kernel keeps
    the last positions and evicts the oldest) the window, plus genai_config.json's
    cache_slack on the CPU (the CUDA kernel takes exactly the window)."""
    window = spec.genai.sliding_window if spec.genai is not None else None
    windowed = 0
    if window is not None:
        windowed = window.window_size + (window.cache_slack if device == "cpu" else 0)
    lengths = tuple(
        windowed if window is not None and layer in window.layers else max_model_len
        for layer in range(spec.num_layers)
    )
    return SlotLayout(
        spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.kv_dtype.numpy, lengths
    )


def _refusal(spec: GeneratorSpec, exc: ModelLoadError) -> ModelLoadError:
    built_for = spec.genai.providers if spec.genai is not None else ()
    if not built_for:
        return exc
    return ModelLoadError(
        f"{spec.model_path}: this folder was built for {', '.join(built_for)} "
        f"(genai_config.json: model.decoder.session_options.provider_options), and ONNX "
        f"Runtime cannot open it with this host's providers: {exc}"
    )


def _free_device_bytes(device_id: int) -> int | None:
    try:
        from cuda.bindings import runtime as cudart

        from tensord.cuda.runtime import check

        check(cudart.cudaSetDevice(device_id), "cudaSetDevice")
        free, _total = check(cudart.cudaMemGetInfo(), "cudaMemGetInfo")
    except Exception as exc:  # no bindings: the configured or default budget stands
        log.warning("generator.device_memory_unknown", error=repr(exc))
        return None
    return int(free)


def open_slot_session(
    spec: GeneratorSpec,
    config: ModelConfig,
    where: DeviceOptions | None = None,
    model: bytes | None = None,
) -> SlotSession:
    """The session (of `model`, a rewritten graph over the weights beside spec's, when
    given), its device and its logits' dtype; ModelLoadError when it cannot serve."""
    try:
        backend = OnnxRuntimeBackend(spec.model_path, config, where, model=model)
    except ModelLoadError as exc:
        raise _refusal(spec, exc) from None
    logits = next((s for s in backend.outputs if s.name == "logits"), None)
    if logits is None or logits.dtype.numpy.kind != "f" or logits.dtype.numpy.itemsize < 2:
        backend.close()
        raise ModelLoadError(
            f"{spec.model_path}: logits of type {logits.dtype.name if logits else 'none'}; "
            "the slot path reads float32 or float16 logits"
        )
    device = _DEVICE_PROVIDERS.get(backend.placement.provider, "cpu")
    budget = None
    if device != "cpu":
        free = _free_device_bytes(backend.device_id)
        budget = int(free * DEVICE_KV_FRACTION) if free else None
    return SlotSession(backend, device, logits.dtype.numpy, budget)


def slot_runner(
    session: SlotSession,
    spec: GeneratorSpec,
    max_model_len: int,
    slots: int,
    max_pass_tokens: int = 2048,
    position_ids: bool | None = None,
) -> SlotRunner:
    """A runner over `slots` fresh slots of max_model_len positions on the session's
    device (prompts of different lengths share a pass unless a layer's cache is
    window-sized); `position_ids`: whether the graph takes them (default: spec's)."""
    storage = SlotStorage(
        slot_layout(spec, max_model_len, session.device),
        slots,
        session.device,
        session.backend.device_id,
    )
    return SlotRunner(
        session.backend,
        storage,
        logits_dtype=session.logits_dtype,
        vocab_size=spec.vocab_size,
        has_position_ids=spec.has_position_ids if position_ids is None else position_ids,
        pad_prompts=spec.genai is None or spec.genai.sliding_window is None,
        max_pass_tokens=max_pass_tokens,
    )


def check_slots(runner: SlotRunner, spec: GeneratorSpec, max_model_len: int) -> None:
    """Prefill a short and a longer prompt (in one pass where the runner pads prompts),
    decode the short one beside the longer, and compare its logits with one pass over its
    tokens in a third slot; refuse the model when they disagree (the graph's attention
    does not read slots as the runner writes them). Sequences reach past the window where
    the model has one (within max_model_len). Needs 3 slots; fewer check what fits."""
    slots = runner.storage.num_slots
    vocab = spec.vocab_size
    window = spec.genai.sliding_window if spec.genai is not None else None
    base = 0 if window is None else window.window_size  # past the window: the ring wraps
    room = max(2, max_model_len - 2)
    short = [(7 * i + 3) % vocab for i in range(min(base + 5, room - 4))]
    long = [(11 * i + 5) % vocab for i in range(min(base + 9, room))]
    prompts = [ScheduledRequest("a", short, 0, [0])]
    if slots > 1:
        prompts.append(ScheduledRequest("b", long, 0, [1]))
    first = runner.execute(prompts)["a"]
    items = [ScheduledRequest("a", [int(first.argmax())], len(short), [0])]
    if slots > 1:
        items.append(ScheduledRequest("b", [long[0]], len(long), [1]))
    shared = runner.execute(items)["a"].copy()
    whole = [*short, int(first.argmax())]
    alone = runner.execute([ScheduledRequest("c", whole, 0, [min(2, slots - 1)])]).rows[0]
    half = runner.storage.layout.dtype.itemsize < 4
    tolerance = 2e-2 if half else 1e-3
    scale = max(1.0, float(np.abs(alone.astype(np.float32)).max()))
    gap = float(np.abs(shared.astype(np.float32) - alone.astype(np.float32)).max())
    if gap > tolerance * scale:
        raise ModelLoadError(
            f"{spec.model_path}: a sequence decoding beside a longer one in its KV slot "
            f"gives logits {gap:.3g} away from one pass over its tokens (tolerance "
            f"{tolerance * scale:.3g}): the graph's attention does not read KV slots as "
            "tensord writes them"
        )
    runner.stats = PassStats()


HALF_EXPORT_TOLERANCE = 5e-2
"""The largest gap (relative to the largest logit) between a float16 export and its rewrite:
both round in float16, differently (fused attention accumulates in float32), and a float16
export is itself a few hundredths from its float32 original (the benchmark Llama: 0.018);
a wrong rewrite moves the logits by tenths or more."""


def check_against_export(
    runner: SlotRunner, spec: GeneratorSpec, reference: Sequence[tuple[list[int], np.ndarray]]
) -> None:
    """A rewritten export's slots against the export itself: each reference sequence
    (its tokens, and the export's logits at every position in one pass without a past)
    prefilled in a slot of its own, all in one pass, then fed one token a step, all
    decoding together; every step's logits must match the export's. ModelLoadError when
    they do not (the rewrite changed the model)."""
    half = runner.storage.layout.dtype.itemsize < 4
    tolerance = HALF_EXPORT_TOLERANCE if half else 1e-3
    reference = reference[: runner.storage.num_slots]  # one slot each, never past the last
    prefix = [max(1, len(tokens) // 2) for tokens, _ in reference]
    items = [
        ScheduledRequest(str(i), tokens[:n], 0, [i])
        for i, ((tokens, _), n) in enumerate(zip(reference, prefix, strict=True))
    ]
    got = runner.execute(items)
    worst = 0.0
    steps = max(len(t) - n for (t, _), n in zip(reference, prefix, strict=True))
    for step in range(steps + 1):
        for i, ((tokens, logits), n) in enumerate(zip(reference, prefix, strict=True)):
            at = n - 1 + step
            if at >= len(tokens) or str(i) not in got.request_ids:
                continue
            want = logits[at].astype(np.float32)
            scale = max(1.0, float(np.abs(want).max()))
            worst = max(worst, float(np.abs(got[str(i)].astype(np.float32) - want).max()) / scale)
        items = [
            ScheduledRequest(str(i), [tokens[n + step]], n + step, [i])
            for i, ((tokens, _), n) in enumerate(zip(reference, prefix, strict=True))
            if n + step < len(tokens)
        ]
        if not items:
            break
        got = runner.execute(items)
    runner.stats = PassStats()
    if worst > tolerance:
        raise ModelLoadError(
            f"{spec.model_path}: its attention rewritten onto GroupQueryAttention gives "
            f"logits {worst:.3g} (relative) away from the export's own (tolerance "
            f"{tolerance}): served as exported instead"
        )


def export_logits(
    spec: GeneratorSpec,
    config: ModelConfig,
    where: DeviceOptions | None,
    sequences: Sequence[list[int]],
) -> list[np.ndarray]:
    """The export's own logits at every position of each sequence, one pass each with
    no past (its session is closed before the rewritten one opens: the weights are in
    memory once at a time)."""
    backend = OnnxRuntimeBackend(spec.model_path, config, where)
    try:
        dtype = spec.kv_dtype.numpy
        out = []
        for tokens in sequences:
            feeds: dict[str, np.ndarray] = {
                "input_ids": np.array([tokens], np.int64),
                "attention_mask": np.ones((1, len(tokens)), np.int64),
            }
            if spec.has_position_ids:
                feeds["position_ids"] = np.arange(len(tokens), dtype=np.int64)[None]
            empty = np.zeros((1, spec.num_kv_heads, 0, spec.head_dim), dtype)
            for key, value in spec.past_input_names:
                feeds[key] = feeds[value] = empty
            out.append(backend.run(feeds, ["logits"])[0][0])
        return out
    finally:
        backend.close()


CHECKED_WINDOW = 512
"""The longest sliding window the load check reaches past (a longer one is taken from
config.json as it is: its sequences would make the check too slow at load)."""


def check_sequences(spec: GeneratorSpec, max_model_len: int) -> list[list[int]]:
    """Two sequences of different lengths for check_against_export: 40 tokens, or past the
    longest sliding window up to CHECKED_WINDOW (within max_model_len)."""
    vocab = spec.vocab_size
    windows = [w for w in layer_windows_of(spec) if w is not None and w <= CHECKED_WINDOW]
    longest = min(max_model_len - 1, max([40, *(w + 8 for w in windows)]))
    return [
        [(13 * i + 7) % vocab for i in range(longest)],
        [(17 * i + 3) % vocab for i in range(max(4, longest * 2 // 3))],
    ]


@dataclass(slots=True)
class ExportSlots:
    """An Optimum export's rewritten graph, open, and the export's own logits to check
    its slots against."""

    session: SlotSession
    reference: list[tuple[list[int], np.ndarray]]


def open_export_slots(
    spec: GeneratorSpec, config: ModelConfig, where: DeviceOptions | None, bound: int
) -> ExportSlots:
    """The export's attention rewritten onto GroupQueryAttention (RewriteDeclined says
    why not) and its session opened, after the export's own logits for the check were
    computed (`bound`: the longest sequence the check may use, max_model_len); an fp32
    export on a CUDA device is declined (the kernel takes float16 or bfloat16 there)."""
    model = rewrite_export(spec)
    device = _planned_device(config)
    if device != "cpu" and spec.kv_dtype.numpy.itemsize > 2:
        raise RewriteDeclined(
            f"GroupQueryAttention on {device} takes float16 or bfloat16, and this export is "
            f"{spec.kv_dtype.numpy.name}"
        )
    sequences = check_sequences(spec, bound)
    logits = export_logits(spec, config, where, sequences)
    session = open_slot_session(spec, config, where, model)
    if session.device != "cpu" and spec.kv_dtype.numpy.itemsize > 2:
        session.backend.close()
        raise RewriteDeclined(
            f"GroupQueryAttention on {session.device} takes float16 or bfloat16, and this "
            f"export is {spec.kv_dtype.numpy.name}"
        )
    return ExportSlots(session, list(zip(sequences, logits, strict=True)))


def _planned_device(config: ModelConfig) -> str:
    """Where a session of `config` would run ("cpu", "cuda"): its first planned provider."""
    plan = plan_providers(
        usable_providers(available_providers()), config.preferred_provider, config.providers
    )
    return _DEVICE_PROVIDERS.get(plan.providers[0], "cpu") if plan.providers else "cpu"


def check_runner(
    runner: SlotRunner,
    spec: GeneratorSpec,
    max_model_len: int,
    reference: Sequence[tuple[list[int], np.ndarray]] = (),
) -> None:
    """check_slots, and for a rewritten export check_against_export too."""
    check_slots(runner, spec, max_model_len)
    if reference:
        check_against_export(runner, spec, reference)
