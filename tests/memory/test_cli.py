"""guide.memory.cli: the guide-memory table is the predicted numbers, labelled, in units a person can
read; ``--json`` carries every field as integer bytes; ``--activation-checkpointing full`` prices
the block inputs the activation-memory example measured; nonsense exits 2 with one line; the
command is reachable as ``python -m guide.memory`` and as the console script."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import time
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

from guide.memory import PRESETS, GiB, activation_bytes, per_rank_state_bytes
from guide.memory import autocast_weight_bytes, fsdp2_buffer_bytes
from guide.memory.activations import block_bytes, checkpointed_layer_bytes, logits_bytes
from guide.memory.architectures import Architecture
from guide.memory.cli import UNITS, format_bytes, main
from guide.memory.finetune import finetune_state_bytes, lora_shapes

ROOT = Path(__file__).resolve().parents[2]


def _row(out: str, label: str, n: int) -> list[str]:
    match = re.search(rf"^{re.escape(label)} +{n:,} (.*)$", out, re.MULTILINE)
    assert match, (label, n, out)
    return match.group(1).split()


def _json(argv: list[str], capsys) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_is_predicts_numbers_with_buckets(capsys):
    assert main(["--preset", "llama-3-70b", "-N", "1", "8", "--strategy", "ddp", "fsdp2",
                 "--precision", "bf16_mixed", "--unit", "GiB"]) == 0
    out = capsys.readouterr().out
    assert "70,553,706,496 parameters" in out
    assert ("predicted GiB per rank; total = params + grads + optimizer + buckets + autocast + "
            "buffers") in out
    arch = PRESETS["llama-3-70b"]
    shapes = arch.param_shapes()
    for key, label in (("ddp", "DDP"), ("fsdp2", "FSDP2")):
        sb = per_rank_state_bytes(shapes, key, 8, "bf16_mixed", "adamw", ddp_buckets=True)
        extra = (autocast_weight_bytes(arch, key, "bf16_mixed"),
                 fsdp2_buffer_bytes(arch, key, "bf16_mixed"))
        want = [f"{v / GiB:,.2f}" for v in (sb.params, sb.grads, sb.optimizer, sb.buckets,
                                            *extra, sb.total + sum(extra))]
        assert _row(out, label, 8) == want
    assert _row(out, "DDP", 8)[3] != "0.00"  # DDP's buckets are in the table, and labelled


def test_activations_column(capsys):
    main(["--preset", "llama-3-8b", "-N", "8", "--strategy", "fsdp2", "--seq-len", "4096",
          "--unit", "GiB"])
    out = capsys.readouterr().out
    act = activation_bytes(PRESETS["llama-3-8b"], 4096, 1)
    assert "activations" in out and _row(out, "FSDP2", 8)[4] == f"{act / GiB:,.2f}"


def test_bucket_view_drops_the_buckets(capsys):
    base = ["--params", "1e9", "-N", "4", "--strategy", "ddp", "--precision", "fp32",
            "--unit", "GiB"]
    main(base)
    with_buckets = _row(capsys.readouterr().out, "DDP", 4)
    main([*base, "--bucket-view"])
    without = _row(capsys.readouterr().out, "DDP", 4)
    assert with_buckets[-1] == f"{20e9 / GiB:,.2f}"  # 16 B state + 4 B buckets per parameter
    assert without[-1] == f"{16e9 / GiB:,.2f}" and without[3] == "0.00"


# -- units a person can read ------------------------------------------------------------------

@pytest.mark.parametrize(("n", "unit", "text"), [
    (0, "auto", "0 B"), (1023, "auto", "1,023 B"), (1024, "auto", "1.00 KiB"),
    (1536 * 2**10, "auto", "1.50 MiB"), (3 * 2**40, "auto", "3.00 TiB"),
    (5 * 2**50, "auto", "5,120.00 TiB"),
    (3 * 2**30, "GiB", "3.00"), (2**20, "KiB", "1,024.00"), (12_345, "B", "12,345"),
])
def test_format_bytes(n, unit, text):
    assert format_bytes(n, unit) == text


def test_format_bytes_refuses_an_unknown_unit():
    with pytest.raises(ValueError, match="unknown unit 'GB'; choose auto or one of B, KiB"):
        format_bytes(1, "GB")


def test_a_small_model_reads_in_small_units_not_zeros(capsys):
    """The issue's example: a ~200k-parameter model printed 0.00 in every GiB column."""
    argv = ["--hidden", "64", "--vocab", "128", "--layers", "4", "--heads", "4", "--mlp", "256",
            "-N", "1", "2", "--strategy", "ddp", "fsdp2", "--precision", "fp32"]
    main(argv)
    out = capsys.readouterr().out
    assert "0.00" not in out
    report = _json(argv, capsys)
    for row in report["rows"]:
        cells = _row(out, {"ddp": "DDP", "fsdp2": "FSDP2"}[row["strategy"]], row["N"])
        want = " ".join(format_bytes(row[c]) for c in ("params", "grads", "optimizer", "buckets",
                                                      "buffers", "total"))
        assert " ".join(cells) == want
    assert re.search(r"KiB|MiB", out)


