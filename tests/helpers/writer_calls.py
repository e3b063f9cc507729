"""Random ``RankMetricsWriter.log_metrics`` calls (hypothesis): names and values that stress the CSV format."""

from __future__ import annotations

from hypothesis import strategies as st

TRICKY_NAMES = ["loss", "a,b", 'say "hi"', "two\nlines", "cr\rlf\r\n", "ünïcødé ✓", " padded ", "x" * 40]
NAMES = st.one_of(
    st.sampled_from(TRICKY_NAMES),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), min_size=1, max_size=8).filter(
        lambda name: name not in ("step", "rank", "epoch") and not name.startswith("metric:")
    ),
)
VALUES = st.one_of(
    st.floats(),  # every float: NaN, ±inf, ±0.0, subnormals, the largest
    st.floats(-1e-300, 1e-300),
    st.integers(-(2**53), 2**53),
)


@st.composite
def call_sequences(draw: st.DrawFn) -> list[tuple[dict[str, float | int], int]]:
    """log_metrics calls whose metric names appear over time (each call logs a random subset of a pool)."""
    pool = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    calls = []
    for _ in range(draw(st.integers(1, 12))):
        names = draw(st.lists(st.sampled_from(pool), max_size=len(pool), unique=True))
        calls.append(({name: draw(VALUES) for name in names}, draw(st.integers(0, 10**6))))
    return calls
