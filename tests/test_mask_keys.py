"""Which keys MASK_KEYS masks: a secret name as words of the key, in any case or spelling."""

from __future__ import annotations

import json

import pytest

from django_jobs import conf, payloads
from tests.admin_fixtures import url
from tests.factories import DeadLetterFactory, MarkerFactory

DEFAULTS = frozenset(conf.DEFAULTS["MASK_KEYS"])

MASKED = [
    "password",
    "Password",
    "PASSWORD",
    "user_password",
    "userPassword",
    "passwords",
    "db.password",
    "pass_word",  # run together, it is a mask key
    "access_token",
    "accessToken",
    "refresh-token",
    "tokens",
    "oauth2Token",
    "token_id",
    "client_secret",
    "clientSecret",
    "CLIENT_SECRET",
    "my secret",
    "x-api-key",
    "X-API-KEY",
    "XApiKey",
    "APIKey",
    "apiKey",
    "API_KEY",
    "api_keys",
    "x_apikey",
    "HTTP_AUTHORIZATION",
    "Authorization",
    "aws_credentials",
    "ssh_private_key",
    "privateKey",
    "passphrase",
    "set-cookie",
    "session_id",
    "sessionid",
    "ÜberSecret",
]

CLEAR = [
    "user",
    "key",
    "api",
    "api_version",
    "tokenizer",
    "secretary",
    "passwordless",
    "card",
    "private",
    "session",
    "idempotency_key",
    "monkey",
    "",
    "_",
]


@pytest.mark.parametrize("key", MASKED)
def test_a_default_secret_name_among_the_words_masks_the_key(key):
    assert payloads.is_secret_key(key, DEFAULTS)
    assert payloads.mask({key: "s3cr3t", "other": 1}, DEFAULTS) == {
        key: payloads.MASK,
        "other": 1,
    }


@pytest.mark.parametrize("key", CLEAR)
def test_a_key_without_a_secret_word_is_shown(key):
    assert not payloads.is_secret_key(key, DEFAULTS)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("X-Api-Key", ["x", "api", "key"]),
        ("APIKey", ["api", "key"]),
        ("oauth2Token", ["oauth", "2", "token"]),
        ("a.b_c-d e", ["a", "b", "c", "d", "e"]),
        ("ÜberSecret", ["über", "secret"]),
        ("Straße_Passwort", ["strasse", "passwort"]),
        ("--", []),
    ],
)
def test_key_words(key, words):
    assert payloads.key_words(key) == words


def test_a_configured_name_of_several_words_matches_them_in_a_row():
    keys = frozenset(["card_number", "CVV"])
    for key in ("card_number", "cardNumber", "CARD-NUMBERS", "cardnumber", "credit_card_number"):
        assert payloads.is_secret_key(key, keys), key
    for key in ("card", "number", "number_card", "card_x_number", "cvvx"):
        assert not payloads.is_secret_key(key, keys), key
    for key in ("cvv", "card_cvv", "cvv2", "CVVs"):
        assert payloads.is_secret_key(key, keys), key


def test_a_long_hostile_key_is_matched_too():
    assert payloads.is_secret_key("x" * 10_000 + "_token", DEFAULTS)
    assert not payloads.is_secret_key("x_" * 10_000, DEFAULTS)


@pytest.mark.django_db
def test_the_admin_masks_them_in_payloads_and_results(admin_client_):
    secrets = {"access_token": "tok-1", "clientSecret": "cs-2", "x-api-key": "ak-3"}
    letter = DeadLetterFactory(payload=json.dumps({**secrets, "user_password": "pw-4"}))
    page = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert not [s for s in ("tok-1", "cs-2", "ak-3", "pw-4") if s in page]
    marker = MarkerFactory(result={"nested": [secrets]})
    page = admin_client_.get(url("completionmarker_change", marker.pk)).content.decode()
    assert not [s for s in ("tok-1", "cs-2", "ak-3") if s in page]


def test_a_tasks_keyword_arguments_are_masked_its_positional_ones_are_not():
    # What docs/tasks.md says: a Task's payload is {"args": [...], "kwargs": {...}}.
    payload = {"args": [42, "s3cr3t", {"api_token": "t-1"}], "kwargs": {"api_token": "t-2"}}
    assert payloads.mask(payload, DEFAULTS) == {
        "args": [42, "s3cr3t", {"api_token": payloads.MASK}],
        "kwargs": {"api_token": payloads.MASK},
    }