def test_one_unit_for_all_columns(capsys):
    main(["--params", "7e9", "-N", "8", "--strategy", "fsdp2", "--unit", "MiB"])
    out = capsys.readouterr().out
    assert "predicted MiB per rank" in out
    assert not re.search(r"\d (KiB|MiB|GiB)", out)  # numbers only; the unit is in the title


# -- JSON for scripts ------------------------------------------------------------------------

def test_json_has_every_table_field_as_integer_bytes(capsys):
    report = _json(["--preset", "llama-3-8b", "-N", "1", "8", "--strategy", "ddp", "fsdp2",
                    "--seq-len", "8192", "--micro-batch", "2"], capsys)
    arch = PRESETS["llama-3-8b"]
    assert report["parameters"] == arch.n_params
    assert report["precision"] == "bf16_mixed" and report["optimizer"] == "adamw"
    assert report["ddp_buckets"] is True
    assert report["activations"] == {"seq_len": 8192, "micro_batch": 2, "attention": "fused",
                                     "checkpointing": "none", "norm": "fused",
                                     "formula": report["activations"]["formula"]}
    assert len(report["rows"]) == 4
    act = activation_bytes(arch, 8192, 2)
    for row in report["rows"]:
        sb = per_rank_state_bytes(arch.param_shapes(), row["strategy"], row["N"], "bf16_mixed",
                                  "adamw", ddp_buckets=True)
        autocast = autocast_weight_bytes(arch, row["strategy"], "bf16_mixed")
        buffers = fsdp2_buffer_bytes(arch, row["strategy"], "bf16_mixed")
        assert row == {"strategy": row["strategy"], "label": row["label"], "N": row["N"],
                       "shard_group": 1 if row["strategy"] == "ddp" else row["N"],
                       "params": sb.params, "unsharded": 0, "grads": sb.grads,
                       "optimizer": sb.optimizer, "buckets": sb.buckets, "activations": act,
                       "autocast": autocast, "buffers": buffers,
                       "total": sb.total + act + autocast + buffers}
        assert all(isinstance(row[c], int) for c in ("params", "grads", "optimizer", "buckets",
                                                     "activations", "total"))


def test_json_without_activations_says_none(capsys):
    report = _json(["--params", "7e9", "-N", "8"], capsys)
    assert report["activations"] is None and report["model"] == "parameter count"
    assert {r["activations"] for r in report["rows"]} == {0}


# -- activation checkpointing ------------------------------------------------------------------

def test_full_checkpointing_prices_block_inputs_plus_one_recomputed_block(capsys):
    arch = PRESETS["llama-3-8b"]
    base = ["--preset", "llama-3-8b", "-N", "8", "--strategy", "fsdp2", "--seq-len", "8192"]
    none = _json(base, capsys)["rows"][0]["activations"]
    full_report = _json([*base, "--activation-checkpointing", "full"], capsys)
    full = full_report["rows"][0]["activations"]
    layer = block_bytes(arch, 8192, 1, norm="fused", bytes_per_element=2)
    head = 8192 * (2 * 2 * arch.hidden + 4) + logits_bytes(arch, 8192, 1)  # final norm, logits
    assert none == arch.layers * layer + head
    assert full == arch.layers * checkpointed_layer_bytes(arch.hidden, 8192, 1, 2) + layer + head
    assert full_report["activations"]["checkpointing"] == "full"
    main([*base, "--activation-checkpointing", "full"])
    assert "full checkpointing (estimate)" in capsys.readouterr().out


# -- bad input ---------------------------------------------------------------------------------

ARCH = ["--hidden", "64", "--vocab", "10", "--heads", "1", "--mlp", "8"]


