"""ChatTTS's text normaliser, with its homophone replacement done by one ``str.translate``.

ChatTTS replaces homophones with a numba loop that scans its whole map (thousands of characters) for
each character of the text: 1-3 ms a segment, on the engine's thread, before the request's prefill.
On the H200, 64 requests arriving at once spent ~100 ms there before their first decode step. A
translation table built once from the same map gives the same text in microseconds.
"""

from __future__ import annotations

# ChatTTS compares the map with the text's UTF-16 code units: only characters of one unit can match.
_ONE_UTF16_UNIT = range(0x10000)
_SURROGATES = range(0xD800, 0xE000)


class TextNormaliser:
    def __init__(self, normalizer):  # ChatTTS.norm.Normalizer
        self._normalizer = normalizer
        sources, targets = normalizer.homophones_map.tolist()
        self._homophones: dict[int, int] = {}
        for source, target in zip(sources, targets, strict=True):
            if source in _ONE_UTF16_UNIT and target in _ONE_UTF16_UNIT and source not in _SURROGATES:
                self._homophones.setdefault(source, target)  # ChatTTS takes a character's first entry

    def __call__(self, text: str) -> str:
        """The text as ChatTTS's ``Normalizer(text, True, True)`` gives it, stripped."""
        # The homophone map's characters are all Chinese, which ChatTTS's later pass (removing
        # characters it cannot speak) keeps: replacing them after that pass gives the same text.
        text = self._normalizer(text, do_text_normalization=True, do_homophone_replacement=False)
        return text.translate(self._homophones).strip()
