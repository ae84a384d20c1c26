"""generate_hf_bench.py --model builder: tensord on a model-builder folder against
onnxruntime-genai's static batch over the same folder (see generate_hf_bench's doc)."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from generate_bench import _wait_ready
from generate_hf_bench import MODEL, REPO, _continuous, _together
from generate_limit import sample_prompts
from hf_llama import ROOT, genai_llama
from machine import write_results
from procs import BENCH_DIR, ProcessGroup
from servers import start_tensord

from tensord.eventloop import run
from tensord.generate.model.model_dir import read_generator_spec
from tensord_client import AsyncClient

TARGETS = {"ort_step_ratio": 1.05, "critical_path_ms": 0.15, 16: 0.85, 1: 0.8}


def _genai(python: Path, folder: Path, n: int, args: argparse.Namespace, profile: Path) -> dict:
    """onnxruntime-genai's median tokens/s over three runs, and its ORT ms per step."""
    out = subprocess.run(
        [str(python), str(BENCH_DIR / "genai_loop.py"), str(folder), "--batch", str(n),
         "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
         "--ort-profile", str(profile)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    rates = [line["tokens_per_s"] for line in lines if "tokens_per_s" in line]
    (ort_ms,) = [line["ort_ms_per_step"] for line in lines if "ort_ms_per_step" in line]
    return {"tokens_per_s": statistics.median(rates), "ort_ms_per_step": ort_ms}


async def _engine_counters(target: str) -> tuple[int, float, float]:
    """(steps, step_seconds, model_seconds) of the served model."""
    async with AsyncClient(target, timeout=60) as client:
        info = await client.info()
    (model,) = [m for m in info.models if m.name == MODEL]
    g = model.generator
    return g.steps, g.step_seconds, g.model_seconds


def _measured(target: str, coro: Any) -> tuple[float, dict[str, float]]:
    """A tensord mode's tokens/s, and its ORT and critical-path ms per step."""
    steps0, step0, model0 = run(_engine_counters(target))
    rate = run(coro)
    steps1, step1, model1 = run(_engine_counters(target))
    steps = max(1, steps1 - steps0)
    ort_ms = 1000 * (model1 - model0) / steps
    own_ms = 1000 * ((step1 - step0) - (model1 - model0)) / steps
    return rate, {"ort_ms_per_step": ort_ms, "critical_path_ms": own_ms}


def _render(points: list[dict[str, Any]]) -> str:
    lines = [
        f"{'streams':>7} {'genai':>9} {'together':>9} {'continuous':>10}   "
        "ratios to genai       ORT ms/step (tensord/genai)   tensord own ms/step"
    ]
    for p in points:
        r, m = p["tokens_per_s"], p["ms"]
        cont = r["continuous"] / r["genai"]
        target = TARGETS.get(p["streams"])
        verdict = "" if target is None else (" ok" if cont >= target else f" (target {target})")
        lines.append(
            f"{p['streams']:>7} {r['genai']:>9.0f} {r['together']:>9.0f} {r['continuous']:>10.0f}"
            f"   together {r['together'] / r['genai']:.2f}, continuous {cont:.2f}{verdict}"
            f"   {m['tensord_ort']:.3f}/{m['genai_ort']:.3f} = "
            f"{m['tensord_ort'] / m['genai_ort']:.2f}x"
            f"   {m['critical_path']:.3f}"
        )
    lines.append("(medians over rounds; tensord's ms from the together runs)")
    return "\n".join(lines)


def run_builder(args: argparse.Namespace) -> int:
    rounds, window = (2, 1.5) if args.quick else (max(1, args.rounds), args.window_s)
    python, folder = genai_llama(args.threads)
    spec = read_generator_spec(folder)
    started = datetime.now(UTC)
    counts = [int(s) for s in args.streams.split(",")]
    points: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as work,
        ProcessGroup() as procs,
        tempfile.TemporaryFile("w+") as log,
    ):
        repo = Path(work) / "repo"
        shutil.copytree(folder, repo / MODEL, ignore=shutil.ignore_patterns(".built"))
        (repo / MODEL / "model.toml").write_text(
            f"[generator]\nintra_op_threads = {args.threads}\nmax_model_len = 256\n"
        )
        server = start_tensord(procs, repo, log)
        run(_wait_ready(server.target))
        for n in counts:
            prompts = sample_prompts(spec, n, args.prompt_len, seed=n)
            batches = max(2, 1024 // (n * args.new_tokens))
            run(_together(server.target, prompts, args.new_tokens, 1))  # warm
            samples: list[dict[str, float]] = []
            for _ in range(rounds):
                genai = _genai(python, folder, n, args, Path(work) / "profile")
                together, ms = _measured(
                    server.target, _together(server.target, prompts, args.new_tokens, batches)
                )
                continuous = run(_continuous(server.target, prompts, args.new_tokens, window))
                sample = {"genai": genai["tokens_per_s"], "together": together,
                          "continuous": continuous, "genai_ort": genai["ort_ms_per_step"],
                          "tensord_ort": ms["ort_ms_per_step"],
                          "critical_path": ms["critical_path_ms"]}  # fmt: skip
                samples.append(sample)
                print(f"{n} streams: " + ", ".join(f"{k} {v:.3f}" for k, v in sample.items()))
            med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            points.append(
                {
                    "streams": n,
                    "rounds": samples,
                    "tokens_per_s": {k: med[k] for k in ("genai", "together", "continuous")},
                    "ms": {k: med[k] for k in ("genai_ort", "tensord_ort", "critical_path")},
                }
            )
        procs.stop_all()
    print(_render(points))
    settings = {"streams": counts, "rounds": rounds, "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens, "window_s": window,
                "intra_op_threads": args.threads,
                "targets": {str(k): v for k, v in TARGETS.items()}}  # fmt: skip
    write_results(
        REPO, args.results_dir, "generate-builder", started,
        {"model": str(ROOT / "genai"), "settings": settings, "points": points},
    )  # fmt: skip
    return 0
