"""Chunking, the keyword query builder and the fusion: the pure parts of host/knowledge.py."""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from agenthost.host.knowledge import chunk_text, fts_match, rrf


def test_chunks_follow_lines_and_overlap() -> None:
    text = "\n".join(f"line {i:02d} " + "x" * 20 for i in range(1, 41))  # 40 lines of 29 chars + newline
    chunks = chunk_text(text, max_chars=300, overlap_chars=60)
    assert len(chunks) > 3
    lines = text.split("\n")
    for chunk in chunks:
        assert len(chunk.text) <= 300
        # whole lines only, and the line numbers say which
        assert chunk.text == "\n".join(lines[chunk.start_line - 1 : chunk.end_line])
    for before, after in zip(chunks, chunks[1:], strict=False):
        # each chunk starts with the last two lines (60 chars) of the one before, and moves on
        assert after.start_line == before.end_line - 1
        assert after.end_line > before.end_line
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 40
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))


def test_long_lines_are_cut_and_blank_runs_dropped() -> None:
    text = "short\n" + "y" * 1000 + "\n\n\n   \n" + "tail"
    chunks = chunk_text(text, max_chars=300, overlap_chars=50)
    assert all(len(c.text) <= 300 for c in chunks)
    assert sum(c.text.count("y") for c in chunks) >= 1000  # nothing of the long line is lost
    assert [c.text for c in chunks if c.start_line == c.end_line == 2][:3] == ["y" * 300] * 3
    assert all(c.text.strip() for c in chunks)
    assert chunks[-1].text.endswith("tail") and chunks[-1].end_line == 6


def test_crlf_and_final_newline() -> None:
    chunks = chunk_text("a\r\nb\r\n", max_chars=100, overlap_chars=10)
    assert [(c.start_line, c.end_line, c.text) for c in chunks] == [(1, 2, "a\nb")]
    assert chunk_text("") == [] and chunk_text("\n\n  \n") == []


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(st.sampled_from("ab \n"), max_size=400),
    max_chars=st.integers(2, 60),
    overlap=st.integers(0, 59),
)
def test_every_line_is_in_some_chunk(text: str, max_chars: int, overlap: int) -> None:
    overlap = min(overlap, max_chars - 1)
    chunks = chunk_text(text, max_chars=max_chars, overlap_chars=overlap)
    covered = set()
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line and len(c.text) <= max_chars
        covered.update(range(c.start_line, c.end_line + 1))
    lines = text.split("\n")
    assert {i for i, line in enumerate(lines, start=1) if line.strip()} <= covered


def test_fts_match_never_passes_syntax_through() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO t(text) VALUES ('deploying the NEAR service'), ('other text')")
    hostile = ['"', 'a" OR "b', "NEAR(x y)", "text:*", "-x", "^start", "col:val AND (", "\x00", "_", "ÿ*", "a\"b'c"]
    for query in hostile:
        match = fts_match(query)
        if match:
            conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,)).fetchall()  # never a syntax error
    assert fts_match("How do I deploy?") == '"deploy"'  # stopwords go when something else is left
    assert fts_match("how do I") == '"how" OR "do" OR "i"'
    assert fts_match("!!! ???") == ""
    rows = conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (fts_match("Deploys near"),)).fetchall()
    assert rows == [(1,)]  # stemmed, case-folded, and NEAR is a word here, not an operator


def test_rrf_rewards_agreement_and_breaks_ties_deterministically() -> None:
    fused = rrf([[1, 2, 3], [3, 4, 1]])
    assert [i for i, _ in fused][:2] == [1, 3]  # both found by both passes
    assert fused[0][1] == 1 / 61 + 1 / 63
    assert [i for i, _ in rrf([[7, 8], [8, 7]])] == [7, 8]  # equal scores: the better best rank, then the id
    assert rrf([[], []]) == []
    assert [i for i, _ in rrf([[5, 6], []])] == [5, 6]
