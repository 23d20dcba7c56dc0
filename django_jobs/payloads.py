"""JSON payloads: strict encoding at enqueue, decoding in the worker, fingerprints, masking.

Payloads are stored as JSON text, not jsonb, so that what a handler receives is
exactly what was enqueued (jsonb reorders keys and rewrites numbers) and so that
a row whose text does not decode can be told apart and dead-lettered.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache, lru_cache
from typing import Any, NamedTuple

from django.core.signals import setting_changed
from django.db.models import Model
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_jobs import conf, encryption, limits
from django_jobs.exceptions import InvalidPayload, UnstorableResult

MASK = "********"
# How an encrypted value ({"$encrypted": token}, encryption.py) shows, its token hidden.
ENCRYPTED = "******** (encrypted)"


def _sealed(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and encryption.SEALED in value


class _StrictEncoder(json.JSONEncoder):
    """Refuse what json would silently turn into something else."""

    def default(self, o: Any) -> Any:
        refuse_model_instance(o)
        raise TypeError(
            f"{type(o).__name__} is not JSON: pass JSON types (dict, list, str, int, "
            "float, bool, None), or set DJANGO_JOBS['JSON_ENCODER']"
        )


def refuse_model_instance(o: Any) -> None:
    """Raise TypeError, saying to pass its primary key, when o is a model instance."""
    if isinstance(o, Model):
        raise TypeError(
            f"{type(o).__name__} is a model instance: pass its primary key instead "
            f'(e.g. {{"{type(o).__name__.lower()}_id": obj.pk}}) and load it in the handler'
        )


@cache
def encoder() -> json.JSONEncoder:
    """Return the payload encoder, built once from the JSON_ENCODER setting."""
    path = conf.get("JSON_ENCODER")
    base = import_string(path) if isinstance(path, str) else (path or _StrictEncoder)
    return base(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@receiver(setting_changed)
def _clear_encoder(*, setting: str, **kwargs: Any) -> None:
    if setting == "DJANGO_JOBS":
        encoder.cache_clear()


_NESTED = (dict, list, tuple)


def _check_keys(value: Any) -> None:
    # json.dumps turns {1: "a"} into {"1": "a"}: the handler would not get what was sent.
    # Called after json encoded the value, so it holds no cycle. One level at a time,
    # to refuse what nests deeper than the admin shows (limits.MAX_NESTING).
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > limits.MAX_NESTING:
            raise InvalidPayload(_too_deep("payload"))
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise InvalidPayload(
                            f"payload dict keys must be strings, got {type(key).__name__} {key!r}"
                        )
                    if isinstance(child, _NESTED):
                        below.append(child)
            else:
                below.extend(child for child in item if isinstance(child, _NESTED))
        level = below


def _too_deep(what: str) -> str:
    return (
        f"{what} nests lists and objects more than {limits.MAX_NESTING} levels deep "
        "(the limit, limits.MAX_NESTING)"
    )


def nesting(value: Any, limit: int = limits.MAX_NESTING) -> int:
    """Return how deep lists and dicts nest in a JSON value (0 for a scalar), at most limit + 1.

    One level at a time, without recursion: any depth is measured, and counting
    stops past limit (so that a cycle, which JSON cannot hold, ends too).
    """
    level = [value] if isinstance(value, _NESTED) else []
    depth = 0
    while level and depth <= limit:
        depth += 1
        below: list[Any] = []
        for item in level:
            children = item.values() if isinstance(item, dict) else item
            below.extend(child for child in children if isinstance(child, _NESTED))
        level = below
    return depth


def encode(payload: Any) -> str:
    """Return payload as JSON text, or raise InvalidPayload naming what is wrong."""
    payload_encoder = encoder()
    try:
        text = payload_encoder.encode(payload)
    except RecursionError as exc:
        raise InvalidPayload(_too_deep("payload")) from exc
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "Out of range float" in str(exc):
            raise InvalidPayload("payload holds NaN or Infinity, which JSON cannot carry") from exc
        if isinstance(exc, ValueError) and "Circular reference" in str(exc):
            raise InvalidPayload("payload holds a circular reference") from exc
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from exc
    if isinstance(payload, _NESTED):
        _check_keys(payload)
    if type(payload_encoder) is not _StrictEncoder:  # a custom encoder may nest what it writes
        try:
            deep = nesting(decode(text)) > limits.MAX_NESTING
        except ValueError as exc:
            raise InvalidPayload(f"the payload's JSON does not decode: {exc}") from exc
        if deep:
            raise InvalidPayload(_too_deep("payload"))
    limit = conf.get("MAX_PAYLOAD_BYTES")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidPayload("payload holds a lone surrogate, which UTF-8 cannot carry") from exc
    if "\x00" in text:
        # Strings are escaped by json; this only trips on a custom encoder's raw output.
        raise InvalidPayload("payload JSON holds a NUL character")
    if limit is not None and size > limit:
        raise InvalidPayload(
            f"payload is {size} bytes of JSON, over the {limit}-byte limit "
            "(DJANGO_JOBS['MAX_PAYLOAD_BYTES']); store large data elsewhere and pass its id"
        )
    return text


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


_decoder = json.JSONDecoder(parse_constant=_refuse_constant)


def decode(text: str) -> Any:
    """Return the payload stored as text; raise ValueError when it is not JSON."""
    try:
        return _decoder.decode(text)
    except RecursionError:
        raise ValueError("payload JSON is nested too deeply") from None


def fingerprint(name: str, text: str) -> str:
    """Return a digest of a job's name and payload, independent of dict key order."""
    canonical = json.dumps(
        json.loads(text), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(f"{name}\x00{canonical}".encode()).hexdigest()


# A JSON \u0000 escape not itself escaped ("\\u0000" is a backslash and "u0000").
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# What PostgreSQL cannot store in text or jsonb: NUL, and surrogates (UTF-8 cannot encode them).
_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


def encode_result(value: Any) -> str | None:
    """Return a handler's return value as JSON text (None stays None).

    Raise UnstorableResult for what the database cannot hold: values that are
    not JSON, NaN or infinities, lone surrogates, NUL characters (jsonb refuses
    them; SQLite is held to the same rule so that both behave alike).
    """
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, cls=type(encoder()))
    except RecursionError as exc:
        raise UnstorableResult(_too_deep("the handler returned a value that")) from exc
    except Exception as exc:  # noqa: BLE001 - whatever the value's own methods raise
        raise UnstorableResult(
            f"the handler returned a value that is not JSON: {safe_str(exc)}"
        ) from exc
    # What the marker stores, as the admin will read it back (a custom encoder may nest).
    try:
        shown = value if type(encoder()) is _StrictEncoder else decode(text)
    except ValueError as exc:
        raise UnstorableResult(f"the handler's result does not decode: {exc}") from exc
    if isinstance(shown, _NESTED) and nesting(shown) > limits.MAX_NESTING:
        raise UnstorableResult(_too_deep("the handler returned a value that"))
    # Cheap checks on the encoded text, not a walk of the value: ASCII text holds no
    # surrogate, and json escapes a NUL in a string as \u0000.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UnstorableResult(
                "the handler returned a string with a lone surrogate, which UTF-8 cannot carry"
            ) from None
    if ("\\u0000" in text and _ESCAPED_NUL.search(text)) or "\x00" in text:
        raise UnstorableResult(
            "the handler returned a string with a NUL character (\\x00), which the "
            "database cannot store"
        )
    return text


