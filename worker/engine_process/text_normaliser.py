"""ChatTTS's text normaliser, in plain Python: the same text, without its numba functions.

ChatTTS's ``Normalizer`` replaces homophones with a numba loop that scans its whole map (thousands of
characters) for each character of the text: 1-3 ms a segment, on the engine's thread, before the
request's prefill (on the H200, 64 requests arriving at once spent ~100 ms there before their first
decode step). Its other helpers (splitting control tags off and joining them back) are numba too, and
compiling them took ~5 s of every worker's start. Here the homophones are one ``str.translate`` with
a table built once from the same map, and the tags are split by a loop of a few lines; the steps and
their order are ChatTTS's (``ChatTTS/norm.py``), and a test holds the output to its own.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# ChatTTS compares the map with the text's UTF-16 code units: only characters of one unit can match.
_ONE_UTF16_UNIT = range(0x10000)
_SURROGATES = range(0xD800, 0xE000)


class TextNormaliser:
    def __init__(self, normalizer):  # ChatTTS.norm.Normalizer: its maps, patterns and registered normalisers
        self._normalizer = normalizer
        sources, targets = normalizer.homophones_map.tolist()
        self._homophones: dict[int, int] = {}
        for source, target in zip(sources, targets, strict=True):
            if source in _ONE_UTF16_UNIT and target in _ONE_UTF16_UNIT and source not in _SURROGATES:
                self._homophones.setdefault(source, target)  # ChatTTS takes a character's first entry

    def __call__(self, text: str) -> str:
        """The text as ChatTTS's ``Normalizer(text, True, True)`` gives it, stripped."""
        chattts = self._normalizer
        language = chattts._detect_language(text)
        if language in chattts.normalizers:  # a text normaliser the user registered with ChatTTS
            texts, tags = split_tags(text)
            text = join_tags([chattts.normalizers[language](piece) for piece in texts], tags)
        if language == "zh":
            text = chattts._apply_half2full_map(text)
        invalid = chattts._count_invalid_characters(text)
        if invalid:
            logger.debug("characters ChatTTS cannot speak: %s", invalid)
            text = chattts._apply_character_map(text)
        text = text.translate(self._homophones)
        if invalid:
            texts, tags = split_tags(text)
            text = join_tags([chattts.reject_pattern.sub("", piece) for piece in texts], tags)
        return text.strip()


def split_tags(text: str) -> tuple[list[str], list[str]]:
    """The text between control tags (``[uv_break]``) and the tags, as ChatTTS splits them: a text
    piece is kept before every ``[``, even an empty one; an unclosed tag at the end is dropped."""
    texts: list[str] = []
    tags: list[str] = []
    piece = tag = ""
    for character in text:
        if character == "[":
            texts.append(piece)
            piece, tag = "", character
        elif tag:
            tag += character
        else:
            piece += character
        if character == "]":
            tags.append(tag)
            tag = ""
    if piece:
        texts.append(piece)
    return texts, tags


def join_tags(texts: list[str], tags: list[str]) -> str:
    """The pieces with the tags back between them, in order; a text without tags is its one piece."""
    if not tags:
        return texts[0]
    return "".join(piece + (tags[index] if index < len(tags) else "") for index, piece in enumerate(texts))
