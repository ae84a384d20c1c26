"""Side by side: tensord's rate and ratio per concurrency from several results files.

    python benchmarks/compare.py benchmarks/results/predict-*.json

One row per file, labelled with the model.toml settings that differ from the defaults
(the way to compare thread counts or batching tried with --model-repository). Points
disturbed by other load (> 0.1 cores) are marked with `!`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_DEFAULTS: dict[str, Any] = {
    "intra_op_threads": 1,
    "inter_op_threads": 1,
    "allow_spinning": False,
    "instance_count": 2,
    "dynamic_batching": None,
}
_DISTURBED_CORES = 0.10


def label(results: dict[str, Any]) -> str:
    """The model.toml keys that differ from tensord's defaults, e.g. `instance_count=1`."""
    config = results.get("model_config", {})
    parts = []
    for key, default in _DEFAULTS.items():
        value = config.get(key, default)
        if value == default:
            continue
        if isinstance(value, dict):  # [dynamic_batching]: its delay, and whatever else is set
            delay = value.get("max_queue_delay_microseconds", 0)
            rest = [
                f"{k}={v}" for k, v in value.items() if v and k != "max_queue_delay_microseconds"
            ]
            parts.append(f"batching(delay={delay}us{''.join(',' + r for r in rest)})")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts) or "defaults"


def _cell(point: dict[str, Any]) -> str:
    disturbed = max(point["echo"]["other_cpu_cores"], point["tensord"]["other_cpu_cores"])
    mark = "!" if disturbed > _DISTURBED_CORES else " "
    return f"{point['tensord']['rps']:>6,.0f} {point['ratio']:>5.2f}{mark}"


def main() -> int:
    """Print one row per results file."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    runs = [json.loads(f.read_text()) for f in args.files]
    concurrencies = sorted({p["concurrency"] for r in runs for p in r["points"]})
    width = max(len(label(r)) for r in runs)
    head = f"{'':<{width}} {'ORT b1':>7} | " + " | ".join(
        f"{f'{c} in flight':>13}" for c in concurrencies
    )
    sub = f"{'model.toml':<{width}} {'runs/s':>7} | " + " | ".join(
        f"{'req/s':>6} {'ratio':>6}" for _ in concurrencies
    )
    print(head)
    print(sub)
    print("-" * len(sub))
    for results in runs:
        by_c = {p["concurrency"]: p for p in results["points"]}
        cells = [_cell(by_c[c]) if c in by_c else f"{'-':>13}" for c in concurrencies]
        ort = results["ort"]["batch1"]["runs_per_s"]
        print(f"{label(results):<{width}} {ort:>7,.0f} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
