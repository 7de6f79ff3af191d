"""Awkward texts, and what the farm does with each: speak it (``None``), or refuse it naming ``text``
with a message holding the fragment given. Every entry point (the contract, the JSON API, a plain
Celery caller) must agree, because the rule lives in one place: the contract's validation."""

NOTHING_SPEAKABLE = "has nothing speakable"

EDGE_TEXTS = {
    "emoji": ("Good morning 🌅! The coffee ☕ is ready 👍🏽.", None),
    "emoji alone": ("🎉🎉🎉 👍🏽", NOTHING_SPEAKABLE),
    "arabic alone": ("مرحبا بالعالم", NOTHING_SPEAKABLE),
    "hebrew inside english": ("Shalom, שלום, means peace.", None),
    "mixed scripts": ("Hello 你好, Привет, مرحبا, こんにちは, 안녕하세요!", None),
    "cyrillic alone": ("Привет, мир!", NOTHING_SPEAKABLE),
    "control characters": ("Bell\x07 and NUL\x00 and \x1b[31mred\x1b[0m terminal colours.", None),
    "control characters alone": ("\x00\x07\x1b\x7f", NOTHING_SPEAKABLE),
    "bidi override": ("Your invoice \u202efdp.exe\u202c is attached.", None),
    "zero-width characters": ("Zero\u200bwidth\u200c joiners\u200d and\ufeff word\u2060 joiners.", None),
    "ten thousand punctuation marks": ("!?.," * 2500, "the maximum is"),
    "words in a flood of punctuation": ("Wait" + "!" * 1200 + " what?" + "…" * 300 + " Really.", None),
    "ssml": ('<speak><break time="1s"/></speak>', "is SSML"),
    "ssml around words": ('<speak>Hello <break time="1s"/> world.</speak>', "is SSML"),
    "angle brackets in prose": ("If a<b and c>d, then stop.", None),
    "lone surrogate": ("A broken \ud83d emoji.", "surrogate"),
    "digits and symbols alone": ("12345 + 678 = 7023 %", NOTHING_SPEAKABLE),
    "control tags alone": ("[uv_break] [laugh]", NOTHING_SPEAKABLE),
}
