"""
Mixed precision pitfalls: the built dtype, cast_forward_inputs, output_dtype
============================================================================

.. admonition:: Verdict
   :class: tip

   Build the model in fp32 and let ``MixedPrecisionPolicy(param_dtype=torch.bfloat16,
   reduce_dtype=torch.float32)`` do the casting: the policy never changes the dtype of the shards.
   The same policy on a model *built* in bf16 kept bf16 shards and bf16 AdamW moments, and one
   AdamW step at a fine-tuning learning rate changed
   :claim:`mp_pitfalls.changed.bf16_built.share` of the elements (fp32-built:
   :claim:`mp_pitfalls.changed.fp32_built.share`). An fp32 rotary table passed to a block as an
   argument arrives in bf16 (rounded by up to :claim:`mp_pitfalls.rope.default.max_error`); give
   that block ``cast_forward_inputs=False`` to keep it fp32. The logits leave the model in bf16
   unless the root's policy says ``output_dtype=torch.float32``.
   Measured on CPU gloo processes (a tiny model, two shared cores).

Three settings of :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` behave differently from
what their names suggest. This page runs each one on gloo ranks, reads the dtypes from inside the
ranks, and **fails the docs build** unless:

* the sharded parameters (``p.to_local()``, the DTensor's ``_local_tensor``), their gradients and
  AdamW's ``exp_avg`` / ``exp_avg_sq`` have the dtype the model was **built** in, whatever
  ``param_dtype`` says: compared with the dtype before ``fully_shard`` and with the state of
  ``torch.optim.AdamW`` on the same model unsharded, in one process;
* the share of elements one AdamW step changed matches that single-process reference;
* with the default ``cast_forward_inputs=True`` a block's ``forward`` receives its fp32 arguments
  in ``param_dtype`` (the rotary table, rounded), and with ``False`` receives them unchanged,
  compared with the table computed in fp32 in this process;
* the model's output is ``param_dtype`` without ``output_dtype`` and ``output_dtype`` with it.

The companion page, :doc:`plot_mixed_precision`, shows the wire bytes and the loss of the
recommended policy.
"""

