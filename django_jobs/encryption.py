"""Encrypted payloads and results: @job(encrypt=True) or encrypt=("card", "ssn").

Fernet (cryptography's AES-128-CBC with HMAC-SHA256, authenticated, a timestamp
in each token), through MultiFernet over DJANGO_JOBS["ENCRYPTION_KEYS"]: the
first key encrypts, every key decrypts, so keys rotate. At enqueue the payload
(all of it, or the values of some top-level keys of a dict) is replaced by
{"$encrypted": "<token>"}; the worker decrypts it just before the handler runs; a
result is stored encrypted the same way. docs/handlers.md#encrypted-payloads.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from django.core.signals import setting_changed
from django.dispatch import receiver

from django_jobs import conf, limits
from django_jobs.exceptions import InvalidJob

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

# The one key of the JSON object that stands for an encrypted value.
SEALED = "$encrypted"
# What encrypt= says: None (nothing), True (the whole payload) or the keys encrypted.
Spec = Literal[True] | tuple[str, ...] | None


class Undecryptable(ValueError):
    """A stored payload or value cannot be decrypted with any of ENCRYPTION_KEYS."""


class Unavailable(RuntimeError):
    """Encryption is asked for, but cryptography or ENCRYPTION_KEYS is missing or invalid."""


def check_encrypt(value: object) -> Spec:
    """Return encrypt=value as a Spec (False: None), else raise InvalidJob."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, list | tuple | set | frozenset) and value:
        keys = tuple(sorted(value, key=str))
        if all(isinstance(k, str) and k and k != SEALED for k in keys):
            return keys
    raise InvalidJob(
        "encrypt must be True (the whole payload) or a non-empty tuple of top-level "
        f"payload keys whose values are encrypted, not {limits.shown(value)}"
    )


def problems(keys: object) -> list[str]:
    """Return what is wrong with ENCRYPTION_KEYS (a list of Fernet keys), or nothing."""
    name = "DJANGO_JOBS['ENCRYPTION_KEYS']"
    if not isinstance(keys, list | tuple) or not keys:
        return [f"{name} must be a non-empty list of Fernet keys, not a {type(keys).__name__}"]
    found = []
    for i, key in enumerate(keys):
        try:
            raw = base64.urlsafe_b64decode(key.encode() if isinstance(key, str) else key)
        except (TypeError, ValueError, binascii.Error, AttributeError):
            raw = b""
        if len(raw) != 32:
            found.append(
                f"{name}[{i}] is not a Fernet key (32 bytes in url-safe base64, as "
                "Fernet.generate_key() makes)"
            )
    return found


def installed() -> bool:
    """Whether cryptography can be imported."""
    try:
        import cryptography.fernet  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _fernet() -> MultiFernet:
    keys = conf.get("ENCRYPTION_KEYS")
    if not installed():
        raise Unavailable("encrypted jobs need cryptography: pip install 'django-jobs[encryption]'")
    wrong = problems(keys)
    if wrong:
        raise Unavailable(f"{wrong[0]} (django_jobs.E402, E403)")
    from cryptography.fernet import Fernet, MultiFernet

    return MultiFernet([Fernet(key) for key in keys])


@receiver(setting_changed)
def _clear(*, setting: str, **kwargs: Any) -> None:
    if setting == "DJANGO_JOBS":
        _fernet.cache_clear()


def _seal(value: Any) -> dict[str, str]:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return {SEALED: _fernet().encrypt(text.encode()).decode()}


def _unseal(value: Any, what: str) -> Any:
    from cryptography.fernet import InvalidToken

    token = value.get(SEALED) if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(token, str):
        raise Undecryptable(f"{what} is not encrypted ({{'{SEALED}': token}} expected)")
    try:
        return json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        raise Undecryptable(
            f"{what} cannot be decrypted with any of DJANGO_JOBS['ENCRYPTION_KEYS']: "
            "its key was removed, or the stored value was altered"
        ) from None


def seal(payload: Any, spec: Spec) -> Any:
    """Return payload with what spec names encrypted (at enqueue, after validate)."""
    if spec is None:
        return payload
    if spec is True:
        return _seal(payload)
    if not isinstance(payload, dict):
        raise InvalidJob(
            f"encrypt={spec!r} encrypts keys of a dict payload, not of a {type(payload).__name__}"
        )
    return {k: _seal(v) if k in spec else v for k, v in payload.items()}


def unseal(payload: Any, spec: Spec) -> Any:
    """Return payload decrypted as spec says (in the worker), else raise Undecryptable."""
    if spec is None:
        return payload
    if spec is True:
        return _unseal(payload, "the payload")
    if not isinstance(payload, dict):
        raise Undecryptable(f"the payload is a {type(payload).__name__}, not a dict")
    return {k: _unseal(v, f"payload[{k!r}]") if k in spec else v for k, v in payload.items()}


def seal_result(text: str | None) -> str | None:
    """Return a handler's stored result (JSON text) encrypted; None stays None."""
    return None if text is None else json.dumps(_seal(json.loads(text)))


def unseal_result(stored: Any) -> Any:
    """Return an encrypted stored result (JSON text, or as the marker's field reads it)
    decrypted; None stays None."""
    if isinstance(stored, str | bytes):
        stored = json.loads(stored)
    return None if stored is None else _unseal(stored, "the result")


def blind(fingerprint: str) -> str:
    """Return a fingerprint keyed with the encrypting key: a plain digest would let a
    reader guess short secrets (an SSN) by hashing candidates."""
    _fernet()  # raises Unavailable, saying why, when the keys are missing or invalid
    return _keyed(conf.get("ENCRYPTION_KEYS")[0], fingerprint)


def blind_all(fingerprint: str) -> tuple[str, ...]:
    """Return the fingerprint as blind() made it under each of ENCRYPTION_KEYS: a job
    enqueued before a rotation holds its key with one of these."""
    _fernet()
    return tuple(_keyed(key, fingerprint) for key in conf.get("ENCRYPTION_KEYS"))


def _keyed(key: str | bytes, fingerprint: str) -> str:
    raw = base64.urlsafe_b64decode(key.encode() if isinstance(key, str) else key)
    return hmac.new(raw, fingerprint.encode(), hashlib.sha256).hexdigest()


# What an encrypted value's text becomes in a stored error or traceback.
HIDDEN = "********"
# Shorter texts (a 1, a "no") are not hidden: they would blank unrelated words.
_HIDE_FROM = 4


def redact(error: dict[str, Any], payload: Any, spec: Spec) -> dict[str, Any]:
    """Return an attempt's error entry with the text of the payload's encrypted values
    (each string, each number, of at least 4 characters) hidden in its message and
    traceback: a handler's `raise ValueError(f"card {payload['card']} refused")`
    would otherwise store the plaintext beside the sealed payload."""
    if spec is None:
        return error
    if spec is True or not isinstance(payload, dict):
        parts = [payload]
    else:
        parts = [payload[k] for k in spec if k in payload]
    found: set[str] = set()
    for part in parts:
        _texts(part, found)
    secrets = sorted((s for s in found if len(s) >= _HIDE_FROM), key=len, reverse=True)
    if not secrets:
        return error
    hidden = dict(error)
    for field in ("message", "traceback"):
        text = hidden.get(field)
        if isinstance(text, str):
            for secret in secrets:
                text = text.replace(secret, HIDDEN)
            hidden[field] = text
    return hidden


def _texts(value: Any, found: set[str]) -> None:
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        found.add(str(value))
    elif isinstance(value, dict):
        for item in value.values():
            _texts(item, found)
    elif isinstance(value, list):
        for item in value:
            _texts(item, found)
