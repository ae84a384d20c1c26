"""The session a model-builder folder serves with on KV slots, and the check before READY.

  1. open the session (the provider plan as for every model); a folder whose operators
     have no kernels on the provider it got (a CUDA build on a host without a GPU) is
     refused with the providers genai_config.json names;
  2. size the slots: per layer, max_model_len positions, or the window for a layer with a
     window-sized cache;
  3. check_slots: a sequence's logits when it decodes beside a longer one equal its
     logits alone, computed in one prompt pass; a graph that disagrees is refused.

Used by the loader and by `tensord inspect`, so both reach the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import structlog

from tensord.backends.base import DeviceOptions
from tensord.backends.onnxruntime import OnnxRuntimeBackend
from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
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
    spec: GeneratorSpec, config: ModelConfig, where: DeviceOptions | None = None
) -> SlotSession:
    """The session, its device and its logits' dtype; ModelLoadError when it cannot serve."""
    try:
        backend = OnnxRuntimeBackend(spec.model_path, config, where)
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
) -> SlotRunner:
    """A runner over `slots` fresh slots of max_model_len positions on the session's
    device (prompts of different lengths share a pass unless a layer's cache is
    window-sized)."""
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
        has_position_ids=spec.has_position_ids,
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
            "tensord writes them, so Generate does not serve it"
        )
    runner.stats = PassStats()
