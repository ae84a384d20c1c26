"""The prefix store of a model on KV slots: sized, and checked on the model before READY.

A stored prefix copied into a slot must leave the slot as computing the prefix there
would: every layer's positions where the graph reads them. That holds for full-attention
layers whose slots hold positions as they are, and for sliding-window layers as far as
their window reaches; a layer whose cache is a window-sized ring holds positions as they
are only up to the window, which bounds the prefix a request may take. The check at load
measures it on the model itself: a prompt's blocks are stored, a second prompt that shares
them is computed once from scratch and once over the stored blocks (copied into a slot
that held other tokens), and the logits of its last prompt token and of one decode step
must agree. Where they do not, prefixes are not reused and Info says why; nothing is
served wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensord.errors import ModelLoadError
from tensord.generate.core.scheduler_output import ScheduledRequest
from tensord.generate.core.slot_prefix import PrefixCopy
from tensord.generate.model.attention_rewrite import layer_windows_of
from tensord.generate.model.model_dir import GeneratorSpec
from tensord.generate.worker.model_runner import PassStats
from tensord.generate.worker.prefix_store import PrefixReuse, PrefixStore
from tensord.generate.worker.slot_runner import SlotRunner
from tensord.modelconfig.generator import PREFIX_BLOCK_TOKENS, prefix_cache_bytes

CHECKED_WINDOW = 512
"""The longest sliding window the check reaches past (as slot_graph's check does)."""


@dataclass(slots=True, frozen=True)
class PrefixVerdict:
    """The prefix store a model got, or why it got none."""

    reuse: PrefixReuse | None
    reason: str
    """Empty when reuse is on; else why not, in words for Info and the log."""


def slot_windows(spec: GeneratorSpec, rewritten: bool) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention, or not known to be windowed, in
    which case a load copies all of the prefix's blocks)."""
    if rewritten:
        return layer_windows_of(spec)
    window = spec.genai.sliding_window if spec.genai is not None else None
    return tuple(
        window.window_size if window is not None and layer in window.layers else None
        for layer in range(spec.num_layers)
    )


def prefix_reuse(
    runner: SlotRunner,
    spec: GeneratorSpec,
    max_model_len: int,
    configured_bytes: int | None,
    rewritten: bool,
) -> PrefixVerdict:
    """The host prefix store for `runner`'s slots, sized by [generator] prefix_cache_bytes
    and checked on the model (check_prefix); no store, with the reason, where it is turned
    off, too small, or the check disagrees."""
    storage = runner.storage
    layout = storage.layout
    size = PREFIX_BLOCK_TOKENS
    block_bytes = 2 * layout.num_layers * layout.kv_heads * size * layout.head_dim
    block_bytes *= layout.dtype.itemsize
    num_blocks = prefix_cache_bytes(configured_bytes, storage.nbytes) // block_bytes
    if configured_bytes == 0:
        return PrefixVerdict(None, "[generator] prefix_cache_bytes is 0")
    rings = [n for n in layout.lengths if n < max_model_len]
    window = spec.genai.sliding_window if spec.genai is not None else None
    held = window.window_size if rings and window is not None else None
    reach = min(max_model_len - 2, held or max_model_len)
    if num_blocks < 2:
        return PrefixVerdict(
            None,
            f"[generator] prefix_cache_bytes holds {num_blocks} block(s) of {size} tokens "
            f"({block_bytes} bytes each), fewer than two",
        )
    if reach < 2 * size + 1:
        return PrefixVerdict(
            None,
            f"a slot holds positions as they are only up to {reach} tokens (a layer's cache "
            f"is a ring of its sliding window, or max_model_len is short), under two blocks "
            f"of {size}",
        )
    store = PrefixStore(
        layout, num_blocks, size, slot_windows(spec, rewritten), pinned=storage.device != "cpu"
    )
    try:
        check_prefix(runner, store, spec.vocab_size, reach)
    except ModelLoadError as exc:
        store.close()
        return PrefixVerdict(None, str(exc))
    except BaseException:
        store.close()
        raise
    return PrefixVerdict(PrefixReuse(store, held), "")


def check_prefix(runner: SlotRunner, store: PrefixStore, vocab: int, reach: int) -> None:
    """A prompt over stored blocks against the same prompt from scratch (the module's
    docstring); ModelLoadError when their logits disagree. `reach`: the longest prompt
    the check may use. Leaves the store's counters at zero."""
    size = store.block_size
    windows = [w for w in store.windows if w is not None and w <= CHECKED_WINDOW]
    longest = min(reach, max([3 * size + 5, *(w + 2 * size for w in windows)]))
    prompt = [(19 * i + 11) % vocab for i in range(longest)]
    blocks = min((longest - 1) // size, store.num_blocks)
    hit = blocks * size
    other = prompt[:hit] + [(23 * i + 5) % vocab for i in range(max(1, min(5, reach - hit)))]
    stored = PrefixCopy(0, 0, tuple(range(blocks)))
    slot = runner.storage.num_slots - 1
    runner.execute([ScheduledRequest("p", prompt, 0, [0])])
    store.save(runner.storage, [stored])
    want = runner.execute([ScheduledRequest("r", other, 0, [0])])["r"].copy()
    token = int(want.argmax())
    want_next = runner.execute([ScheduledRequest("r", [token], len(other), [0])])["r"].copy()
    stale = [(29 * i + 17) % vocab for i in range(hit + 1)]  # the slot held other tokens
    runner.execute([ScheduledRequest("s", stale, 0, [slot])])
    store.load(runner.storage, [PrefixCopy(slot, 0, stored.store_blocks)])
    got = runner.execute([ScheduledRequest("o", other[hit:], hit, [slot])])["o"].copy()
    got_next = runner.execute([ScheduledRequest("o", [token], len(other), [slot])])["o"].copy()
    store.bytes_loaded = store.bytes_saved = 0
    runner.stats = PassStats()
    tolerance = 2e-2 if store.layout.dtype.itemsize < 4 else 1e-3
    worst = max(_gap(got, want), _gap(got_next, want_next))
    if worst > tolerance:
        raise ModelLoadError(
            f"a prompt over {hit} stored prefix tokens gives logits {worst:.3g} (relative) away "
            f"from the same prompt computed whole (tolerance {tolerance}): the graph does not "
            "read a copied prefix as its own"
        )


def _gap(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float32)
    scale = max(1.0, float(np.abs(want).max()))
    return float(np.abs(got.astype(np.float32) - want).max()) / scale
