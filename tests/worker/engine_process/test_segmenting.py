"""Splitting long text into segments."""

from worker.engine_process.segmenting import split_segments


def test_short_text_is_one_segment():
    assert split_segments("Hello there. How are you?", 120) == ["Hello there. How are you?"]


def test_sentences_are_packed_up_to_the_limit():
    text = "One two three. Four five six. Seven eight nine."
    assert split_segments(text, 30) == ["One two three. Four five six.", "Seven eight nine."]


def test_chinese_sentence_ends_and_newlines_are_boundaries():
    assert split_segments("你好。今天天气很好！\n我们走吧", 7) == ["你好。", "今天天气很好！", "我们走吧"]


def test_punctuation_stays_with_the_character_before_it():
    assert split_segments("今天天气很好！", 6) == ["今天天气很", "好！"]


def test_a_long_sentence_is_cut_between_words_never_inside_one():
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
    segments = split_segments(text, 20)
    assert all(len(s) <= 20 for s in segments)
    assert " ".join(segments).split() == text.split()


def test_a_long_chinese_run_is_cut_between_characters():
    text = "我" * 25
    assert split_segments(text, 10) == ["我" * 10, "我" * 10, "我" * 5]


def test_every_character_of_long_text_survives_splitting():
    text = " ".join(f"Sentence number {i} is here." for i in range(200))
    segments = split_segments(text, 120)
    assert all(len(s) <= 120 for s in segments)
    assert "".join(segments).replace(" ", "") == text.replace(" ", "")
