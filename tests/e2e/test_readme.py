"""The README stays short and true: every example in it runs, as written, against a real
daemon (the address aside: the tests' daemons listen on a free port, which
TENSORD_TARGET and a substitution of 127.0.0.1:50051 give the examples).

Exempt, and marked so in the README: the grpcurl block (grpcurl is an outside tool that
`make test` does not install) and the Hugging Face export's download (the test exports a
checkpoint it builds, with the README's own command).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Daemon, start_daemon, wait_serving
from tests.tools import ROOT

README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
DEFAULT_TARGET = "127.0.0.1:50051"


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks of one language, in order."""
    text = README.read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def block_with(language: str, marker: str) -> str:
    found = [b for b in blocks(language) if marker in b]
    assert len(found) == 1, f"expected one {language} block with {marker!r}, found {len(found)}"
    return found[0]


def shell(script: str, cwd: Path, target: str, timeout: float = 240) -> str:
    """Run a README block with bash (-e: every command must succeed), the venv's commands
    on the PATH as `source .venv/bin/activate` puts them, TENSORD_TARGET set."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TENSORD_TARGET": target,
        "PYTHONUNBUFFERED": "1",
    }
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script.replace(DEFAULT_TARGET, target)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


def test_the_readme_fits_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.encode()) <= 20 * 1024, len(text.encode())
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in link:
            assert (ROOT / link).exists(), link
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in link:
                assert (page.parent / link).exists(), f"{page.name}: {link}"


@pytest.fixture(scope="module")
def demo_daemon(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    d = start_daemon(demo_repo, tmp_path_factory.mktemp("readme") / "tensord.log")
    yield d
    d.terminate()


def test_the_quickstart_and_the_client_examples(demo_daemon: Daemon, tmp_path: Path) -> None:
    target = demo_daemon.target
    quickstart = block_with("sh", "source .venv/bin/activate")
    venv = ROOT / ".venv" / "bin" / "activate"
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve() or not venv.exists():
        quickstart = quickstart.replace("source .venv/bin/activate", "true")
    out = shell(quickstart, ROOT, target)
    assert "SERVING" in out and "tinylm" in out
    python = block_with("python", "from tensord_client import Client")
    done = subprocess.run(
        [sys.executable, "-c", python.replace(DEFAULT_TARGET, target)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "TENSORD_TARGET": target},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("(4, 10)\nSERVING\n"), done.stdout
    assert "NOT_FOUND: model 'nope' not found" in done.stdout
    shell(block_with("sh", "tensorctl --json info"), tmp_path, target)
    assert '"server_version"' in (tmp_path / "info.json").read_text()
    node = block_with("sh", "node clients/node/tensord-client.js")
    if not (ROOT / "clients" / "node" / "node_modules").exists():
        pytest.fail("clients/node has no node_modules: make npm-deps (make test runs it)")
    node = "\n".join(line for line in node.splitlines() if not line.startswith("npm install"))
    assert "output" in shell(node, ROOT, target)
    assert "(needs grpcurl)" in README.read_text()


def test_serving_your_own_model(demo_repo: Path, tmp_path: Path) -> None:
    """The walkthrough with the demo mlp as `my_model.onnx`; the daemon it starts in the
    foreground runs here on a free port."""
    shutil.copy(demo_repo / "mlp" / "1" / "model.onnx", tmp_path / "my_model.onnx")
    setup = block_with("sh", "cp my_model.onnx")
    serve_line = next(line for line in setup.splitlines() if line.startswith("tensord serve"))
    before = setup.split(serve_line)[0]
    out = shell(before, tmp_path, DEFAULT_TARGET)
    assert "my_model" in out
    daemon = start_daemon(tmp_path / "models", tmp_path / "tensord.log")
    try:
        shell(block_with("sh", "tensorctl predict my_model"), tmp_path, daemon.target)
        assert (tmp_path / "out" / "output.npy").exists()
    finally:
        daemon.terminate()


def test_serving_a_hugging_face_decoder(tmp_path: Path, demo_repo: Path) -> None:
    """The export walkthrough on a tiny Llama checkpoint built here, exported with the
    README's own optimum-cli command, added to a running daemon with SIGHUP."""
    from tests.hf_families import FAMILIES, build_model, hf_tokenizer
    from tests.tools import require_module

    for module in ("torch", "transformers", "optimum.exporters.onnx"):
        require_module(module, "make setup (the export extra)")
    checkpoint = tmp_path / "checkpoint"
    build_model(FAMILIES["llama"]).save_pretrained(checkpoint)
    hf_tokenizer().save_pretrained(checkpoint)
    (tmp_path / "models").mkdir()
    shutil.copytree(demo_repo / "mlp", tmp_path / "models" / "mlp")
    daemon = start_daemon(tmp_path / "models", tmp_path / "tensord.log")
    try:
        walkthrough = block_with("sh", "optimum-cli export onnx")
        model_id = re.search(r"--model (\S+)", walkthrough)
        assert model_id is not None
        script = walkthrough.replace(model_id.group(1), str(checkpoint))
        script = script.replace("$(pidof tensord)", str(daemon.process.pid))
        out = shell(script, tmp_path, daemon.target, timeout=400)
        assert "smollm" in out and "ready" in out.lower(), out
        wait_serving(daemon.target)
    finally:
        daemon.terminate()


@pytest.mark.parametrize("where", ["terminal", "make serve in a pipe"])
def test_serve_says_how_to_call_it(demo_repo: Path, tmp_path: Path, where: str) -> None:
    """`make serve` runs `tensord serve`: once started it prints where the commands are and
    one that calls it, and that command works. On a terminal (console logs) the lines go to
    stdout; off one (JSON logs, TENSORD_SAY_HOW_TO_CALL as make serve sets it) to stderr,
    and stdout stays JSON."""
    terminal = where == "terminal"
    env = dict(os.environ)
    env.pop("TENSORD_SAY_HOW_TO_CALL", None)
    if not terminal:
        env["TENSORD_SAY_HOW_TO_CALL"] = "1"
    process = subprocess.Popen(
        [str(VENV_BIN / "tensord"), "serve", "--model-repository", str(demo_repo),
         "--listen", "127.0.0.1:0", "--log-format", "console" if terminal else "json"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT if terminal else subprocess.PIPE,
        text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        stream = process.stdout if terminal else process.stderr
        assert stream is not None
        lines: list[str] = []
        for line in stream:
            lines.append(line)
            if line.startswith("    ") and line.strip().endswith(" health"):
                break
        said = "".join(lines)
        assert "tensord is listening on 127.0.0.1:" in said, said
        command = lines[-1].strip()
        assert command.startswith("tensorctl --target 127.0.0.1:"), said
        if (VENV_BIN / "activate").exists():
            assert f"source {os.path.relpath(VENV_BIN / 'activate', ROOT)}" in said
        if not terminal:
            assert process.stdout is not None
            assert json.loads(process.stdout.readline())["event"] == "server.listening"
        out = shell(command, ROOT, "unused")
        assert "SERVING" in out
    finally:
        process.terminate()
        process.wait(30)
