"""guide.validate.positive_int: one wording for one mistake."""

from __future__ import annotations

import pytest

from guide.validate import positive_int


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "2", None])
def test_refuses_what_is_not_a_positive_int(bad) -> None:
    with pytest.raises(ValueError, match=rf"world_size must be a positive integer \(ranks\), got {bad!r}"):
        positive_int("world_size", bad, "ranks")


def test_returns_the_value() -> None:
    assert positive_int("k", 3) == 3
