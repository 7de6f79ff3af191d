"""`chattts-farm batch`'s side of the batch API: a JSON Lines file submitted to a farm's web, its progress
read back, its archive downloaded. The standard library alone: a machine that only submits batches needs
no more than the base install."""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import urljoin
from urllib.request import Request, urlopen

# A form upload must carry a CSRF header when the farm runs with keys off (any value does): it proves
# the request is no cross-site form. A bearer key needs none, and carrying one does no harm.
CSRF_HEADER = {"X-CSRF-Token": "chattts-farm-cli"}
TIMEOUT_S = 300


class BatchRefused(Exception):
    """The farm refused a request: its status and its answer's error, naming the field at fault."""


@dataclass(frozen=True)
class Farm:
    url: str
    api_key: str | None = None

    def submit(self, items: Path, defaults: dict) -> dict:
        """Upload the JSON Lines file ``items`` with the batch's ``defaults``; the batch's status."""
        boundary = uuid.uuid4().hex
        body = b"".join(
            [
                _part(boundary, 'name="defaults"', json.dumps(defaults).encode()),
                _part(
                    boundary,
                    f'name="items"; filename="{items.name}"\r\nContent-Type: application/jsonl',
                    items.read_bytes(),
                ),
                f"--{boundary}--\r\n".encode(),
            ]
        )
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", **CSRF_HEADER}
        return json.load(self._open("/api/batches", "POST", body, headers))

    def status(self, path: str) -> dict:
        return json.load(self._open(path))

    def download(self, path: str, output: Path) -> None:
        """Write the answer to ``path`` to ``output`` as it comes."""
        with self._open(path) as answer, output.open("wb") as written:
            shutil.copyfileobj(answer, written)

    def _open(self, path: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
        headers = {"Accept": "application/json", **(headers or {})}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = Request(urljoin(self.url, path), data=body, headers=headers, method=method)
        try:
            return urlopen(request, timeout=TIMEOUT_S)
        except HTTPError as error:
            try:
                answer = json.load(error)
                message = answer["error"] + (f" ({answer['field']})" if answer.get("field") else "")
            except (ValueError, KeyError, TypeError):
                message = error.reason
            raise BatchRefused(f"{error.code}: {message}") from None
        except URLError as error:
            raise BatchRefused(f"the farm at {self.url} could not be reached: {error.reason}") from None


def _part(boundary: str, disposition: str, content: bytes) -> bytes:
    return f"--{boundary}\r\nContent-Disposition: form-data; {disposition}\r\n\r\n".encode() + content + b"\r\n"
