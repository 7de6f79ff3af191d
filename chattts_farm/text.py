"""What text the farm accepts and can speak: one policy for the web, the Celery contract and the worker.

ChatTTS pronounces Latin letters and Chinese characters; everything else in a text is dropped by its
normaliser, and some characters are never speech at all.
"""

from __future__ import annotations

import functools
import re
import unicodedata

CJK_CHARACTER = re.compile(r"[\u4e00-\u9fff]")
# What ChatTTS pronounces, as a regular expression both Python and JSON Schema (ECMA-262) read alike:
# the web's description of text fields says a text must hold one.
SPEAKABLE_CHARACTER = r"[A-Za-z\u4e00-\u9fff]"
_SPEAKABLE = re.compile(SPEAKABLE_CHARACTER)
# ChatTTS control tags such as [uv_break] or [laugh] are spoken as effects, not read out.
_CONTROL_TAG = re.compile(r"\[[a-z_]+(?:_\d)?\]")
# Terminal colour codes go whole: dropping the ESC alone would leave "[31m" to be read out.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# Tags only SSML has (and vendors' namespaced ones, such as <amazon:effect>); "a<b and c>d" is not SSML.
_SSML_TAG = re.compile(
    r"<\s*/?\s*(?:speak|break|prosody|emphasis|say-as|phoneme|[a-z]+:[a-z-]+)(?=[\s/>])", re.IGNORECASE
)

NOTHING_SPEAKABLE = (
    "has nothing speakable (ChatTTS reads Latin letters and Chinese characters; digits, "
    "symbols, emoji and other scripts are dropped)"
)


@functools.cache
def visible_character() -> str:
    """A regular expression for one character that :func:`drop_invisible` keeps and ``strip`` does not
    drop (neither whitespace, nor a control or invisible format character), over the Basic Multilingual
    Plane: the pattern of names that must keep something visible, as their schema says it. Made when
    first asked for (10 ms), not by every process that imports this module."""
    hidden = [code for code in range(0x10000) if chr(code).isspace() or unicodedata.category(chr(code)) in ("Cc", "Cf")]
    ranges, start = [], hidden[0]
    for previous, code in zip(hidden, [*hidden[1:], None], strict=True):
        if code != previous + 1:
            ranges.append(f"\\u{start:04x}" if start == previous else f"\\u{start:04x}-\\u{previous:04x}")
            start = code
    return "[^" + "".join(ranges) + "]"


def drop_invisible(text: str) -> str:
    """Text without control characters (NUL, ESC, ...) and invisible format characters (zero-width
    spaces and joiners, byte-order marks, bidi overrides such as U+202E). They are never speech, and
    kept they would reach the job list, where a bidi override reorders what a reader sees.
    Whitespace stays: a newline ends a sentence.
    """
    text = _ANSI_ESCAPE.sub("", text)
    return "".join(char for char in text if char.isspace() or unicodedata.category(char) not in ("Cc", "Cf"))


def is_ssml(text: str) -> bool:
    """Whether text holds SSML tags, which ChatTTS would read out as words."""
    return bool(_SSML_TAG.search(text))


def caption_of(text: str) -> str:
    """Text as a caption shows it: without control tags (effects, not words), its whitespace one space."""
    return " ".join(_CONTROL_TAG.sub(" ", text).split())


def is_speakable(text: str) -> bool:
    """Whether text holds anything ChatTTS can pronounce (Latin letters or CJK characters)."""
    return bool(_SPEAKABLE.search(_CONTROL_TAG.sub("", text)))
