"""How sequences of different lengths share one model pass: the batch layout of a decoder.

A batched pass feeds one past tensor [B, kv_heads, width, head_dim] for all its sequences,
so a sequence shorter than the widest is padded. Each layout is correct for some graphs:

  padded        every past is right-aligned (padding on the left, masked) so the step's
                new tokens follow each sequence's own last position; positions come from
                position_ids. Correct where a graph takes its positions from position_ids
                or the attention mask and its key-index arithmetic is relative (causal
                masks, sliding windows, ALiBi over key offsets): Llama, Mistral, GPT-2, ...
                and BLOOM, Falcon and MPT, whose ALiBi needs no position_ids.
  equal_length  only sequences whose pasts have the same length share a pass (no padding
                in the past): for graphs that take no position_ids and count positions
                from the past's length (Gemma, Gemma 2 and 3, GPT-OSS, Nemotron), where
                any padding would shift a shorter sequence's positions.
  single        one sequence per pass; the last resort, for a graph whose rows interfere.

`choose_layout` picks from the graph's inputs and model_type; the loader then checks the
choice on the model itself before the model is READY (see check.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensord.modelconfig.generator import BatchLayout

MASK_POSITION_TYPES = frozenset({"bloom", "falcon", "mpt"})
"""model_types whose Optimum exports take no position_ids but need none: their ALiBi bias is
built from the attention mask (BLOOM, Falcon) or from key offsets (MPT), so a masked left
padding leaves every sequence's attention as it is alone."""


@dataclass(frozen=True, slots=True)
class LayoutChoice:
    """A layout and the reason for it, in words for the log and Info."""

    layout: BatchLayout
    reason: str


def choose_layout(model_type: str, has_position_ids: bool) -> LayoutChoice:
    """The widest sharing the graph allows, judged from its inputs and model_type."""
    if has_position_ids:
        return LayoutChoice(
            BatchLayout.PADDED,
            "the graph takes position_ids: pasts of any length share a pass, right-aligned "
            "with masked padding",
        )
    if model_type in MASK_POSITION_TYPES:
        return LayoutChoice(
            BatchLayout.PADDED,
            f"{model_type} takes no position_ids, but its ALiBi bias follows the attention "
            "mask and key offsets: pasts of any length share a pass, right-aligned with "
            "masked padding",
        )
    return LayoutChoice(
        BatchLayout.EQUAL_LENGTH,
        "the graph takes no position_ids and counts positions from the past's length: only "
        "sequences whose pasts have the same length share a pass",
    )


def restrict(choice: LayoutChoice, configured: BatchLayout | None) -> LayoutChoice:
    """The configured layout when it is at least as safe as `choice`; a wider one than the
    graph allows would serve wrong tokens, so it raises ValueError naming why."""
    if configured is None or configured == choice.layout:
        return choice
    order = list(BatchLayout)
    if order.index(configured) < order.index(choice.layout):
        raise ValueError(
            f"batch_layout {configured.value!r} cannot serve this model correctly: {choice.reason}"
        )
    return LayoutChoice(configured, "set by [generator] batch_layout in model.toml")
