"""The SSML subset the farm reads, into a *script*: the speech and the silences of a text, in order.

One reading for the web (which refuses a bad document at submit), the Celery contract and the worker
(which reads the document again from the request, trusting nobody's reading of it). The subset:

- ``<speak>`` around the whole text (which is what makes a text SSML: see :func:`is_document`);
- ``<p>`` and ``<s>``: segment boundaries (a segment never spans one);
- ``<break time="750ms|1.5s" strength="...">``: that much silence, exactly, in the audio (``time`` wins
  over ``strength``; a bare ``<break/>`` is a medium one, and ``strength="none"`` takes even the usual
  pause between segments away);
- ``<prosody rate="...">``: ChatTTS's speed for the text inside (:data:`RATES`, or a percentage);
- ``<sub alias="...">``: the alias said instead of the words inside;
- ``<say-as interpret-as="characters|cardinal">``: spelled out, or a whole number read as words
  (Chinese words when the document holds Chinese characters, else English ones; ``xml:lang`` is taken
  on ``<speak>`` and changes nothing).

Anything else (``<audio>``, ``<voice>``, other attributes, a DTD, entities, processing instructions)
is refused. The parser is the standard library's expat, told to read no DTD and to refuse every
declaration: no entity is ever expanded (a "billion laughs" document stops at its DOCTYPE) and
nothing outside the document is ever fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.parsers import expat

from num2words import num2words

from chattts_farm.speech_length import speed_of_rate
from chattts_farm.text import CJK_CHARACTER

# What a <break strength> lasts, in milliseconds (SSML leaves the lengths to the reader; these are
# common vendors'). A bare <break/> is a medium one.
BREAK_STRENGTHS_MS = {"none": 0, "x-weak": 250, "weak": 500, "medium": 750, "strong": 1000, "x-strong": 1250}
MAX_BREAK_MS = 10_000  # one <break>
MAX_SILENCE_MS = 60_000  # all of a text's breaks together
# <prosody rate> as ChatTTS speed levels, two levels per doubling as OpenAI's speed maps (see
# speed_of_rate): a percentage of the normal rate (25% to 400%), or a name for one.
RATES = {"x-slow": 25, "slow": 50, "medium": 100, "fast": 200, "x-fast": 400}
MIN_RATE_PERCENT, MAX_RATE_PERCENT = 25, 400
MAX_DEPTH = 16  # elements inside elements
MAX_CARDINAL_DIGITS = 15
SAY_AS = ("characters", "cardinal")
_ATTRIBUTES = {
    "speak": {"version", "xmlns", "xml:lang"},
    "p": set(),
    "s": set(),
    "break": {"time", "strength"},
    "prosody": {"rate"},
    "sub": {"alias"},
    "say-as": {"interpret-as"},
}
SUBSET = "speak, p, s, break, prosody (rate), sub, say-as (characters, cardinal)"
# The subset in a sentence, for the API's description and the speak page.
SUMMARY = (
    "<speak> around the whole text; <p> and <s>, segment boundaries; "
    '<break time="750ms" or "1.5s" strength="...">, exactly that much silence ('
    + ", ".join(f"{name} {ms} ms" for name, ms in BREAK_STRENGTHS_MS.items())
    + f"; medium when neither is given; at most {MAX_BREAK_MS // 1000} s a break, "
    + f"{MAX_SILENCE_MS // 1000} s a text); "
    '<prosody rate="...">, ChatTTS\'s speed for the text inside ('
    + ", ".join(f"{name} {speed_of_rate(percent / 100)}" for name, percent in RATES.items())
    + f", or a percentage from {MIN_RATE_PERCENT}% to {MAX_RATE_PERCENT}%: two speed levels a doubling); "
    '<sub alias="..."> (the alias is said); <say-as interpret-as="characters"> (spelled out) or "cardinal" '
    "(a whole number, said in words). Anything else is refused, as are DTDs and entities beyond XML's own five."
)

# A document's first markup: <speak>, or what may come before it in XML (a declaration, a comment, a DOCTYPE).
_DOCUMENT_START = re.compile(r"\s*<(?:speak[\s/>]|\?xml|!)")
_TIME = re.compile(r"(\d+(?:\.\d+)?)(ms|s)")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
_CARDINAL = re.compile(r"[+-]?\d{1,3}(?:,\d{3})*|[+-]?\d+")
_DIGIT_NAMES = {
    False: ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    True: tuple("零一二三四五六七八九"),
}


class SsmlRefused(ValueError):
    """A document outside the subset, or not well-formed: the message says what to change."""


@dataclass(frozen=True)
class Speech:
    """Text spoken as one run: split into segments as any text is, never joined to its neighbours."""

    text: str
    speed: int | None = None  # ChatTTS's speed, from a <prosody rate>; None: the request's


@dataclass(frozen=True)
class Silence:
    """Silence of exactly this length, instead of the usual pause between segments."""

    ms: int


Script = tuple[Speech | Silence, ...]


def is_document(text: str) -> bool:
    """Whether text is SSML: it begins (after blanks) with ``<speak``, or with ``<?xml`` or ``<!`` (an
    XML declaration, a comment, a DOCTYPE), which only XML begins with. Text with SSML tags that is not
    one is plain text the contract refuses (see chattts_farm.text.is_ssml)."""
    return bool(_DOCUMENT_START.match(text))


def script_of(text: str) -> Script:
    """The script of any text: a document's, read; plain text's, one run of speech."""
    return read(text) if is_document(text) else (Speech(text),)


def read(document: str) -> Script:
    """The script of a ``<speak>`` document; :class:`SsmlRefused` says why it is not one the farm reads."""
    reader = _Reader(chinese=bool(CJK_CHARACTER.search(document)))
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse("a DTD (<!DOCTYPE ...>)")
    parser.EntityDeclHandler = _refuse("an entity declaration")
    parser.ExternalEntityRefHandler = _refuse("an external reference")
    parser.ProcessingInstructionHandler = _refuse("a processing instruction (<?...?>)")
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.characters
    try:
        parser.Parse(document, True)
    except expat.ExpatError as error:
        raise SsmlRefused(
            f"is not well-formed SSML: {expat.ErrorString(error.code)} at line {error.lineno}, "
            f"column {error.offset + 1}"
        ) from None
    return tuple(reader.script)


def _refuse(what: str):
    def refuse(*_):
        raise SsmlRefused(f"holds {what}, which SSML here may not")

    return refuse


class _Reader:
    """expat's handlers: elements and text in, the script out."""

    def __init__(self, *, chinese: bool):
        self.chinese = chinese
        self.script: list[Speech | Silence] = []
        self.open: list[str] = []  # the elements open, outermost first
        self.speeds: list[int | None] = [None]  # the rate of each <prosody> open, innermost last
        self.run: list[str] = []  # the text of the speech being read
        self.inner: list[str] | None = None  # the words inside the <sub> or <say-as> open
        self.inner_attributes: dict[str, str] = {}
        self.silence_ms = 0

    def start(self, name: str, attributes: dict[str, str]) -> None:
        self._check(name, attributes)
        self.open.append(name)
        if name in ("p", "s"):
            self._end_run()
        elif name == "break":
            self._end_run()
            self._silence(_break_ms(attributes))
        elif name == "prosody":
            self._end_run()
            self.speeds.append(_speed(attributes["rate"]) if "rate" in attributes else self.speeds[-1])
        elif name in ("sub", "say-as"):
            self.inner, self.inner_attributes = [], attributes
            if name == "sub" and "alias" not in attributes:
                raise SsmlRefused('holds a <sub> without its alias="..."')
            if name == "say-as" and attributes.get("interpret-as") not in SAY_AS:
                raise SsmlRefused(f"holds a <say-as> whose interpret-as is not one of {', '.join(SAY_AS)}")

    def end(self, name: str) -> None:
        self.open.pop()
        if name in ("p", "s", "speak"):
            self._end_run()
        elif name == "prosody":
            self._end_run()
            self.speeds.pop()
        elif name == "sub":
            self.run.append(self.inner_attributes["alias"])
            self.inner = None
        elif name == "say-as":
            written = "".join(self.inner)
            if self.inner_attributes["interpret-as"] == "cardinal":
                self.run.append(_cardinal(written, chinese=self.chinese))
            else:
                self.run.append(_characters(written, chinese=self.chinese))
            self.inner = None

    def characters(self, data: str) -> None:
        if not self.open:
            return  # whitespace around the root: expat refuses anything else there
        if self.open[-1] == "break" and data.strip():
            raise SsmlRefused("holds words inside a <break>, which is silence: write <break/>")
        (self.inner if self.inner is not None else self.run).append(data)

    def _check(self, name: str, attributes: dict[str, str]) -> None:
        if name not in _ATTRIBUTES:
            raise SsmlRefused(f"holds <{name}>, which is not in the SSML the farm reads ({SUBSET})")
        if (name == "speak") != (not self.open):
            raise SsmlRefused("must be one <speak> element around the whole text")
        if self.open and self.open[-1] == "break":
            raise SsmlRefused(f"holds <{name}> inside a <break>, which is silence: write <break/>")
        if self.inner is not None:
            raise SsmlRefused(f"holds <{name}> inside <{self.open[-1]}>, which holds words alone")
        if len(self.open) >= MAX_DEPTH:
            raise SsmlRefused(f"nests elements more than {MAX_DEPTH} deep")
        unknown = sorted(
            attribute
            for attribute in attributes
            if attribute not in _ATTRIBUTES[name] and not (name == "speak" and attribute.startswith("xmlns:"))
        )
        if unknown:
            allowed = ", ".join(sorted(_ATTRIBUTES[name])) or "none"
            raise SsmlRefused(f'holds <{name} {unknown[0]}="...">, which is not read (its attributes: {allowed})')

    def _end_run(self) -> None:
        text = " ".join("".join(self.run).split())
        self.run = []
        if text:
            self.script.append(Speech(text, self.speeds[-1]))

    def _silence(self, ms: int) -> None:
        self.silence_ms += ms
        if self.silence_ms > MAX_SILENCE_MS:
            raise SsmlRefused(f"breaks add up to more than {MAX_SILENCE_MS / 1000:g} s, the most one text may hold")
        if self.script and isinstance(self.script[-1], Silence):
            self.script[-1] = Silence(self.script[-1].ms + ms)
        else:
            self.script.append(Silence(ms))


