"""Which callback URLs the farm takes, and the signature a receiver checks (the README's recipe)."""

import hashlib
import hmac

import pytest

from chattts_farm.callbacks import CallbackPolicy, CallbackRefused, signature
from chattts_farm.contract import InvalidRequest, SynthesisRequest
from tests.support import readme_callback_check

POLICY = CallbackPolicy(secret="s3cret", allowed_hosts=frozenset({"127.0.0.1", "hooks.internal"}))

REFUSED_AT_SUBMIT = [
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "gopher://example.com/",
    "http:///no-host",
    "http://user:password@example.com/hook",
    "http://example.com:0/hook",
    "http://example.com/a hook",
    "http://10.0.0.1/hook",
    "http://172.16.5.4/hook",
    "http://192.168.1.10/hook",
    "http://127.0.0.2/hook",
    "http://169.254.169.254/latest/meta-data/",  # the clouds' metadata service
    "http://100.64.0.1/hook",  # carrier-grade NAT
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
    "http://255.255.255.255/hook",
    "http://[::1]/hook",
    "http://[::]/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://[ff02::1]/hook",
    "http://[::ffff:10.0.0.1]/hook",  # IPv4-mapped
    "http://[::ffff:127.0.0.1]/hook",  # IPv4-mapped, though 127.0.0.1 itself is allowed
    "http://[2002:7f00:1::1]/hook",  # 6to4 of 127.0.0.1
    "http://127.1/hook",  # the old forms a resolver reads as 127.0.0.1
    "http://2130706433/hook",
    "http://0x7f.0.0.1/hook",
    "http://127.0.0.1./hook",  # a fully qualified address is the same address
]


@pytest.mark.parametrize("url", REFUSED_AT_SUBMIT)
def test_a_callback_url_that_is_not_http_to_a_public_address_is_refused_naming_callback_url(url):
    with pytest.raises(InvalidRequest) as refused:
        SynthesisRequest.from_arguments({"text": "Hello.", "callback_url": url}, max_text_chars=100, callbacks=POLICY)
    assert refused.value.field == "callback_url"


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hooks/tts?token=abc",
        "http://93.184.216.34:8080/hook",
        "https://[2606:4700::1111]/hook",
        "http://127.0.0.1:9000/hook",  # listed in the allowed hosts
        "https://hooks.internal/hook",  # listed: never resolved at submit, and exempt at delivery
        "http://localhost:9000/hook",  # a name: checked once resolved, at delivery
    ],
)
def test_an_http_url_to_a_public_or_allowed_host_is_taken(url):
    request = SynthesisRequest.from_arguments(
        {"text": "Hello.", "callback_url": url}, max_text_chars=100, callbacks=POLICY
    )
    assert request.callback_url == url
    assert request.as_arguments()["callback_url"] == url


def test_a_farm_without_a_callback_secret_refuses_callbacks_rather_than_send_them_unsigned():
    unsigned = CallbackPolicy(secret="", allowed_hosts=frozenset())
    with pytest.raises(InvalidRequest, match="CHATTTS_FARM_CALLBACK_SECRET") as refused:
        SynthesisRequest.from_arguments(
            {"text": "Hello.", "callback_url": "https://example.com/hook"}, max_text_chars=100, callbacks=unsigned
        )
    assert refused.value.field == "callback_url"


def test_a_request_without_a_callback_has_no_callback_argument():
    request = SynthesisRequest.from_arguments({"text": "Hello."}, max_text_chars=100)
    assert request.callback_url is None and "callback_url" not in request.as_arguments()


def test_a_resolved_private_address_is_refused_unless_the_host_is_allowed():
    import ipaddress

    with pytest.raises(CallbackRefused, match=r"localhost \(resolved to 127\.0\.0\.1\)"):
        POLICY.check_host("localhost", ipaddress.ip_address("127.0.0.1"))
    POLICY.check_host("hooks.internal", ipaddress.ip_address("10.1.2.3"))  # allowed: no refusal


def test_the_signature_is_the_hex_hmac_sha256_of_the_raw_body_and_the_readme_recipe_checks_it():
    body = b'{"id": "42", "status": "done"}'
    signed = signature(body, "s3cret")
    assert signed == "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    is_from_the_farm = readme_callback_check()
    assert is_from_the_farm(body, signed, "s3cret")
    assert not is_from_the_farm(body + b" ", signed, "s3cret")
    assert not is_from_the_farm(body, signed, "another secret")
