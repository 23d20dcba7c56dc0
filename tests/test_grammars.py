"""The small grammars: rate limits, queue and job names, partition values.

Each accepts exactly what the docs show (docs/flow-control.md, docs/configuration.md)
and refuses the rest with an error naming the accepted form. Property-based: the
generated texts mix the accepted forms with their near misses (spaces, fullwidth
and other Unicode digits, other scripts, NBSP, zero-width and control characters).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_jobs import enqueue, flow, job, limits
from django_jobs.exceptions import InvalidJob
from django_jobs.models import Job
from django_jobs.registry import unregister

# ---- rate_limit ---------------------------------------------------------------------------

RATE = re.compile(r"(0|[1-9][0-9]*)/([smh])")  # docs/flow-control.md's "N/s" | "N/m" | "N/h"
NEAR_RATES = st.builds(
    lambda before, n, around, unit, after: f"{before}{n}{around}/{around}{unit}{after}",
    st.sampled_from(["", "", " ", "\t", "\u00a0"]),
    st.integers(0, 2**40).map(str)
    | st.sampled_from(["５", "٥", "05", "1_000", "+5", "-5", "5.0", "²", "1e3"]),
    st.sampled_from(["", "", "", " "]),
    st.sampled_from(["s", "m", "h", "S", "d", "ｓ", "sec", ""]),
    st.sampled_from(["", "", "", " ", "\n"]),
)
RATES = NEAR_RATES | st.text(max_size=12)


@settings(max_examples=500, deadline=None)
@given(text=RATES)
def test_a_rate_is_exactly_n_slash_unit_in_ascii(text):
    match = RATE.fullmatch(text)
    try:
        rate = flow.parse_rate(text)
    except InvalidJob as exc:
        assert match is None or not 1 <= int(match[1]) <= limits.MAX_INT, text
        message = str(exc)
        assert "'N/s', 'N/m' or 'N/h'" in message or "from 1 to" in message, message
        return
    assert match is not None, text
    assert str(rate) == text  # one spelling per rate


@pytest.mark.parametrize("text", ["５/s", " 5 /s", "5 /s", "5/ s", " 5/s", "5/s ", "5/S", "05/s"])
def test_the_forms_the_docs_do_not_show_are_refused_naming_the_form(text):
    with pytest.raises(InvalidJob, match=r"'N/s', 'N/m' or 'N/h' .*ASCII digits, no spaces"):
        flow.parse_rate(text)
    with pytest.raises(InvalidJob, match="rate_limit"):
        job(name="tests.grammars.rate", rate_limit=text)(lambda payload, ctx: None)


# ---- queue and job names ------------------------------------------------------------------

QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,99}")
NAME = re.compile(r"[A-Za-z_<][A-Za-z0-9_.:<>\-]{0,199}")
NAMEISH = st.text(
    st.sampled_from("aZ09_.:-<> \u00a0\u200bДжé٣５\x00\t") | st.characters(),
    min_size=1,
    max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(text=NAMEISH | st.from_regex(QUEUE, fullmatch=True))
def test_a_queue_name_is_ascii_letters_digits_and_four_marks(text):
    try:
        assert limits.queue_name(text) == text
    except ValueError as exc:
        assert not QUEUE.fullmatch(text), text
        assert "ASCII letters (A-Z, a-z), digits (0-9) and _ . : - only" in str(exc)
        return
    assert QUEUE.fullmatch(text), text


@settings(max_examples=500, deadline=None)
@given(text=NAMEISH | st.from_regex(NAME, fullmatch=True))
def test_a_job_name_is_ascii_letters_digits_and_six_marks(text):
    try:
        assert limits.job_name(text) == text
    except ValueError as exc:
        assert not NAME.fullmatch(text), text
        assert "ASCII letters (A-Z, a-z), digits (0-9) and _ . : < > - only" in str(exc)
        return
    assert NAME.fullmatch(text), text


@pytest.mark.parametrize("queue", ["очередь", "émails", "mails٣", "q\u00a01"])
def test_a_queue_name_in_other_letters_is_refused_saying_ascii(queue):
    with pytest.raises(InvalidJob, match=r"may hold ASCII letters \(A-Z, a-z\), digits \(0-9\)"):
        enqueue("tests.noop", queue=queue)


# ---- partition values ---------------------------------------------------------------------

REFUSED_IN_PARTITION = set(range(0x20)) | set(range(0x7F, 0xA0)) | {0x2028, 0x2029}
REFUSED_IN_PARTITION |= set(range(0xD800, 0xE000))


def _by_value(value):
    return value


@settings(max_examples=500, deadline=None)
@given(value=st.text(st.characters(codec=None), max_size=20))
def test_a_partition_value_is_any_text_but_controls_separators_and_surrogates(value):
    refused = [ch for ch in value if ord(ch) in REFUSED_IN_PARTITION]
    try:
        assert flow.partition_of("tests.p", _by_value, value) == value
    except InvalidJob as exc:
        assert refused, repr(value)
        assert f"U+{ord(refused[0]):04X}" in str(exc)
        assert flow.NOT_IN_PARTITION in str(exc)
        return
    assert not refused, repr(value)


ACCEPTED_PARTITIONS = [
    "Mary\u00a0Ann",  # a no-break space
    "zero\u200bwidth",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # an emoji sequence with joiners
    "\u200fעברית",  # a right-to-left mark
    "word\u2060joiner",
    "Ωμέγα 東京",
]


@pytest.fixture
def partitioned():
    handler = job(name="tests.grammars.partitioned", global_concurrency=1, partition_by="p")(
        lambda payload, ctx: None
    )
    yield handler
    unregister(handler.name)


@pytest.mark.django_db
@pytest.mark.parametrize("value", ACCEPTED_PARTITIONS)
def test_accepted_partition_values_are_stored_as_they_are(partitioned, value):
    result = enqueue(partitioned, {"p": value})
    assert Job.objects.get(id=result.id).partition == value
    assert Job.objects.filter(partition=value).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["a\x00b", "tab\there", "line\u2028sep", "c1\x85", "del\x7f"])
def test_refused_partition_values_say_what_is_accepted_and_write_nothing(partitioned, value):
    with pytest.raises(InvalidJob, match="a partition value may hold any text but control"):
        enqueue(partitioned, {"p": value})
    assert Job.objects.count() == 0
