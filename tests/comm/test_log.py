"""guide.comm.log: the collective counter sees what DDP, FSDP2 and ZeRO-1 issue, and what it sees
matches guide.comm.expected (checked with guide.checks.check_volume / check_wire).

The launched tests run 2 gloo ranks (a few seconds each); the rest run in a gloo world of one.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.parallel import DistributedDataParallel as DDP

import guide
from guide import checks, comm
from guide.comm import Collective, CollectiveLog, FSDPGroup
from guide.data import synthetic_batches
from guide.launcher.torch_support import flat_collective_name
from guide.model import ModelConfig, build_model
from guide.sharding import apply_fsdp2
from guide.training import make_optimizer, train_steps

from peers import IMPORT_LIMIT_S, rank0_beside_peer


@pytest.mark.parametrize("call", [
    lambda: CollectiveLog("model"),
    lambda: CollectiveLog().count("allreduce"),
    lambda: comm.count_ddp_allreduce(torch.nn.Linear(2, 2)),
])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


# -- in one process (a gloo world of one) ----------------------------------------------------------

@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_log_records_kind_dtype_bytes_and_phase(world_of_one):
    all_gather = flat_collective_name("all_gather")
    originals = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", all_gather)}
    model = torch.nn.Linear(3, 3)
    model.register_forward_hook(lambda m, i, o: dist.broadcast(torch.zeros(7), src=0))
    with CollectiveLog(model) as log:
        dist.all_reduce(torch.zeros(10, dtype=torch.bfloat16))
        with log.phase("custom"):
            getattr(dist, all_gather)(torch.zeros(6), torch.zeros(6))
        model(torch.zeros(1, 3))
    assert log.records == [
        Collective("all_reduce", "bfloat16", 10, 20, None, 1),
        Collective("all_gather", "float32", 6, 24, "custom", 1),
        Collective("broadcast", "float32", 7, 28, "forward", 1),
    ]
    assert (log.count(), log.count("all_reduce"), log.bytes(), log.elements("broadcast")) == (3, 1, 72, 7)
    assert log.summary()[("all_gather", "float32")] == {"calls": 1, "numel": 6, "bytes": 24}
    dist.all_reduce(torch.zeros(3))  # after exit: not recorded, and the originals are back
    assert log.count() == 3
    assert all(getattr(dist, name) is fn for name, fn in originals.items())


def test_log_restores_wrappers_after_an_exception(world_of_one):
    original = dist.all_reduce
    with pytest.raises(RuntimeError, match="boom"):
        with CollectiveLog():
            raise RuntimeError("boom")
    assert dist.all_reduce is original
    with CollectiveLog() as log:  # and a new log can open
        dist.all_reduce(torch.zeros(1))
    assert log.count("all_reduce") == 1


def test_logs_do_not_nest(world_of_one):
    with CollectiveLog():
        with pytest.raises(ValueError, match="already active"):
            CollectiveLog().__enter__()


# -- on 2 ranks: DDP needs the hook, FSDP2 matches the model exactly --------------------------------

def _ddp_worker(rank: guide.Rank, hook: bool) -> tuple[list[Collective], int | None]:
    cfg = ModelConfig(n_layers=1)
    batches = synthetic_batches(steps=3, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = DDP(build_model(cfg))
    opt = make_optimizer("sgd", model.parameters())
    if hook:
        comm.count_ddp_allreduce(model)
    train_steps(model, opt, batches[:1], rank)
    with CollectiveLog(model if hook else None) as log:
        train_steps(model, opt, batches[1:], rank)
    return log.records, log.wire_bytes


def _fsdp_worker(rank: guide.Rank) -> tuple[list[Collective], list[FSDPGroup], int | None]:
    cfg = ModelConfig(vocab=127, n_layers=2)  # 127 rows: the embedding and head are padded
    batches = synthetic_batches(steps=2, batch_size=4, seq_len=8, vocab=cfg.vocab)
    model = build_model(cfg)
    groups = comm.fsdp2_groups(model)  # fully_shard's default: blocks reshard, the root does not
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    apply_fsdp2(model, init_device_mesh("cpu", (rank.world_size,)), mp_policy=mp)
    opt = make_optimizer("sgd", model.parameters())
    train_steps(model, opt, batches[:1], rank)
    with CollectiveLog(model) as log:
        train_steps(model, opt, batches[1:], rank)
    return log.records, groups, log.wire_bytes


def test_ddp_allreduce_is_counted_only_with_the_hook():
    psi = sum(p.numel() for p in build_model(ModelConfig(n_layers=1)).parameters())
    records, wire = guide.launch(_ddp_worker, 2, True)[0]
    assert {c.kind for c in records} == {"all_reduce"}
    assert sum(c.numel for c in records) == 2 * psi  # two steps, all gradients each
    assert all(c.phase == "backward" for c in records)
    # the wire counter agrees with the ring model to within WIRE_TOL (gloo headers, control traffic)
    assert wire == pytest.approx(sum(comm.gloo_bytes(c) for c in records), rel=checks.WIRE_TOL)
    # the fault: without the hook, DDP's C++ reducer all-reduces out of Python's sight
    records, wire = guide.launch(_ddp_worker, 2, False)[0]
    assert records == []
    assert wire > psi * 4  # ... though the bytes still went over the wire


@pytest.fixture(scope="module")
def fsdp2_run():
    """Rank 0's records, the fully_shard groups, and both ranks' wire bytes, for one counted step."""
    results = guide.launch(_fsdp_worker, 2)
    records, groups, _ = results[0]
    return records, groups, [w for *_, w in results]


def test_fsdp2_collectives_match_the_model_exactly(fsdp2_run):
    records, groups, _ = fsdp2_run
    expected = comm.fsdp2_step(groups, 2, torch.bfloat16, torch.float32)
    # the same calls (FSDP2 prefetches the next backward all-gather before the current
    # reduce-scatter, so the order differs from the model's listing; the multiset does not)
    assert sorted((c.kind, c.dtype, c.numel, c.phase) for c in records) == \
        sorted((c.kind, c.dtype, c.numel, c.phase) for c in expected)
    padded = sum(c.numel for c in expected if c.kind == "reduce_scatter")
    unpadded = sum(math.prod(s) for g in groups for s in g.shapes)
    assert padded - unpadded == 2 * 64  # one padding row each for tok_emb and head
    checks.check_volume("fsdp2", records, expected, steps=1)


def test_check_volume_catches_a_wrong_model(fsdp2_run):
    records, groups, _ = fsdp2_run
    wrong = {
        "fp32 all-gathers": comm.fsdp2_step(groups, 2),
        "no backward all-gather": comm.fsdp2_step(
            [FSDPGroup(g.shapes, False) for g in groups], 2, torch.bfloat16, torch.float32),
        "DDP": comm.ddp_step([s for g in groups for s in g.shapes], 2),
    }
    for name, model in wrong.items():
        with pytest.raises(checks.CheckFailed, match=r"\[comm (volume|calls)\] run-x"):
            checks.check_volume("run-x", records, model, steps=1)


def test_wire_bytes_show_gloo_runs_reduce_scatter_as_all_reduce(fsdp2_run):
    records, groups, wire = fsdp2_run
    step = comm.fsdp2_step(groups, 2, torch.bfloat16, torch.float32)
    checks.check_wire("fsdp2", wire, sum(comm.gloo_bytes(c) for c in step), steps=1)
    # the ring model (a native reduce-scatter) is what gloo does *not* do: the check must say so
    with pytest.raises(checks.CheckFailed, match=r"\[comm wire\] fsdp2: rank 0"):
        checks.check_wire("fsdp2", wire, sum(comm.ring_bytes(c) for c in step), steps=1)


def _list_all_gather(rank: guide.Rank) -> list[Collective]:
    with CollectiveLog() as log:
        out = [torch.zeros(5) for _ in range(rank.world_size)]
        dist.all_gather(out, torch.full((5,), float(rank.rank)))
    assert [t[0].item() for t in out] == list(range(rank.world_size))
    return log.records


def test_list_form_all_gather_counts_the_gathered_elements():
    """``dist.all_gather(list, t)`` moves world_size × t.numel() elements, like the tensor form."""
    records = guide.launch(_list_all_gather, 2)[0]
    assert records == [Collective("all_gather", "float32", 10, 40, None, 2)]


# -- every entry point, phases and the DDP hook, in one process ------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: CollectiveLog("model"),
     r"CollectiveLog\(model\) takes the nn.Module being trained \(or None\), got str"),
    (lambda: CollectiveLog().count("allreduce"),
     r"unknown collective kind 'allreduce'; choose one of \("),
    (lambda: comm.count_ddp_allreduce(torch.nn.Linear(2, 2)),
     r"count_ddp_allreduce needs a DistributedDataParallel model, got Linear; FSDP2 and ZeRO-1 "
     r"collectives need no hook"),
    (lambda: CollectiveLog().phase("").__enter__(),
     r"phase label must be a non-empty string, got ''"),
    (lambda: CollectiveLog().phase(3).__enter__(),
     r"phase label must be a non-empty string, got 3"),
])
def test_bad_input_names_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_second_log_says_to_close_the_first(world_of_one):
    with CollectiveLog():
        with pytest.raises(ValueError, match=r"^a CollectiveLog is already active in this process; "
                           r"close it first \(logs do not nest\)\.$"):
            CollectiveLog().__enter__()


#: Entry points torch 2.9 (the floor pyproject.toml claims) lacks and 2.13 has: comm.log wraps them
#: where they exist (test_a_name_this_torch_lacks_is_skipped), and they are left out of _HERE.
_NEWER_THAN_THE_FLOOR = {"all_gather_single", "reduce_scatter_single"}
_TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

# (function, its arguments in a world of one, the kind and full-buffer numel it records)
_CALLS = [
    ("all_gather_single", lambda: (torch.zeros(6), torch.ones(6)), "all_gather", 6),
    ("all_gather_into_tensor", lambda: (torch.zeros(6), torch.ones(6)), "all_gather", 6),
    ("_all_gather_base", lambda: (torch.zeros(6), torch.ones(6)), "all_gather", 6),
    ("all_gather", lambda: ([torch.zeros(6)], torch.ones(6)), "all_gather", 6),
    ("reduce_scatter_single", lambda: (torch.zeros(6), torch.ones(6)), "reduce_scatter", 6),
    ("reduce_scatter_tensor", lambda: (torch.zeros(6), torch.ones(6)), "reduce_scatter", 6),
    ("_reduce_scatter_base", lambda: (torch.zeros(6), torch.ones(6)), "reduce_scatter", 6),
    ("reduce_scatter", lambda: (torch.zeros(6), [torch.ones(6)]), "reduce_scatter", 6),
    ("all_reduce", lambda: (torch.ones(6),), "all_reduce", 6),
    ("broadcast", lambda: (torch.ones(6), 0), "broadcast", 6),
    ("all_to_all_single", lambda: (torch.zeros(6), torch.ones(6)), "all_to_all", 6),
    ("reduce", lambda: (torch.ones(6), 0), "reduce", 6),
]
_HERE = [call for call in _CALLS if hasattr(dist, call[0])]  # torch 2.9: all but the two newer


def test_this_torch_lacks_only_the_known_newer_entry_points():
    """A name missing from this torch is one 2.9 lacks and 2.13 has; anything else means torch
    renamed a collective: update _WRAPPED and _CALLS. (A missing name is left out of the next test's
    cases, not skipped: a skip fails the run, tests/no_skips.py.)"""
    missing = {name for name, *_ in _CALLS if not hasattr(dist, name)}
    assert missing <= _NEWER_THAN_THE_FLOOR, f"torch {torch.__version__} lacks dist.{sorted(missing)}"
    if _TORCH >= (2, 13):
        assert missing == set(), f"torch {torch.__version__} lacks dist.{sorted(missing)}"


@pytest.mark.filterwarnings("ignore:.*deprecated:FutureWarning")  # the aliases say so
@pytest.mark.parametrize("name, args, kind, numel", _HERE, ids=[c[0] for c in _HERE])
def test_every_entry_point_is_recorded_once_by_kind(world_of_one, name, args, kind, numel):
    """Each ``torch.distributed`` function a training library calls (the deprecated aliases too)
    is one record of its kind, with the full buffer, and still does its job."""
    with CollectiveLog() as log:
        getattr(dist, name)(*args())
    assert log.records == [Collective(kind, "float32", numel, 4 * numel, None, 1)]


@pytest.mark.filterwarnings("ignore:.*deprecated:FutureWarning")
def test_a_name_this_torch_lacks_is_skipped(world_of_one, monkeypatch):
    """torch 2.9 has no ``all_gather_single``: the log opens, counts the name it has, and does not
    add the missing one."""
    monkeypatch.delattr(dist, "all_gather_single", raising=False)  # torch 2.9 has none to delete
    with CollectiveLog() as log:
        dist.all_gather_into_tensor(torch.zeros(4), torch.ones(4))
    assert log.count("all_gather") == 1
    assert not hasattr(dist, "all_gather_single")


def test_without_a_process_group_the_call_fails_as_torch_says_and_is_not_counted():
    assert not dist.is_initialized()
    with pytest.raises(ValueError) as outside:
        dist.all_reduce(torch.zeros(2))
    with CollectiveLog() as log:
        with pytest.raises(ValueError) as inside:
            dist.all_reduce(torch.zeros(2))
    assert str(inside.value) == str(outside.value)
    assert "init_process_group" in str(inside.value)
    assert log.records == []


class _CountingSGD(torch.optim.SGD):
    """An optimizer whose step all-reduces (as ZeRO-1's broadcasts its shard)."""

    def step(self, closure=None):
        dist.all_reduce(torch.zeros(11))
        return super().step(closure)


class _Wrapping(torch.optim.Optimizer):
    """An optimizer that steps an inner one and then communicates (ZeroRedundancyOptimizer's shape):
    its collective comes after the inner step has ended, still inside its own step."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.inner = inner
        super().__init__(inner.param_groups, {})

    def step(self, closure=None):
        self.inner.step()
        dist.broadcast(torch.zeros(12), src=0)


class _Twice(nn.Module):
    """A module that calls itself once (a weight-shared block): a nested forward of the logged
    module; its collective after the inner call is still in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x, again=True):
        if again:
            x = self(x, again=False)
        dist.all_reduce(torch.zeros(13))
        return self.lin(x)


