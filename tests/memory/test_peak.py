"""guide.memory.peak: the CPU peak is calibrated against tensors of known size, transient peaks are
caught, the guards refuse what would give a wrong number, and the launcher's budget is honoured."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import guide
from guide.launcher import heap
from guide.memory import peak as peak_memory
from guide.memory.peak import PeakMemory, current_bytes, data_segment_bytes, prepare

MiB = 2**20


def _warm_up() -> None:
    """The first block in a process also pays for first-time code paths (a few MiB of code pages
    and allocator metadata): measure after one, as the examples measure after building the model."""
    with PeakMemory():
        torch.ones(2 * MiB // 4).add_(1)


@pytest.fixture(autouse=True)
def _prepared():
    prepare()
    _warm_up()


@pytest.mark.parametrize("mib", [8, 64])
def test_peak_matches_a_tensor_of_known_size(mib):
    with PeakMemory("cpu") as peak:
        x = torch.ones(mib * MiB // 4)  # touched: ones() writes every page
        del x
    assert peak.method == "VmHWM"
    assert abs(peak.peak_bytes - mib * MiB) <= 1 * MiB + 0.02 * mib * MiB, peak
    assert abs(peak.end_bytes) <= 1 * MiB, f"a freed tensor stayed resident: {peak}"


def test_transient_peak_is_caught_and_kept_memory_is_end_bytes():
    with PeakMemory() as peak:
        kept = torch.ones(16 * MiB // 4)
        temp = torch.ones(32 * MiB // 4)
        del temp
    assert peak.peak_bytes >= 47 * MiB, peak  # both were alive at once
    assert 15 * MiB <= peak.end_bytes <= 17 * MiB, peak
    assert peak.peak_level_bytes == peak.baseline_bytes + peak.peak_bytes
    del kept


def test_untouched_reservation_is_not_counted_but_data_segment_is():
    before = data_segment_bytes()
    with PeakMemory() as peak:
        x = torch.empty(64 * MiB // 4)  # mmap'd, never written: no resident pages
        grown = data_segment_bytes() - before
    assert peak.peak_bytes < 4 * MiB, peak
    assert grown >= 63 * MiB
    del x


def test_without_prepare_refuses(monkeypatch):
    monkeypatch.setattr(heap, "_prepared_pid", None)
    assert not peak_memory.is_prepared()
    with pytest.raises(RuntimeError, match=r"prepare\(\)"):
        with PeakMemory("cpu"):
            pass


def test_blocks_cannot_nest():
    with PeakMemory():
        with pytest.raises(RuntimeError, match="nest"):
            with PeakMemory():
                pass
    with PeakMemory():  # the outer block released the lock
        pass


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64k"])
def test_prepare_rejects_a_bad_threshold(bad):
    with pytest.raises(ValueError, match="mmap_threshold"):
        prepare(bad)


@pytest.mark.parametrize("bad", ["meta", "nonsense", 3.5])
def test_bad_device_is_a_value_error(bad):
    with pytest.raises(ValueError, match="device"):
        PeakMemory(bad)


def test_current_bytes_is_vmrss():
    x = torch.ones(32 * MiB // 4)
    with_x = current_bytes("cpu")
    del x
    assert with_x - current_bytes("cpu") >= 31 * MiB


@pytest.mark.cuda
def test_cuda_peak_matches_a_tensor():
    with PeakMemory("cuda") as peak:
        x = torch.ones(16 * MiB // 4, device="cuda")
        del x
    assert peak.method == "cuda.max_memory_allocated"
    assert peak.peak_bytes == 16 * MiB


def _rank_under_budget(rank: guide.Rank, mib: int) -> dict:
    # No prepare(): the launcher's memory limit already lowered the mmap threshold.
    _warm_up()
    with PeakMemory(rank.device) as peak:
        x = torch.ones(8 * MiB // 4)
        del x
    out = {"prepared": peak_memory.is_prepared(), "peak": peak.peak_bytes}
    if rank.rank == 1:
        torch.ones(mib * MiB // 4)  # far beyond the budget
    return out


def test_rank_under_a_budget_measures_and_runs_out_of_memory_clearly():
    start = max(guide.launch(lambda rank: data_segment_bytes(), 2))
    budget = (start + 64 * MiB) // MiB
    with pytest.raises(guide.RankOutOfMemory) as info:
        guide.launch(_rank_under_budget, 2, 256, memory_limit_mib=budget)
    assert info.value.rank == 1
    assert info.value.limit_mib == budget
    assert info.value.requested_bytes == 256 * MiB
    assert f"budget of {budget} MiB" in str(info.value)
    # Within the budget the same worker runs, prepared by the launcher, and measures 8 MiB.
    results = guide.launch(_rank_under_budget, 1, 0, memory_limit_mib=budget)
    assert results[0]["prepared"]
    assert abs(results[0]["peak"] - 8 * MiB) <= 1 * MiB


def test_memory_limit_prepares_the_rank():
    """launch(memory_limit_mib=...) lowers the mmap threshold itself: the ranks count as prepared."""
    import guide

    def worker(rank):
        return peak_memory.is_prepared()

    assert guide.launch(worker, 2, memory_limit_mib=4096) == [True, True]
    assert guide.launch(worker, 2) == [False, False]


_HOLE = """
import gc
from guide.memory import PeakMemory, current_bytes, prepare, release_freed_heap
prepare()  # as the pages' workers do: blocks below 64 KiB still come from the heap
MiB = 2**20
base = current_bytes()
blocks = [bytes(bytearray(4000)) for _ in range(25_000)]  # about 95 MiB of heap blocks
top = bytes(bytearray(4000))  # allocated above them: glibc cannot trim the heap's top
del blocks
gc.collect()  # freed, yet resident: the blocks are a hole in the heap
"""


def _beside_a_heap_hole(then: str) -> list[int]:
    """Run ``then`` in a fresh process just after :data:`_HOLE` made a resident 95 MiB heap hole;
    the whole numbers it prints."""
    out = subprocess.run([sys.executable, "-c", _HOLE + then],
                         capture_output=True, text=True, check=True).stdout.split()
    return [int(v) for v in out]


@pytest.mark.parametrize("release", [True, False], ids=["released", "control"])
def test_release_freed_heap_gives_freed_heap_pages_back(release):
    """A freed heap block stays resident under a live one (the control); release_freed_heap hands
    it back, so the next point a torchrun rank measures starts from what is live."""
    freed, now = _beside_a_heap_hole("freed = current_bytes() - base\n"
                                      f"{'release_freed_heap()' if release else 'pass'}\n"
                                      "print(freed, current_bytes() - base)")
    freed_mib, now_mib = freed / MiB, now / MiB
    assert freed_mib > 80  # freed, yet resident: the heap kept the pages
    if release:
        assert now_mib < 10
    else:
        assert now_mib > 80


_INTO_THE_HOLE = """
import torch
if {peak}:
    with PeakMemory() as peak:
        x = torch.ones(32 * MiB // 4)  # above the mmap threshold, yet glibc fills the hole first
    print(peak.end_bytes)
else:
    before = current_bytes()
    x = torch.ones(32 * MiB // 4)
    print(current_bytes() - before)
"""


@pytest.mark.parametrize("how", ["peak", "control"])
def test_a_tensor_placed_in_a_resident_heap_hole_is_counted(how):
    """glibc serves even an allocation above the mmap threshold from a freed heap hole before it
    maps new memory. The control shows the hole's resident pages hiding a 32 MiB tensor from a bare
    VmRSS difference; PeakMemory hands the hole's pages back at entry, so it sees the tensor."""
    (grown,) = _beside_a_heap_hole(_INTO_THE_HOLE.format(peak=how == "peak"))
    grown_mib = grown / MiB
    if how == "peak":
        assert 31 <= grown_mib <= 34
    else:
        assert grown_mib < 4  # the tensor reused resident pages: what the entry trim prevents


def test_heap_blocks_freed_inside_the_block_are_not_left_behind():
    """Small blocks made and freed inside the block refill the hole the entry released; at exit
    their pages go back too, so ``end_bytes`` is what the block kept, while the peak saw them."""
    peak, end = _beside_a_heap_hole(
        "with PeakMemory() as peak:\n"
        "    junk = [bytes(bytearray(4000)) for _ in range(12_500)]  # refills half the hole\n"
        "    del junk\n"
        "print(peak.peak_bytes, peak.end_bytes)")
    peak_mib, end_mib = peak / MiB, end / MiB
    assert peak_mib > 40  # about 48 MiB of blocks were alive at once
    assert abs(end_mib) < 4