def _break_ms(attributes: dict[str, str]) -> int:
    if "time" in attributes:
        time = _TIME.fullmatch(attributes["time"].strip())
        if time is None:
            raise SsmlRefused(
                f'holds <break time="{attributes["time"]}">: a time is milliseconds or seconds, "750ms" or "1.5s"'
            )
        ms = round(float(time.group(1)) * (1 if time.group(2) == "ms" else 1000))
        if ms > MAX_BREAK_MS:
            raise SsmlRefused(f"holds a break of {ms / 1000:g} s; one break is at most {MAX_BREAK_MS / 1000:g} s")
        return ms
    strength = attributes.get("strength", "medium")
    if strength not in BREAK_STRENGTHS_MS:
        raise SsmlRefused(f'holds <break strength="{strength}">: a strength is one of {", ".join(BREAK_STRENGTHS_MS)}')
    return BREAK_STRENGTHS_MS[strength]


def _speed(rate: str) -> int:
    percent = RATES.get(rate.strip())
    if percent is None and (match := _PERCENT.fullmatch(rate.strip())):
        percent = float(match.group(1))
    if percent is None or not MIN_RATE_PERCENT <= percent <= MAX_RATE_PERCENT:
        raise SsmlRefused(
            f'holds <prosody rate="{rate}">: a rate is one of {", ".join(RATES)}, '
            f"or a percentage of the normal rate from {MIN_RATE_PERCENT}% to {MAX_RATE_PERCENT}%"
        )
    return speed_of_rate(percent / 100)


def _cardinal(words: str, *, chinese: bool) -> str:
    number = words.strip()
    if not _CARDINAL.fullmatch(number) or len(re.sub(r"\D", "", number)) > MAX_CARDINAL_DIGITS:
        raise SsmlRefused(
            f'holds <say-as interpret-as="cardinal">{words}</say-as>: a cardinal is a whole number of at most '
            f"{MAX_CARDINAL_DIGITS} digits"
        )
    value = int(number.replace(",", ""))
    if not chinese:
        return num2words(value)
    import cn2an  # only here: importing it takes 0.15 s, which every importer of the contract would pay

    return cn2an.an2cn(str(value))


def _characters(words: str, *, chinese: bool) -> str:
    """Each letter, digit and CJK character said on its own (digits as their names); nothing else is said."""
    said = []
    for character in words:
        if character.isdigit() and character.isascii():
            said.append(_DIGIT_NAMES[chinese][int(character)])
        elif character.isalpha():
            said.append(character.upper() if character.isascii() else character)
    return " ".join(said)