def safe_str(value: Any) -> str:
    """Return str(value), or a placeholder when its __str__ raises."""
    try:
        text = str(value)
        return text if type(text) is str else str.__str__(text)  # a str subclass: plain text
    except BaseException:  # noqa: BLE001 - a hostile __str__ may raise anything
        try:
            return f"<{type(value).__qualname__} object: str() failed>"
        except BaseException:  # noqa: BLE001
            return "<str() failed>"


def storable_text(value: Any, limit: int | None = None) -> str:
    """Return value as text any database stores: NUL and surrogates replaced, cut at limit."""
    text = value if type(value) is str else safe_str(value)
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… [{len(text) - limit} more characters cut]"
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE_CHARS.sub("\ufffd", text)


# A key's words: runs of letters or digits, split where the case changes as in camelCase
# (accessToken, APIKey) and between letters and digits (oauth2token); anything else
# (_ - . spaces ...) separates. _ASCII_WORD does it in one pass for the usual keys.
_ASCII_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_NOT_ALPHANUMERIC = re.compile(r"[\W_]+")
_WORD_BOUNDARY = re.compile(
    r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[^\W\d_])(?=\d)|(?<=\d)(?=[^\W\d_])"
)


def key_words(key: str) -> list[str]:
    """Split a payload key into its words, case-folded: "X-Api-Key" -> ["x", "api", "key"]."""
    if key.isascii():
        return [word.lower() for word in _ASCII_WORD.findall(key)]
    return [
        word.casefold()
        for part in _NOT_ALPHANUMERIC.split(key)
        for word in _WORD_BOUNDARY.split(part)
        if word
    ]


