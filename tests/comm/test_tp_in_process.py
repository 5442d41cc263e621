"""guide.comm.tp and guide.tensor_parallel in one process: a fake world of ranks (torch's ``fake``
process-group backend: every collective returns at once, nothing is computed), so the real
``parallelize_module`` + ``fully_shard`` step issues its real calls, and the models of those calls
are checked against them here, where the mutation session sees them (the pages and
tests/test_tp_fsdp2.py run the same comparison in real gloo ranks).

Each test names the bug it exists for: an all-gather counted by its input, every collective filed
as forward, the layout of dp rank 0 given for every dp rank, the MLP's backward all-reduces left
out of the model...
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from guide.comm.tp import MeshLog, tp_fsdp2_step, tp_step
from guide.layout import param_layouts
from guide.model import ModelConfig
from guide.tensor_parallel import build_tp_model, expected_layout, plan_kinds, tp_local_shapes

CFG = ModelConfig(vocab=32, d_model=16, n_layers=2, n_heads=4, d_mlp=32, max_seq=8)
PLAN = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
        "proj": RowwiseParallel(), "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


@pytest.fixture
def fake_world():
    """``fake_world(rank, world_size)``: this process is that rank of a fake world."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(rank: int, world_size: int) -> None:
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation
        yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def key(c) -> tuple:
    return c.kind, c.dtype, c.numel, c.phase, c.group_size


def multiset(records) -> dict:
    return dict(sorted(collections.Counter(map(key, records)).items()))


