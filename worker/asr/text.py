"""The text a segment was asked to say and the text heard in its audio, made comparable.

Both go through :func:`normalise` (a recogniser writes "42" or "forty-two", "Hello," or "hello"
as it likes), and :func:`error_rate` counts words for English and characters for Chinese, whose
words are not separated by spaces.
"""

from __future__ import annotations

import re
import unicodedata

import cn2an
import jiwer
from num2words import num2words

from chattts_farm.text import CJK_CHARACTER

# ChatTTS's control tags ([uv_break], [laugh], [lbreak], ...) are said as pauses and laughs, not words.
_TAG = re.compile(r"\[[^\]]*\]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# Everything but letters, digits and apostrophes; an apostrophe only inside a word ("don't").
_PUNCTUATION = re.compile(r"[^\w\s']|_|(?<!\w)'|'(?!\w)")


def is_chinese(text: str) -> bool:
    """Whether a text is Chinese, by the characters ChatTTS speaks as Chinese (the farm's one rule)."""
    return bool(CJK_CHARACTER.search(text))


def normalise(text: str) -> str:
    """Lower case, without punctuation or control tags, full-width forms made plain (NFKC), numbers
    as words (Chinese numerals in Chinese text), words separated by single spaces."""
    text = _TAG.sub(" ", unicodedata.normalize("NFKC", text))
    if is_chinese(text):
        text = cn2an.transform(text, "an2cn")
    else:
        text = _NUMBER.sub(lambda number: f" {num2words(number.group())} ", text)
    return " ".join(_PUNCTUATION.sub(" ", text.casefold()).split())


def error_rate(said: str, heard: str) -> float:
    """Word error rate of ``heard`` against ``said`` (character error rate for Chinese), both as
    :func:`normalise` leaves them; ``said`` must have something in it."""
    if is_chinese(said):
        return jiwer.cer(said.replace(" ", ""), heard.replace(" ", ""))
    return jiwer.wer(said, heard)
