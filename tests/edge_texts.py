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
    "ssml of silence alone": ('<speak><break time="1s"/></speak>', NOTHING_SPEAKABLE),
    "ssml around words": ('<?xml version="1.0"?>\n<speak>Hello <break time="1s"/> world.</speak>', None),
    "ssml tags outside a speak document": ('Hello <break time="1s"/> world.', "no SSML document"),
    "ssml audio": ('<speak>Listen: <audio src="https://example.com/a.wav"/></speak>', "holds <audio>"),
    "ssml voice": ('<speak><voice name="en-US-Ava">Hello.</voice></speak>', "holds <voice>"),
    "ssml entity expansion": (
        '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
        "<speak>&b;&b;&b;&b;</speak>",
        "holds a DTD",
    ),
    "ssml external entity": ('<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>Hi.</speak>', "holds a DTD"),
    "ssml undeclared entity": ("<speak>Hi &secret; there.</speak>", "undefined entity"),
    "ssml nested too deep": ("<speak>" + "<p>" * 40 + "Deep." + "</p>" * 40 + "</speak>", "more than 16 deep"),
    "ssml not well-formed": ("<speak>Hello <p>world.</speak>", "not well-formed"),
    "ssml breaks adding up to fifteen minutes": (
        "<speak>Wait." + '<break time="10s"/>' * 90 + "</speak>",
        "add up to more than 60 s",
    ),
    "ssml break too long": ('<speak>Wait.<break time="11s"/>Go.</speak>', "at most 10 s"),
    "ssml rate outside chattts speeds": ('<speak><prosody rate="900%">Fast.</prosody></speak>', "from 25% to 400%"),
    "ssml pitch": ('<speak><prosody pitch="high">High.</prosody></speak>', "prosody pitch"),
    "ssml cardinal of words": ('<speak><say-as interpret-as="cardinal">many</say-as> cats.</speak>', "a cardinal"),
    "angle brackets in prose": ("If a<b and c>d, then stop.", None),
    "lone surrogate": ("A broken \ud83d emoji.", "surrogate"),
    "digits and symbols alone": ("12345 + 678 = 7023 %", NOTHING_SPEAKABLE),
    "control tags alone": ("[uv_break] [laugh]", NOTHING_SPEAKABLE),
}