def test_a_functional_all_gather_is_counted_by_its_output(fake_world) -> None:
    """DTensor's funcol all-gather gets this rank's piece; the full buffer is group size x it."""
    fake_world(0, 4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    with MeshLog() as log:
        out = funcol.all_gather_tensor(torch.ones(3), 0, (mesh, 1))
    assert out.shape == (6,)
    assert [(c.kind, c.numel, c.bytes, c.group_size) for c, _ in log.records] == \
        [("all_gather", 6, 24, 2)], "a functional all-gather must be counted by its output (6)"
    assert log.records[0][1] == (0, 1)


def test_c10d_calls_are_counted_by_their_full_buffer(fake_world) -> None:
    fake_world(0, 2)
    with MeshLog() as log:
        dist.all_gather_into_tensor(torch.empty(8), torch.ones(4))
        dist.reduce_scatter_tensor(torch.empty(5), torch.ones(10))
        dist.all_reduce(torch.ones(7, dtype=torch.bfloat16))
    assert [(c.kind, c.dtype, c.numel, c.group_size) for c, _ in log.records] == [
        ("all_gather", "float32", 8, 2), ("reduce_scatter", "float32", 10, 2),
        ("all_reduce", "bfloat16", 7, 2)]


class _AllReduceGrad(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient (as a ColwiseParallel input does)."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x.detach().clone())
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def test_a_collective_issued_in_backward_is_filed_as_backward(fake_world) -> None:
    fake_world(0, 2)
    with MeshLog() as log:
        x = torch.ones(3, requires_grad=True)
        _AllReduceGrad.apply(x).sum().backward()
    assert [c.phase for c, _ in log.records] == ["forward", "backward"]


def test_by_dim_files_each_call_under_its_dimension_and_refuses_another_group(fake_world) -> None:
    """On a (2, 2) mesh both groups have 2 ranks: only the ranks tell dp from tp."""
    fake_world(0, 4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    with MeshLog() as log:
        dist.all_reduce(torch.ones(2), group=mesh.get_group("dp"))
        dist.all_reduce(torch.ones(3), group=mesh.get_group("tp"))
        dist.all_reduce(torch.ones(5), group=mesh.get_group("tp"))
    assert {d: [c.numel for c in cs] for d, cs in log.by_dim(mesh).items()} == \
        {"dp": [2], "tp": [3, 5]}
    with MeshLog() as log:
        dist.all_reduce(torch.ones(4))  # the whole world: no dimension of the mesh
    with pytest.raises(ValueError, match=r"all_reduce of 4 elements ran on ranks \(0, 1, 2, 3\)"):
        log.by_dim(mesh)


def test_a_2d_step_issues_what_the_models_say_and_holds_the_expected_layout(fake_world) -> None:
    """Rank 5 of a (3, 2) mesh (dp rank 2, the last), one forward + backward of the TP + FSDP2
    model: the tp group's calls are :func:`tp_step`'s (forward and backward), the dp group's
    :func:`tp_fsdp2_step`'s, and every parameter's placements and local shape are
    :func:`expected_layout`'s at this rank's dp coordinate (16 rows over 3 dp ranks: 6, 6, 4)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    rank = 5  # one 2-D step per process: a second one, in a new fake world, met the first's
    # destroyed groups in DTensor's caches ("Could not resolve the process group ... 5")
    fake_world(rank, 6)
    mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("dp", "tp"))
    dp_rank = mesh.get_coordinate()[0]
    assert dp_rank == rank // 2
    reference = build_tp_model(CFG)
    model = build_tp_model(CFG)
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    tokens = torch.randint(0, CFG.vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    with MeshLog() as log:
        model(tokens[:, :-1]).sum().backward()
    got = log.by_dim(mesh)
    assert multiset(got["tp"]) == multiset(tp_step(reference, plan_kinds(PLAN), tokens=16, tp=2))
    assert multiset(got["dp"]) == multiset(
        tp_fsdp2_step(reference, tp_local_shapes(reference, PLAN, 2), 3))
    want = expected_layout(reference, PLAN, 3, 2, dp_rank)
    wrong = {lay.name: ((lay.placements, lay.local_shape), want[lay.name])
             for lay in param_layouts(model, rank)
             if (lay.placements, lay.local_shape) != want[lay.name]}
    assert wrong == {}, f"dp rank {dp_rank}: (held, expected) {wrong}"


def test_every_group_form_funcol_takes_is_resolved_to_its_ranks_and_the_log_restores(
        fake_world) -> None:
    """funcol takes a ``(mesh, dim)`` pair, a 1-D DeviceMesh or a group name; c10d a group or
    ``None`` (the world). Closing the log puts torch's functions back."""
    fake_world(1, 4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    originals = (dist.all_reduce, funcol.all_reduce, dist.all_gather_into_tensor)
    with MeshLog() as log:
        funcol.all_reduce(torch.ones(2), "sum", mesh["tp"])
        funcol.all_reduce(torch.ones(3), "sum", mesh.get_group("dp").group_name)
        funcol.all_reduce(torch.ones(4), "sum", (mesh, 0))
        dist.all_reduce(torch.ones(5))
    assert [(c.numel, ranks) for c, ranks in log.records] == [
        (2, (0, 1)), (3, (1, 3)), (4, (1, 3)), (5, (0, 1, 2, 3))]
    assert (dist.all_reduce, funcol.all_reduce, dist.all_gather_into_tensor) == originals
    assert MeshLog._active is None
    with MeshLog() as again:
        pass
    assert again.records == []
    with pytest.raises(ValueError, match=r"^a all_reduce of 5 elements ran on ranks \(0, 1, 2, "
                                         r"3\), which is no dimension of this rank's mesh "
                                         r"\{\(1, 3\): 'dp', \(0, 1\): 'tp'\}\.$"):
        log.by_dim(mesh)


def test_a_name_this_torch_lacks_is_skipped_and_the_rest_still_counted(
        fake_world, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.9 has no ``all_gather_single`` (the compat runs): the log wraps every other name."""
    fake_world(0, 2)
    monkeypatch.delattr(dist, "all_gather_single", raising=False)
    with MeshLog() as log:
        dist.all_reduce(torch.ones(3))
    assert [(c.kind, c.numel) for c, _ in log.records] == [("all_reduce", 3)]
    assert not hasattr(dist, "all_gather_single")


def test_a_nested_log_is_refused_with_the_fix() -> None:
    with MeshLog():
        with pytest.raises(ValueError, match=r"^a MeshLog is already active in this process; "
                                             r"close it first\.$"):
            MeshLog().__enter__()