def _phases(log: CollectiveLog) -> list[tuple[int, str | None]]:
    return [(c.numel, c.phase) for c in log.records]


def test_phases_follow_the_step(world_of_one):
    """forward / backward / optimizer are labelled automatically, nested calls included; after each
    ends nothing is; a phase label overrides them and nests; count, elements and bytes select by
    kind and phase together."""
    model = _Twice()
    # a hook registered before the log: its collective is part of the forward all the same
    model.register_forward_pre_hook(lambda m, args: dist.broadcast(torch.zeros(1), src=0))
    opt = _Wrapping(_CountingSGD(model.parameters(), lr=0.1))
    with CollectiveLog(model) as log:
        out = model(torch.ones(1, 2))
        out.register_hook(lambda g: dist.all_reduce(torch.zeros(2)))
        dist.all_reduce(torch.zeros(3))
        out.sum().backward()
        dist.all_reduce(torch.zeros(4))
        opt.step()
        dist.all_reduce(torch.zeros(5))
        with log.phase("outer"):
            with log.phase("inner"):
                dist.all_reduce(torch.zeros(6))
            model(torch.ones(1, 2))
        dist.all_reduce(torch.zeros(7))
    assert _phases(log) == [
        (1, "forward"), (1, "forward"), (13, "forward"), (13, "forward"), (3, None),
        (2, "backward"), (4, None), (11, "optimizer"), (12, "optimizer"), (5, None), (6, "inner"),
        (1, "outer"), (1, "outer"), (13, "outer"), (13, "outer"), (7, None)]
    assert (log.count("all_reduce", "forward"), log.count(phase="outer"),
            log.count("broadcast", "outer")) == (2, 4, 2)
    assert (log.elements("all_reduce", "outer"), log.bytes("broadcast", "optimizer")) == (26, 48)
    assert log.elements(phase="forward") == 28 and log.bytes(phase="backward") == 8


