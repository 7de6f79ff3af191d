"""A callback over https goes to the address checked beforehand, yet names and verifies the URL's host:
a real TLS receiver with a certificate for localhost, trusted here through SSL_CERT_FILE."""

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chattts_farm.callbacks import SIGNATURE_HEADER, CallbackPolicy, signature
from cli.local_services import free_port
from worker.callbacks import post_signed

SECRET = "s3cret"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_):
        pass


@pytest.fixture
def tls_receiver(tmp_path, monkeypatch):
    """An https server on 127.0.0.1 whose certificate names localhost only."""
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(certificate)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Handler)
    server.received = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_https_names_and_verifies_the_urls_host_while_connecting_to_its_checked_address(tls_receiver):
    port = tls_receiver.server_address[1]
    policy = CallbackPolicy(SECRET, frozenset({"localhost", "127.0.0.1"}))
    body = b'{"id": "1", "status": "done"}'
    assert post_signed(f"https://localhost:{port}/hook?job=1", body, policy, timeout_s=5) == 204
    [(headers, received)] = tls_receiver.received
    assert received == body and headers["Host"] == f"localhost:{port}"
    assert headers[SIGNATURE_HEADER] == signature(body, SECRET)
    # The same server reached by its address: the certificate does not name it, and that is checked.
    with pytest.raises(ssl.SSLCertVerificationError):
        post_signed(f"https://127.0.0.1:{port}/hook", body, policy, timeout_s=5)
    assert len(tls_receiver.received) == 1


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_time_out():
    # Each header line comes well within the time-out: only the bound on the whole attempt ends it.
    listener = socket.create_server(("127.0.0.1", 0))

    def trickle():
        connection, _ = listener.accept()
        with connection, contextlib.suppress(OSError):
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n")
            while True:
                connection.sendall(b"X-Slow: yes\r\n")
                time.sleep(0.05)

    threading.Thread(target=trickle, daemon=True).start()
    policy = CallbackPolicy(SECRET, frozenset({"127.0.0.1"}))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        post_signed(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", b"{}", policy, timeout_s=0.5)
    assert time.monotonic() - started < 2
    listener.close()
