"""Payload encoding, decoding, fingerprints and masking."""

import pytest

from django_jobs import InvalidPayload, payloads


@pytest.mark.parametrize(
    "value",
    [
        None,
        0,
        -1,
        2**70,
        1.5,
        1e308,
        -0.0,
        "",
        "é ✓ 𝄞",
        "\x00 nul and \n newline",
        [],
        {},
        {"a": [1, {"b": None}]},
    ],
)
def test_round_trip_is_exact(value):
    text = payloads.encode(value)
    back = payloads.decode(text)
    assert back == value
    assert type(back) is type(value)


def test_shared_references_are_fine():
    shared = [1, 2]
    assert payloads.decode(payloads.encode({"a": shared, "b": shared})) == {
        "a": [1, 2],
        "b": [1, 2],
    }


def test_decode_refuses_non_json_constants():
    for text in ("NaN", "Infinity", "-Infinity", "[NaN]"):
        with pytest.raises(ValueError):
            payloads.decode(text)


def test_fingerprint_ignores_key_order_but_not_name_or_values():
    a = payloads.fingerprint("n", payloads.encode({"x": 1, "y": 2}))
    assert a == payloads.fingerprint("n", payloads.encode({"y": 2, "x": 1}))
    assert a != payloads.fingerprint("m", payloads.encode({"x": 1, "y": 2}))
    assert a != payloads.fingerprint("n", payloads.encode({"x": 1, "y": 3}))


def test_mask_hides_configured_keys_at_any_depth():
    value = {"user": 1, "Password": "hunter2", "nested": [{"token": "abc", "ok": True}]}
    assert payloads.mask(value) == {
        "user": 1,
        "Password": payloads.MASK,
        "nested": [{"token": payloads.MASK, "ok": True}],
    }


def test_error_messages_say_what_is_wrong():
    with pytest.raises(InvalidPayload, match="set is not JSON"):
        payloads.encode({"tags": {"a"}})
    with pytest.raises(InvalidPayload, match="NaN or Infinity"):
        payloads.encode(float("nan"))
    with pytest.raises(InvalidPayload, match="keys must be strings"):
        payloads.encode({None: 1})