def test_a_forward_that_raises_ends_the_forward_phase(world_of_one):
    model = nn.Linear(2, 2)
    with CollectiveLog(model) as log:
        with pytest.raises(RuntimeError):
            model(torch.ones(1, 3))  # wrong width
        dist.all_reduce(torch.zeros(1))
    assert _phases(log) == [(1, None)]


def test_ddp_hook_is_registered_once_and_counts_every_bucket(world_of_one):
    """Without the hook DDP's reducer all-reduces out of sight; with it (registered by hand, again
    by hand, and again by the log: DDP allows one hook) each bucket is one backward all-reduce of
    every gradient, over DDP's group, and the gradients are DDP's own."""
    torch.manual_seed(0)
    plain = DDP(nn.Linear(3, 2))
    with CollectiveLog(plain) as log:  # a log given a DDP model registers the hook itself
        plain(torch.ones(4, 3)).sum().backward()
    assert _phases(log) == [(8, "backward")]
    hooked = DDP(nn.Linear(3, 2))
    with CollectiveLog() as log:  # no model given: the C++ reducer is invisible
        hooked(torch.ones(4, 3)).sum().backward()
    assert log.records == []
    want = [p.grad.clone() for p in hooked.parameters()]
    hooked.zero_grad()
    comm.count_ddp_allreduce(hooked)
    comm.count_ddp_allreduce(hooked)
    with CollectiveLog(hooked) as log:
        hooked(torch.ones(4, 3)).sum().backward()
    assert log.records == [Collective("all_reduce", "float32", 8, 32, "backward", 1)]
    assert all(torch.equal(p.grad, g) for p, g in zip(hooked.parameters(), want))


