"""@job, the registry and retry policies."""

from __future__ import annotations

import pytest

from django_jobs import Backoff, InvalidJob, job
from django_jobs.exceptions import HandlerConflict, UnknownJob
from django_jobs.registry import get_handler, lookup, unregister
from tests.testapp import jobs


@pytest.fixture
def cleanup():
    names = []
    yield names
    for name in names:
        unregister(name)


def test_default_name_is_the_dotted_path(cleanup):
    @job
    def handler(payload, ctx):
        return payload

    cleanup.append(handler.name)
    assert handler.name == f"{__name__}.test_default_name_is_the_dotted_path.<locals>.handler"
    assert get_handler(handler.name) is handler
    assert handler({"x": 1}) == {"x": 1}  # still callable directly


def test_options_are_kept(cleanup):
    @job(
        name="tests.opts",
        queue="mail",
        priority=5,
        max_attempts=7,
        backoff=10,
        timeout=3,
        concurrency=2,
        atomic=True,
    )
    def handler(payload, ctx):
        pass

    cleanup.append("tests.opts")
    assert (handler.queue, handler.priority, handler.max_attempts) == ("mail", 5, 7)
    assert handler.backoff == Backoff.fixed(10)
    assert (handler.timeout, handler.concurrency, handler.atomic) == (3.0, 2, True)


@pytest.mark.parametrize(
    "options",
    [
        {"name": "bad name"},
        {"name": ""},
        {"queue": "a b"},
        {"priority": 1000},
        {"max_attempts": 0},
        {"timeout": -1},
        {"concurrency": 0},
        {"backoff": "soon"},
    ],
)
def test_bad_options_are_refused_at_declaration(options):
    with pytest.raises((InvalidJob, ValueError, TypeError)):

        @job(**options)
        def handler(payload, ctx):
            pass


def test_a_second_function_under_one_name_is_an_error(cleanup):
    @job(name="tests.same")
    def first(payload, ctx):
        pass

    cleanup.append("tests.same")
    with pytest.raises(HandlerConflict, match="tests.same"):

        @job(name="tests.same")
        def second(payload, ctx):
            pass

    assert get_handler("tests.same").func is first.func


def test_unknown_names_are_not_imported():
    with pytest.raises(UnknownJob):
        get_handler("os.system")
    assert lookup("subprocess.run") is None


def test_fixed_backoff_with_jitter_stays_in_its_band():
    policy = Backoff.fixed(10, jitter=0.2)
    delays = [policy.delay(n) for n in range(1, 50)]
    assert all(8 <= d <= 10 for d in delays)  # never above the ceiling
    assert len(set(delays)) > 1


def test_exponential_backoff_doubles_up_to_its_ceiling():
    policy = Backoff.exponential(base=1, ceiling=60, jitter=0)
    assert [policy.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert policy.delay(500) == 60  # no overflow on huge attempt numbers


def test_backoff_from_settings_dict():
    assert Backoff.coerce({"kind": "exponential", "base": 2, "ceiling": 8}) == Backoff.exponential(
        2, 8
    )
    with pytest.raises(ValueError):
        Backoff.coerce({"kind": "linear", "base": 1, "ceiling": 2})
    with pytest.raises(ValueError):
        Backoff.exponential(base=10, ceiling=1)


def test_handler_enqueue_is_connected_by_the_app_and_names_the_fix_without_it(cleanup, monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from django_jobs import api, registry

    @job
    def handler(payload, ctx):
        return payload

    cleanup.append(handler.name)
    # The registry sits below the enqueue API: the app's ready() hands it down.
    assert registry._connected().enqueue is api.enqueue
    assert registry._connected().enqueue_on_commit is api.enqueue_on_commit
    monkeypatch.setattr(registry, "_enqueue_api", None)
    with pytest.raises(ImproperlyConfigured, match="add 'django_jobs' to INSTALLED_APPS"):
        handler.enqueue({})


@pytest.mark.parametrize(
    "signature", ["(payload)", "()", "(payload, ctx, extra)", "(*, payload, ctx)"]
)
def test_a_handler_the_worker_cannot_call_is_refused_at_import(signature):
    # Else every job of it fails with a TypeError on each attempt, then dies.
    namespace: dict = {}
    exec(f"def send{signature}: pass", namespace)  # noqa: S102
    with pytest.raises(InvalidJob, match=r"declare it as def send\(payload, ctx\)"):
        job(name="tests.signature_check")(namespace["send"])
    assert lookup("tests.signature_check") is None


@pytest.mark.parametrize(
    "signature", ["(payload, ctx)", "(payload, ctx=None)", "(*args)", "(payload, *rest, **kw)"]
)
def test_handlers_the_worker_can_call_register(signature):
    namespace: dict = {}
    exec(f"def send{signature}: pass", namespace)  # noqa: S102
    try:
        job(name="tests.signature_ok")(namespace["send"])
    finally:
        unregister("tests.signature_ok")


@pytest.mark.parametrize("call", ["delay", "apply_async", "s", "map"])
def test_a_celery_call_on_a_handler_says_what_to_call_instead(call):
    with pytest.raises(AttributeError) as raised:
        getattr(jobs.noop, call)
    message = str(raised.value)
    assert f"'tests.noop' is a django-jobs handler, not a Celery task: it has no .{call}()" in (
        message
    )
    assert "use noop.enqueue_on_commit(payload, delay=..., run_at=...)" in message
    assert "docs/celery.md" in message  # the migration guide
    assert not hasattr(jobs.noop, "no_such_thing")
