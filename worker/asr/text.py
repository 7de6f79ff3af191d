"""The text a segment was asked to say and the text heard in its audio, made comparable.

Both go through :func:`normalise` (a recogniser writes "42" or "forty-two", "Hello," or "hello"
as it likes), and :func:`error_rate` counts words for English and characters for Chinese, whose
words are not separated by spaces.
"""

from __future__ import annotations

import functools
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
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def is_chinese(text: str) -> bool:
    """Whether a text is Chinese, by the characters ChatTTS speaks as Chinese (the farm's one rule)."""
    return bool(CJK_CHARACTER.search(text))


# Remembered: the listener normalises a segment's text for Whisper's token limit and again for the verdict,
# on its thread beside the engine's, which waits while that Python holds the interpreter's lock.
@functools.lru_cache(maxsize=4096)
def normalise(text: str) -> str:
    """Lower case, without punctuation or control tags, full-width forms made plain (NFKC), numbers
    as words (Chinese numerals in Chinese text), words separated by single spaces."""
    text = _TAG.sub(" ", unicodedata.normalize("NFKC", text))
    if is_chinese(text):
        text = cn2an.transform(text, "an2cn")
    else:
        text = _NUMBER.sub(lambda number: f" {_in_words(number.group())} ", text)
    return " ".join(_PUNCTUATION.sub(" ", text.casefold()).split())


# Remembered too: num2words takes ~0.1 ms a number (most of normalising a sentence with numbers in it),
# and the same few numbers come back in text after text.
@functools.lru_cache(maxsize=4096)
def _in_words(number: str) -> str:
    return num2words(number)


def says_something(text: str) -> bool:
    """Whether :func:`normalise` leaves anything of the text, without normalising it when a letter or digit
    outside its control tags shows it will: the engine's thread asks this of every segment the gate hears."""
    shown = _LETTER_OR_DIGIT.search(_TAG.sub(" ", unicodedata.normalize("NFKC", text))) is not None
    return shown or bool(normalise(text))


def error_rate(said: str, heard: str) -> float:
    """Word error rate of ``heard`` against ``said`` (character error rate for Chinese), both as
    :func:`normalise` leaves them; ``said`` must have something in it."""
    if is_chinese(said):
        return jiwer.cer(said.replace(" ", ""), heard.replace(" ", ""))
    return jiwer.wer(said, heard)
