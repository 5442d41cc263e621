"""guide.memory.budget: the OOM page's cap, on the host (RLIMIT_DATA, really enforced here) and on
a GPU (the caching allocator's fraction; torch.cuda stood in for, since no GPU runs the suite)."""

from __future__ import annotations

import resource
import types

import pytest
import torch

from guide.memory import budget as B
from guide.memory.peak import data_segment_bytes

MiB = 2**20


def test_host_budget_caps_the_data_segment_and_lifts_the_cap() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    level = data_segment_bytes()
    with B.host_budget(64 * MiB) as limit:
        assert level + 64 * MiB - 8 * MiB <= limit <= level + 64 * MiB + 8 * MiB
        assert resource.getrlimit(resource.RLIMIT_DATA) == (limit, before[1])
        with pytest.raises(MemoryError):
            bytearray(512 * MiB)  # over the cap: refused, not granted
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    bytearray(512 * MiB)  # lifted: the same allocation succeeds


def test_host_budget_lifts_the_cap_when_the_block_raises() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with pytest.raises(KeyError):
        with B.host_budget(64 * MiB):
            raise KeyError("inside")
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "64"])
def test_a_headroom_that_is_not_a_positive_byte_count_is_refused(bad) -> None:
    for cap in (B.host_budget(bad), B.gpu_budget("cuda:0", bad)):
        with pytest.raises(ValueError, match="positive whole number of bytes"):
            with cap:
                pass


class FakeCuda:
    """torch.cuda's five calls the GPU cap makes, recorded."""

    def __init__(self, total: int, allocated: int) -> None:
        self.total, self.allocated, self.calls = total, allocated, []

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "empty_cache", lambda: self.calls.append(("empty_cache",)))
        monkeypatch.setattr(cuda, "get_device_properties",
                            lambda d: types.SimpleNamespace(total_memory=self.total))
        monkeypatch.setattr(cuda, "memory_allocated", lambda d: self.allocated)
        monkeypatch.setattr(cuda, "set_per_process_memory_fraction",
                            lambda f, d: self.calls.append(("fraction", f, d)))


def test_gpu_budget_caps_the_allocator_at_allocated_plus_headroom(monkeypatch) -> None:
    fake = FakeCuda(total=80 * 2**30, allocated=2 * 2**30)
    fake.install(monkeypatch)
    with B.gpu_budget("cuda:1", 6 * 2**30) as limit:
        assert limit == 8 * 2**30
        assert fake.calls == [("empty_cache",), ("fraction", 0.1, "cuda:1")]
    assert fake.calls[-1] == ("fraction", 1.0, "cuda:1")


def test_gpu_budget_gives_the_device_back_when_the_block_raises(monkeypatch) -> None:
    fake = FakeCuda(total=1000, allocated=100)
    fake.install(monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        with B.gpu_budget("cuda:0", 400):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert fake.calls == [("empty_cache",), ("fraction", 0.5, "cuda:0"),
                          ("fraction", 1.0, "cuda:0")]


def test_gpu_budget_refuses_a_cap_above_the_device(monkeypatch) -> None:
    fake = FakeCuda(total=1000, allocated=100)
    fake.install(monkeypatch)
    with pytest.raises(ValueError, match="above the device's 1000 bytes"):
        with B.gpu_budget("cuda:0", 901):
            pass
    assert not [c for c in fake.calls if c[0] == "fraction"]
    with B.gpu_budget("cuda:0", 900) as limit:  # exactly the device: allowed
        assert limit == 1000
    assert ("fraction", 1.0, "cuda:0") in fake.calls


def test_a_headroom_of_one_byte_is_allowed(monkeypatch) -> None:
    FakeCuda(total=1000, allocated=100).install(monkeypatch)
    with B.gpu_budget("cuda:0", 1) as limit:  # the smallest positive whole number of bytes
        assert limit == 101


def test_budget_picks_the_gpu_cap_on_cuda_only(monkeypatch) -> None:
    fake = FakeCuda(total=1000, allocated=0)
    fake.install(monkeypatch)
    with B.budget(torch.device("cuda", 0), 250) as limit:
        assert limit == 250 and ("fraction", 0.25, torch.device("cuda", 0)) in fake.calls
    with B.budget("cuda:1", 500) as limit:  # a device's name, as torchrun scripts often pass it
        assert limit == 500 and ("fraction", 0.5, "cuda:1") in fake.calls
    with B.budget(torch.device("cuda"), 100) as limit:  # no index: prints as "cuda"
        assert limit == 100 and ("fraction", 0.1, torch.device("cuda")) in fake.calls
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with B.budget(torch.device("cpu"), 64 * MiB) as limit:
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] == limit
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert len([c for c in fake.calls if c[0] == "fraction"]) == 6  # the CPU cap touched no GPU


@pytest.mark.parametrize("exc, oom", [
    (MemoryError(), True),
    (RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"), True),
    (RuntimeError("Cannot allocate memory"), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (RuntimeError("Expected all tensors to be on the same device"), False),
    (ValueError("out of memory"), False),
    (KeyError("can't allocate memory"), False),
])
def test_only_an_allocation_over_the_cap_counts_as_out_of_memory(exc, oom) -> None:
    assert B.is_out_of_memory(exc) is oom
