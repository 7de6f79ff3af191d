"""A finished job's captions: one cue per segment of its text, at the segment's place in the audio (the
result's ``timeline``), written as WebVTT or SubRip. Sentence-level on purpose: ChatTTS's audio codes say
nothing of where its words fall, so no word times are made up."""

from __future__ import annotations

from collections.abc import Callable

FORMATS = ("vtt", "srt")
MIME_TYPES = {"vtt": "text/vtt", "srt": "application/x-subrip"}


def webvtt(timeline: list[dict]) -> str:
    cues = [
        f"{entry['index'] + 1}\n{_timestamp(entry['start_s'], '.')} --> {_timestamp(entry['end_s'], '.')}\n"
        f"{_vtt_text(entry['text'])}\n"
        for entry in timeline
    ]
    return "\n".join(["WEBVTT\n", *cues])


def subrip(timeline: list[dict]) -> str:
    cues = [
        f"{entry['index'] + 1}\n{_timestamp(entry['start_s'], ',')} --> {_timestamp(entry['end_s'], ',')}\n"
        f"{_srt_text(entry['text'])}\n"
        for entry in timeline
    ]
    return "\n".join(cues)


WRITERS: dict[str, Callable[[list[dict]], str]] = {"vtt": webvtt, "srt": subrip}


def _one_line(text: str) -> str:
    # A blank line ends a cue in both formats: a caption is one line.
    return " ".join(text.split())


def _vtt_text(text: str) -> str:
    # WebVTT's character references: with ">" escaped, no "-->" is left to end the cue text.
    return _one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _srt_text(text: str) -> str:
    # SubRip has no escapes, and readers take a line holding "-->" for a cue's timing: the arrow is broken up.
    return _one_line(text).replace("-->", "-- >")


def _timestamp(seconds: float, decimal_mark: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, rest = divmod(milliseconds, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole_seconds, milliseconds = divmod(rest, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole_seconds:02d}{decimal_mark}{milliseconds:03d}"
