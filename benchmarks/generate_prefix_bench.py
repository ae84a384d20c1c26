"""Time to first token on a prefix-heavy workload, with and without prefix reuse.

    python benchmarks/generate_prefix_bench.py [--system 512] [--suffix 16] [--streams 8]
                                               [--requests 24] [--rounds 3]

One daemon serves the Optimum export of the benchmark Llama (benchmarks/hf_llama.py; its
attention rewritten at load onto KV slots) twice: `reuse` as dropped in (the host prefix
store on), and `recompute` with `[generator] prefix_cache_bytes = 0`. Every request is a
shared system prompt of --system tokens followed by --suffix tokens of its own, asking for
8 greedy tokens. Each round measures both models back to back:

  alone    --requests requests one after another: each one's time to first token
  loaded   --streams clients sending such requests back to back for --requests each:
           time to first token under load

The first request of a round warms the store (it is not counted). Printed: median and p90
time to first token per model and mode, the ratio reuse / recompute, and from Info the
prefix hit rate and bytes copied. Target: reuse's median time to first token alone at
most 0.5x recompute's with a 512-token system prompt. Results go to
benchmarks/results/generate-prefix-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import use_venv
from generate_bench import _wait_ready
from hf_llama import ROOT, optimum_llama
from machine import write_results
from procs import ProcessGroup, exit_on_signals
from servers import start_tensord

from tensord.eventloop import run
from tensord_client import AsyncClient, Client

REPO = use_venv.REPO
RESULTS_DIR = REPO / "benchmarks" / "results"
MODELS = {"reuse": "", "recompute": "[generator]\nprefix_cache_bytes = 0\n"}
TARGET = 0.5
NEW_TOKENS = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--system", type=int, default=512, help="shared prompt tokens")
    parser.add_argument("--suffix", type=int, default=16, help="each request's own tokens")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


class Prompts:
    """The shared system prompt, and a fresh suffix for every request."""

    def __init__(self, system: int, suffix: int, vocab: int = 1000) -> None:
        rng = np.random.default_rng(7)
        self.system = rng.integers(3, vocab, system).tolist()
        self._suffix = suffix
        self._rng = rng
        self._vocab = vocab

    def next(self) -> list[int]:
        return self.system + self._rng.integers(3, self._vocab, self._suffix).tolist()


async def _first_token(client: AsyncClient, model: str, prompt: list[int]) -> float:
    """Seconds from sending a request to its first token (the rest is drained)."""
    start = time.perf_counter()
    first = None
    async for chunk in client.generate(
        model, token_ids=prompt, max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True
    ):
        if first is None and chunk.token_ids:
            first = time.perf_counter() - start
    assert first is not None
    return first


async def _alone(target: str, model: str, prompts: Prompts, count: int) -> list[float]:
    async with AsyncClient(target, timeout=600) as client:
        await _first_token(client, model, prompts.next())  # warms the store
        return [await _first_token(client, model, prompts.next()) for _ in range(count)]


async def _loaded(
    target: str, model: str, prompts: Prompts, streams: int, count: int
) -> list[float]:
    async with AsyncClient(target, timeout=600) as client:
        await _first_token(client, model, prompts.next())
        times: list[float] = []

        async def stream() -> None:
            for _ in range(count):
                times.append(await _first_token(client, model, prompts.next()))

        await asyncio.gather(*(stream() for _ in range(streams)))
        return times


def _p90(values: list[float]) -> float:
    return float(np.percentile(values, 90))


def _prefix_figures(target: str, model: str) -> dict[str, float]:
    with Client(target, timeout=30) as client:
        info = client.info()
    status = next(m for m in info.models if m.name == model).generator
    queried = max(1, status.prefix_query_tokens)
    return {
        "hit_rate": status.prefix_hit_tokens / queried,
        "bytes_loaded": status.prefix_bytes_loaded,
        "bytes_saved": status.prefix_bytes_saved,
        "kv_path": status.kv_path,  # type: ignore[dict-item]
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_signals()
    export = optimum_llama()
    started = datetime.now(UTC)
    prompts = Prompts(args.system, args.suffix)
    ttft: dict[str, dict[str, list[float]]] = {m: {"alone": [], "loaded": []} for m in MODELS}
    ratios: dict[str, list[float]] = {"alone": [], "loaded": []}
    with (
        tempfile.TemporaryDirectory() as repo_dir,
        ProcessGroup() as procs,
        tempfile.TemporaryFile("w+") as log,
    ):
        for model, toml in MODELS.items():
            shutil.copytree(export, Path(repo_dir) / model, ignore=shutil.ignore_patterns(".built"))
            if toml:
                (Path(repo_dir) / model / "model.toml").write_text(toml)
        server = start_tensord(procs, Path(repo_dir), log)
        run(_wait_ready(server.target))
        for round_ in range(args.rounds):
            medians: dict[str, dict[str, float]] = {}
            for model in MODELS:
                alone = run(_alone(server.target, model, prompts, args.requests))
                loaded = run(_loaded(server.target, model, prompts, args.streams, args.requests))
                ttft[model]["alone"] += alone
                ttft[model]["loaded"] += loaded
                medians[model] = {
                    "alone": statistics.median(alone),
                    "loaded": statistics.median(loaded),
                }
            for mode in ratios:
                ratios[mode].append(medians["reuse"][mode] / medians["recompute"][mode])
            print(
                f"round {round_ + 1}: "
                + ", ".join(
                    f"{m} alone {v['alone'] * 1e3:.1f} ms, loaded {v['loaded'] * 1e3:.1f} ms"
                    for m, v in medians.items()
                ),
                flush=True,
            )
        figures = {model: _prefix_figures(server.target, model) for model in MODELS}
        procs.stop_all()
    lines = [f"{'model':>10} {'mode':>7} {'p50 ms':>8} {'p90 ms':>8}   prefix"]
    for model in MODELS:
        f = figures[model]
        note = (
            f"hit rate {f['hit_rate']:.2f}, {f['bytes_loaded'] / 2**20:.1f} MiB loaded, "
            f"{f['bytes_saved'] / 2**20:.1f} MiB saved ({f['kv_path']})"
        )
        for mode, times in ttft[model].items():
            lines.append(
                f"{model:>10} {mode:>7} {statistics.median(times) * 1e3:>8.1f} "
                f"{_p90(times) * 1e3:>8.1f}   {note}"
            )
    ratio = {mode: statistics.median(values) for mode, values in ratios.items()}
    verdict = "ok" if ratio["alone"] <= TARGET else f"target <= {TARGET}"
    lines.append(
        f"time to first token, reuse / recompute (median of rounds): alone "
        f"{ratio['alone']:.2f} ({verdict}), loaded at {args.streams} streams "
        f"{ratio['loaded']:.2f}"
    )
    print("\n".join(lines))
    write_results(
        REPO,
        args.results_dir,
        "generate-prefix",
        started,
        {
            "model": str(ROOT),
            "settings": {
                "system": args.system,
                "suffix": args.suffix,
                "streams": args.streams,
                "requests": args.requests,
                "rounds": args.rounds,
                "new_tokens": NEW_TOKENS,
                "target": TARGET,
            },
            "ttft_ms": {
                m: {k: [round(t * 1e3, 3) for t in v] for k, v in modes.items()}
                for m, modes in ttft.items()
            },
            "ratios": ratio,
            "prefix": figures,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
