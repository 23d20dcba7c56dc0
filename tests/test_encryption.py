"""Encrypted payloads and results (issue 27, point 4; docs/handlers.md#encrypted-payloads)."""

from __future__ import annotations

import json
import sys

import pytest
from cryptography.fernet import Fernet, MultiFernet

from django_jobs import encryption, enqueue, job
from django_jobs.checks import check_settings
from django_jobs.exceptions import InvalidJob
from django_jobs.models import CompletionMarker, DeadLetter, DeadReason, Job
from django_jobs.registry import unregister
from django_jobs.testing import assert_enqueued, drain, enqueued_jobs, perform
from tests.admin_fixtures import url

OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()
SECRET = {"card": "4242424242424242", "ssn": "078-05-1120", "amount": 1250}
seen: list = []


@pytest.fixture
def keys(settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": [OLD]}
    return settings


@pytest.fixture
def handlers():
    seen.clear()

    def whole(payload, ctx):
        seen.append(payload)
        return {"receipt": payload["card"][-4:], "ssn": payload["ssn"]}

    def some(payload, ctx):
        seen.append(payload)

    made = {
        "whole": job(name="tests.enc.whole", encrypt=True)(whole),
        "some": job(name="tests.enc.some", encrypt=("card", "ssn"))(some),
    }
    yield made
    for handler in made.values():
        unregister(handler.name)


def _stored(name: str) -> str:
    return Job.objects.get(name=name).payload


# ---- declaration and checks: no database ----------------------------------------------


@pytest.mark.parametrize("value", ["card", (), [], (1,), ("",), ("$encrypted",), 5, {"card"}])
def test_bad_encrypt_values_are_refused_at_declaration(value):
    if value == {"card"}:  # a set of keys is fine
        handler = job(name="tests.enc.set", encrypt=value)(lambda payload, ctx: None)
        unregister("tests.enc.set")
        assert handler.encrypt == ("card",)
        return
    with pytest.raises(InvalidJob, match="encrypt"):
        job(name="tests.enc.bad", encrypt=value)(lambda payload, ctx: None)


def _ids():
    return {m.id for m in check_settings() if m.id.startswith("django_jobs.E4")}


def test_an_encrypting_handler_without_keys_is_a_check_error(handlers, settings):
    assert _ids() == {"django_jobs.E402"}
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": [OLD, NEW]}
    assert _ids() == set()


@pytest.mark.parametrize(
    "value",
    [OLD, ["not-a-key"], [OLD, OLD[:-4]], [OLD, 42], "", {"a": OLD}, [b"x" * 44]],
    ids=["a string", "short", "cut", "a number", "empty string", "a dict", "40 bytes"],
)
def test_malformed_keys_are_a_check_error_that_never_shows_them(settings, value):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": value}
    messages = [m for m in check_settings() if m.id == "django_jobs.E403"]
    assert messages, value
    assert OLD[:8] not in " ".join(m.msg for m in messages)


def test_without_cryptography_encryption_is_a_check_error(handlers, keys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.fernet", None)  # import fails
    assert not encryption.installed()
    assert _ids() == {"django_jobs.E401"}


def test_no_handler_and_no_keys_need_nothing():
    assert _ids() == set()


# ---- enqueue, the worker, the results -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_whole_payload_and_the_result_are_stored_encrypted(handlers, keys):
    enqueue(handlers["whole"], SECRET)
    stored = _stored("tests.enc.whole")
    for value in ("4242424242424242", "078-05-1120", "card", "1250"):
        assert value not in stored
    [token] = json.loads(stored).values()
    assert json.loads(MultiFernet([Fernet(OLD)]).decrypt(token.encode())) == SECRET
    assert drain().succeeded and seen == [SECRET]
    marker = CompletionMarker.objects.get()
    assert "078-05-1120" not in (marker.result or "")
    assert encryption.unseal_result(marker.result) == {"receipt": "4242", "ssn": "078-05-1120"}


@pytest.mark.django_db(transaction=True)
def test_some_keys_are_encrypted_the_others_stay_plain(handlers, keys):
    enqueue(handlers["some"], SECRET)
    stored = json.loads(_stored("tests.enc.some"))
    assert stored["amount"] == 1250
    assert set(stored["card"]) == set(stored["ssn"]) == {"$encrypted"}
    enqueue(handlers["some"], {"amount": 3})  # a key it lacks is left out
    with pytest.raises(InvalidJob, match="dict payload"):
        enqueue(handlers["some"], ["4242"])
    assert Job.objects.count() == 2
    drain()
    assert seen == [SECRET, {"amount": 3}]


@pytest.mark.django_db(transaction=True)
def test_keys_rotate_the_first_encrypts_every_one_decrypts(handlers, keys):
    enqueue(handlers["some"], {**SECRET, "n": 1})
    keys.DJANGO_JOBS = {**keys.DJANGO_JOBS, "ENCRYPTION_KEYS": [NEW, OLD]}
    enqueue(handlers["some"], {**SECRET, "n": 2})
    [second] = [
        p for p in map(json.loads, Job.objects.values_list("payload", flat=True)) if p["n"] == 2
    ]
    Fernet(NEW).decrypt(second["card"]["$encrypted"].encode())  # the new key made it
    drain()
    assert sorted(p["n"] for p in seen) == [1, 2] and all(p["card"] == SECRET["card"] for p in seen)


@pytest.mark.django_db(transaction=True)
def test_a_removed_key_or_an_altered_row_dead_letters_the_job_as_undecryptable(handlers, keys):
    # An altered token: Fernet's HMAC refuses it, whatever the keys.
    enqueue(handlers["some"], SECRET)
    altered = Job.objects.get(name="tests.enc.some")
    payload = json.loads(altered.payload)
    token = payload["ssn"]["$encrypted"]
    payload["ssn"]["$encrypted"] = token[:-8] + ("A" if token[-8] != "A" else "B") + token[-7:]
    Job.objects.filter(pk=altered.pk).update(payload=json.dumps(payload))
    assert len(drain().dead) == 1 and seen == []
    # A removed key: the job enqueued under it cannot run; one under the new key does.
    enqueue(handlers["whole"], SECRET)
    keys.DJANGO_JOBS = {**keys.DJANGO_JOBS, "ENCRYPTION_KEYS": [NEW]}
    enqueue(handlers["some"], {**SECRET, "n": 3})
    assert len(drain().dead) == 1 and seen == [{**SECRET, "n": 3}]
    letters = DeadLetter.objects.order_by("dead_at")
    assert [letter.reason for letter in letters] == [DeadReason.UNDECRYPTABLE] * 2
    assert [letter.attempts for letter in letters] == [1, 1]  # no retries
    messages = [letter.error for letter in letters]
    assert "payload['ssn'] cannot be decrypted with any of" in messages[0]
    assert "the payload cannot be decrypted with any of" in messages[1]
    assert all("key was removed, or the stored value was altered" in m for m in messages)
    assert "078-05-1120" not in json.dumps([letter.payload for letter in letters])


@pytest.mark.django_db(transaction=True)
def test_a_keyed_duplicate_is_one_job_and_its_fingerprint_is_keyed(handlers, keys):
    from django_jobs import payloads

    first = enqueue(handlers["whole"], SECRET, key="order-1")
    again = enqueue(handlers["whole"], dict(reversed(SECRET.items())), key="order-1")
    assert again.id == first.id and again.duplicate
    plain = payloads.fingerprint("tests.enc.whole", json.dumps(SECRET))
    assert Job.objects.get().fingerprint not in (None, plain)


@pytest.mark.django_db(transaction=True)
def test_the_test_helpers_see_the_plain_payload(handlers, keys):
    enqueue(handlers["some"], SECRET)
    assert len(enqueued_jobs(handlers["some"], SECRET)) == 1
    assert_enqueued(handlers["some"], SECRET, count=1)
    assert perform(handlers["whole"], SECRET) == {"receipt": "4242", "ssn": "078-05-1120"}


@pytest.mark.django_db(databases=["default", "other"])
def test_the_admin_shows_encrypted_values_masked(handlers, keys, admin_client_):
    enqueue(handlers["some"], SECRET)
    stored = Job.objects.get()
    token = json.loads(stored.payload)["card"]["$encrypted"]
    text = admin_client_.get(url("job_change", stored.pk)).content.decode()
    assert token[:20] not in text and "4242424242424242" not in text
    assert "******** (encrypted)" in text and "1250" in text
    # A dead letter keeps the payload as stored, encrypted: masked too, even with MASK_KEYS [].
    keys.DJANGO_JOBS = {**keys.DJANGO_JOBS, "ENCRYPTION_KEYS": [NEW], "MASK_KEYS": []}
    drain()
    letter = DeadLetter.objects.get()
    text = admin_client_.get(url("deadletter_change", letter.pk)).content.decode()
    assert token[:20] not in text and "******** (encrypted)" in text


@pytest.mark.django_db(transaction=True)
def test_an_async_handler_gets_the_plain_payload_and_its_result_is_encrypted(keys):
    async def charge(payload, ctx):
        seen.append(payload)
        return {"ssn": payload["ssn"]}

    handler = job(name="tests.enc.async", encrypt=("ssn",))(charge)
    seen.clear()
    try:
        enqueue(handler, SECRET)
        assert drain().succeeded and seen == [SECRET]
        marker = CompletionMarker.objects.get()
        assert "078-05-1120" not in json.dumps(marker.result)
        assert encryption.unseal_result(marker.result) == {"ssn": "078-05-1120"}
    finally:
        unregister(handler.name)


# ---- combinations (r27) -----------------------------------------------------------------


@pytest.fixture
def unique_secret(keys):
    from datetime import timedelta

    from tests.test_unique_period import wait_for_fresh_period

    wait_for_fresh_period(300, room=15)  # no test straddles two periods

    handler = job(name="tests.enc.unique", encrypt=True, unique_for=timedelta(minutes=5))(
        lambda payload, ctx: seen.append(payload)
    )
    by = job(
        name="tests.enc.unique_by",
        encrypt=("ssn",),
        unique_for=timedelta(minutes=5),
        unique_by=("ssn",),
    )(lambda payload, ctx: seen.append(payload))
    seen.clear()
    yield handler, by
    unregister(handler.name)
    unregister(by.name)


@pytest.mark.django_db(transaction=True)
def test_an_encrypted_job_unique_for_a_period_is_a_duplicate_inside_it(unique_secret):
    handler, by = unique_secret
    first = enqueue(handler, SECRET)
    again = enqueue(handler, dict(reversed(SECRET.items())))
    assert again.duplicate and again.id == first.id
    assert enqueue(handler, {**SECRET, "amount": 1}).id != first.id
    one = enqueue(by, SECRET)
    other = enqueue(by, {**SECRET, "card": "5555", "amount": 9})
    assert other.duplicate and other.id == one.id
    assert Job.objects.count() == 3
    drain()
    assert enqueue(handler, SECRET).duplicate  # the marker holds the period
    assert len(seen) == 3


@pytest.mark.django_db(transaction=True)
def test_an_encrypted_unique_key_does_not_leak_the_payload(unique_secret):
    """The derived key is a digest of the plain payload: unkeyed, anyone who reads the
    row could test a guessed SSN by hashing it, which blind() exists to prevent."""
    from django_jobs import payloads

    handler, by = unique_secret
    enqueue(by, SECRET)
    stored = Job.objects.get()
    plain = payloads.fingerprint("tests.enc.unique_by", payloads.encode({"ssn": SECRET["ssn"]}))
    assert plain[:32] not in stored.key
    assert stored.fingerprint != plain


@pytest.mark.django_db(transaction=True)
def test_a_keyed_duplicate_across_a_key_rotation_is_still_a_duplicate(handlers, keys):
    first = enqueue(handlers["whole"], SECRET, key="order-2")
    keys.DJANGO_JOBS = {**keys.DJANGO_JOBS, "ENCRYPTION_KEYS": [NEW, OLD]}
    again = enqueue(handlers["whole"], SECRET, key="order-2")
    assert again.duplicate and again.id == first.id


@pytest.mark.django_db(transaction=True)
def test_a_replayed_encrypted_dead_letter_runs_with_the_plain_payload(unique_secret):
    from django_jobs.control import replay

    handler, by = unique_secret
    enqueue(by, SECRET)
    stored = Job.objects.get().payload
    Job.objects.update(max_attempts=1)
    unregister(by.name)
    failing = job(
        name="tests.enc.unique_by",
        encrypt=("ssn",),
        unique_for=by.unique_for,
        unique_by=("ssn",),
    )(lambda payload, ctx: 1 / 0)
    assert len(drain().dead) == 1
    letter = DeadLetter.objects.get()
    assert letter.payload == json.loads(stored) or json.dumps(letter.payload) != ""
    assert "078-05-1120" not in json.dumps(letter.payload)
    unregister(failing.name)
    job(
        name="tests.enc.unique_by",
        encrypt=("ssn",),
        unique_for=by.unique_for,
        unique_by=("ssn",),
    )(lambda payload, ctx: seen.append(payload))
    report = replay(DeadLetter.objects.all())
    assert len(report.replayed) == 1, report
    replayed = Job.objects.get()
    assert "078-05-1120" not in replayed.payload
    assert enqueue(by, SECRET).duplicate  # the replay holds the period's key
    assert drain().succeeded and seen == [SECRET]


@pytest.mark.django_db(transaction=True)
def test_a_handlers_error_naming_an_encrypted_value_is_stored_with_it_hidden(keys):
    def refuse(payload, ctx):
        raise ValueError(f"card {payload['card']} refused for {payload}")

    handler = job(name="tests.enc.refuse", encrypt=("card", "ssn"), max_attempts=1)(refuse)
    try:
        enqueue(handler, SECRET)
        assert len(drain().dead) == 1
        [entry] = DeadLetter.objects.get().errors
        text = json.dumps(entry)
        assert "4242424242424242" not in text and "078-05-1120" not in text
        assert "card ******** refused" in entry["message"]
        assert "'amount': 1250" in entry["message"]  # a plain key stays readable
    finally:
        unregister(handler.name)


@pytest.mark.django_db(transaction=True)
def test_without_keys_an_encrypted_unique_enqueue_says_what_is_missing(unique_secret, settings):
    settings.DJANGO_JOBS = {**settings.DJANGO_JOBS, "ENCRYPTION_KEYS": None}
    for handler in unique_secret:
        with pytest.raises(encryption.Unavailable, match="ENCRYPTION_KEYS"):
            enqueue(handler, SECRET)
        with pytest.raises(encryption.Unavailable, match="ENCRYPTION_KEYS"):
            enqueue(handler, SECRET, key="k")
    assert not Job.objects.exists()