def test_wire_bytes_count_what_this_process_writes(world_of_one, tmp_path):
    """The counter sees every write of this process (a file here, a socket in a collective), and
    the log's wire_bytes is what was written while it was open."""
    before = comm.wire_bytes_written()
    (tmp_path / "blob").write_bytes(b"x" * 2**20)
    after = comm.wire_bytes_written()
    assert 2**20 <= after - before < 2**20 + 2**16
    with CollectiveLog() as log:
        (tmp_path / "blob").write_bytes(b"x" * 2**20)
    assert 2**20 <= log.wire_bytes < 2**20 + 2**16


def test_without_proc_self_io_the_log_works_and_wire_bytes_is_none(world_of_one, monkeypatch):
    """Not Linux: no ``/proc/self/io``. The records are still kept; the byte count is unknown."""
    read_text = Path.read_text

    def no_proc(self, *args, **kwargs):
        if str(self) == "/proc/self/io":
            raise FileNotFoundError(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_proc)
    assert comm.wire_bytes_written() is None
    with CollectiveLog() as log:
        dist.all_reduce(torch.zeros(2))
    assert log.count() == 1
    assert log.wire_bytes is None


# -- two ranks, the log in this process: rank 1 is a plain torch process beside it -----------------

#: What rank 1 runs: the same collectives as rank 0's, in the same order (torch only, no log).
_PEER = """
import datetime, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method=sys.argv[1], rank=1, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
dist.new_group([0])
dist.all_gather([torch.zeros(5), torch.zeros(5)], torch.ones(5))
(getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
    torch.zeros(10), torch.ones(5))
(getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
    torch.zeros(3), torch.ones(6))
dist.reduce_scatter(torch.zeros(3), [torch.ones(3), torch.ones(3)])
dist.all_to_all_single(torch.zeros(3), torch.ones(6), [1, 2], [4, 2])
dist.destroy_process_group()
"""


