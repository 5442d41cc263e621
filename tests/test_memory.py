"""guide.memory (the per-rank model-state model, the calculator) and guide.model_state (measuring it).

Most tests are arithmetic. One launches 3 gloo ranks (uneven shards, ZeRO-1's uneven partition) and
compares every rank's measured bytes with the model, byte for byte; a few prove that the
comparison would notice a wrong model (no padding, no greedy partition, double counting).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import guide
from guide import memory, model_state, sharding
from guide.data import synthetic_batches
from guide.memory import GB, GiB, Architecture, StateBytes, per_rank_state_bytes
from guide.model import ModelConfig, build_model
from guide.training import make_optimizer, train_steps

# -- ZeRO's formulas and bytes per parameter ------------------------------------------------------


def test_zero_paper_figure_1():
    """ZeRO (arXiv 1910.02054) Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 -> 120 / 31.4 / 16.6 / 1.9 GB."""
    got = [memory.state_bytes_for_count(7_500_000_000, s, 64, "zero_mixed", "adamw").total / GB
           for s in ("ddp", "zero1", "zero2", "fsdp2")]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize(("precision", "optimizer", "bytes_per_param"), [
    ("fp32", "adamw", 16), ("bf16_mixed", "adamw", 16), ("zero_mixed", "adamw", 16),
    ("bf16", "adamw", 8), ("fp32", "sgd", 8), ("fp32", "sgd_momentum", 12), ("bf16", "sgd", 4),
])
def test_bytes_per_parameter(precision, optimizer, bytes_per_param):
    assert memory.state_bytes_for_count(1000, "ddp", 1, precision, optimizer).total == \
        1000 * bytes_per_param


def test_seed_notebook_numbers():
    """The seed's code (8 B/param) gave 521.5 GiB for 70B DDP; 16 B/param is 1,043.1 GiB, and
    its "~140 GiB at N=8" is 140 GB = 130.4 GiB."""
    psi = 70_000_000_000
    assert round(memory.state_bytes_for_count(psi, "ddp", 1, "bf16").total / GiB, 1) == 521.5
    assert round(memory.state_bytes_for_count(psi, "ddp", 8, "bf16_mixed").total / GiB, 1) == 1043.1
    n8 = memory.state_bytes_for_count(psi, "fsdp2", 8, "bf16_mixed").total
    assert n8 == 140 * GB and round(n8 / GiB, 1) == 130.4


# -- the shape-based model -------------------------------------------------------------------------


def test_fsdp2_pads_params_and_grads_but_not_optimizer_state():
    # 5 rows over 4 ranks: torch.chunk gives 2, 2, 1, 0 rows; every rank allocates 2 rows.
    ranks = memory.state_bytes_by_rank([(5, 3)], "fsdp2", 4, "fp32", "adamw")
    assert [r.params for r in ranks] == [2 * 3 * 4] * 4
    assert [r.grads for r in ranks] == [2 * 3 * 4] * 4
    assert [r.optimizer for r in ranks] == [2 * 3 * 8 + 4, 2 * 3 * 8 + 4, 1 * 3 * 8 + 4, 4]
    assert per_rank_state_bytes([(5, 3)], "fsdp2", 4, "fp32", "adamw") == ranks[0]
    # reshard_after_forward=False holds the same state between steps
    assert memory.state_bytes_by_rank([(5, 3)], "fsdp2_no_reshard", 4) == ranks


def test_fsdp2_is_one_nth_of_ddp_when_shapes_divide():
    shapes = [(64, 32), (64,), (128, 64)]
    ddp = per_rank_state_bytes(shapes, "ddp", 1, "fp32", "sgd_momentum")
    for n in (1, 2, 4, 8, 16, 32):
        fsdp = per_rank_state_bytes(shapes, "fsdp2", n, "fp32", "sgd_momentum")
        assert fsdp.total * n == ddp.total, n


def test_zero1_partition_is_greedy_largest_first():
    # sizes 10, 7, 5, 5, 3 -> r0: 10, r1: 7, r1: 5 (7 < 10), r0: 5 (10 < 12), r1: 3 (15 > 12)
    shapes = [(10,), (7,), (5,), (5,), (3,)]
    assert memory.zero1_partition(shapes, 2) == [[0, 3], [1, 2, 4]]
    ranks = memory.state_bytes_by_rank(shapes, "zero1", 2, "fp32", "adamw")
    assert [r.optimizer for r in ranks] == [15 * 8 + 2 * 4, 15 * 8 + 3 * 4]
    assert all(r.params == 30 * 4 and r.grads == 30 * 4 for r in ranks)


def test_zero1_floor_is_the_largest_tensor():
    """One big tensor cannot be split by ZeRO-1: its owner keeps all of its optimizer state."""
    shapes = [(1000, 1000)] + [(10,)] * 10
    top = per_rank_state_bytes(shapes, "zero1", 8, "fp32", "adamw")
    assert top.optimizer == 1000 * 1000 * 8 + 4


def test_ddp_buckets_are_one_more_gradient_copy():
    shapes = [(3, 4), (5,)]
    assert memory.ddp_bucket_bytes(shapes, "fp32") == per_rank_state_bytes(shapes, "ddp", 2).grads
    assert memory.ddp_bucket_bytes(shapes, "bf16") == 17 * 2


def test_unsharded_param_bytes_pads_to_n_chunks():
    assert memory.unsharded_param_bytes([(5, 3)], 4, compute_dtype_bytes=2) == 8 * 3 * 2


def test_statebytes_is_frozen_and_adds():
    a = StateBytes(1, 2, 3)
    assert (a + a).total == 12
    with pytest.raises(AttributeError):
        a.params = 5  # type: ignore[misc]


# -- architectures and presets ---------------------------------------------------------------------

PUBLISHED = {  # parameter counts as the models' own releases report them
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b": 7_241_732_096,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts(name):
    assert memory.PRESETS[name].n_params == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(memory.PRESETS))
def test_fsdp_units_partition_the_parameters(name: str) -> None:
    """Root + one unit per layer hold every parameter once, and every layer has the same shapes."""
    arch = memory.PRESETS[name]
    root, layers = arch.fsdp_units()
    assert len(layers) == arch.layers and all(layer == layers[0] for layer in layers)
    assert sorted(root + [s for layer in layers for s in layer]) == sorted(arch.param_shapes())
    assert (arch.vocab, arch.hidden) in root


def test_tied_embeddings_drop_the_head():
    arch = Architecture(vocab=100, hidden=8, layers=1, heads=2, mlp=16)
    tied = Architecture(vocab=100, hidden=8, layers=1, heads=2, mlp=16, tied_embeddings=True)
    assert arch.n_params - tied.n_params == 100 * 8


def test_activation_memory_korthikanti():
    """sbh(34 + 5as/h) per layer; h=8192, L=80, a=64, s=8192, b=1: 170 GiB fused, 1,770 full."""
    arch = Architecture(vocab=1000, hidden=8192, layers=80, heads=64, mlp=28672)
    assert memory.activation_bytes(arch, 8192, 1, fused_attention=True) / GiB == pytest.approx(170.0)
    assert memory.activation_bytes(arch, 8192, 1, fused_attention=False) / GiB == \
        pytest.approx(1770.0)


# -- bad input: one clear ValueError ---------------------------------------------------------------


@pytest.mark.parametrize(("call", "match"), [
    (lambda: per_rank_state_bytes([(4, 4)], "zero3", 2), "unknown strategy"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 0), "world_size"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2.0), "world_size"),
    (lambda: per_rank_state_bytes([(4, -4)], "ddp", 2), "integer >= 0"),
    (lambda: per_rank_state_bytes([], "ddp", 2), "empty"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp16"), "unknown precision"),
    (lambda: per_rank_state_bytes([(4, 4)], "ddp", 2, "fp32", "adam"), "unknown optimizer"),
    (lambda: memory.state_bytes_for_count(-1, "ddp", 2), "n_params"),
    (lambda: Architecture(vocab=-1, hidden=8, layers=1, heads=2, mlp=8), "vocab"),
    (lambda: Architecture(vocab=10, hidden=8, layers=1, heads=3, mlp=8), "divisible"),
    (lambda: memory.activation_bytes(memory.PRESETS["llama-3-8b"], 0, 1), "seq_len"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the calculator --------------------------------------------------------------------------------


def test_cli_table(capsys):
    assert memory.main(["--preset", "llama-3-70b", "-N", "1", "8", "--strategy", "ddp", "fsdp2",
                        "--precision", "bf16_mixed"]) == 0
    out = capsys.readouterr().out
    assert "70,553,706,496 parameters" in out
    shapes = memory.PRESETS["llama-3-70b"].param_shapes()
    for strategy in ("ddp", "fsdp2"):  # each row: params, grads, optim, buckets, total (GiB)
        state = per_rank_state_bytes(shapes, strategy, 8, "bf16_mixed")
        buckets = memory.ddp_bucket_bytes(shapes, "bf16_mixed") if strategy == "ddp" else 0
        total = memory.per_rank_total_bytes(shapes, strategy, 8, "bf16_mixed")
        want = [f"{v / GiB:.2f}" for v in (state.params, state.grads, state.optimizer, buckets, total)]
        row = re.search(rf"^{strategy} +8 (.*)$", out, re.MULTILINE)
        assert row and row.group(1).split() == want, (strategy, want, out)


def test_cli_activations_column(capsys):
    memory.main(["--preset", "llama-3-8b", "-N", "8", "--strategy", "fsdp2", "--seq-len", "4096"])
    out = capsys.readouterr().out
    act = memory.activation_bytes(memory.PRESETS["llama-3-8b"], 4096, 1)
    assert f"{act / GiB:.2f}" in out and "activ" in out


def test_cli_ddp_buckets_and_bucket_view(capsys):
    base = ["--params", "1e9", "-N", "4", "--strategy", "ddp", "--precision", "fp32"]
    memory.main(base)
    with_buckets = capsys.readouterr().out
    memory.main([*base, "--bucket-view"])
    without = capsys.readouterr().out
    assert f"{20e9 / GiB:.2f}" in with_buckets  # 16 B state + 4 B buckets per parameter
    assert f"{16e9 / GiB:.2f}" in without and f"{20e9 / GiB:.2f}" not in without


@pytest.mark.parametrize(("argv", "match"), [
    (["--preset", "llama-9"], "unknown preset"),
    (["--params", "7e9", "-N", "0"], "world_size"),
    (["--params", "-5"], "positive"),
    (["--hidden", "64", "--vocab", "10"], "--layers"),
    (["--params", "7e9", "--strategy", "zero9"], "unknown strategy"),
    (["--params", "7e9", "--seq-len", "128"], "architecture"),
])
def test_cli_rejects_nonsense(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        memory.main(argv)
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


# -- measuring: single process ---------------------------------------------------------------------


def test_measure_counts_a_shared_storage_once():
    lin = nn.Linear(4, 3, bias=False)
    model = nn.Sequential(lin, nn.Linear(3, 4, bias=False))
    model[1].weight = nn.Parameter(lin.weight.data.t())  # same storage, transposed view: a tied weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    got = model_state.measure(model, opt)
    assert got.params == 12 * 4  # one storage, not two
    assert got.grads == 2 * 12 * 4  # the grads are separate tensors
    assert got.optimizer == 2 * (2 * 12 * 4 + 4)


def test_measure_rejects_non_modules():
    with pytest.raises(ValueError, match="nn.Module"):
        model_state.measure(torch.zeros(3))


# -- measuring: real ranks -------------------------------------------------------------------------


#: 127 and 17 rows do not split over 3 ranks: FSDP2 pads, ZeRO-1's partition is uneven.
_CFG = ModelConfig(vocab=127, d_model=32, n_layers=1, n_heads=2, d_mlp=64, max_seq=17)


def _ranks_worker(rank, strategies):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    batches = synthetic_batches(steps=1, batch_size=6, seq_len=8, vocab=_CFG.vocab, seed=0)
    out = {}
    for strategy in strategies:
        model = sharding.wrap(build_model(_CFG), "FSDP2" if strategy == "fsdp2" else "DDP", rank)
        opt = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                       lr=1e-2) if strategy == "zero1"
               else make_optimizer("adamw", model.parameters()))
        train_steps(model, opt, batches, rank.rank, rank.world_size)
        buckets = model_state.ddp_bucket_bytes(model) if strategy != "fsdp2" else 0
        out[strategy] = (model_state.measure(model, opt), buckets,
                         model_state.total_bytes(model, opt))
        del model, opt
    return out


@pytest.fixture(scope="module")
def three_ranks():
    shapes = model_state.param_shapes(build_model(_CFG))
    return shapes, guide.launch(_ranks_worker, 3, ("ddp", "zero1", "fsdp2"))


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp2"])
def test_measured_equals_model_on_every_rank(three_ranks, strategy):
    shapes, results = three_ranks
    want = memory.state_bytes_by_rank(shapes, strategy, 3, "fp32", "adamw")
    got = [r[strategy][0] for r in results]
    assert got == want
    if strategy != "fsdp2":
        assert all(r[strategy][1] == memory.ddp_bucket_bytes(shapes) for r in results)


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp2"])
def test_total_with_buckets_measured_equals_model(three_ranks, strategy):
    """model_state.total_bytes (state + DDP's buckets) on the fullest rank is
    memory.per_rank_total_bytes, and adds the buckets exactly where DDP is underneath."""
    shapes, results = three_ranks
    assert max(r[strategy][2] for r in results) == memory.per_rank_total_bytes(shapes, strategy, 3)
    assert all(r[strategy][2] == r[strategy][0].total + r[strategy][1] for r in results)


def test_a_model_without_padding_would_be_caught(three_ranks):
    """127 and 17 rows do not split over 3 ranks: an ideal 1/N model is measurably wrong."""
    shapes, results = three_ranks
    naive = math.ceil(sum(math.prod(s) for s in shapes) / 3) * 4
    assert results[0]["fsdp2"][0].params > naive


def test_a_model_with_an_even_zero1_split_would_be_caught(three_ranks):
    """ZeRO-1 splits by parameter, not evenly: the measured shares differ from 1/N."""
    shapes, results = three_ranks
    measured = [r["zero1"][0].optimizer for r in results]
    ideal = memory.state_bytes_for_count(sum(math.prod(s) for s in shapes), "zero1", 3).optimizer
    assert len(set(measured)) > 1 and max(measured) != ideal


# -- the example's guard ---------------------------------------------------------------------------

MEMORY_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plot_memory_model_state.py"


def test_example_fails_when_fsdp2_root_is_not_sharded(tmp_path):
    """Inject a real bug into the shipped example (``fully_shard`` on the blocks only: embeddings and
    head stay whole on every rank) and run it on N=2, fp32 AdamW only: the build must fail, naming the check,
    the strategy, N, the rank and the component."""
    from conftest import run_python

    source = MEMORY_EXAMPLE.read_text()
    for anchor, replacement in (
            ("WORLD_SIZES = (1, 2, 4)\n", "WORLD_SIZES = (2,)\n"),
            ('RUNS = (("fp32", "adamw"), ', 'RUNS = (("fp32", "adamw"),)  # '),
            ("    apply_fsdp2(model, mesh, **options)\n",
             "    from torch.distributed.fsdp import fully_shard\n"
             "    for block in model.blocks:\n"
             "        fully_shard(block, mesh=mesh, **options)\n")):
        assert source.count(anchor) == 1, f"anchor not found once in the example: {anchor!r}"
        source = source.replace(anchor, replacement)
    faulty = tmp_path / MEMORY_EXAMPLE.name
    faulty.write_text(source)
    run = run_python(faulty, timeout=180)
    assert run.returncode != 0, run.output[-2000:]
    assert re.search(r"CheckFailed: model-state bytes: FSDP2 at N=2, rank 0, fp32 adamw: params "
                     r"measured [\d,]+ B, model [\d,]+ B", run.output), run.output[-3000:]
