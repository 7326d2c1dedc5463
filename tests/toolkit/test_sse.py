"""toolkit.base.sse: the one SSE reader of the verifier, the scripts and the tests."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from toolkit.base.sse import iter_sse, parse_sse

payloads = st.lists(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), max_size=3), max_size=6)


@given(payloads)
def test_events_come_back_as_sent_whole_or_line_by_line(events):
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    assert parse_sse(body) == events
    assert list(iter_sse(iter(body.splitlines()))) == events  # a live stream, one line at a time


def test_multi_line_data_comments_other_fields_and_a_missing_last_blank_line():
    body = ': keep-alive\nevent: x\ndata: {"a":\ndata:  1}\n\ndata:{"b":2}'
    assert parse_sse(body) == [{"a": 1}, {"b": 2}]


def test_nothing_after_done_is_read():
    lines = iter(["data: {\"a\": 1}", "", "data: [DONE]", "", "data: not json"])
    assert list(iter_sse(lines)) == [{"a": 1}]
