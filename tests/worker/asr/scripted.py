"""A scripted recogniser for the listener's tests: it hears what it is told. Its choice (:class:`Scripted`)
is loaded in the listener's spawned process, as the real ones are, so it and all it holds pickle."""

import os
from dataclasses import dataclass

# A segment of this text makes a scripted recogniser's process die, as a crash in Whisper would.
DIES = "the recogniser dies hearing this"


@dataclass
class Held:
    """Holds a recogniser's batches until released, and counts the clips of each batch (a manager's
    event, event and list: shared with the test's process)."""

    holding: object
    release: object
    sizes: object

    def hold(self, clips):
        self.holding.set()
        self.release.wait(timeout=30)
        self.sizes.append(clips)


class Hearing:
    """Hears each clip as the next of ``heard`` in turn (the last again once they run out; "" for none);
    an exception in turn is raised."""

    name = "scripted"

    def __init__(self, heard, held):
        self.heard = list(heard)
        self.held = held

    def warm_up(self, batch):
        pass

    def transcribe_batch(self, clips, sample_rate, expected_texts):
        if DIES in expected_texts:
            os._exit(3)
        if self.held is not None:
            self.held.hold(len(clips))
        texts = []
        for _ in clips:
            text = self.heard.pop(0) if len(self.heard) > 1 else (self.heard or [""])[0]
            if isinstance(text, Exception):
                raise text
            texts.append(text)
        return texts


@dataclass(frozen=True)
class Scripted:
    """A recogniser's choice that loads a :class:`Hearing` of ``heard``; ``fails`` makes loading fail."""

    heard: tuple = ()
    held: Held | None = None
    fails: bool = False

    def hears(self, text):
        return True

    def load(self):
        if self.fails:
            raise OSError("no weights here")
        return Hearing(self.heard, self.held)
