"""guide.layout: chunk rows (torch.chunk semantics), plain names, dtype names."""

from __future__ import annotations

import pytest
import torch

from guide import layout


@pytest.mark.parametrize("length, n", [(10, 4), (7, 4), (4, 4), (3, 4), (1, 3), (0, 2), (128, 2),
                                       (127, 2), (5, 3)])
def test_chunk_sizes_are_torch_chunk(length: int, n: int) -> None:
    chunks = torch.arange(length).chunk(n) if length else ()
    expected = [len(c) for c in chunks] + [0] * (n - len(chunks))
    assert layout.chunk_sizes(length, n) == expected
    assert [layout.chunk_rows(length, r, n) for r in range(n)] == expected


def test_the_last_ranks_may_get_nothing() -> None:
    # ceil-sized chunks, not "remainder on the last"
    assert layout.chunk_sizes(5, 4) == [2, 2, 1, 0]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="n must be a positive integer"):
        layout.chunk_sizes(4, 0)
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        layout.chunk_rows(4, 2, 2)


def test_names() -> None:
    assert layout.plain_name("module.blocks.0.qkv.weight") == "blocks.0.qkv.weight"
    assert layout.plain_name("blocks.0.module.x") == "blocks.0.module.x"
    assert layout.dtype_name(torch.bfloat16) == "bfloat16"


def test_full_state_and_layouts_of_a_plain_model() -> None:
    model = torch.nn.Linear(3, 2)
    state = layout.full_state(model)
    assert set(state) == {"weight", "bias"} and state["weight"].data_ptr() != model.weight.data_ptr()
    (w, b) = layout.param_layouts(model, rank=0)
    assert (w.is_dtensor, w.local_shape, b.global_shape) == (False, (2, 3), (2,))
    assert layout.local_tensor(model.weight) is model.weight