class _MaskWords(NamedTuple):
    joined: frozenset[str]  # each mask key's words run together, "apikey"
    single: frozenset[str]  # the one-word mask keys and their plurals in -s
    longer: dict[str, list[list[str]]]  # the longer ones' words, by their first word


@lru_cache(maxsize=16)
def _mask_words(keys: frozenset[str]) -> _MaskWords:
    words = [key_words(key) or [key.casefold()] for key in keys]
    longer: dict[str, list[list[str]]] = {}
    for sequence in words:
        if len(sequence) > 1:
            longer.setdefault(sequence[0], []).append(sequence)
    return _MaskWords(
        joined=frozenset("".join(w) for w in words),
        single=frozenset(w[0] + plural for w in words if len(w) == 1 for plural in ("", "s")),
        longer=longer,
    )


def is_secret_key(key: str, keys: frozenset[str]) -> bool:
    """Say whether a payload key names a secret of MASK_KEYS (see docs/admin.md, Secrets).

    It does when the words of a mask key come in it one after the other ("client_secret",
    "x-api-key", "accessToken"), or when the key's words run together are a mask key's
    words run together ("API_KEY", "apiKey" for "apikey"); the last word may take an -s
    ("accessTokens", "APIKEYS").
    """
    if len(key) <= 100:  # payloads repeat their keys (a list of records): ask once
        return _is_secret_short(key, keys)
    return _is_secret(key, keys)


@lru_cache(maxsize=4096)
def _is_secret_short(key: str, keys: frozenset[str]) -> bool:
    return _is_secret(key, keys)


def _is_secret(key: str, keys: frozenset[str]) -> bool:
    mask_words = _mask_words(keys)
    words = key_words(key)
    joined = "".join(words)
    if joined in mask_words.joined or (joined[-1:] == "s" and joined[:-1] in mask_words.joined):
        return True
    for i, word in enumerate(words):
        if word in mask_words.single:
            return True
        for sequence in mask_words.longer.get(word, ()):
            n = len(sequence)
            last = words[i + n - 1] if i + n <= len(words) else None
            if words[i : i + n - 1] == sequence[:-1] and last in (sequence[-1], sequence[-1] + "s"):
                return True
    return False


def mask(value: Any, keys: frozenset[str] | None = None) -> Any:
    """Return value with the values of the keys that name secrets (is_secret_key) masked.

    A copy made without recursion: a value nested any depth is masked all through.
    """
    if keys is None:
        keys = frozenset(conf.get("MASK_KEYS") or ())
    if _sealed(value):
        return ENCRYPTED
    if not isinstance(value, dict | list):
        return value
    masked: Any = {} if isinstance(value, dict) else []
    stack = [(value, masked)]  # (a dict or list to copy, its copy, still empty)
    while stack:
        source, copy = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for k, v in items:
            if isinstance(source, dict) and isinstance(k, str) and is_secret_key(k, keys):
                v = MASK
            elif _sealed(v):
                v = ENCRYPTED
            elif isinstance(v, dict | list):
                child: Any = {} if isinstance(v, dict) else []
                stack.append((v, child))
                v = child
            if isinstance(copy, dict):
                copy[k] = v
            else:
                copy.append(v)
    return masked
