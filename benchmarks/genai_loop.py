"""onnxruntime-genai's greedy loop on one batch, as a peer for the Generate benchmark.

Run by the genai venv's python (benchmarks/hf_llama.py), never by tensord's:

    python genai_loop.py MODEL_DIR --batch 16 --prompt-len 32 --new-tokens 64 --repeats 3

One warm-up run, then `--repeats` runs of `--batch` seeded prompts of `--prompt-len` tokens,
each generating exactly `--new-tokens` tokens greedily (min_length = max_length, so an
end-of-sequence token does not stop a sequence early). Prints one JSON line per run:
{"batch": ..., "tokens_per_s": ...}, timed by wall clock from the first token fed to the
last token chosen, as the plain loop is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import onnxruntime_genai as og


def run_once(model: og.Model, prompts: np.ndarray, new_tokens: int) -> float:
    """Tokens/s of one batched greedy generation."""
    batch, prompt_len = prompts.shape
    params = og.GeneratorParams(model)
    length = prompt_len + new_tokens
    params.set_search_options(
        max_length=length, min_length=length, do_sample=False, batch_size=batch
    )
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompts)
    while not generator.is_done():
        generator.generate_next_token()
    return batch * new_tokens / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ort-profile",
        help="also run once with ONNX Runtime's profiler on (a copy of the folder) and print "
        '{"ort_ms_per_step": ...}: the mean time of its model runs',
    )
    args = parser.parse_args()
    model = og.Model(args.model_dir)
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(3, 2000, (args.batch, args.prompt_len)).astype(np.int32)
    run_once(model, prompts, min(4, args.new_tokens))
    for _ in range(args.repeats):
        rate = run_once(model, prompts, args.new_tokens)
        print(json.dumps({"batch": args.batch, "tokens_per_s": rate}), flush=True)
    if args.ort_profile:
        print(json.dumps({"ort_ms_per_step": profiled(args, prompts)}), flush=True)
    return 0


def profiled(args: argparse.Namespace, prompts: np.ndarray) -> float:
    """Mean milliseconds of ONNX Runtime's model runs (its "model_run" events) over one
    generation, with the profiler on in a copy of the folder."""
    import glob
    import os
    import shutil

    folder = args.ort_profile
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(args.model_dir, folder)
    path = os.path.join(folder, "genai_config.json")
    with open(path) as f:
        config = json.load(f)
    prefix = os.path.join(folder, "ort-profile")
    config["model"]["decoder"]["session_options"]["enable_profiling"] = prefix
    with open(path, "w") as f:
        json.dump(config, f)
    model = og.Model(folder)
    run_once(model, prompts, args.new_tokens)
    del model  # the profile is written when the session ends
    (found,) = glob.glob(prefix + "*.json")
    with open(found) as f:
        events = json.load(f)
    runs = [e["dur"] for e in events if e.get("name") == "model_run"]
    return sum(runs) / len(runs) / 1000


if __name__ == "__main__":
    sys.exit(main())
