"""The browser calculator's input checks, rounding and assumptions line are the command's, sentence
for sentence and digit for digit; it takes every option of the command that is an input.

``docs/_static/memory_widget.js`` runs in Node (``tests/memory/widget_node.js`` loads it without a
page) and every answer is compared with :mod:`guide.memory.inputs`, :mod:`guide.memory.display` and
``guide-memory`` itself: bad input (the inputs that crashed, hung or changed a number), ties at
half a hundredth, an exact fit, the line of assumptions, LoRA fine-tuning, CPU offload, and one
field per option of ``guide-memory``'s parser. No browser needed: these
run in the fast suite (the page-level behaviour is in ``tests/test_calculator_widget.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from guide.memory import PRECISIONS, PRESETS
from guide.memory import cli as memory_cli
from guide.memory.cli import main
from guide.memory.display import fixed, format_bytes, smallest_text
from guide.memory.inputs import (
    BOUNDS,
    check_heads,
    check_param_count,
    check_seq_len,
    parse_gib,
    parse_int,
    unknown,
)
from guide.memory.offload import offload_traffic
from guide.memory.widget import WIDGET_JS
from guide.optimizers import OPTIMIZERS

HARNESS = Path(__file__).with_name("widget_node.js")
GiB = 2**30


def js(*calls: list) -> list:
    """Each call ``[name, *args]`` of ``MemoryWidget.model``, run in Node; BigInts as strings
    (pass one as ``"123n"``)."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node not found: install Node.js (apt-get install -y nodejs) to test the "
                    "browser calculator's JavaScript.")
    run = subprocess.run([node, str(HARNESS), str(WIDGET_JS)], input=json.dumps(list(calls)),
                         text=True, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def py_error(fn, *args) -> str | None:
    try:
        fn(*args)
    except ValueError as err:
        return str(err)
    return None


def cli(argv: list[str]) -> tuple[str, dict | None]:
    """(the first line guide-memory prints, its --json report)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    first = out.getvalue().splitlines()[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return first, json.loads(out.getvalue())


# -- bad input: one sentence, the same on both sides -------------------------------------------

TEXTS = ["", "  ", "two", "inf", "-inf", "nan", "NaN", "0x10", "1e", ".", "-", "0", "-0", "-8",
         "-" + "9" * 31, "9" * 31, "2.5", "0.5", "1e-5", "1.5e3", "70e9", "7.5e9", "+8", "1,024",
         "4_096", " 16 ", "1e400", "1e30", "1e9999999999", "1e-9999999999", "9007199254740991",
         "9007199254740992", "9007199254740993", "512", "513", "16384", "16385", "65536",
         "100000000", "1000000000000", "100000", "00012", "12.000", "1.20e1"]


@pytest.mark.parametrize("key", sorted(BOUNDS))
def test_whole_numbers_are_read_and_refused_alike(key):
    answers = js(*(["parseInt", key, t] for t in TEXTS))
    for text, got in zip(TEXTS, answers):
        try:
            want = {"value": parse_int(key, text)}
        except ValueError as err:
            want = {"error": str(err)}
        assert got == want, (key, text)


def test_the_bounds_refuse_what_crashed_or_hung_the_command():
    """The inputs found by trying, each refused by a sentence that names the limit."""
    got = js(["parseInt", "params", "1e30"], ["parseInt", "params", "9007199254740993"],
             ["parseInt", "world_size", "100000000"], ["parseInt", "layers", "100000"],
             ["parseInt", "layers", "1000000000000"], ["parseInt", "shard_group", "0"])
    assert [g["error"] for g in got] == [
        "Parameters must be at most 9,007,199,254,740,991, got 1e30.",
        "Parameters must be at most 9,007,199,254,740,991, got 9007199254740993.",
        "Number of GPUs must be at most 16,384, got 100000000.",
        "Layers must be at most 512, got 100000.",
        "Layers must be at most 512, got 1000000000000.",
        "HSDP shard group must be at least 1, got 0."]


@pytest.mark.parametrize("text", ["80", "80.5", "0.001", "1048576", "1048577", "-80", "0", "",
                                  "inf", "nan", "1e400", "2e6", "eighty", "1e-400"])
def test_gpu_memory_is_read_and_refused_alike(text):
    try:
        want = {"value": parse_gib(text)}
    except ValueError as err:
        want = {"error": str(err)}
    assert js(["parseGib", text]) == [want]


def test_unknown_choices_name_the_value_and_the_options():
    got = js(["choiceErrors", {"precision": "fp64"}], ["choiceErrors", {"optimizer": "adam"}],
             ["choiceErrors", {"preset": "unknown-model"}], ["choiceErrors", {"precision": ""}],
             ["choiceErrors", {"precision": "bf16", "preset": "llama-3-8b"}])
    assert got[0] == [str(unknown("precision", "fp64", PRECISIONS))]
    assert got[0] == ['unknown precision "fp64"; choose one of fp32, bf16_mixed, bf16, '
                      'zero_mixed.']
    assert got[1] == [str(unknown("optimizer", "adam", OPTIMIZERS))]
    assert got[2][0].startswith('unknown model "unknown-model"; choose one of gpt2-xl, '
                                "llama-3.2-1b,") and "llama-3-8b" in got[2][0]
    assert got[3] == ['unknown precision ""; choose one of fp32, bf16_mixed, bf16, zero_mixed.']
    assert got[4] == []


def test_a_shared_link_with_an_unknown_model_gets_no_numbers():
    """M.parse of a link's values: an unknown model is an error, never another model's numbers."""
    raw = {"preset": "unknown-model", "precision": "bf16_mixed", "optimizer": "adamw",
           "checkpointing": "none", "strategy": "all", "seq_len": "4096", "micro_batch": "1",
           "world_size": "8", "shard_group": "8", "gpu": "H100 (80 GB)"}
    (got,) = js(["parse", raw])
    assert "cfg" not in got and got["errors"][0].startswith('unknown model "unknown-model"')


@pytest.mark.parametrize(("hidden", "heads", "kv"), [(4096, 30, None), (100, 3, None),
                                                     (4096, 32, 5), (4096, 32, 8)])
def test_shape_checks_read_alike(hidden, heads, kv):
    (got,) = js(["checkHeads", hidden, heads, kv])
    assert got == py_error(check_heads, hidden, heads, kv)


def test_sequence_and_size_checks_read_alike():
    got = js(["checkSeqLen", 9000, 8192, "llama-3-8b"], ["checkSeqLen", 8192, 8192, "llama-3-8b"],
             ["checkParamCount", f"{2**53}n"], ["checkParamCount", f"{2**53 - 1}n"])
    assert got == [py_error(check_seq_len, 9000, 8192, "llama-3-8b"), None,
                   py_error(check_param_count, 2**53), None]
    assert got[0] == ("Sequence length 9,000 is longer than llama-3-8b supports (8,192 "
                      "positions); use 8,192 or fewer.")


# -- one rounding rule: half to even, exactly ----------------------------------------------------

TIES = [2125 * GiB // 1000, 2375 * GiB // 1000, 2125 * GiB // 1000 + 1, 2375 * GiB // 1000 - 1,
        -2125 * GiB // 1000, 1280, 1029, 1030, 0, 1023, 1024, 3 * 2**40 + 2**37 + 1,
        3 * 2**40 + 2**37, 10**6 * 2**40 + 2**37 + 1, 2**70 + 2**37]


def test_bytes_round_half_to_even_on_both_sides():
    got = js(*(["formatBytes", f"{n}n"] for n in TIES))
    assert got == [format_bytes(n) for n in TIES]
    assert got[:2] == ["2.12 GiB", "2.38 GiB"]  # the widget said 2.13 for 2.125 (half up)


def test_llama_2_7b_activations_tie_reads_the_same():
    """The case found: llama-2-7b, N = 32, 512 tokens; whatever its activations come to, the
    widget's text is the command's."""
    cfg = {"preset": "llama-2-7b", "precision": "bf16_mixed", "optimizer": "adamw",
           "checkpointing": "none", "seq_len": 512, "micro_batch": 1, "world_sizes": [32],
           "shard_group": 8, "strategies": ["fsdp2"], "gpu": "H100 (80 GB)"}
    (rep,) = js(["fitReport", cfg])
    _, report = cli(["--preset", "llama-2-7b", "-N", "32", "--seq-len", "512",
                     "--strategy", "fsdp2", "--gpu", "H100 (80 GB)"])
    act = report["rows"][0]["activations"]
    assert int(rep["activations"]) == act
    assert js(["formatBytes", f"{act}n"]) == [format_bytes(act)]


def test_random_quotients_round_alike():
    rng = random.Random(34)
    cases = []
    for _ in range(400):
        scale = 2 ** rng.randint(1, 40)
        q = rng.randint(0, 10**18)
        n = q * scale // 100 + rng.choice([0, 0, scale // 200, 1, -1])  # many exact ties
        cases.append((n * rng.choice([1, -1]), scale, rng.choice([0, 1, 2, 3])))
    got = js(*(["fixed", f"{n}n", f"{s}n", d] for n, s, d in cases))
    assert got == [fixed(n, s, d) for n, s, d in cases]


def test_the_smallest_n_reads_as_gpus():
    assert js(["smallestText", None, 4096], ["smallestText", 16, 4096]) == [
        smallest_text(None, 4096), "16"]
    assert smallest_text(None, 4096) == "no N ≤ 4,096 GPUs"


# -- an exact fit fits ---------------------------------------------------------------------------

def test_an_exact_fit_fits_in_the_widget():
    base = {"preset": "llama-3-8b", "precision": "bf16_mixed", "optimizer": "adamw",
            "checkpointing": "none", "seq_len": 1024, "micro_batch": 1, "world_sizes": [8],
            "shard_group": 8, "strategies": ["fsdp2"]}
    (rep,) = js(["fitReport", {**base, "gpu": "H100 (80 GB)"}])
    total = int(rep["rows"][0]["total"])
    assert total < 2**53  # total / 2**30 is exact as a float, and floor() gives it back
    exact, short = js(["fitReport", {**base, "gib": total / GiB}],
                      ["fitReport", {**base, "gib": (total - 1) / GiB}])
    assert exact["capacity"] == str(total) and exact["rows"][0]["fits"] is True
    assert exact["rows"][0]["headroom"] == "0" and exact["smallest_world_size"]["fsdp2"] == 8
    assert short["rows"][0]["fits"] is False and short["smallest_world_size"]["fsdp2"] != 8
    _, py = cli(["--preset", "llama-3-8b", "-N", "8", "--seq-len", "1024", "--strategy",
                 "fsdp2", "--gpu-memory", repr(total / GiB)])
    assert py["rows"][0]["fits"] is True and py["rows"][0]["headroom"] == 0


# -- what the answer assumes, and LoRA ------------------------------------------------------------

ASSUMED = [
    ({"preset": "llama-3-8b", "precision": "bf16_mixed", "optimizer": "adamw",
      "checkpointing": "full", "seq_len": 8192, "micro_batch": 2},
     ["--preset", "llama-3-8b", "--seq-len", "8192", "--micro-batch", "2",
      "--activation-checkpointing", "full"]),
    ({"hidden": 512, "heads": 8, "kv_heads": 2, "layers": 4, "vocab": 1000, "mlp": 1024,
      "tied": True, "precision": "fp32", "optimizer": "sgd_momentum", "checkpointing": "none",
      "seq_len": 128, "micro_batch": 1},
     ["--hidden", "512", "--heads", "8", "--kv-heads", "2", "--layers", "4", "--vocab", "1000",
      "--mlp", "1024", "--tied", "--precision", "fp32", "--optimizer", "sgd_momentum",
      "--seq-len", "128"]),
    ({"params": 70_000_000_000, "precision": "bf16", "optimizer": "adamw",
      "checkpointing": "none"}, ["--params", "70e9", "--precision", "bf16"]),
]


@pytest.mark.parametrize(("cfg", "argv"), ASSUMED)
def test_the_widget_states_the_commands_assumptions(cfg, argv):
    """The line above the answer (the compact form's too) is guide-memory's first line."""
    full = {**cfg, "world_sizes": [8], "shard_group": 8, "strategies": ["fsdp2"],
            "gpu": "H100 (80 GB)"}
    (rep,) = js(["fitReport", full])
    first, _ = cli([*argv, "-N", "8", "--strategy", "fsdp2"])
    revived = {**rep, "parameters": f"{rep['parameters']}n"}
    assert js(["assumptions", full, revived]) == [first]


@pytest.mark.parametrize(("cfg", "argv"), [
    ({"preset": "llama-3-8b"}, ["--preset", "llama-3-8b"]),
    ({"preset": "gpt2-xl"}, ["--preset", "gpt2-xl"]),
    ({"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 3, "vocab": 100, "mlp": 96,
      "tied": False},
     ["--hidden", "64", "--heads", "4", "--kv-heads", "2", "--layers", "3", "--vocab", "100",
      "--mlp", "96"]),
])
@pytest.mark.parametrize(("rank", "base", "precision"), [(16, "bf16", "bf16_mixed"),
                                                         (3, "fp32", "fp32")])
def test_lora_in_the_widget_is_the_commands(cfg, argv, rank, base, precision):
    sizes = [1, 8, 7]
    full = {**cfg, "precision": precision, "optimizer": "adamw", "checkpointing": "none",
            "seq_len": 64, "micro_batch": 1, "world_sizes": sizes, "shard_group": 8,
            "strategies": ["fsdp2"], "gpu": "H100 (80 GB)", "lora_rank": rank,
            "base_precision": base}
    (rep,) = js(["fitReport", full])
    _, py = cli([*argv, "--precision", precision, "--lora-rank", str(rank), "--base-precision",
                 base, "-N", *map(str, sizes), "--strategy", "fsdp2", "--seq-len", "64"])
    want = {"rank": rank, "base_precision": base,
            "rows": [{k: (v if k == "N" else str(v)) for k, v in r.items()}
                     for r in py["lora"]["rows"]]}
    assert rep["lora"] == want


def test_a_parameter_count_has_no_lora():
    raw = {"preset": "count", "params": "7e9", "precision": "bf16_mixed", "optimizer": "adamw",
           "checkpointing": "none", "strategy": "all", "world_size": "8", "shard_group": "8",
           "gpu": "H100 (80 GB)", "lora_rank": "8", "base_precision": "bf16"}
    (got,) = js(["parse", raw])
    assert got["errors"] == ["LoRA rank adds adapters to every linear: choose a model or a "
                             "custom shape, not a parameter count."]


def test_a_custom_shape_takes_its_longest_sequence_like_the_command(capsys):
    raw = {"preset": "custom", "layers": "2", "hidden": "64", "heads": "4", "kv_heads": "",
           "vocab": "100", "mlp": "96", "max_seq_len": "1024", "precision": "bf16_mixed",
           "optimizer": "adamw", "checkpointing": "none", "strategy": "all", "seq_len": "2048",
           "micro_batch": "1", "world_size": "8", "shard_group": "8", "gpu": "H100 (80 GB)"}
    too_long, fine = js(["parse", raw], ["parse", {**raw, "seq_len": "1024"}])
    assert too_long["errors"] == [py_error(check_seq_len, 2048, 1024, "this architecture")]
    assert fine["cfg"]["max_seq_len"] == 1024
    with pytest.raises(SystemExit):
        main(["--hidden", "64", "--heads", "4", "--vocab", "100", "--mlp", "96", "--layers", "2",
              "--max-seq-len", "1024", "--seq-len", "2048"])
    assert capsys.readouterr().err.strip() == (
        "guide-memory: error: --seq-len 2,048 is longer than this architecture supports (1,024 "
        "positions); use 1,024 or fewer.")


def test_no_form_makes_the_widget_throw():
    """Random forms, typos and extremes included: each gets messages or a full report, never an
    exception, a NaN or an undefined."""
    rng = random.Random(2026)
    values = ["0", "1", "2", "8", "12", "-1", "2.5", "1e3", "inf", "", "x", "1e400", "9" * 25,
              "16384", "16385", "512", "1,024"]
    base = {"preset": "llama-3-8b", "precision": "bf16_mixed", "optimizer": "adamw",
            "checkpointing": "none", "strategy": "all", "seq_len": "4096", "micro_batch": "1",
            "world_size": "8", "shard_group": "8", "gpu": "H100 (80 GB)", "params": "70e9",
            "layers": "4", "hidden": "256", "heads": "4", "kv_heads": "", "vocab": "1000",
            "mlp": "512", "max_seq_len": "", "lora_rank": "", "base_precision": "bf16", "gib": "80"}
    forms = []
    for _ in range(150):
        raw = dict(base, preset=rng.choice(["llama-3-8b", "gpt2-xl", "custom", "count", "nope"]),
                   gpu=rng.choice(["H100 (80 GB)", "custom"]))
        for key in rng.sample(["seq_len", "micro_batch", "world_size", "shard_group", "params",
                               "layers", "hidden", "heads", "kv_heads", "vocab", "mlp",
                               "max_seq_len", "lora_rank", "gib"], 3):
            raw[key] = rng.choice(values)
        forms.append(raw)
    parsed = js(*(["parse", f] for f in forms))
    good = [p["cfg"] for p in parsed if "cfg" in p]
    assert all("errors" in p and p["errors"] for p in parsed if "cfg" not in p), parsed
    assert len(good) >= 10
    reports = js(*(["fitReport", c] for c in good))
    text = json.dumps([parsed, reports])
    assert '"error"' not in text and "NaN" not in text and "undefined" not in text


# -- guide-memory's three switches: the form takes each, and each changes the bytes alike ---------

FORM = {"preset": "llama-3-8b", "precision": "bf16_mixed", "optimizer": "adamw",
        "checkpointing": "none", "strategy": "all", "seq_len": "4096", "micro_batch": "1",
        "world_size": "8", "shard_group": "8", "gpu": "H100 (80 GB)", "attention": "fused",
        "bucket_view": "false"}
ARGV = ["--preset", "llama-3-8b", "--seq-len", "4096", "-N", "8", "--shard-group", "8",
        "--gpu", "H100 (80 GB)"]


def _form_report(raw: dict) -> dict:
    """What the widget shows for a form's raw values: M.parse, then M.fitReport."""
    (parsed,) = js(["parse", raw])
    assert "cfg" in parsed, parsed
    (rep,) = js(["fitReport", parsed["cfg"]])
    return rep


def _bytes(report: dict, field: str) -> dict:
    """``field`` of every row and the smallest N of every strategy, as integers (the widget's
    BigInts come as strings)."""
    def num(v):
        return v if v is None or isinstance(v, bool) else int(v)
    return {"rows": {(r["strategy"], r["N"]): num(r[field]) for r in report["rows"]},
            "smallest": {k: num(v) for k, v in report["smallest_world_size"].items()}}


ALL = {"ddp", "zero1", "fsdp2_no_reshard", "fsdp2", "hsdp"}


@pytest.mark.parametrize(("setting", "switch", "field", "changed"), [
    ({}, {"attention": "unfused"}, "activations", ALL),
    ({"checkpointing": "selective"}, {"attention": "unfused"}, "activations", ALL),
    ({}, {"bucket_view": "true"}, "buckets", {"ddp", "zero1"}),
    ({"preset": "count", "params": "70e9"}, {"bucket_view": "true"}, "buckets", {"ddp", "zero1"}),
])
def test_each_switch_changes_the_bytes_in_both(setting, switch, field, changed):
    """Flip one of guide-memory's switches: the command's bytes change, on the rows they should,
    and the widget's (from its form) change to the same bytes; a port that ignored the switch
    would keep the first answer and fail here."""
    flags = {"attention": "--unfused-attention", "bucket_view": "--bucket-view"}
    argv = (["--params", setting["params"], "-N", "8", "--gpu", "H100 (80 GB)"]
            if "params" in setting else
            [*ARGV, "--activation-checkpointing", setting.get("checkpointing", "none")])
    _, py_off = cli([*argv, "--strategy", "all"])
    _, py_on = cli([*argv, *(flags[k] for k in switch), "--strategy", "all"])
    js_off, js_on = _form_report({**FORM, **setting}), _form_report({**FORM, **setting, **switch})
    for part in (field, "total"):
        assert _bytes(js_off, part) == _bytes(py_off, part)
        assert _bytes(js_on, part) == _bytes(py_on, part)
    before, after = _bytes(py_off, field)["rows"], _bytes(py_on, field)["rows"]
    assert {k for (k, n), v in after.items() if v != before[(k, n)]} == changed
    assert (js_off["ddp_buckets"], js_on["ddp_buckets"]) == (py_off["ddp_buckets"],
                                                             py_on["ddp_buckets"])
    if "attention" in switch:
        assert js_on["attention"] == py_on["activations"]["attention"] == "unfused"


@pytest.mark.parametrize("model", [{}, {"preset": "count", "params": "70e9"}])
def test_the_papers_zero2_is_a_strategy_of_the_widget(model):
    """``--strategy zero2`` (the paper's stage 2, analytic) is a choice of the form, priced as
    the command prices it, and not FSDP2 without resharding (which the widget also calls
    ZeRO-2): parameters replicated, gradients and optimizer state split, nothing unsharded."""
    argv = ["--params", "70e9", "-N", "8", "--gpu", "H100 (80 GB)"] if model else ARGV
    raw = {**FORM, **model}
    (paper,) = _form_report({**raw, "strategy": "zero2"})["rows"]
    (rerun,) = _form_report({**raw, "strategy": "fsdp2_no_reshard"})["rows"]
    _, py = cli([*argv, "--strategy", "zero2", "fsdp2_no_reshard"])
    want = {r["strategy"]: r for r in py["rows"]}
    for got in (paper, rerun):
        assert {k: (v if k in ("strategy", "label", "N", "fits") else int(v))
                for k, v in got.items()} == want[got["strategy"]]
    assert paper["label"] == "ZeRO-2 (the paper's, analytic)"
    assert int(paper["total"]) != int(rerun["total"])
    assert int(paper["unsharded"]) == 0 and int(rerun["unsharded"]) > 0
    assert js(["parse", {**raw, "strategy": "all"}])[0]["cfg"]["strategies"] == [
        "ddp", "zero1", "fsdp2_no_reshard", "fsdp2", "hsdp"]  # "all" is --strategy all


def test_the_switches_reach_the_assumptions_line():
    """The line above the answer says which attention it priced, as guide-memory's does."""
    first, _ = cli([*ARGV, "--unfused-attention", "--strategy", "fsdp2"])
    (parsed,) = js(["parse", {**FORM, "attention": "unfused", "strategy": "fsdp2"}])
    (rep,) = js(["fitReport", parsed["cfg"]])
    assert js(["assumptions", parsed["cfg"], {**rep, "parameters": f"{rep['parameters']}n"}]) == [
        first]
    assert "unfused attention" in first


@pytest.mark.parametrize(("key", "value", "message"), [
    ("attention", "flash", 'unknown attention "flash"; choose one of fused, unfused.'),
    ("attention", "", 'unknown attention ""; choose one of fused, unfused.'),
    ("bucket_view", "1", 'unknown gradient_as_bucket_view "1"; choose one of false, true.'),
    ("bucket_view", "True", 'unknown gradient_as_bucket_view "True"; choose one of false, true.'),
    ("strategy", "zero3", 'unknown strategy "zero3"; choose one of all, ddp, zero1, '
                          "fsdp2_no_reshard, fsdp2, hsdp, zero2."),
    ("cpu_offload", "yes", 'unknown CPU offload "yes"; choose one of false, true.'),
    ("cpu_offload", "1", 'unknown CPU offload "1"; choose one of false, true.'),
    ("cpu_offload", "", 'unknown CPU offload ""; choose one of false, true.'),
])
def test_a_shared_link_with_a_bad_switch_gets_no_numbers(key, value, message):
    """A link's value for a new input is checked like the others: the message names the value
    and the choices, and M.parse gives no configuration (so no numbers)."""
    errors, parsed = js(["choiceErrors", {key: value}], ["parse", {**FORM, key: value}])
    assert errors == [message]
    assert "cfg" not in parsed and parsed["errors"] == [message]


# -- guide-memory --cpu-offload: FSDP2's CPUOffloadPolicy ---------------------------------------

CUSTOM = {"preset": "custom", "layers": "3", "hidden": "96", "heads": "6", "kv_heads": "2",
          "vocab": "1001", "mlp": "200", "max_seq_len": "", "tied": True}
CUSTOM_ARGV = ["--hidden", "96", "--heads", "6", "--kv-heads", "2", "--layers", "3", "--vocab",
               "1001", "--mlp", "200", "--tied", "--seq-len", "4096", "-N", "8", "--shard-group",
               "8", "--gpu", "H100 (80 GB)"]


def _offload_text(report: dict) -> dict:
    """The command's ``cpu_offload`` as the widget's report spells it (BigInts as strings)."""
    return {**report["cpu_offload"],
            "rows": [{k: (v if k == "N" else str(v)) for k, v in r.items()}
                     for r in report["cpu_offload"]["rows"]]}


@pytest.mark.parametrize(("setting", "argv"), [
    ({}, ARGV),
    ({"checkpointing": "full", "world_size": "64", "precision": "bf16"},
     [*ARGV[:-6], "-N", "64", "--shard-group", "8", "--gpu", "H100 (80 GB)",
      "--activation-checkpointing", "full", "--precision", "bf16"]),
    ({"preset": "gpt2-xl", "seq_len": "1024", "optimizer": "sgd", "world_size": "7"},
     ["--preset", "gpt2-xl", "--seq-len", "1024", "--optimizer", "sgd", "-N", "7",
      "--shard-group", "8", "--gpu", "H100 (80 GB)"]),
    (CUSTOM, CUSTOM_ARGV),
])
def test_cpu_offload_changes_the_bytes_in_both(setting, argv):
    """Turn CPU offload on in the form and on the command line: both reports gain the same
    offload bytes (the GPU keeps less, the host holds what it no longer keeps), and the rows of
    every strategy stay as they were, in both. A port that ignored the switch would give no
    offload table and fail here."""
    raw = {**FORM, **setting}
    _, py_off = cli([*argv, "--strategy", "all"])
    _, py_on = cli([*argv, "--strategy", "all", "--cpu-offload"])
    js_off = _form_report(raw)
    js_on = _form_report({**raw, "cpu_offload": "true"})
    assert _form_report({**raw, "cpu_offload": "false"}) == js_off
    assert "cpu_offload" not in py_off and "cpu_offload" not in js_off
    assert js_on["cpu_offload"] == _offload_text(py_on)
    for part in ("total", "params", "activations"):
        assert _bytes(js_on, part) == _bytes(js_off, part) == _bytes(py_on, part) \
            == _bytes(py_off, part)
    (row,) = py_on["cpu_offload"]["rows"]
    fsdp2 = next(r for r in py_on["rows"] if r["strategy"] == "fsdp2")
    assert row["gpu_without"] == fsdp2["total"] and 0 < row["gpu_saved"] == row["host"]
    assert row["gpu_with"] == row["gpu_without"] - row["gpu_saved"] \
        == fsdp2["activations"] + fsdp2["buffers"]
    assert row["to_device"] > 0 and row["to_host"] > 0


@pytest.mark.parametrize("preset", ["gpt2-xl", "llama-3.2-1b", "llama-3.1-405b"])
@pytest.mark.parametrize("precision", ["bf16_mixed", "fp32", "zero_mixed"])
def test_cpu_offload_in_the_widget_is_the_commands_for_each_n(preset, precision):
    """Several N at once (as the command takes them), N = 1, 7 (uneven shards), 4,096."""
    sizes = [1, 7, 8, 4096]
    cfg = {"preset": preset, "precision": precision, "optimizer": "adamw",
           "checkpointing": "selective", "seq_len": 512, "micro_batch": 2, "world_sizes": sizes,
           "shard_group": 8, "strategies": ["fsdp2"], "gpu": "H100 (80 GB)", "cpu_offload": True}
    (rep,) = js(["fitReport", cfg])
    _, py = cli(["--preset", preset, "--precision", precision, "--seq-len", "512",
                 "--micro-batch", "2", "--activation-checkpointing", "selective", "-N",
                 *map(str, sizes), "--strategy", "fsdp2", "--cpu-offload"])
    assert rep["cpu_offload"] == _offload_text(py)


@pytest.mark.parametrize(("rank", "reshard", "n"), [(0, True, 8), (3, True, 8), (6, False, 7),
                                                    (0, False, 1)])
def test_offload_traffic_and_units_are_the_pythons(rank, reshard, n):
    """The port's fully_shard units and host-device bytes, rank and resharding included."""
    arch = PRESETS["gpt2-xl"]
    units = [[list(s) for s in u] for u in arch.fsdp2_units()]
    got_units, traffic = js(["fsdp2Units", dataclasses.asdict(arch)],
                            ["offloadTraffic", units, n, "bf16_mixed", rank, reshard])
    assert got_units == units
    want = offload_traffic(arch.fsdp2_units(), n, "bf16_mixed", rank=rank,
                           reshard_after_forward=reshard)
    assert traffic == {k: str(v) if k in ("to_device", "to_host") else v
                       for k, v in dataclasses.asdict(want).items()}


def test_a_parameter_count_has_no_cpu_offload(capsys):
    raw = {**FORM, "preset": "count", "params": "7e9", "cpu_offload": "true"}
    (got,) = js(["parse", raw])
    assert got["errors"] == ["CPU offload prices FSDP2's shards unit by unit: choose a model or "
                             "a custom shape, not a parameter count."]
    with pytest.raises(SystemExit):
        main(["--params", "7e9", "--cpu-offload"])
    assert "--cpu-offload prices FSDP2's shards unit by unit" in capsys.readouterr().err
    (off,) = js(["parse", {**raw, "cpu_offload": "false"}])
    assert "cfg" in off and not off["cfg"].get("cpu_offload")


# -- every option of guide-memory is an input of the widget --------------------------------------

#: guide-memory's options that are not inputs of the model, so the widget has no field for them.
EXEMPT = {
    "--help": "argparse's own help",
    "--json": "the output's format (the widget draws its table; tests read fitReport directly)",
    "--unit": "display only: one unit for every value of the table (cli.main's format_bytes "
              "calls); the widget gives each value its own unit, as --unit auto does",
}


def _options(parser) -> set[str]:
    """Each option of an argparse parser, by its first long name (``--world-size``, not
    ``-N``), read from the parser's actions."""
    return {next(o for o in a.option_strings if o.startswith("--"))
            for a in parser._actions if a.option_strings}


def test_every_option_of_the_command_is_a_widget_input():
    """guide-memory's parser, read as it is: each option is a field of the widget's form (and a
    parameter of its shared link), except the few in EXEMPT; and no input stands for an option
    the command no longer has."""
    options = _options(memory_cli._parser())
    inputs, link = js(["formInputs"], ["linkDefaults"])
    missing = options - set(inputs.values()) - set(EXEMPT)
    assert not missing, f"guide-memory has {sorted(missing)} but the widget has no input for " \
        "it: add a field to docs/_static/memory_widget.js's FIELDS (with its option), or, if it " \
        "is not an input of the model, to EXEMPT with the reason"
    assert set(inputs.values()) <= options, sorted(set(inputs.values()) - options)
    assert len(set(inputs.values())) == len(inputs)  # one field per option
    assert set(EXEMPT) <= options and not set(EXEMPT) & set(inputs.values())
    assert set(inputs) == set(link)  # every field travels in a shared link
    assert "--cpu-offload" in inputs.values() and "--gpu-memory" in inputs.values()


def test_a_new_option_without_a_widget_input_is_caught(monkeypatch):
    """Add an option to the command's parser: the test above fails, naming it."""
    made = memory_cli._parser

    def more():
        parser = made()
        parser.add_argument("--grad-accum", help="micro-batches per optimizer step")
        return parser

    monkeypatch.setattr(memory_cli, "_parser", more)
    with pytest.raises(AssertionError, match=r"\['--grad-accum'\] but the widget has no input"):
        test_every_option_of_the_command_is_a_widget_input()