# %%
# The code to copy
# ----------------
# A Llama-style model in miniature: the root computes a rotary table (cos, sin) in fp32 and passes
# it to every block as an argument. ``shard`` gives every unit the same compute and reduction
# dtypes; ``cast_forward_inputs`` goes to the blocks (the root's own input is token ids, which no
# cast touches) and ``output_dtype`` to the root only (what the model returns). Build the model
# in fp32: ``param_dtype`` is the compute dtype, the built dtype is the storage dtype.
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def rope_table(seq_len: int, dim: int, device=None) -> torch.Tensor:
    """``(seq_len, dim)``: cos of each position's angles, then their sin, in fp32."""
    inv_freq = 10000.0 ** -(torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def rotate(h: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of ``h``'s features by the table's angles, computed in the table's dtype."""
    cos, sin = rope.chunk(2, dim=-1)
    h1, h2 = h[..., 0::2].to(rope.dtype), h[..., 1::2].to(rope.dtype)
    return torch.cat([h1 * cos - h2 * sin, h1 * sin + h2 * cos], dim=-1).to(h.dtype)


class RopeBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.inner, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = rotate(self.norm(x), rope)
        return x + self.out(torch.nn.functional.gelu(self.inner(h)))


class RopeLM(nn.Module):
    def __init__(self, vocab: int = 128, d: int = 64, n_blocks: int = 2) -> None:
        super().__init__()
        self.emb, self.norm = nn.Embedding(vocab, d), nn.LayerNorm(d)
        self.blocks = nn.ModuleList(RopeBlock(d) for _ in range(n_blocks))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        rope = rope_table(tokens.shape[1], x.shape[-1], tokens.device)  # fp32, an argument
        for block in self.blocks:
            x = block(x, rope)
        return self.head(self.norm(x))


def shard(model: nn.Module, mesh, cast_forward_inputs: bool = True,
          output_dtype: torch.dtype | None = None) -> nn.Module:
    """bf16 compute, fp32 gradient reduction; the shards keep the dtype ``model`` was built in."""
    dtypes = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(
            **dtypes, cast_forward_inputs=cast_forward_inputs))  # fault-point: block-policy
    return fully_shard(model, mesh=mesh,  # fault-point: root-policy
                       mp_policy=MixedPrecisionPolicy(**dtypes, output_dtype=output_dtype))


# %%
# The runs
# --------
# Three runs on the same ranks, each one training step with AdamW at a fine-tuning learning rate
# (``LR``, no weight decay) from the same seed: the model built in fp32, the same built in bf16
# (``model.to(torch.bfloat16)``, as loading a bf16 checkpoint "as is" does), and the fp32 model
# with ``cast_forward_inputs=False`` on its blocks and ``output_dtype=torch.float32`` on its root.
# A forward pre-hook on the first block, registered after ``fully_shard``, records what its
# ``forward`` receives: FSDP2's own pre-forward hook (which casts) is prepended, so it runs first.
import dataclasses

import matplotlib.pyplot as plt
import torch.nn.functional as F

import guide
from guide import checks, precision
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.layout import dtype_name
from guide.plotting import legend_below, style

PAGE = guide.Page(section="Configure FSDP2", order=7, key_api="cast_forward_inputs=",
                  world_size=2, supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
BF16, FP32 = torch.bfloat16, torch.float32
LR = 1e-5
VOCAB, SEQ = 128, 16
BATCH = synthetic_batches(steps=1, batch_size=8, seq_len=SEQ, vocab=VOCAB, seed=0)[0]
SETUP = dict(model="ropelm", world_size=WORLD_SIZE)  # what every number of the page depends on
PAGE.state("mp_pitfalls.lr", LR, "learning rate", fmt=".0e", **SETUP)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run: the dtype the model is built in, the blocks' ``cast_forward_inputs`` and the
    root's ``output_dtype``; ``key`` names its claims."""

    key: str
    label: str
    built: torch.dtype = FP32
    cast_forward_inputs: bool = True
    output_dtype: torch.dtype | None = None


RUNS = (Run("fp32_built", "built in fp32"), Run("bf16_built", "built in bf16", built=BF16),
        Run("options", "cast_forward_inputs=False, output_dtype=fp32", cast_forward_inputs=False,
            output_dtype=FP32))


def build(dtype: torch.dtype) -> RopeLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return RopeLM(VOCAB).to(dtype)  # fault-point: build


def loss_of(model: nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token loss (from fp32 logits) and the logits as the model returned them."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()), logits


def run(rank: guide.Rank, r: Run) -> dict:
    model = shard(build(r.built).to(rank.device),
                  init_device_mesh(rank.device.type, (rank.world_size,)),
                  r.cast_forward_inputs, r.output_dtype)
    arrived = {}

    def record(_module, args) -> None:  # returns None: the arguments go on unchanged
        arrived.setdefault("args", [a.detach().clone() for a in args])

    model.blocks[0].register_forward_pre_hook(record)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    before = [p.detach().to_local().clone() for p in model.parameters()]
    with CollectiveLog(model) as log:
        loss, logits = loss_of(model, rank_slice(BATCH, rank.rank, rank.world_size).to(rank.device))
        loss.backward()
    opt.step()
    after = [p.detach().to_local() for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    x, rope = arrived["args"]
    return {
        "shards": {n: p.to_local().dtype for n, p in model.named_parameters()},
        "grads": {n: p.grad.to_local().dtype for n, p in model.named_parameters()},
        "state": {f"{n}.{k}": v.dtype for n, p in zip(names, model.parameters())
                  for k, v in opt.state[p].items() if k.startswith("exp_avg")},
        "wire": {kind: sorted({c.dtype for c in log.records if c.kind == kind})
                 for kind in ("all_gather", "reduce_scatter")},
        "changed": sum(int((a != b).sum()) for a, b in zip(after, before)),
        "elements": sum(b.numel() for b in before),
        "x": x.dtype, "rope": rope, "logits": logits.dtype}


def worker(rank: guide.Rank) -> dict:
    return {r.key: run(rank, r) for r in RUNS}


per_rank = guide.launch(worker, WORLD_SIZE)
results = {r.key: [out[r.key] for out in per_rank] for r in RUNS}


def reference(dtype: torch.dtype) -> dict:
    """One process, the model unsharded and built in ``dtype``, the whole batch, the same step."""
    model = build(dtype)  # fault-point: reference-build
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    loss_of(model, BATCH)[0].backward()
    opt.step()
    return {"state": {f"{n}.{k}": v.dtype for n, p in model.named_parameters()
                      for k, v in opt.state[p].items() if k.startswith("exp_avg")},
            "changed": sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before)),
            "elements": sum(b.numel() for b in before)}


REFERENCE = {dtype: reference(dtype) for dtype in (FP32, BF16)}

# %%
# 1. The shards and AdamW's state take the built dtype
# ----------------------------------------------------
# ``param_dtype=torch.bfloat16`` is the dtype of the *unsharded* copy each unit all-gathers for
# compute; the sharded parameters the optimizer updates keep the dtype the model had when
# ``fully_shard`` was called, and so do their gradients (torch accepts only a gradient of the
# parameter's own dtype) and AdamW's moments (``torch.zeros_like(p)``). ``reduce_dtype=fp32``
# still reduce-scatters in fp32 in both: FSDP2 up-casts the bf16 gradients before the sum and
# casts the result back to the shard's dtype.
POLICY_WIRE = {"all_gather": "bfloat16", "reduce_scatter": "float32"}
rows = []
for r in RUNS[:2]:
    ref = REFERENCE[r.built]
    for i, res in enumerate(results[r.key]):
        run_name = f"FSDP2 x{WORLD_SIZE}, {r.label}, rank {i}"
        precision.assert_dtypes(run_name, "sharded parameters", res["shards"], r.built)
        precision.assert_dtypes(run_name, "their gradients", res["grads"], r.built)
        checks.expect("optimizer state", run_name, res["state"] == ref["state"],
                      f"AdamW's state dtypes {sorted(set(res['state'].values()))}, the "
                      f"single-process AdamW's {sorted(set(ref['state'].values()))}.")
        checks.expect("wire dtype", run_name, res["wire"] == {k: [v] for k, v in POLICY_WIRE.items()},
                      f"collectives ran in {res['wire']}, the policy says {POLICY_WIRE}.")
    res = results[r.key][0]
    rows.append([r.label, *(PAGE.state(f"mp_pitfalls.dtypes.{r.key}.{what}", text, "dtype", **SETUP)
                            for what, text in (
        ("shard", dtype_name(res["shards"]["blocks.0.inner.weight"])),
        ("grad", dtype_name(res["grads"]["blocks.0.inner.weight"])),
        ("exp_avg", dtype_name(res["state"]["blocks.0.inner.weight.exp_avg"])),
        ("exp_avg_sq", dtype_name(res["state"]["blocks.0.inner.weight.exp_avg_sq"])),
        ("reduce_scatter", ", ".join(res["wire"]["reduce_scatter"]))))])
# dtype names, each compared above with the model's built dtype and the single-process AdamW's.
PAGE.show(None, rows, ["model", "shard (to_local)", "gradient", "exp_avg", "exp_avg_sq",
                       "reduce-scatter"],
          title="Same MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)")

# %%
# What bf16 storage costs: the update that is rounded away. Adam's first step moves each weight
# by about ``LR``; a bf16 weight moves only if that is at least half the spacing of bf16 numbers
# around it (bf16 keeps :claim:`bf16.significant_bits_pitfalls` significant bits). The share of
# elements the step changed, summed over the ranks' shards, must match the same step in one
# process, unsharded (within ``CHANGED_TOL``).
CHANGED_TOL = 0.01
bits = PAGE.check("bf16.significant_bits_pitfalls", checks.expect_close(
    "bf16 format", "bfloat16", 1 - torch.log2(torch.tensor(torch.finfo(BF16).eps)).item(), 8, 0,
    against="bfloat16's format: 7 stored fraction bits + 1 implicit"), "bits", fmt=".0f")
shares, checked = {}, {}
for r in RUNS[:2]:
    res, ref = results[r.key], REFERENCE[r.built]
    got = sum(x["changed"] for x in res) / sum(x["elements"] for x in res)
    checked[r.key] = checks.expect_close(
        "changed by the step", f"FSDP2 x{WORLD_SIZE}, {r.label}", got,
        ref["changed"] / ref["elements"], CHANGED_TOL, "share of elements changed",
        unit="fraction", against=checks.SINGLE_PROCESS)
    shares[r.key] = PAGE.check(f"mp_pitfalls.changed.{r.key}.share", checked[r.key], fmt=".1%",
                               optimizer=f"AdamW lr={LR:.0e}", **SETUP)
checks.expect_order("bf16 storage", f"FSDP2 x{WORLD_SIZE}", shares["bf16_built"],
                    shares["fp32_built"], low_name="share changed, built in bf16",
                    high_name="share changed, built in fp32")
PAGE.show("mp_pitfalls.changed_table", [[r.label, checked[r.key]] for r in RUNS[:2]],
          ["model", "elements one AdamW step changed"],
          formats={"elements one AdamW step changed": ".1%"}, keys=[r.key for r in RUNS[:2]],
          optimizer=f"AdamW lr={LR:.0e}", **SETUP)

# %%
# The same, drawn.
style()
fig, ax = plt.subplots(figsize=(6.4, 3.6))
ax.bar([r.label for r in RUNS[:2]], [100 * shares[r.key] for r in RUNS[:2]],
       color=["#1f77b4", "#d62728"], label="FSDP2, measured")
ax.scatter([r.label for r in RUNS[:2]],
           [100 * REFERENCE[r.built]["changed"] / REFERENCE[r.built]["elements"] for r in RUNS[:2]],
           color="black", zorder=3, label="one process, unsharded")
ax.set(ylabel="elements changed by one AdamW step (%)",
       title="bf16 master weights round a small update away")
legend_below(fig)
plt.show()
# sphinx_gallery_thumbnail_number = 1
PAGE.conclude("Build (or load) the model in fp32 and let param_dtype cast the copy that "
              "computes; a model built in bf16 trains bf16 master weights, whatever the policy.")

# %%
# 2. ``cast_forward_inputs``: what arrives in ``forward``
# -------------------------------------------------------
# By default each unit casts the floating-point tensors among its ``forward`` arguments to its
# ``param_dtype`` before the forward runs. Activations want that; a rotary table computed in fp32
# does not: it arrives rounded to bf16 (each value moves by at most ``u = 2**-8`` times its size,
# and ``|cos|, |sin| <= 1``). ``cast_forward_inputs=False`` on the blocks leaves it
# fp32; the block then computes its rotation in fp32 (``rotate`` uses the table's dtype) and
# casts back. The hidden state still arrives in bf16 either way: the bf16 embedding made it.
# (A complex table, as torchtitan's ``freqs_cis``, is not floating point and is never cast.)
TABLE = rope_table(SEQ, 64)
u = PAGE.check("mp_pitfalls.unit_roundoff", checks.expect_close(
    "unit roundoff", "bfloat16", precision.unit_roundoff(BF16), torch.finfo(BF16).eps / 2, 0,
    against="torch.finfo(bfloat16).eps / 2"), "relative", fmt=".6f", **SETUP)
rope_rows = []
for r, want in ((RUNS[0], BF16), (RUNS[2], FP32)):
    for i, res in enumerate(results[r.key]):
        run_name = f"FSDP2 x{WORLD_SIZE}, cast_forward_inputs={r.cast_forward_inputs}, rank {i}"
        checks.expect("cast_forward_inputs", run_name, res["rope"].dtype == want,
                      f"the rotary table arrived in {res['rope'].dtype}, expected {want}.")
        checks.expect("cast_forward_inputs", run_name, res["x"] == BF16,
                      f"the hidden state arrived in {res['x']}, expected bfloat16.")
    err = (results[r.key][0]["rope"].float() - TABLE).abs().max().item()
    key = "default" if r.cast_forward_inputs else "off"
    if want == BF16:
        checks.expect_order("rope rounding", "default", 0.0, err, low_name="0",
                            high_name="max error of the table that arrived")
        err = checks.expect_order(
            "rope rounding", "default", err, u * TABLE.abs().max().item(), strict=False,
            low_name="max error of the table that arrived", high_name="u · max|table|")
        PAGE.check(f"mp_pitfalls.rope.{key}.max_error", err, "absolute", fmt=".1e", **SETUP)
    else:  # an exact match: the check's allowance is 0, so the ledger keeps the value as computed
        checks.expect_close("rope rounding", "cast_forward_inputs=False", err, 0.0, 0.0,
                            "max error of the table that arrived", unit="absolute",
                            against="the table computed in fp32 in this process")
        PAGE.state(f"mp_pitfalls.rope.{key}.max_error", err, "absolute", fmt=".1e", **SETUP)
    res = results[r.key][0]
    rope_rows.append([f"cast_forward_inputs={r.cast_forward_inputs}",
                      PAGE.state(f"mp_pitfalls.rope.{key}.x_dtype", dtype_name(res["x"]), "dtype",
                                 **SETUP),
                      PAGE.state(f"mp_pitfalls.rope.{key}.rope_dtype", dtype_name(res["rope"].dtype),
                                 "dtype", **SETUP), err])
PAGE.show("mp_pitfalls.rope_table", rope_rows, ["block policy", "hidden state arrives",
                                                "rope table arrives", "max |table − fp32 table|"],
          formats={"max |table − fp32 table|": ".1e"}, keys=["default", "off"], **SETUP)
PAGE.conclude("Pass cast_forward_inputs=False on the blocks that take an fp32 table (rotary "
              "cos/sin, an attention bias) and cast it yourself where bf16 is fine; keep the "
              "default elsewhere.")

# %%
# 3. ``output_dtype``: what the model returns
# -------------------------------------------
# The root's output is computed by the bf16 head, so the logits are bf16 unless the root's policy
# names ``output_dtype``; then FSDP2 casts them in its post-forward hook. The site computes the loss
# from fp32 logits (``.float()``), which is what ``output_dtype=torch.float32`` does for a loss
# function that does not.
out_rows = []
for r, want, against in ((RUNS[0], BF16, "the policy's param_dtype"),
                         (RUNS[2], FP32, "the policy's output_dtype")):
    for i, res in enumerate(results[r.key]):
        checks.expect("output_dtype", f"FSDP2 x{WORLD_SIZE}, {r.label}, rank {i}",
                      res["logits"] == want, f"logits in {res['logits']}, expected {want} "
                      f"({against}).")
    setting = f"output_dtype={dtype_name(r.output_dtype) if r.output_dtype else None}"
    out_rows.append([setting, PAGE.state(f"mp_pitfalls.output.{r.key}.logits_dtype",
                                         dtype_name(results[r.key][0]["logits"]), "dtype", **SETUP)])
PAGE.show(None, out_rows, ["root policy", "logits dtype"])
PAGE.conclude("Set output_dtype=torch.float32 on the root's policy only: the model then returns "
              "fp32 logits to the loss; on a block it would be undone by the next unit's input "
              "cast (plot_mixed_precision shows why).")
# sphinx_gallery_start_ignore
# What the tests (tests/test_mixed_precision_pitfalls.py) read of this run, and nothing else.
RESULT = dict(results=results, shares=shares, TABLE=TABLE)
# sphinx_gallery_end_ignore

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
