"""The one-screen summary of a GPU run, and its verdict.

    python tests/gpu/summary.py RESULTS_DIR

Reads what a GPU call (tests/gpu/run-offline.sh, run-ort-gpu.sh) left in RESULTS_DIR
(steps.tsv, device.json, gpu-tests.xml, kernels.json, gpu.json), writes summary.json and
prints the summary. Exits
0 only when every step ended 0 and the GPU tests ran with no failure, error or skip; a
speed target missed is shown, not failed (figures are measured, not asserted).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def steps(results: Path) -> list[dict[str, Any]]:
    """Each step's name, exit code, seconds and note, as run-offline.sh recorded them."""
    found = []
    path = results / "steps.tsv"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        name, rc, seconds, *note = line.split("\t")
        found.append(
            {"step": name, "rc": int(rc), "seconds": float(seconds), "note": "".join(note)}
        )
    return found


def tests(results: Path) -> dict[str, Any]:
    """Counts from the JUnit XML, and the tests that did not pass."""
    path = results / "gpu-tests.xml"
    if not path.exists():
        return {"ran": False}
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    bad = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = "passed"
        for tag, kind in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome = kind
                bad.append(f"{kind}: {name}: {(element.get('message') or '')[:160]}")
                break
        counts[outcome] += 1
    return {"ran": True, **counts, "not_passed": bad}


def targets(kernels: Any, gpu: Any) -> list[dict[str, Any]]:
    """Each figure with a target: its value, the target and whether it was met."""
    found = []
    if isinstance(gpu, dict):
        found.append(
            {"figure": "H2D from the pinned pool / raw pinned copy",
             "value": gpu.get("pool_over_raw"), "target": 0.8}
        )  # fmt: skip
        found.append(
            {"figure": "2 lanes / 1 lane (upload = compute = download)",
             "value": gpu.get("two_over_one"), "target": 1.5}
        )  # fmt: skip
    if isinstance(kernels, dict):
        for name, kernel in kernels.get("kernels", {}).items():
            if kernel.get("target"):
                found.append(
                    {"figure": f"{name} / device-to-device copy bandwidth",
                     "value": kernel.get("of_copy"), "target": kernel["target"]}
                )  # fmt: skip
    for target in found:
        value = target["value"]
        target["met"] = isinstance(value, int | float) and value >= target["target"]
    return found


def main() -> int:
    results = Path(sys.argv[1])
    device, kernels, gpu = (load(results / n) for n in ("device.json", "kernels.json", "gpu.json"))
    summary = {
        "steps": steps(results),
        "tests": tests(results),
        "targets": targets(kernels, gpu),
        "device": (device or {}).get("nvidia_smi", {}).get("gpus", []),
    }
    failed_steps = [s for s in summary["steps"] if s["rc"] != 0]
    t = summary["tests"]
    tests_ok = t.get("ran") and t["passed"] > 0 and not (t["failed"] or t["errors"] or t["skipped"])
    # A run of chosen steps (TENSORD_GPU_STEPS) without the test step is judged by its steps.
    partial = os.environ.get("TENSORD_GPU_STEPS", "")
    if partial and "gpu-tests" not in partial.split(",") and not t.get("ran"):
        tests_ok = True
    summary["partial"] = partial
    summary["ok"] = bool(summary["steps"]) and not failed_steps and bool(tests_ok)
    (results / "summary.json").write_text(json.dumps(summary, indent=2))

    print("=" * 78)
    if summary["device"]:
        d = summary["device"][0]
        print(f"{d.get('name')}, driver {d.get('driver_version')}, {d.get('memory.total')}")
    for s in summary["steps"]:
        mark = "ok  " if s["rc"] == 0 else f"rc={s['rc']}"
        note = f"  ({s['note']})" if s["note"] else ""
        print(f"  {mark:<6} {s['step']:<22} {s['seconds']:7.1f} s{note}")
    if t.get("ran"):
        print(
            f"GPU tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped"
        )
        for line in t["not_passed"][:12]:
            print(f"  {line}")
    else:
        print("GPU tests: did not run")
    if partial:
        print(f"partial run: only {partial} (TENSORD_GPU_STEPS)")
    if summary["targets"]:
        print("Targets:")
        for target in summary["targets"]:
            value = target["value"]
            shown = f"{value:.2f}" if isinstance(value, int | float) else "-"
            verdict = "met" if target["met"] else "MISSED"
            print(f"  {shown:>6} (>= {target['target']:.2f}) {verdict:<6} {target['figure']}")
    print(f"verdict: {'PASS' if summary['ok'] else 'FAIL'} (summary.json in {results})")
    print("=" * 78)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
