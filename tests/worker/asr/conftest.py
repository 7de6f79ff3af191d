import subprocess

import pytest
import soundfile


@pytest.fixture(scope="session")
def speak(tmp_path_factory):
    """Real speech: Debian's espeak-ng saying a text (American English: pocketsphinx's model is), as
    (float samples, sample rate)."""
    folder = tmp_path_factory.mktemp("speech")

    def spoken(text: str):
        path = folder / f"{abs(hash(text))}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), text], check=True)
        return soundfile.read(path, dtype="float32")

    return spoken
