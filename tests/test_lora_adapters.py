"""Where LoRA adapters go (:func:`guide.memory.finetune.lora_state_bytes`, what ``guide-memory
--lora-rank R`` prices): on every linear weight of every layer, whatever its shape. Under
grouped-query attention k and v are narrower than q, and the MLP's weights are rectangular: an
adapter rule that kept only square weights (q and o) would price a quarter of the adapters of
this architecture and still look plausible."""

from __future__ import annotations

import pytest

from guide.memory.architectures import Architecture
from guide.memory.finetune import lora_state_bytes

#: 4 heads of 2, 2 kv heads (k, v: 4 x 8), gated MLP 12 wide: q, o 8x8; k, v 4x8; gate, up 12x8;
#: down 8x12. No biases.
GQA = Architecture(vocab=16, hidden=8, layers=2, heads=4, kv_heads=2, mlp=12)
#: (d_out, d_in) of each linear of one layer, by hand
LINEARS = {"q": (8, 8), "k": (4, 8), "v": (4, 8), "o": (8, 8), "gate": (12, 8), "up": (12, 8),
           "down": (8, 12)}


@pytest.mark.parametrize("rank", [1, 2])
def test_every_linear_of_every_layer_gets_an_adapter(rank: int) -> None:
    """Gradients exist only for the adapters: ``A`` (rank x d_in) and ``B`` (d_out x rank) of each
    of the 7 linears, in both layers (fp32, one rank: no padding)."""
    adapter = sum(rank * (d_in + d_out) for d_out, d_in in LINEARS.values())
    assert adapter == rank * 116
    (one,) = lora_state_bytes(GQA, rank, 1, base_precision="bf16", adapter_precision="fp32",
                              optimizer="sgd")
    assert one.grads == GQA.layers * adapter * 4, (
        "LoRA adapters must cover every linear weight: q, k, v, o and the MLP "
        f"({GQA.layers * adapter} adapter parameters), not only the square ones")
    assert one.params == GQA.n_params * 2 + GQA.layers * adapter * 4  # bf16 base + fp32 adapters
    assert one.optimizer == 0


def test_adamw_keeps_two_moments_and_a_step_per_adapter_tensor() -> None:
    (one,) = lora_state_bytes(GQA, 2, 1, base_precision="bf16", adapter_precision="fp32",
                              optimizer="adamw")
    tensors = 2 * len(LINEARS) * GQA.layers  # A and B of each linear
    adapters = GQA.layers * 2 * 116  # rank 2
    assert one.optimizer == 2 * adapters * 4 + tensors * 4  # exp_avg, exp_avg_sq; fp32 step


def test_the_embeddings_and_norms_get_no_adapter() -> None:
    """Only the layers' 2-D weights: the embedding (16 x 8) and the norms are frozen, unadapted."""
    plain = Architecture(vocab=1000, hidden=8, layers=1, heads=2, mlp=8, gated_mlp=False)
    (one,) = lora_state_bytes(plain, 1, 1, base_precision="fp32", adapter_precision="fp32",
                              optimizer="sgd")
    assert one.grads == 6 * (8 + 8) * 4  # q, k, v, o, fc1, fc2: all 8x8
