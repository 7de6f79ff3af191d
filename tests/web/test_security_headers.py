"""Security headers on every answer, pages and API alike."""


def test_security_headers_are_on_pages_and_api(client):
    for path in ("/", "/api/jobs"):
        headers = client.get(path).headers
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
        assert "default-src 'self'" in headers["Content-Security-Policy"]