@pytest.mark.timeout(IMPORT_LIMIT_S + 120)  # rank 1 imports torch first (tests/peers.py)
def test_two_ranks_record_the_full_buffer_and_the_group_size(tmp_path):
    """With two ranks the full buffer differs from this rank's part: a list all-gather of 5 elements
    per rank moves 10, a flat one's output is 10, a flat reduce-scatter's input is 6 and a list
    one's inputs add up to 6; a collective over a group of one inside the world of two records 1,
    and so does DDP over that group (HSDP's shape: DDP over a subgroup), whose hook must reduce over
    DDP's group, not the world."""
    with rank0_beside_peer(_PEER, tmp_path, timeout_s=30, peer_exit_s=60):
        alone = dist.new_group([0])
        with CollectiveLog() as log:
            out = [torch.zeros(5), torch.zeros(5)]
            dist.all_gather(out, torch.zeros(5))
            gathered = torch.zeros(10)
            getattr(dist, flat_collective_name("all_gather"))(gathered, torch.zeros(5))
            getattr(dist, flat_collective_name("reduce_scatter"))(torch.zeros(3), torch.ones(6))
            dist.reduce_scatter(torch.zeros(3), [torch.ones(3), torch.ones(3)])
            # uneven: rank 0 sends 1 + 1 and receives 1 + 4; what it sends is its traffic
            received = torch.zeros(5)
            dist.all_to_all_single(received, torch.zeros(2), [1, 4], [1, 1])
            dist.all_reduce(torch.zeros(4), group=alone)
        assert out[1].sum() == 5 and gathered.sum() == 5  # rank 1's ones arrived
        assert received.tolist() == [0, 1, 1, 1, 1]
        ddp = DDP(nn.Linear(3, 2), process_group=alone)
        with CollectiveLog(ddp) as ddp_log:
            ddp(torch.ones(4, 3)).sum().backward()
        assert torch.equal(ddp.module.bias.grad, torch.full((2,), 4.0))  # divided by 1, not 2
    assert log.records == [
        Collective("all_gather", "float32", 10, 40, None, 2),
        Collective("all_gather", "float32", 10, 40, None, 2),
        Collective("reduce_scatter", "float32", 6, 24, None, 2),
        Collective("reduce_scatter", "float32", 6, 24, None, 2),
        Collective("all_to_all", "float32", 2, 8, None, 2),
        Collective("all_reduce", "float32", 4, 16, None, 1),
    ]
    assert ddp_log.records == [Collective("all_reduce", "float32", 8, 32, "backward", 1)]
