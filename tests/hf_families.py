"""Tiny random-weight Hugging Face decoders of many families, exported with Optimum.

Each family is a transformers config small enough to export in seconds (hidden 64, two
layers, four heads), with the demo tokenizer's vocabulary. `export_family` saves the
PyTorch model, exports it as Optimum's `text-generation-with-past` task writes it, and
returns the directory (model.onnx, config.json, tokenizer.json, ...), which is what a user
drops into a model repository. Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensord.demo.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, build_tokenizer

VOCAB = 2048
"""The demo tokenizer's vocabulary size."""

_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_LLAMA_LIKE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.2,
    **_TOKENS,
}


_GPTJ_LIKE = {
    "vocab_size": VOCAB,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "rotary_dim": 8,
    "n_positions": 256,
    "initializer_range": 0.2,
    **_TOKENS,
}


@dataclass(frozen=True, slots=True)
class Family:
    """One architecture: its transformers config class name and the arguments."""

    name: str
    config_class: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    model_class: str = "AutoModelForCausalLM"
    patch: Callable[[Any], None] | None = None
    """Adjusts the built model before saving (e.g. weights a tiny init leaves at zero)."""


def _llama_like(**extra: Any) -> dict[str, Any]:
    return {**_LLAMA_LIKE, **extra}


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "gpt2",
            "GPT2Config",
            {
                "vocab_size": VOCAB,
                "n_positions": 128,
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family("llama", "LlamaConfig", _llama_like()),
        Family("mistral", "MistralConfig", _llama_like(sliding_window=None)),
        Family("mistral_sw16", "MistralConfig", _llama_like(sliding_window=16)),
        Family("qwen2", "Qwen2Config", _llama_like()),
        Family("qwen3", "Qwen3Config", _llama_like(head_dim=16)),
        Family(
            "qwen3_moe",
            "Qwen3MoeConfig",
            _llama_like(
                head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                decoder_sparse_step=1,
            ),
        ),
        Family("phi3", "Phi3Config", _llama_like()),
        Family("phi", "PhiConfig", _llama_like(num_key_value_heads=4, partial_rotary_factor=0.5)),
        Family(
            "gpt_neox",
            "GPTNeoXConfig",
            _llama_like(num_key_value_heads=None, rotary_pct=0.5),
        ),
        Family(
            "opt",
            "OPTConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "ffn_dim": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "word_embed_proj_dim": 64,
                "max_position_embeddings": 256,
                "init_std": 0.2,
                **_TOKENS,
            },
        ),
        Family("gptj", "GPTJConfig", _GPTJ_LIKE),
        Family("codegen", "CodeGenConfig", {**_GPTJ_LIKE, "n_ctx": 256}),
        Family(
            "gpt_neo",
            "GPTNeoConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "num_layers": 2,
                "num_heads": 4,
                "attention_types": [[["global", "local"], 1]],
                "window_size": 8,
                "max_position_embeddings": 256,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family(
            "gpt_bigcode",
            "GPTBigCodeConfig",
            {
                "vocab_size": VOCAB,
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 256,
                "multi_query": True,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family("cohere", "CohereConfig", _llama_like()),
        Family("granite", "GraniteConfig", _llama_like()),
        Family("helium", "HeliumConfig", _llama_like(head_dim=16)),
        Family("olmo", "OlmoConfig", _llama_like()),
        Family("olmo2", "Olmo2Config", _llama_like()),
        Family("smollm3", "SmolLM3Config", _llama_like()),
        Family("stablelm", "StableLmConfig", _llama_like()),
        Family("gemma", "GemmaConfig", _llama_like(head_dim=16)),
        Family(
            "gemma2",
            "Gemma2Config",
            _llama_like(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
        ),
        Family(
            "gemma3_text",
            "Gemma3TextConfig",
            _llama_like(
                head_dim=16,
                sliding_window=8,
                query_pre_attn_scalar=16,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
        Family(
            "gpt_oss",
            "GptOssConfig",
            _llama_like(
                head_dim=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=8,
                layer_types=["sliding_attention", "full_attention"],
            ),
        ),
        Family("nemotron", "NemotronConfig", _llama_like(head_dim=16)),
        Family(
            "bloom",
            "BloomConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "n_layer": 2,
                "n_head": 4,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family(
            "falcon",
            "FalconConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "multi_query": True,
                "new_decoder_architecture": False,
                "alibi": False,
                "max_position_embeddings": 256,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family(
            "mpt",
            "MptConfig",
            {
                "vocab_size": VOCAB,
                "d_model": 64,
                "n_heads": 4,
                "n_layers": 2,
                "expansion_ratio": 2,
                "max_seq_len": 256,
                "initializer_range": 0.2,
                **_TOKENS,
            },
        ),
        Family(
            "deepseek_v3",
            "DeepseekV3Config",
            _llama_like(
                num_key_value_heads=4,
                kv_lora_rank=16,
                q_lora_rank=32,
                qk_rope_head_dim=8,
                qk_nope_head_dim=16,
                v_head_dim=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
            ),
        ),
    ]
}


def hf_tokenizer() -> Any:
    """The demo tokenizer as transformers' fast tokenizer (saved beside each export)."""
    import transformers

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
    )


def build_model(family: Family, seed: int = 0) -> Any:
    """The family's model with seeded random weights, in eval mode."""
    import torch
    import transformers

    config = getattr(transformers, family.config_class)(**family.kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, family.model_class).from_config(config)
    if family.patch is not None:
        family.patch(model)
    return model.eval()


def export_family(family: Family, root: Path, seed: int = 0) -> Path:
    """Save the family's PyTorch model to root/<name>-pytorch and export it with Optimum
    to root/<name>; returns the export's directory."""
    import warnings

    from optimum.exporters.onnx import main_export

    source, out = root / f"{family.name}-pytorch", root / family.name
    # Exporting traces PyTorch code: its tracer and deprecation warnings are not about tensord.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(family, seed)
        model.save_pretrained(source)
        hf_tokenizer().save_pretrained(source)
        main_export(str(source), output=str(out), task="text-generation-with-past", device="cpu")
    return out


TRANSFORMERS_TIE = 1e-4
"""A step whose top two transformers logits are closer than this is not compared (nor any
after it): float rounding may pick either token."""


class ExportCache:
    """Each family exported at most once per test run, on first use, under one root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, Path] = {}

    def get(self, name: str) -> Path:
        """The family's export directory (model.onnx, config.json, tokenizer.json, ...)."""
        if name not in self._done:
            self._done[name] = export_family(FAMILIES[name], self.root)
        return self._done[name]

    def pytorch(self, name: str) -> Path:
        """The saved PyTorch model the export was made from."""
        self.get(name)
        return self.root / f"{name}-pytorch"


def greedy_steps(model: Any, prompts: list[list[int]], new_tokens: int) -> list[dict[str, Any]]:
    """transformers' generate(do_sample=False) for each prompt alone, as plain records: the
    prompt, the tokens, and each step's top-2 logit gap and largest logit (torch alone, so
    the genai venv's tests/genai_build.py runs it too).

    No end-of-sequence id, as ignore_eos asks of tensord: an EOS may be picked and the run
    goes on (min_new_tokens would instead forbid EOS, which ignore_eos does not)."""
    import copy

    import torch

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.pad_token_id = 0
    config.do_sample = False
    runs = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                generation_config=config,
                max_new_tokens=new_tokens,
                output_scores=True,
                return_dict_in_generate=True,
            )
        top2 = [torch.topk(step[0].double(), 2).values for step in out.scores]
        runs.append(
            {
                "prompt": list(prompt),
                "tokens": out.sequences[0, len(prompt) :].tolist(),
                "top2_gaps": [float(t[0] - t[1]) for t in top2],
                "max_logits": [float(t[0]) for t in top2],
            }
        )
    return runs


def transformers_greedy(model: Any, prompts: list[list[int]], new_tokens: int) -> list[Any]:
    """greedy_steps as ReferenceRuns that tensord's streams are checked against, with
    transformers' near-tie threshold."""
    from tests.generate_reference import ReferenceRun

    return [
        ReferenceRun.from_record(run, TRANSFORMERS_TIE)
        for run in greedy_steps(model, prompts, new_tokens)
    ]
