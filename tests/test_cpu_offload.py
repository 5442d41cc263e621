"""The CPU offload page (``examples/plot_cpu_offload.py``), :mod:`guide.host_copies` and
:mod:`guide.memory.offload`.

The counter must count FSDP2's offload copies and nothing else, the prediction must price them
to the byte (root once, blocks twice, padded shards in, real rows out), and the page must fail
when the policy it teaches is left out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import EXAMPLES
from faults import assert_fails_by_name
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy

import guide
from guide import host_copies, sharding
from guide.host_copies import HostCopy, HostDeviceCopies
from guide.memory import PRESETS, per_rank_state_bytes
from guide.memory.offload import offload_memory, offload_traffic
from guide.model import ModelConfig, build_model
from guide.training import next_token_loss

PAGE = EXAMPLES / "plot_cpu_offload.py"
CFG = ModelConfig(vocab=128, d_model=64, n_layers=2, n_heads=4, d_mlp=256)


# -- guide.memory.offload ------------------------------------------------------------------------

def test_traffic_gathers_the_root_once_and_each_block_twice() -> None:
    # root: 4 rows of 2 -> 2 rows per rank = 4 elements; block: 6 rows of 3 -> 9 elements
    units = [[(4, 2)], [(6, 3)]]
    t = offload_traffic(units, 2, "fp32")
    assert (t.to_device, t.to_host) == ((4 + 2 * 9) * 4, (4 + 9) * 4)
    assert (t.to_device_copies, t.to_host_copies) == (3, 2)
    once = offload_traffic(units, 2, "fp32", reshard_after_forward=False)
    assert (once.to_device, once.to_device_copies) == ((4 + 9) * 4, 2)


def test_traffic_copies_padded_shards_in_and_real_rows_out() -> None:
    units = [[(5,)]]  # 5 rows on 2 ranks: 3 and 2, every rank allocates 3
    assert offload_traffic(units, 2, "fp32", rank=0).to_host == 3 * 4
    last = offload_traffic(units, 2, "fp32", rank=1)
    assert (last.to_device, last.to_host) == (3 * 4, 2 * 4)
    # bf16 compute with fp32 master: the copy is of the stored fp32 shard, before the cast
    assert offload_traffic(units, 2, "bf16_mixed").to_device == 3 * 4
    assert offload_traffic(units, 2, "bf16").to_device == 3 * 2


def test_traffic_refuses_what_it_cannot_price() -> None:
    for kwargs in ({"rank": 2}, {"rank": True}):
        with pytest.raises(ValueError, match="rank"):
            offload_traffic([[(4,)]], 2, "fp32", **kwargs)
    with pytest.raises(ValueError, match="precision"):
        offload_traffic([[(4,)]], 2, "fp16")
    with pytest.raises(ValueError, match="empty"):
        offload_traffic([], 2, "fp32")


def test_memory_moves_fsdp2s_model_state_to_the_host() -> None:
    arch = PRESETS["llama-3-8b"]
    moved = offload_memory(arch, 8, "bf16_mixed", "adamw")
    state = per_rank_state_bytes(arch.param_shapes(), "fsdp2", 8, "bf16_mixed", "adamw",
                                 ddp_buckets=False)
    assert moved.gpu_saved == moved.host == state.params + state.grads + state.optimizer
    assert 14 * 2**30 < moved.gpu_saved < 16 * 2**30  # ~16 bytes per parameter over 8 GPUs


def _refusal(call, *args, **kwargs) -> str:
    """The whole message of the ValueError ``call`` raises."""
    with pytest.raises(ValueError) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_traffic_refusals_in_full() -> None:
    assert _refusal(offload_traffic, [[(4,)]], 0, "fp32") == (
        "world_size must be a positive integer (the number of ranks), got 0.")
    assert _refusal(offload_traffic, [[(4,)]], 2, "fp16") == (
        "unknown precision 'fp16'; choose one of fp32, bf16_mixed, bf16, zero_mixed.")
    assert _refusal(offload_traffic, [], 2, "fp32") == (
        "units is empty: pass the root's shapes, then each block's.")


def test_traffic_is_rank_0s_unless_told() -> None:
    units = [[(5,)]]  # rank 0 sends 3 rows out, rank 1 two
    assert offload_traffic(units, 2, "fp32") == offload_traffic(units, 2, "fp32", rank=0)
    assert offload_traffic(units, 2, "fp32") != offload_traffic(units, 2, "fp32", rank=1)
    assert offload_traffic(units, 1, "fp32").to_host == 5 * 4  # one rank: rank 0 exists


def test_traffic_counts_a_scalar_parameter_as_one_element() -> None:
    t = offload_traffic([[()], [(), (2, 3)]], 1, "fp32")
    assert (t.to_device, t.to_host) == ((1 + 2 * (1 + 6)) * 4, (1 + 1 + 6) * 4)


def test_memory_of_the_shapes_is_the_memory_of_the_architecture() -> None:
    arch = PRESETS["llama-3-8b"]
    assert offload_memory(arch.param_shapes(), 8, "bf16_mixed", "adamw") == \
        offload_memory(arch, 8, "bf16_mixed", "adamw")


# -- guide.host_copies ---------------------------------------------------------------------------

def all_gather_inputs(t: torch.Tensor) -> torch.Tensor:  # named as FSDP2's caller
    return t.to("cpu", non_blocking=True)


def foreach_reduce(t: torch.Tensor) -> torch.Tensor:  # named as FSDP2's caller
    return t.to(torch.device("cpu"))


def some_other_code(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


def test_counter_keeps_only_fsdp2s_offload_copies() -> None:
    t = torch.zeros(10, dtype=torch.float32)
    with HostDeviceCopies() as copies:
        all_gather_inputs(t), foreach_reduce(t[:3]), some_other_code(t)
    assert copies.copies == [HostCopy("to_device", 40), HostCopy("to_host", 12)]
    assert (copies.count(), copies.bytes("to_device"), copies.count("to_host")) == (2, 40, 1)


def test_counter_without_its_caller_filter_fails_the_test(monkeypatch) -> None:
    """The fault: every ``Tensor.to`` counted as a copy; the filter test above must then fail."""
    monkeypatch.setattr(host_copies, "CALLERS", {**host_copies.CALLERS,
                                                 "some_other_code": "to_device"})
    with pytest.raises(AssertionError):
        test_counter_keeps_only_fsdp2s_offload_copies()


def test_counter_restores_tensor_to_and_refuses_nesting() -> None:
    original = torch.Tensor.to
    with pytest.raises(RuntimeError, match="boom"), HostDeviceCopies():
        raise RuntimeError("boom")
    assert torch.Tensor.to is original
    with HostDeviceCopies(), pytest.raises(ValueError, match="already active"):
        HostDeviceCopies().__enter__()
    assert torch.Tensor.to is original
    with pytest.raises(ValueError, match="direction"):
        HostDeviceCopies().count("sideways")


def test_counter_refuses_nesting_and_a_direction_with_the_fix() -> None:
    with HostDeviceCopies(), pytest.raises(ValueError) as refused:
        HostDeviceCopies().__enter__()
    assert str(refused.value) == ("a HostDeviceCopies is already active; close it first (they do "
                                  "not nest: both would wrap Tensor.to).")
    with pytest.raises(ValueError) as refused:
        HostCopy("sideways", 4)
    assert str(refused.value) == ("HostCopy direction 'sideways': use one of ['to_device', "
                                  "'to_host'].")


def test_a_counted_tensor_to_still_converts_as_asked() -> None:
    t = torch.zeros(10, dtype=torch.float32)
    with HostDeviceCopies():
        by_position, by_keyword = t.to(torch.float64), t.to(dtype=torch.int32)
    assert (by_position.dtype, by_keyword.dtype) == (torch.float64, torch.int32)


def one_step(rank: guide.Rank, offload: bool) -> tuple:
    model = build_model(CFG, device=rank.device)
    options = {"offload_policy": CPUOffloadPolicy(pin_memory=False)} if offload else {}
    sharding.apply_fsdp2(model, init_device_mesh("cpu", (rank.world_size,)), **options)
    tokens = torch.randint(0, CFG.vocab, (2, 9))
    with HostDeviceCopies() as copies:
        next_token_loss(model, tokens).backward()
    return tuple((copies.count(d), copies.bytes(d)) for d in ("to_device", "to_host"))


def test_counted_copies_on_ranks_are_the_predicted_bytes() -> None:
    units = [[tuple(p.shape) for p in u] for u in sharding.fsdp2_units(build_model(CFG))]
    for offload in (True, False):
        for r, got in enumerate(guide.launch(one_step, 2, offload)):
            want = offload_traffic(units, 2, "fp32", rank=r)
            expected = (((want.to_device_copies, want.to_device),
                         (want.to_host_copies, want.to_host)) if offload else ((0, 0), (0, 0)))
            assert got == expected, f"offload={offload}, rank {r}"


# -- the page ------------------------------------------------------------------------------------

#: Faults injected into the page's tagged fault points (tests/faults.py): (tag, replacement).
FAULTS = {
    # the policy left out of the page's own code
    "policy_left_out": [("offload-blocks", "fully_shard(block, mesh=mesh)"),
                        ("offload-root", "return fully_shard(model, mesh=mesh)")],
    # the prediction of a block's backward gather forgotten
    "backward_gathers_unpriced": [("predicted-copies",
                                   'want = offload_traffic(units, WORLD_SIZE, "fp32", rank=r, '
                                   'reshard_after_forward=False)')],
}
#: Each fault must stop the page at the copy (or placement) check.
EXPECTED = r"\[offload (copies|placement)\]"


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_injected_fault_fails_the_page(fault: str, tmp_path: Path) -> None:
    assert_fails_by_name(PAGE, fault, FAULTS[fault], EXPECTED, tmp_path, timeout=400)
