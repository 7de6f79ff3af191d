"""Splitting long text into the segments the GPT speaks one row each.

Stock ChatTTS cuts one segment off at its token limit (~44 s), the most common complaint about it;
the farm instead splits at sentence boundaries into short segments that are synthesised in one batch
and joined.
"""

from __future__ import annotations

import re

from chattts_farm.text import CJK_CHARACTER

_SENTENCE_END = re.compile(r"(?<=[。！？；.!?;])\s*|\n+")
_CLAUSE_END = re.compile(r"(?<=[，、,:：])\s*")
_CJK_WORD = re.compile(r"[\u4e00-\u9fff][^\u4e00-\u9fff\w\s]*|[^\u4e00-\u9fff]+")


def split_segments(text: str, max_chars: int) -> list[str]:
    """Split text into segments of at most ``max_chars`` characters.

    Cuts at sentence ends (。！？；.!?; and newlines) first, packing whole sentences together while they
    fit; a sentence longer than the limit is cut at clause marks, then between words; only a run of
    CJK characters (which has no spaces) is cut between characters. Never inside a Latin word, unless
    a single word is longer than the limit.
    """
    segments: list[str] = []
    current = ""
    for sentence in _pieces(text, max_chars):
        joined = f"{current} {sentence}" if current and _needs_space(current, sentence) else current + sentence
        if len(joined) <= max_chars:
            current = joined
        else:
            if current:
                segments.append(current)
            current = sentence
    if current:
        segments.append(current)
    return segments


def _pieces(text: str, max_chars: int) -> list[str]:
    """Sentences of text, each further cut to fit ``max_chars``."""
    pieces = []
    for sentence in _SENTENCE_END.split(text):
        sentence = sentence.strip()
        if not sentence:
            continue
        if len(sentence) <= max_chars:
            pieces.append(sentence)
            continue
        for clause in _CLAUSE_END.split(sentence):
            clause = clause.strip()
            if clause:
                pieces.extend(_cut_between_words(clause, max_chars))
    return pieces


def _cut_between_words(clause: str, max_chars: int) -> list[str]:
    if len(clause) <= max_chars:
        return [clause]
    parts: list[str] = []
    current = ""
    for word in _words(clause):
        candidate = f"{current} {word}" if current and _needs_space(current, word) else current + word
        if len(candidate) <= max_chars:
            current = candidate
            continue
        if current:
            parts.append(current)
        # A single word longer than the limit has no boundary to respect.
        while len(word) > max_chars:
            parts.append(word[:max_chars])
            word = word[max_chars:]
        current = word
    if current:
        parts.append(current)
    return parts


def _words(clause: str) -> list[str]:
    """Whitespace-separated words, with every CJK character (and the punctuation after it) a word of its own."""
    words = []
    for token in clause.split():
        words.extend(_CJK_WORD.findall(token))
    return words


def _needs_space(left: str, right: str) -> bool:
    return not (CJK_CHARACTER.match(left[-1]) or CJK_CHARACTER.match(right[0]))
