"""guide.memory.cli: the guide-memory table is predict's numbers, labelled; nonsense exits 2 with
one line; the command is reachable as ``python -m guide.memory`` and as the console script."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from guide.memory import PRESETS, GiB, activation_bytes, per_rank_state_bytes
from guide.memory.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _row(out: str, label: str, n: int) -> list[str]:
    match = re.search(rf"^{re.escape(label)} +{n:,} (.*)$", out, re.MULTILINE)
    assert match, (label, n, out)
    return match.group(1).split()


def test_table_is_predicts_numbers_with_buckets(capsys):
    assert main(["--preset", "llama-3-70b", "-N", "1", "8", "--strategy", "ddp", "fsdp2",
                 "--precision", "bf16_mixed"]) == 0
    out = capsys.readouterr().out
    assert "70,553,706,496 parameters" in out
    assert "total = params + grads + optimizer + buckets" in out
    shapes = PRESETS["llama-3-70b"].param_shapes()
    for key, label in (("ddp", "DDP"), ("fsdp2", "FSDP2")):
        sb = per_rank_state_bytes(shapes, key, 8, "bf16_mixed", "adamw", ddp_buckets=True)
        want = [f"{v / GiB:,.2f}" for v in (sb.params, sb.grads, sb.optimizer, sb.buckets, sb.total)]
        assert _row(out, label, 8) == want
    assert _row(out, "DDP", 8)[3] != "0.00"  # DDP's buckets are in the table, and labelled


def test_activations_column(capsys):
    main(["--preset", "llama-3-8b", "-N", "8", "--strategy", "fsdp2", "--seq-len", "4096"])
    out = capsys.readouterr().out
    act = activation_bytes(PRESETS["llama-3-8b"], 4096, 1)
    assert "activations" in out and _row(out, "FSDP2", 8)[4] == f"{act / GiB:,.2f}"


def test_bucket_view_drops_the_buckets(capsys):
    base = ["--params", "1e9", "-N", "4", "--strategy", "ddp", "--precision", "fp32"]
    main(base)
    with_buckets = _row(capsys.readouterr().out, "DDP", 4)
    main([*base, "--bucket-view"])
    without = _row(capsys.readouterr().out, "DDP", 4)
    assert with_buckets[-1] == f"{20e9 / GiB:,.2f}"  # 16 B state + 4 B buckets per parameter
    assert without[-1] == f"{16e9 / GiB:,.2f}" and without[3] == "0.00"


@pytest.mark.parametrize(("argv", "match"), [
    (["--preset", "llama-9"], "unknown preset"),
    (["--params", "7e9", "-N", "0"], "world_size"),
    (["--params", "-5"], "positive"),
    (["--hidden", "64", "--vocab", "10"], "--layers"),
    (["--params", "7e9", "--strategy", "zero9"], "unknown strategy"),
    (["--params", "7e9", "--seq-len", "128"], "architecture"),
    (["--preset", "gpt2-xl", "--seq-len", "2048"], "max_seq_len=1,024"),
    (["--preset", "llama-3-8b", "--seq-len", "128", "--micro-batch", "0"], "micro_batch"),
    (["--params", "7e9", "--optimizer", "adam"], "unknown optimizer"),
])
def test_rejects_nonsense(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1


def test_python_dash_m():
    run = subprocess.run([sys.executable, "-m", "guide.memory", "--params", "7e9", "-N", "8"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "7,000,000,000 parameters" in run.stdout


def test_console_script_points_at_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["guide-memory"].partition(":")
    assert getattr(importlib.import_module(module), name) is main
