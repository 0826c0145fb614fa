"""Scans text bound for the system prompt (memory entries) for prompt injection, secret exfiltration, secrets
themselves, and invisible or bidirectional unicode.

Memory is written by the model and read back into every future system prompt, so one poisoned entry is a
persistent injection. Patterns anchor on attack phrasing, not on mere mentions of sensitive words, because false
positives that silently drop a user's notes are their own failure; every rejection therefore carries a reason.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

MAX_SCAN_CHARS = 64 * 1024

_INVISIBLE = {
    0x00AD,
    0x034F,
    0x061C,
    0x115F,
    0x1160,
    0x17B4,
    0x17B5,
    0x180E,
    0x3164,
    0xFEFF,
    0xFFA0,
    *range(0x200B, 0x2010),  # zero-width space/joiners, LRM, RLM
    *range(0x202A, 0x202F),  # bidi embeddings and overrides
    *range(0x2060, 0x2070),  # word joiner, invisible operators, bidi isolates (2066-2069)
    *range(0xFE00, 0xFE10),  # variation selectors
    *range(0xE0000, 0xE0080),  # tag characters (ASCII smuggling)
}

_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "prompt injection: instruction override",
        re.compile(
            r"\b(ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}\b(previous|prior|above|earlier|all|any|your|system|developer)\b"
            r"[^.\n]{0,30}\b(instructions?|rules|prompts?|guidelines|directives|constraints)",
            re.I,
        ),
    ),
    (
        "prompt injection: role reassignment",
        re.compile(
            r"\byou are (now|no longer)\b|\bfrom now on,? you (are|will|must)\b"
            r"|\bact as (an? )?(unrestricted|jailbroken|dan)\b",
            re.I,
        ),
    ),
    (
        "prompt injection: fake system or tool message",
        re.compile(
            r"^\s*(system|developer)\s*:|<\|?(system|im_start|im_end)\|?>|\[/?(system|inst)\]|</?(system|tool_result)>",
            re.I | re.M,
        ),
    ),
    (
        "prompt injection: concealment",
        re.compile(
            r"\b(do not|don't|never)\s+(tell|inform|reveal|mention|show)\b[^.\n]{0,30}\b(the )?(user|human|operator)\b",
            re.I,
        ),
    ),
    (
        "secret exfiltration",
        re.compile(
            r"\b(send|post|upload|exfiltrate|leak|forward|email|transmit|curl|wget)\b[^\n]{0,80}"
            r"\b(api[ _-]?keys?|tokens?|secrets?|passwords?|credentials?|private keys?|\.env|ssh keys?|cookies?)\b",
            re.I,
        ),
    ),
    (
        "secret exfiltration: reads credential files",
        re.compile(
            r"\b(cat|read|print|dump|type)\b[^\n]{0,40}(~/\.ssh/|id_rsa|id_ed25519|\.aws/credentials|/etc/shadow|\.netrc)",
            re.I,
        ),
    ),
    (
        "secret exfiltration: env expansion into a request",
        re.compile(r"\b(curl|wget|fetch|http)\b[^\n]{0,120}\$\{?[A-Z_]*(KEY|TOKEN|SECRET|PASSWORD)[A-Z_]*\}?", re.I),
    ),
    (
        "contains a secret",
        re.compile(
            r"\b(sk-(ant-|proj-)?[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|xox[baprs]-[A-Za-z0-9-]{10,}"
            r"|AIza[0-9A-Za-z_-]{30,})\b|-----BEGIN [A-Z ]*PRIVATE KEY-----"
        ),
    ),
]


@dataclass(frozen=True)
class ScanResult:
    ok: bool
    reason: str = ""


def scan(text: str) -> ScanResult:
    if len(text) > MAX_SCAN_CHARS:
        return ScanResult(False, f"entry is larger than the {MAX_SCAN_CHARS}-char scan limit")
    # Invisible characters are checked on the raw text: NFKC normalization would erase some of them.
    for ch in text:
        cp = ord(ch)
        if cp in _INVISIBLE:
            return ScanResult(False, f"invisible or bidirectional unicode character U+{cp:04X}")
        if unicodedata.category(ch) == "Cc" and ch not in "\n\t":
            return ScanResult(False, f"control character U+{cp:04X}")
    normalized = unicodedata.normalize("NFKC", text)
    for reason, pattern in _RULES:
        if pattern.search(normalized):
            return ScanResult(False, reason)
    return ScanResult(True)
