"""Stop strings across arbitrary piece boundaries: the emitted text must equal the text up to the
stop string completed first in the whole text (ties: the earliest start), computed directly on
the whole string, whatever the cuts."""
from hypothesis import given, settings, strategies as st

from tightfit.runtime.stops import StopMatcher

alphabet = st.sampled_from(list("ab<|>\n é"))


def expected(text, stops):
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s and text.find(s) >= 0]
    return text[: min(hits)[1]] if hits else text


@settings(max_examples=1500, deadline=None)
@given(text=st.text(alphabet, max_size=40), stops=st.lists(st.text(alphabet, min_size=1, max_size=4), max_size=3),
       cuts=st.lists(st.integers(0, 40), max_size=10))
def test_emitted_text_equals_prefix_before_first_stop(text, stops, cuts):
    points = sorted(set(c for c in cuts if c <= len(text)))
    pieces, last = [], 0
    for c in points + [len(text)]:
        pieces.append(text[last:c])
        last = c
    m = StopMatcher(stops)
    out = "".join(m.feed(p) for p in pieces) + m.flush()
    assert out == expected(text, stops)
    assert m.stopped == (out != text or any(s and s in text for s in stops))


def test_holds_back_partial_stop():
    m = StopMatcher(["</s>"])
    assert m.feed("hello </") == "hello "
    assert m.feed("x") == "</x"
    assert m.feed(" ok </s") == " ok "
    assert m.feed("> tail") == ""
    assert m.stopped and m.matched == "</s>"


def test_earliest_completed_stop_wins():
    # '<' completes before '><<' can: the stop is '<' whatever the cuts
    for pieces in (["><<"], ["><", "<"], [">", "<", "<"]):
        m = StopMatcher(["<", "><<"])
        assert "".join(m.feed(p) for p in pieces) + m.flush() == ">"
        assert m.matched == "<"
