"""Embedding models served from sentence-transformers folders as the Hub publishes them.

Tiny random BERT and MPNet encoders are built and exported by tests/st_models.py in both
ONNX layouts (the Hub's onnx/model.onnx with last_hidden_state, and Optimum's
sentence-transformers export with sentence_embedding), dropped into a repository with no
model.toml, and served. Every protocol's vectors are compared with sentence-transformers'
`encode` on the same folder: Embed, Predict and KServe ModelInfer with a BYTES text input,
and OpenAI's /v1/embeddings through the official openai client and LangChain.
"""

from __future__ import annotations

import base64
import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.conftest import ServerThread, serve
from tests.tools import require_module

# name in the repository: (family, layout, pooling, normalize)
MODELS = {
    "bert_hub": ("bert", "hub", "mean", True),
    "mpnet_hub": ("mpnet", "hub", "cls", False),
    "bert_optimum": ("bert", "optimum", "mean", True),
    "mpnet_optimum": ("mpnet", "optimum", "lasttoken", True),
}
MAX_SEQ_LENGTH = 64
TEXTS = [
    " hello world\n",  # encode() strips each text
    "   ",  # only spaces: encode() embeds the special tokens alone
    "The quick brown fox jumps over the lazy dog.",
    "a",
    "Ünïcödé text with accents, and numbers 12345 and ☕ symbols",
    " ".join(["a long text that is cut at the model's max_seq_length"] * 12),
    "what is the capital of france",
    "short",
    "sentence embeddings map texts to vectors",
]
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model's folder as built (with its reference, sentence-transformers' encode)."""
    for module in ("torch", "transformers", "optimum.exporters.onnx", "sentence_transformers"):
        require_module(module, "make setup (the export extra)")
    from tests.st_models import build_st_folder

    staging = tmp_path_factory.mktemp("st-staging")
    return {
        name: build_st_folder(
            staging,
            family,
            layout,
            pooling=pooling,
            normalize=norm,
            max_seq_length=MAX_SEQ_LENGTH,
        )
        for name, (family, layout, pooling, norm) in MODELS.items()
    }


@pytest.fixture(scope="module")
def references(folders: dict[str, Path]) -> dict[str, np.ndarray]:
    from tests.st_models import st_encode

    return {name: st_encode(folder, TEXTS) for name, folder in folders.items()}


@pytest.fixture(scope="module")
def srv(
    folders: dict[str, Path], demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerThread]:
    """The folders copied into a repository as they are (no model.toml), beside a predict
    model; the OpenAI port on."""
    root = tmp_path_factory.mktemp("embedding-repo")
    for name, folder in folders.items():
        shutil.copytree(folder, root / name)
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    server = serve(root, openai__listen="127.0.0.1:0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> Iterator[Any]:
    from tensord_client import Client

    with Client(srv.target, timeout=60, retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def openai_url(client: Any) -> str:
    return str(dict(client.info().endpoints)["openai"])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_same(vectors: np.ndarray, reference: np.ndarray) -> None:
    assert vectors.shape == reference.shape
    assert cosines(vectors, reference).min() >= MIN_COSINE
    np.testing.assert_allclose(vectors, reference, atol=1e-4)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_embed_matches_sentence_transformers(
    client: Any, references: dict[str, np.ndarray], name: str
) -> None:
    assert_same(client.embed(name, TEXTS), references[name])


def test_info_describes_embedding_models(client: Any) -> None:
    models = {m.name: m for m in client.info().models}
    hub = models["bert_hub"]
    assert hub.kind == "embedding" and hub.state == "READY"
    assert (hub.embedding.max_seq_length, hub.embedding.dimensions) == (MAX_SEQ_LENGTH, 64)
    assert (hub.embedding.pooling, hub.embedding.normalized) == ("mean", True)
    assert models["mpnet_hub"].embedding.pooling == "cls"
    assert not models["mpnet_hub"].embedding.normalized
    assert models["bert_optimum"].embedding.pooling == "graph"
    assert [(s.name, s.dtype.name) for s in hub.inputs] == [("text", "STRING")]
    assert [(s.name, list(s.shape)) for s in hub.outputs] == [("embedding", [-1, 64])]
    assert hub.postprocess.kind == "pool"


def test_texts_of_mixed_lengths_at_once_equal_each_alone(
    client: Any, references: dict[str, np.ndarray]
) -> None:
    """Texts packed with others of other lengths (padded, in one run) give the vectors
    each gives alone."""
    texts = TEXTS * 6
    with ThreadPoolExecutor(24) as pool:
        together = list(pool.map(lambda t: client.embed("mpnet_hub", [t])[0], texts))
    reference = np.tile(references["mpnet_hub"], (6, 1))
    assert_same(np.array(together), reference)
    assert_same(client.embed("mpnet_hub", texts), reference)


def test_token_ids_give_the_texts_vectors(
    client: Any, folders: dict[str, Path], references: dict[str, np.ndarray]
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folders["bert_hub"] / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    ids = [e.ids for e in tokenizer.encode_batch(TEXTS)]
    assert_same(client.embed("bert_hub", token_ids=ids), references["bert_hub"])


def test_truncation_or_refusal(client: Any) -> None:
    from tensord_client.errors import InvalidArgument

    long = TEXTS[5]
    cut = client.embed("bert_hub", [long])
    assert cut.shape == (1, 64)
    with pytest.raises(InvalidArgument, match=f"more than {MAX_SEQ_LENGTH} tokens"):
        client.embed("bert_hub", [long], truncate=False)
    client.embed("bert_hub", [TEXTS[0]], truncate=False)  # a short one passes
    with pytest.raises(InvalidArgument, match="more than"):
        client.embed("bert_hub", token_ids=[[5] * (MAX_SEQ_LENGTH + 1)], truncate=False)


def test_a_huge_text_gives_encodes_vector(client: Any, folders: dict[str, Path]) -> None:
    """Cut before it is tokenised, a long text keeps the tokens encode() keeps; one padded
    with spaces the tokenizer drops is tokenised whole."""
    from tests.st_models import st_encode

    texts = ["word " * 200_000, "start" + " " * 300_000 + "end", "x" * 500_000]
    reference = st_encode(folders["mpnet_optimum"], texts)
    assert_same(client.embed("mpnet_optimum", texts), reference)
    short = client.embed("mpnet_optimum", [texts[1]], truncate=False)
    assert_same(short, reference[1:2])


def test_matryoshka_dimensions(client: Any, references: dict[str, np.ndarray]) -> None:
    from tensord_client.errors import InvalidArgument

    # A normalised model's first values are normalised again; a raw one's stay raw.
    full = references["bert_hub"]
    short = client.embed("bert_hub", TEXTS, dimensions=16)
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-5)
    raw = references["mpnet_hub"]
    np.testing.assert_allclose(client.embed("mpnet_hub", TEXTS, dimensions=16), raw[:, :16],
                               atol=1e-4)  # fmt: skip
    assert_same(client.embed("mpnet_hub", TEXTS, dimensions=64), raw)
    with pytest.raises(InvalidArgument, match=r"outside 1\.\.64"):
        client.embed("mpnet_hub", TEXTS, dimensions=65)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"texts": [""]}, "input 0 is an empty text"),
        ({"texts": ["ok", ""]}, "input 1 is an empty text"),
        ({"texts": []}, "no input"),
        ({"texts": ["x"] * 2049}, "at most 2048"),
        ({"token_ids": [[]]}, "input 0 has no token ids"),
        ({"token_ids": [[1, 2, 10**6]]}, "outside the vocabulary"),
        ({"token_ids": [[-1]]}, "outside the vocabulary"),
    ],
)
def test_bad_input_is_refused_and_loses_nothing(
    client: Any, references: dict[str, np.ndarray], arguments: dict[str, Any], message: str
) -> None:
    from tensord_client.errors import InvalidArgument

    texts = arguments.pop("texts", None)
    with pytest.raises(InvalidArgument, match=message):
        client.embed("bert_hub", texts, **arguments)
    assert_same(client.embed("bert_hub", TEXTS), references["bert_hub"])


def test_wrong_kinds_are_refused(client: Any) -> None:
    from tensord_client.errors import FailedPrecondition, NotFound

    with pytest.raises(FailedPrecondition, match="not an embedding model"):
        client.embed("mlp", ["text"])
    with pytest.raises(FailedPrecondition, match="is an embedding model: call Embed"):
        list(client.generate("bert_hub", "hello", max_tokens=2))
    with pytest.raises(NotFound):
        client.embed("no_such_model", ["text"])


def test_predict_with_texts(client: Any, references: dict[str, np.ndarray]) -> None:
    from tensord_client.errors import InvalidArgument

    texts = np.array([t.encode() for t in TEXTS], dtype=object)
    outputs = client.predict("bert_optimum", {"text": texts})
    assert_same(outputs["embedding"], references["bert_optimum"])
    with pytest.raises(InvalidArgument, match="element 1 is not valid UTF-8"):
        client.predict("bert_optimum", {"text": np.array([b"ok", b"\xff\xfe"], dtype=object)})


def test_kserve_model_infer_with_a_bytes_input(
    srv: ServerThread, references: dict[str, np.ndarray]
) -> None:
    triton = require_module("tritonclient.grpc", "make test (it installs tritonclient)")
    with triton.InferenceServerClient(srv.target) as kserve:
        text = triton.InferInput("text", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
        reply = kserve.infer("bert_hub", [text])
        assert_same(reply.as_numpy("embedding"), references["bert_hub"])
        meta = kserve.get_model_metadata("bert_hub")
        assert [(i.name, i.datatype) for i in meta.inputs] == [("text", "BYTES")]


def test_openai_embeddings_create(openai_url: str, references: dict[str, np.ndarray]) -> None:
    openai = require_module("openai", "make setup (the dev extra)")
    api = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0)
    assert {"bert_hub", "mpnet_optimum"} <= {m.id for m in api.models.list()}
    # Unless told, the client asks for base64 and decodes it; told, it hands over what
    # came: lists of floats, or base64 of little-endian float32.
    for encoding in (None, "float", "base64"):
        options = {"encoding_format": encoding} if encoding else {}
        reply = api.embeddings.create(model="bert_hub", input=TEXTS, **options)
        data = sorted(reply.data, key=lambda d: d.index)
        if encoding == "base64":
            vectors = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in data])
        else:
            vectors = np.array([d.embedding for d in data], np.float32)
        assert_same(vectors, references["bert_hub"])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > len(TEXTS)
    one = api.embeddings.create(model="mpnet_optimum", input=TEXTS[2])
    assert_same(np.array([one.data[0].embedding], np.float32), references["mpnet_optimum"][2:3])
    short = api.embeddings.create(model="mpnet_hub", input=TEXTS, dimensions=8)
    assert {len(d.embedding) for d in short.data} == {8}


def test_openai_embeddings_of_token_ids_and_bad_bodies(
    openai_url: str, folders: dict[str, Path], references: dict[str, np.ndarray]
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folders["bert_hub"] / "tokenizer.json"))
    ids = tokenizer.encode(TEXTS[2]).ids
    body = post(openai_url, {"model": "bert_hub", "input": ids, "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4")
    assert_same(vector[None, :], references["bert_hub"][2:3])
    body = post(openai_url, {"model": "bert_hub", "input": [ids, ids[:3]]})
    assert [d["index"] for d in body["data"]] == [0, 1]
    for bad, field in [
        ({"model": "bert_hub", "input": ""}, "input 0 is an empty text"),
        ({"model": "bert_hub", "input": []}, "input"),
        ({"model": "bert_hub", "input": ["x"] * 2049}, "at most 2048"),
        ({"model": "bert_hub", "input": [1.5]}, "input"),
        ({"model": "bert_hub", "input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"model": "bert_hub", "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "bert_hub", "input": "\ud800"}, "lone surrogate"),
        ({"model": "bert_hub", "input": "x", "truncate": "yes"}, "truncate"),
        ({"model": "mlp", "input": "x"}, "not an embedding model"),
    ]:
        with pytest.raises(urllib.error.HTTPError) as error:
            post(openai_url, bad)
        assert error.value.code in (400, 404), bad
        assert field in json.loads(error.value.read())["error"]["message"], bad


def post(url: str, body: dict[str, Any]) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        f"{url}/embeddings", data, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


def test_langchain_openai_embeddings(openai_url: str, references: dict[str, np.ndarray]) -> None:
    langchain_openai = require_module("langchain_openai", "make setup (the dev extra)")
    embeddings = langchain_openai.OpenAIEmbeddings(
        model="bert_hub", base_url=openai_url, api_key="unused",
        check_embedding_ctx_length=False, max_retries=0,
    )  # fmt: skip
    documents = np.array(embeddings.embed_documents(TEXTS), np.float32)
    assert_same(documents, references["bert_hub"])
    query = np.array([embeddings.embed_query(TEXTS[2])], np.float32)
    assert_same(query, references["bert_hub"][2:3])


def test_the_embed_rpc_refuses_too_many_inputs_before_parsing(srv: ServerThread) -> None:
    from tensord_client.v1 import inference_pb2 as pb
    from tensord_client.v1 import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(srv.target) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.EmbedRequest(model="bert_hub", texts=["x"] * 3000)
        with pytest.raises(grpc.RpcError) as error:
            stub.Embed(request, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "more than 2048 inputs" in error.value.details()
        reply = stub.Embed(pb.EmbedRequest(model="bert_hub", texts=["x"]), timeout=30)
        assert len(reply.embeddings) == 1 and reply.prompt_tokens == 3
