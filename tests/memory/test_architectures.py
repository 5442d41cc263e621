"""guide.memory.architectures: the presets are the published models, the FSDP2 units partition
them, and a model's sequence limit is enforced."""

from __future__ import annotations

import pytest

from guide.memory import PRESETS, Architecture

PUBLISHED = {  # parameter counts as the models' own releases report them
    "gpt2-xl": 1_557_611_200,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
}


def test_every_preset_is_checked():
    assert sorted(PRESETS) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
    assert PRESETS[name].n_params == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fsdp2_units_partition_the_parameters(name: str) -> None:
    """Root first (as guide.sharding.fsdp2_units orders a live model), then one unit per layer:
    every parameter once, every layer the same shapes."""
    arch = PRESETS[name]
    root, *layers = arch.fsdp2_units()
    assert len(layers) == arch.layers and all(layer == layers[0] for layer in layers)
    assert sorted(root + [s for layer in layers for s in layer]) == sorted(arch.param_shapes())
    assert (arch.vocab, arch.hidden) in root


def test_tied_embeddings_drop_the_head():
    arch = Architecture(vocab=100, hidden=8, layers=1, heads=2, mlp=16)
    tied = Architecture(vocab=100, hidden=8, layers=1, heads=2, mlp=16, tied_embeddings=True)
    assert arch.n_params - tied.n_params == 100 * 8


def test_learned_positions_are_one_row_per_position():
    gpt2 = PRESETS["gpt2-xl"]
    assert (gpt2.max_seq_len, gpt2.hidden) in gpt2.param_shapes()


def test_check_seq_len():
    assert PRESETS["llama-3-8b"].check_seq_len(8192) == 8192
    with pytest.raises(ValueError, match="max_seq_len=8,192"):
        PRESETS["llama-3-8b"].check_seq_len(8193)
    assert Architecture(vocab=10, hidden=8, layers=1, heads=2, mlp=8).check_seq_len(10**6) == 10**6


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"vocab": -1}, "vocab"),
    ({"heads": 3}, "divisible"),
    ({"kv_heads": 3}, "kv_heads"),
    ({"max_seq_len": 0}, "max_seq_len"),
    ({"learned_positions": True}, "needs max_seq_len"),
])
def test_bad_architecture(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Architecture(**{"vocab": 10, "hidden": 8, "layers": 1, "heads": 2, "mlp": 8, **kwargs})
