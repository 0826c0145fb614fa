"""A deterministic embeddings endpoint on loopback, speaking OpenAI's `/v1/embeddings` and Ollama's `/api/embed`.

Its "model" is a bag of concepts: each word is mapped through a synonym table to a concept, each concept to a
signed dimension by a hash, and the sum is the vector. Synonyms land on the same dimension, so a query worded
differently from a document ("automobile" for "vehicle") is near it for the vector pass while sharing no word with
it for the keyword pass. Like real models, it is vague about identifiers: every word with a digit in it (an error
code, a port, a version) is the same concept, so "E4021" and "E5003" look alike to it and only the keyword pass
tells them apart.
The benchmark (benchmarks/bench_kb.py) uses the same function in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

DIMS = 256

# Word → concept. The corpus (corpus.py) is written with one side of each group and queried with the other.
SYNONYMS: dict[str, str] = {
    # money back
    "reimbursement": "refund",
    "reimburse": "refund",
    "repayment": "refund",
    "refunded": "refund",
    # credentials
    "passphrase": "password",
    "recover": "reset",
    "lost": "forgotten",
    # request limits
    "throttling": "limit",
    "throttled": "limit",
    "calls": "request",
    # backups
    "copies": "snapshot",
    "snapshotted": "snapshot",
    "db": "database",
    "nightly": "night",
    "retention": "kept",
    # people
    "colleagues": "teammate",
    "coworkers": "teammate",
    "organisation": "workspace",
    "organization": "workspace",
    # vehicles
    "automobile": "vehicle",
    "car": "vehicle",
    "truck": "vehicle",
    "position": "location",
    "whereabouts": "location",
    # closing an account
    "shut": "close",
    "terminate": "close",
    "closing": "close",
    # hardware
    "graphics": "gpu",
    "accelerator": "gpu",
    "machines": "instance",
    "servers": "instance",
    # pricing
    "price": "cost",
    "costs": "cost",
    "professional": "pro",
    "tier": "plan",
    # support
    "helpdesk": "support",
    "reach": "contact",
    "open": "hours",
    # invoices
    "bill": "invoice",
    "bills": "invoice",
    "receipt": "invoice",
    # privacy
    "information": "data",
    "europe": "eu",
    "european": "eu",
    "stored": "processed",
    # configuration
    "configuration": "variable",
    "settings": "variable",
    "values": "variable",
    # webhooks
    "callbacks": "webhook",
    "payloads": "event",
    # sign-in
    "login": "sign",
    "logins": "sign",
    "signin": "sign",
    # status
    "downtime": "outage",
    "alerts": "notified",
    # identity
    "yubikey": "hardware",
    "dongle": "hardware",
    "authenticate": "login",
    "verification": "authentication",
    "mfa": "factor",
    # scheduling
    "recurring": "scheduled",
    "periodic": "scheduled",
    "tasks": "job",
    # domains
    "hostname": "domain",
    "dns": "cname",
    "tls": "certificate",
    "ssl": "certificate",
    # scaling
    "replicas": "replica",
    "load": "cpu",
    "grow": "add",
    "busy": "cpu",
}

STOPWORDS = frozenset(
    "a an and are as at be by can do does for from get has have how i in is it its my of on or the to what when"
    " where which with you your me we our this that after before than".split()
)

_WORD = re.compile(r"[a-z0-9]+")


def concepts(text: str) -> list[str]:
    out = []
    for word in _WORD.findall(text.lower()):
        if word in STOPWORDS:
            continue
        if any(c.isdigit() for c in word):
            out.append("<number>")
            continue
        word = SYNONYMS.get(word, word)
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.append(SYNONYMS.get(word, word))
    return out


def embed(text: str, dims: int = DIMS) -> list[float]:
    vector = [0.0] * dims
    for concept in concepts(text):
        digest = hashlib.blake2b(concept.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dims
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeEmbeddings:
    """`async with FakeEmbeddings() as server:` then point a bot at server.openai_url or server.ollama_url.

    `fail_with` (an HTTP status) makes every request fail until reset; `requests` records what arrived."""

    dims: int = DIMS
    fail_with: int = 0
    answer: bytes | None = None  # a raw body to send instead of embeddings (for malformed answers)
    requests: list[Received] = field(default_factory=list)
    release: asyncio.Event | None = None  # when set, requests wait for it (a slow endpoint)
    _server: asyncio.AbstractServer | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def ollama_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeEmbeddings:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                _, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, payload = await self._answer(path, headers, body)
                head = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
                head += "\r\n"
                writer.write(head.encode() + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, bytes]:
        body = json.loads(raw or b"{}")
        self.requests.append(Received(path, headers, body))
        if self.release is not None:
            await self.release.wait()
        if self.fail_with:
            return self.fail_with, b'{"error": {"message": "the fake endpoint was told to fail"}}'
        if self.answer is not None:
            return 200, self.answer
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else texts
        dims = int(body.get("dimensions") or self.dims)
        vectors = [embed(t, dims) for t in texts]
        if path == "/v1/embeddings":
            data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
            return 200, json.dumps({"object": "list", "data": data, "model": body.get("model")}).encode()
        if path == "/api/embed":
            return 200, json.dumps({"model": body.get("model"), "embeddings": vectors}).encode()
        return 404, b'{"error": "not found"}'