@pytest.mark.parametrize(("argv", "match"), [
    (["--preset", "llama-9"], 'unknown --preset "llama-9"; choose one of gpt2-xl, llama-3.2-1b'),
    (["--params", "7e9", "-N", "0"], "--world-size must be at least 1, got 0."),
    (["--params", "7e9", "-N", "-8"], "--world-size must be at least 1, got -8."),
    (["--params", "-5"], "--params must be at least 1, got -5."),
    (["--params", "0"], "--params must be at least 1, got 0."),
    (["--hidden", "64", "--vocab", "10"], "--layers"),
    (["--params", "7e9", "--strategy", "zero9"], 'unknown --strategy "zero9"; choose one of ddp'),
    (["--params", "7e9", "--seq-len", "128"], "architecture"),
    (["--preset", "gpt2-xl", "--seq-len", "2048"],
     "--seq-len 2,048 is longer than gpt2-xl supports (1,024 positions); use 1,024 or fewer."),
    (["--preset", "llama-3-8b", "--seq-len", "0"], "--seq-len must be at least 1, got 0."),
    (["--preset", "llama-3-8b", "--seq-len", "128", "--micro-batch", "0"],
     "--micro-batch must be at least 1, got 0."),
    (["--params", "7e9", "--optimizer", "adam"], 'unknown --optimizer "adam"; choose one of'),
    (["--preset", "llama-3-8b", "--seq-len", "128", "--activation-checkpointing", "offload"],
     'unknown --activation-checkpointing "offload"; choose one of none, full, selective'),
    (["--preset", "llama-3-8b", "--activation-checkpointing", "full"], "give --seq-len too"),
    (["--params", "7e9", "--unit", "GB"], 'unknown --unit "GB"; choose one of auto, B, KiB'),
    # found by trying: each crashed, hung or changed the number before the bounds
    (["--params", "inf"], '--params: "inf" is not a number; enter a whole number such as 70e9.'),
    (["--params", "nan"], '--params: "nan" is not a number'),
    (["--params", "1e400"], "--params must be at most 9,007,199,254,740,991, got 1e400."),
    (["--params", "1e30"], "--params must be at most 9,007,199,254,740,991, got 1e30."),
    (["--params", "9007199254740993"], "at most 9,007,199,254,740,991, got 9007199254740993."),
    (["--params", "2.5e0"], "--params must be a whole number, got 2.5e0."),
    (["--params", "7e9", "-N", "-" + "9" * 31],
     f"--world-size must be at least 1, got -{'9' * 31}."),
    (["--params", "7e9", "-N", "9" * 31], "--world-size must be at most 16,384"),
    (["--params", "7e9", "-N", "100000000", "--strategy", "all"], "--world-size must be at most"),
    (["--params", "7e9", "-N", *map(str, range(1, 10))], "at most 8 world sizes at once, got 9."),
    (["--preset", "llama-3-8b", "--shard-group", "0", "--strategy", "all", "--gpu-memory", "80"],
     "--shard-group must be at least 1, got 0."),
    ([*ARCH, "--layers", "1000000000000"], "--layers must be at most 512, got 1000000000000."),
    ([*ARCH, "--layers", "100000"], "--layers must be at most 512, got 100000."),
    ([*ARCH, "--layers", "two"], '--layers: "two" is not a number; enter a whole number such as'),
    (["--hidden", "4096", "--vocab", "10", "--heads", "30", "--mlp", "8", "--layers", "2"],
     "--heads (30) must divide --hidden (4096): try 64 heads of 64 dimensions."),
    (["--hidden", "1048576", "--vocab", "16777216", "--heads", "1", "--mlp", "4194304",
      "--layers", "512"], "parameters, more than 9,007,199,254,740,991: reduce a dimension."),
    (["--params", "7e9", "--gpu-memory", "inf"], '--gpu-memory must be a positive number of GiB'),
    (["--params", "7e9", "--gpu-memory", "1e400"],
     "--gpu-memory must be at most 1,048,576 GiB, got 1e400."),
    (["--params", "7e9", "--gpu-memory", "2e6"], "--gpu-memory must be at most 1,048,576 GiB"),
    (["--params", "7e9", "--gpu", "A100"], 'unknown --gpu "A100"; choose one of H100 (80 GB)'),
    (["--params", "7e9", "--precision", "fp64"],
     'unknown --precision "fp64"; choose one of fp32, bf16_mixed, bf16, zero_mixed.'),
    (["--params", "7e9", "--no-such-option"], "unrecognized arguments: --no-such-option (see"),
    (["--params"], "argument --params: expected one argument (see guide-memory --help)."),
])
def test_rejects_nonsense(argv, match, capsys):
    for extra in ([], ["--json"]):
        started = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main([*argv, *extra])
        assert time.monotonic() - started < 5  # refused at once, not after a long computation
        assert exc.value.code == 2
        captured = capsys.readouterr()
        assert match in captured.err and len(captured.err.strip().splitlines()) == 1
        assert captured.out == ""


