"""Console log lines: short fields share the event's line, long ones get their own, and no
line runs past the width."""

from __future__ import annotations

from tensord.logs import CONSOLE_WIDTH, render_console


def test_console_lines_fit_and_keep_every_field() -> None:
    reason = "the model runs on CPUExecutionProvider, so its batches stay in host memory " * 3
    text = render_console(
        None,
        "info",
        {
            "timestamp": "2026-11-25T04:08:08.105Z",
            "level": "info",
            "event": "model.loaded",
            "model": "cnn",
            "version": 1,
            "load_ms": 58.6,
            "executor_reason": reason.strip(),
            "path": "/srv/models/" + "x" * 150,
        },
    )
    lines = text.splitlines()
    assert lines[0].startswith("2026-11-25 04:08:08 [info   ] model.loaded model=cnn version=1")
    assert all(len(line) <= CONSOLE_WIDTH for line in lines), lines
    assert " ".join(line.strip() for line in lines).count("CPUExecutionProvider") == 3
    assert any(line.startswith("    executor_reason: the model") for line in lines)
    assert "x" * 80 in "".join(line.strip() for line in lines)
