"""One large request must not stall the daemon: prompts far beyond the model's context, on
every protocol and in both process modes, are refused from their size within a second,
while Health, probed from a third process, keeps answering within 100 ms (over its idle
baseline). A text is never tokenised, nor a list of token ids walked, before its size is
checked; a body over [openai] max_body_bytes is refused (413) before it is read."""

from __future__ import annotations

import json
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tensord_client import Client
from tests.e2e.conftest import Daemon, log_events, start_daemon, wait_for_event
from tests.health_probe import HealthProbe

pytestmark = pytest.mark.e2e
pytest.importorskip("starlette")

MODEL = "tinylm"
BODY_LIMIT = 2 * 1024 * 1024
"""[openai] max_body_bytes's default."""
HEALTH_WITHIN_S = 0.1
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
ANSWER_WITHIN_S = 1.0


@dataclass(frozen=True, slots=True)
class OpenAIDaemon:
    daemon: Daemon
    http_port: int


@pytest.fixture(scope="module", params=[0, 2], ids=["one-process", "frontends"])
def served(
    request: pytest.FixtureRequest, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpenAIDaemon]:
    folder = tmp_path_factory.mktemp("prompt-bounds")
    repo = folder / "models"
    shutil.copytree(demo_repo / MODEL, repo / MODEL)
    config_path = repo / MODEL / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config))
    config = folder / "tensord.toml"
    config.write_text(f'[server]\nfrontends = {request.param}\n[openai]\nlisten = "127.0.0.1:0"\n')
    log = folder / "tensord.log"
    daemon = start_daemon(repo, log, "--config", str(config))
    try:
        wait_for_event(log, "openai.listening", daemon.process, 60)
        (port,) = {int(e["port"]) for e in log_events(log) if e.get("event") == "openai.listening"}
        yield OpenAIDaemon(daemon, port)
    finally:
        daemon.terminate()


def _http(port: int, path: str, body: bytes) -> tuple[int, str]:
    """POST `body`; the status and the error message (or the body) of the answer."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", body, {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)["error"]["message"]


def _declared_only(port: int, declared: int) -> tuple[int, str]:
    """Headers declaring a body of `declared` bytes, and none of it sent: the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {declared}\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(payload)["error"]["message"]


def _completion(prompt: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()


def _chat(content: str) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return json.dumps(body).encode()


def _chat_of(count: int) -> bytes:
    """A conversation of `count` short messages (a body just under the limit)."""
    messages = [{"role": "user", "content": "ab"}] * count
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4}).encode()


def _grpc_generate(target: str, prompt: str) -> tuple[int, str]:
    with Client(target, timeout=30, retries=0) as client:
        try:
            list(client.generate(MODEL, prompt, max_tokens=4))
        except grpc.RpcError as error:
            return error.code().value[0], error.details() or ""
    return 0, ""


TEXT = "a" * (BODY_LIMIT - 200)  # as much text as a body may carry
IDS = [5] * 300_000  # 1.8 MB of token ids
CASES: dict[str, tuple[Callable[[OpenAIDaemon], tuple[int, str]], int, str]] = {
    "grpc-generate-text": (
        lambda s: _grpc_generate(s.daemon.target, "a" * (20 << 20)),
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "bytes, so it has at least",
    ),
    "completions-text": (
        lambda s: _http(s.http_port, "/v1/completions", _completion(TEXT)),
        400,
        "bytes, so it has at least",
    ),
    "completions-token-ids": (
        lambda s: _http(s.http_port, "/v1/completions", _completion(IDS)),
        400,
        "the prompt has 300000 tokens; the model's context is 2048 tokens",
    ),
    "chat-content": (
        lambda s: _http(s.http_port, "/v1/chat/completions", _chat(TEXT)),
        400,
        "bytes, so it has at least",
    ),
    "chat-of-many-messages": (
        lambda s: _http(s.http_port, "/v1/chat/completions", _chat_of(55_000)),
        400,
        "bytes, so it has at least",
    ),
    "body-over-the-limit": (
        lambda s: _declared_only(s.http_port, 20 << 20),
        413,
        f"more than the {BODY_LIMIT} a request may have ([openai] max_body_bytes)",
    ),
    "lone-surrogate": (
        lambda s: _http(
            s.http_port, "/v1/completions", b'{"model": "tinylm", "prompt": "ab\\ud800c"}'
        ),
        400,
        "the prompt is not valid Unicode text: it holds a lone surrogate (U+D800) at character 2",
    ),
    "lone-surrogate-field-name": (
        lambda s: _http(
            s.http_port, "/v1/completions", b'{"model": "tinylm", "prompt": "hi", "\\ud800": 1}'
        ),
        400,
        r"unknown field '\ud800'",
    ),
    "integer-of-5000-digits": (
        lambda s: _http(
            s.http_port,
            "/v1/completions",
            b'{"model": "tinylm", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}",
        ),
        400,
        "the request body is not valid JSON: Exceeds the limit (4300 digits)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_prompt_far_too_long_is_refused_at_once(served: OpenAIDaemon, case: str) -> None:
    send, status, says = CASES[case]
    with HealthProbe(served.daemon.target, 60) as probe:
        start = time.monotonic()
        got, message = send(served)
        end = time.monotonic()
        time.sleep(0.15)  # the probe calls every 10 ms: some overlap even a quick answer
        record = probe.stop()
    until = max(end, start + 0.1)
    record.assert_answered(start, until, within_s=HEALTH_WITHIN_S, what=case)
    assert end - start < ANSWER_WITHIN_S, f"{case}: answered in {end - start:.2f} s"
    assert (got, says in message) == (status, True), (got, message[:300])


def test_the_daemon_serves_on(served: OpenAIDaemon) -> None:
    """After the refusals, a prompt that fits is served on both ports."""
    status, body = _http(served.http_port, "/v1/completions", _completion("Hello"))
    assert status == 200 and json.loads(body)["choices"][0]["text"] is not None
    with Client(served.daemon.target, timeout=30, retries=0) as client:
        chunks = list(client.generate(MODEL, "Hello", max_tokens=4, ignore_eos=True))
        assert sum(len(c.token_ids) for c in chunks) == 4
    assert served.daemon.process.poll() is None
