"""The farm's text normaliser gives exactly the text ChatTTS's own gives (homophones replaced, tags kept,
characters ChatTTS cannot speak removed), without ChatTTS's numba functions."""

import pytest

from worker.engine_process.text_normaliser import TextNormaliser


@pytest.fixture(scope="module")
def stock(synthesizer):
    return synthesizer.model.chat.normalizer


def homophone_sources(stock, count):
    sources, _ = stock.homophones_map.tolist()
    return "".join(chr(source) for source in sources[:: max(1, len(sources) // count)][:count])


def test_every_text_comes_out_as_chatts_normalises_it(stock):
    normalise = TextNormaliser(stock)
    homophones = homophone_sources(stock, 40)
    texts = [
        f"今天{homophones[:10]}天气很好。",
        f"他说：{homophones[10:30]}！[uv_break]然后走了。",
        f"Mixed 中文 and English {homophones[30:]} with 42 numbers.",
        "Plain English, nothing to replace.",
        f"Emoji 😀 and symbols ♪ beside {homophones[:5]} 🎉",
        "  spaced out  ",
        f"Tags [uv_break] with emoji 😀 and {homophones[:3]}[laugh] between [lbreak]",
        f"[uv_break]开头的标签，还有半角字符!?和{homophones[3:8]}。",
        "An unclosed [tag at the end 🎉",
        "Nested [[uv_break]] brackets and ] a stray one ♪",
        "中文句子，没有标签。",
    ]
    for text in texts:
        assert normalise(text) == stock(text, True, True).strip()


def test_homophones_are_replaced(stock):
    normalise = TextNormaliser(stock)
    homophones = homophone_sources(stock, 20)
    text = f"我们{homophones}。"
    assert normalise(text) != stock(text, True, False).strip()