def test_units_are_the_binary_ones():
    assert UNITS == {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def test_python_dash_m():
    run = subprocess.run([sys.executable, "-m", "guide.memory", "--params", "7e9", "-N", "8",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["parameters"] == 7_000_000_000


def test_console_script_points_at_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["guide-memory"].partition(":")
    assert getattr(importlib.import_module(module), name) is main


def test_lora_rank_prices_frozen_base_plus_adapters_by_hand(capsys):
    # Llama-style toy (no biases, SwiGLU): embeddings 8x4 + layer (norm 4, q k v o 4x4 each,
    # norm 4, MLP 4x4 three times) + final norm 4 + head 8x4 = 188 parameters, frozen, fp32.
    # Rank 1 adapters on the 7 linears: (1, 4) + (4, 1) each = 56 elements, fp32: params and
    # grads 224 B each; AdamW: 2 moments x 224 B + 14 step counters x 4 B.
    argv = ["--hidden", "4", "--vocab", "8", "--layers", "1", "--heads", "1", "--mlp", "4",
            "-N", "1", "2", "--lora-rank", "1", "--base-precision", "fp32",
            "--precision", "fp32", "--strategy", "fsdp2"]
    lora = _json(argv, capsys)["lora"]
    assert lora["rank"] == 1 and lora["base_precision"] == "fp32"
    want = dict(N=1, params=188 * 4 + 56 * 4, grads=56 * 4, optimizer=2 * 56 * 4 + 14 * 4)
    assert lora["rows"][0] == {**want, "total": sum(v for k, v in want.items() if k != "N")}
    # N = 2: rank 0's shard of every tensor (padded rows), the rows it owns of the moments.
    arch = Architecture(vocab=8, hidden=4, layers=1, heads=1, mlp=4)
    linears = [s for s in arch.fsdp2_units()[1] if len(s) == 2]
    sb = finetune_state_bytes(arch.param_shapes(), lora_shapes(linears, 1), 2,
                              frozen_precision="fp32", trainable_precision="fp32",
                              optimizer="adamw")[0]
    assert lora["rows"][1] == dict(N=2, params=sb.params, grads=sb.grads,
                                   optimizer=sb.optimizer, total=sb.model_state)
    assert main(argv) == 0
    assert "FSDP2, LoRA rank 1 on every linear, base frozen in fp32" in capsys.readouterr().out


def test_lora_rank_bf16_base_halves_the_frozen_bytes(capsys):
    common = ["--preset", "llama-3-8b", "-N", "8", "--lora-rank", "16", "--strategy", "fsdp2"]
    fp32 = _json([*common, "--base-precision", "fp32"], capsys)["lora"]["rows"][0]
    bf16 = _json(common, capsys)["lora"]["rows"][0]
    adapters = fp32["grads"]  # fp32 adapters (bf16_mixed): their params are their grads' size
    assert fp32["params"] - adapters == 2 * (bf16["params"] - adapters)


@pytest.mark.parametrize("argv, match", [
    (["--params", "7e9", "--lora-rank", "8"], "--lora-rank adds adapters to every linear"),
    (["--preset", "llama-3-8b", "--lora-rank", "0"], "--lora-rank must be at least 1, got 0."),
    (["--preset", "llama-3-8b", "--lora-rank", "8", "--base-precision", "int4"],
     'unknown --base-precision "int4"'),
])
def test_lora_rank_rejects_nonsense(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and match in capsys.readouterr().err


# -- one rounding rule: half to even, on the exact byte count ------------------------------------

@pytest.mark.parametrize(("n", "text"), [
    (2125 * 2**30 // 1000, "2.12 GiB"),  # 2.125 GiB exactly: a tie, 2 is even
    (2375 * 2**30 // 1000, "2.38 GiB"),  # 2.375: a tie, 8 is even
    (2125 * 2**30 // 1000 + 1, "2.13 GiB"),  # one byte past the tie
    (2375 * 2**30 // 1000 - 1, "2.37 GiB"),  # one byte short of it
    (-2125 * 2**30 // 1000, "-2.12 GiB"),
    (1280, "1.25 KiB"), (1029, "1.00 KiB"), (1030, "1.01 KiB"),  # 1029 B = 1.0049 KiB
    # past 2**53 a float cannot see the last byte: 3.125 TiB + 1 B rounds up, exactly
    (3 * 2**40 + 2**37 + 1, "3.13 TiB"), (3 * 2**40 + 2**37, "3.12 TiB"),
    (10**6 * 2**40 + 2**37 + 1, "1,000,000.13 TiB"),
])
def test_format_bytes_rounds_half_to_even_exactly(n, text):
    assert format_bytes(n) == text


def test_the_table_rounds_a_tie_half_to_even(capsys):
    """bf16 parameters of 1,140,850,688 elements: 2.125 GiB, printed 2.12 (half to even)."""
    assert main(["--params", "1140850688", "--precision", "bf16", "--strategy", "ddp",
                 "-N", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("DDP"))
    assert row.split()[2:4] == ["2.12", "GiB"], row


def test_an_exact_fit_fits(capsys):
    """A GPU of exactly the predicted bytes fits (<=, not <), with 0 B of headroom; one byte less
    does not."""
    total = _json(["--params", "7e9", "--strategy", "fsdp2", "-N", "8"], capsys)["rows"][0]["total"]
    assert total < 2**53  # so total / 2**30 is exact as a float, and floor() gives it back
    exact = _json(["--params", "7e9", "--strategy", "fsdp2", "-N", "8",
                   "--gpu-memory", repr(total / 2**30)], capsys)
    assert exact["capacity"] == total
    assert exact["rows"][0]["fits"] is True and exact["rows"][0]["headroom"] == 0
    assert exact["smallest_world_size"]["fsdp2"] == 8
    short = _json(["--params", "7e9", "--strategy", "fsdp2", "-N", "8",
                   "--gpu-memory", repr((total - 1) / 2**30)], capsys)
    assert short["rows"][0]["fits"] is False and short["smallest_world_size"]["fsdp2"] == 16


def test_the_smallest_n_reads_as_gpus(capsys):
    assert main(["--preset", "llama-3-70b", "--strategy", "ddp", "fsdp2", "-N", "8",
                 "--gpu", "H100 (80 GB)"]) == 0
    # FSDP2 needs 32, not 16: at 16 its state (65.71 GiB) plus its transient buffers (15.80 GiB,
    # guide.memory.transient) is 81.5 GiB, over the H100's 79.65 GiB
    assert "DDP: no N ≤ 4,096 GPUs; FSDP2: 32" in capsys.readouterr().out


def test_cpu_offload_moves_fsdp2s_model_state_to_the_host(capsys):
    """``--cpu-offload``: the GPU keeps FSDP2's buffers (and activations), the host the shards."""
    from guide.memory.offload import offload_memory, offload_traffic

    arch = PRESETS["llama-3-8b"]
    argv = ["--preset", "llama-3-8b", "-N", "8", "64", "--strategy", "fsdp2", "--cpu-offload"]
    report = _json(argv, capsys)
    fsdp2 = {r["N"]: r for r in report["rows"]}
    assert report["cpu_offload"]["estimate"] == "GPU-only, predicted"
    for row in report["cpu_offload"]["rows"]:
        n = row["N"]
        moved = offload_memory(arch, n, "bf16_mixed", "adamw")
        traffic = offload_traffic(arch.fsdp2_units(), n, "bf16_mixed")
        assert row["gpu_without"] == fsdp2[n]["total"]
        assert row["gpu_saved"] == row["host"] == moved.gpu_saved
        assert row["gpu_saved"] == fsdp2[n]["params"] + fsdp2[n]["grads"] + fsdp2[n]["optimizer"]
        assert row["gpu_with"] == fsdp2[n]["buffers"]  # no activations asked for
        assert (row["to_device"], row["to_host"]) == (traffic.to_device, traffic.to_host)
    assert "cpu_offload" not in _json(argv[:-1], capsys)
    assert main(argv) == 0 and "CPUOffloadPolicy (GPU-only, predicted)" in capsys.readouterr().out


def test_cpu_offload_needs_an_architecture(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--params", "8e9", "-N", "8", "--cpu-offload"])
    assert exc.value.code == 2 and "give an architecture" in capsys.readouterr().err
