"""
Fine-tuning with FSDP2: LoRA, a pretrained load, one file out
=============================================================

.. admonition:: Verdict
   :class: tip

   Freeze the base, put LoRA adapters beside its linears and ``fully_shard`` the blocks: a step
   reduce-scatters only the adapters, :claim:`finetune.lora.fsdp2.reduce_scatter_elements`
   elements here against FSDP1's :claim:`finetune.lora.fsdp1.reduce_scatter_elements`
   (``use_orig_params=True``), and each rank holds 1/N of their Adam moments. With a bf16 base and
   fp32 adapters, put the adapters in their own ``fully_shard`` groups. Load the pretrained file on
   rank 0 only and broadcast (``set_model_state_dict(..., full_state_dict=True,
   broadcast_from_rank0=True)``): rank 1 peaked at :claim:`finetune.load.broadcast.rank1.peak_mib`
   MiB instead of :claim:`finetune.load.naive.rank1.peak_mib` MiB; export merged from rank 0 with
   ``cpu_offload=True`` (its peak: :claim:`finetune.export.rank0.peak_mib` MiB for a
   :claim:`finetune.model_mib` MiB model).

Measured on CPU gloo processes (a small model, two shared cores); nothing on this page is
predicted for GPUs.

Most FSDP2 questions in the trackers are about fine-tuning a pretrained model, not pre-training
one: what LoRA with frozen weights communicates and holds, which mixes of dtypes ``fully_shard``
accepts, how to load a checkpoint into a model built on the meta device without every rank holding
the whole model, and how to get one ``safetensors`` file back out. This page does all of it on CPU
gloo ranks and checks each claim against a single process.
"""

# %%
# The recipe
# ----------
# Plain PyTorch and ``safetensors``; the workers below call these very functions. The adapters are
# written out (``A``, ``B`` beside each frozen ``nn.Linear``, two short classes) instead of taken
# from ``peft``, so that what FSDP2 shards, gathers and exports is visible and the page depends on
# nothing beyond torch and safetensors. ``LoRA`` is a module of its own so that it can be its own
# ``fully_shard`` group; ``LoRALinear`` *is* an ``nn.Linear``, so the pretrained file's keys
# (``blocks.0.fc1.weight``) still name its weights.
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     set_model_state_dict)
from torch.distributed.fsdp import fully_shard


class LoRA(nn.Module):
    """The trainable low-rank update ``scale * B @ A`` of one linear (``B`` starts at 0)."""

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float, dtype=None, device=None):
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, d_in, dtype=dtype, device=device))
        self.B = nn.Parameter(torch.zeros(d_out, rank, dtype=dtype, device=device))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(self.A.dtype) @ self.A.T @ self.B.T) * self.scale


class LoRALinear(nn.Linear):
    """A frozen pretrained ``nn.Linear`` (same parameters, same keys) plus a :class:`LoRA`."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dtype=None):
        super().__init__(base.in_features, base.out_features, bias=False, device="meta")
        self.weight, self.bias = base.weight, base.bias  # the pretrained tensors themselves
        self.requires_grad_(False)
        self.lora = LoRA(base.in_features, base.out_features, rank, alpha,
                         dtype or base.weight.dtype, base.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.lora(x).to(x.dtype)


def add_lora(model: nn.Module, rank: int, alpha: float, dtype=None) -> nn.Module:
    """Freeze every parameter, then put an adapter beside each linear of each block."""
    model.requires_grad_(False)  # fault-point: freeze-base
    for block in model.blocks:
        for name, child in list(block.named_children()):
            if type(child) is nn.Linear:
                setattr(block, name, LoRALinear(child, rank, alpha, dtype))  # fault-point: adapter
    return model


def fresh_adapters(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Initial adapters, whole, by state-dict key: ``A`` uniform in ±1/sqrt(d_in), ``B`` zero."""
    gen, out = torch.Generator().manual_seed(seed), {}
    for name, m in model.named_modules():
        if isinstance(m, LoRA):
            bound = m.A.shape[1] ** -0.5
            out[f"{name}.A"] = (torch.rand(m.A.shape, generator=gen) * 2 - 1) * bound
            out[f"{name}.B"] = torch.zeros(m.B.shape)
            out[f"{name}.A"], out[f"{name}.B"] = (out[f"{name}.{p}"].to(m.A.dtype) for p in "AB")
    return out


def shard(model: nn.Module, mesh, adapters_apart: bool = False, **options) -> nn.Module:
    """``fully_shard`` each block (each adapter first, if apart), then the root."""
    for block in model.blocks:
        if adapters_apart:
            for m in block.modules():
                if isinstance(m, LoRA):
                    fully_shard(m, mesh=mesh, **options)
        fully_shard(block, mesh=mesh, **options)
    return fully_shard(model, mesh=mesh, **options)


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """``{alias: name}`` for each parameter registered twice (a head tied to the embedding)."""
    first, aliases = {}, {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(p), name) != name:
            aliases[name] = first[id(p)]
    return aliases


def load_pretrained(model: nn.Module, path, adapters: dict[str, torch.Tensor]) -> None:
    """Rank 0 reads the whole file; every rank receives its own rows of each tensor."""
    full = {}
    if dist.get_rank() == 0:
        full = load_file(path) | adapters
        for alias, name in tied_aliases(model).items():
            full[alias] = full[name]  # save_model wrote one name of a tied pair
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))


def merged(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The plain model's state: ``W += scale * B @ A`` (in ``state``'s tensors) for every adapted
    linear, adapters dropped, one name per tied pair."""
    out = dict(state)
    for name, m in model.named_modules():
        if isinstance(m, LoRA):
            A, B = out.pop(f"{name}.A"), out.pop(f"{name}.B")
            w = out[name.removesuffix("lora") + "weight"]
            w.add_((m.scale * (B.float() @ A.float())).to(w.dtype))  # in place: no second copy
    for alias in tied_aliases(model):
        out.pop(alias)
    return out


def export(model: nn.Module, path) -> None:
    """Gather the full state on rank 0's CPU (the others get ``{}``), merge, write one file."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    if dist.get_rank() == 0:
        save_file(merged(model, full), path, metadata=tied_aliases(model))


# %%
# The pretrained model and its file
# ---------------------------------
# The model has the two things a real checkpoint load trips on: a head tied to the token embedding,
# and fixed sinusoidal positions in a non-persistent buffer (as rotary tables are), which no state
# dict carries. Its blocks are :class:`guide.model.Block` (attention and MLP). A plain single
# process writes the "pretrained" file. ``save_file`` refuses the tied pair; ``save_model`` writes
# one of the two names and notes the other in the file's metadata, so a strict load of the file
# misses the alias: ``load_pretrained`` restores it from the model's own ties.
import math
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import safetensors
from safetensors.torch import load_model, save_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import guide
from guide import checkpoint, checks, plotting, precision, report
from guide.comm import CollectiveLog, fsdp2_padded_numel
from guide.data import synthetic_batches
from guide.memory import (RESOLUTION_BYTES, PeakMemory, measure, per_rank_state_bytes,
                          prepare)
from guide.memory.finetune import finetune_state_bytes, lora_shapes
from guide.model import Block, ModelConfig
from guide.training import make_optimizer, mean_over_ranks, next_token_loss, train_steps

if guide.under_torchrun():
    prepare()  # this process is a rank: freed memory must leave it before anything is measured
PAGE = guide.Page(section="Fine-tune", order=1, key_api="fully_shard(", world_size=2,
                  supports=(2, 3, 4), why="1 rank has no peer to shard with; 8 was not run yet")
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig(vocab=2048, d_model=256, n_layers=6, n_heads=4, d_mlp=1024, max_seq=32)
LORA_RANK, ALPHA, SEED, K = 8, 16.0, 0, 3
BATCHES = synthetic_batches(steps=1, batch_size=2 * WORLD_SIZE, seq_len=16, vocab=CFG.vocab,
                            seed=1).repeat(K, 1, 1)  # one global batch, K times: its loss must fall
ROOT = checkpoint.job_dir("guide-finetune")  # shared by the ranks: the export
LOCAL = Path(tempfile.mkdtemp(prefix="guide-finetune-"))  # this process's own: the pretrained file
PRETRAINED, EXPORTED = LOCAL / "pretrained.safetensors", ROOT / "merged.safetensors"
RUN = dict(model="finetune-lm", lora_rank=LORA_RANK, world_size=WORLD_SIZE)


def sinusoids(length: int, d: int) -> torch.Tensor:
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=1)


class PretrainedLM(nn.Module):
    """Embedding (tied to the head) + fixed positions + blocks + norm + head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.register_buffer("positions", torch.empty(cfg.max_seq, cfg.d_model),
                             persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.embed.weight
        nn.init.normal_(self.embed.weight, std=0.02)  # GPT-2's: logits of a sane size
        self.init_buffers()

    def init_buffers(self) -> None:
        """The non-persistent buffer: after ``to_empty`` it holds whatever the memory held."""
        with torch.no_grad():
            self.positions.copy_(sinusoids(*self.positions.shape))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions[: tokens.shape[1]].to(self.embed.weight.dtype)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def pretrained() -> PretrainedLM:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return PretrainedLM(CFG)


def lora_model(base_dtype=torch.float32, adapter_dtype=torch.float32) -> PretrainedLM:
    """The pretrained model (every rank builds the same), adapted, adapters initialised."""
    model = add_lora(pretrained().to(base_dtype), LORA_RANK, ALPHA, adapter_dtype)
    model.load_state_dict(fresh_adapters(model, SEED), strict=False)
    return model


base = pretrained()
try:
    save_file(base.state_dict(), LOCAL / "refused.safetensors")
    raise checks.CheckFailed("[tied weights] save_file wrote a tied state dict.")
except RuntimeError as exc:
    save_file_error = " ".join(str(exc).split()).split(". A potential")[0]
save_model(base, PRETRAINED)
with safetensors.safe_open(PRETRAINED, "pt") as f:
    file_keys, file_meta = set(f.keys()), f.metadata()
try:
    PretrainedLM(CFG).load_state_dict(load_file(PRETRAINED))
    raise checks.CheckFailed("[tied weights] a strict load of save_model's file passed.")
except RuntimeError as exc:
    missing_error = str(exc).splitlines()[1].strip()
checks.expect("tied weights", "save_model", file_meta == tied_aliases(base),
              f"metadata {file_meta}, the model's ties {tied_aliases(base)}.")
N_PARAMS = PAGE.state("finetune.params", sum(p.numel() for p in base.parameters()),
                      "parameters", model="finetune-lm")
MODEL_BYTES = PAGE.state("finetune.model_bytes", sum(p.nbytes for p in base.parameters()),
                         "bytes", model="finetune-lm", precision="fp32")
FILE_BYTES = PAGE.state("finetune.file_bytes", PRETRAINED.stat().st_size, "bytes",
                        model="finetune-lm", precision="fp32")
print(f"{N_PARAMS:,} parameters ({MODEL_BYTES / 2**20:.1f} MiB in fp32); the file "
      f"{FILE_BYTES:,} bytes, keys {len(file_keys)}, metadata {file_meta}")
print(f"save_file(state_dict): {save_file_error}.")
print(f"load_state_dict(load_file(...)): {missing_error}")

# %%
# The single-process reference
# ----------------------------
# One process, the whole batch, the same adapters and AdamW on the adapters only: the losses and the
# merged weights every sharded run must reproduce. It must learn (the first batch's loss falls),
# or matching it would prove nothing.
EVAL = synthetic_batches(steps=1, batch_size=2, seq_len=16, vocab=CFG.vocab, seed=2)[0, :, :-1]


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def reference(base_dtype=torch.float32) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = lora_model(base_dtype)
    losses = train_steps(model, make_optimizer("adamw", trainable(model)), BATCHES)
    with torch.no_grad():
        after = next_token_loss(model, BATCHES[0]).item()
    checks.assert_learns(f"reference, {base_dtype} base", [losses[0], after])
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, merged(model, state)


REF_LOSSES, REF_MERGED = reference()
REF_BF16_LOSSES, _ = reference(torch.bfloat16)

# %%
# The workers
# -----------
# One job runs everything on ``WORLD_SIZE`` ranks. The two loads are measured with
# :class:`guide.memory.PeakMemory` (the process's resident high-water mark above its level at the
# start of the block): the naive one, where every rank builds the whole model and loads the whole
# file before sharding, and the recipe's, on the meta device. After ``to_empty`` the non-persistent
# buffer holds whatever the memory held, so ``init_buffers`` runs before the load.


def load_naive(mesh, path) -> nn.Module:
    model = PretrainedLM(CFG)
    load_model(model, path)  # the whole file, on every rank
    add_lora(model, LORA_RANK, ALPHA)
    model.load_state_dict(fresh_adapters(model, SEED), strict=False)
    return shard(model, mesh)


def load_sharded(mesh, path) -> nn.Module:
    with torch.device("meta"):
        model = add_lora(PretrainedLM(CFG), LORA_RANK, ALPHA)
    shard(model, mesh)  # fault-point: sharded-shard
    model.to_empty(device="cpu")
    model.init_buffers()  # fault-point: init-buffers
    load_pretrained(model, path, fresh_adapters(model, SEED) if dist.get_rank() == 0 else {})
    return model


def file_mismatches(model: nn.Module, path, rank: guide.Rank) -> tuple[list[str], int]:
    """Parameters whose local shard is not, bit for bit, its rows of the file (read by slice),
    and how many were compared."""
    bad, compared = [], 0
    with safetensors.safe_open(path, "pt") as f:
        for name, p in model.named_parameters():
            if name in f.keys():
                rows = math.ceil(p.shape[0] / rank.world_size)
                want = f.get_slice(name)[rank.rank * rows:(rank.rank + 1) * rows]
                compared += 1
                if not torch.equal(p.to_local(), want):
                    bad.append(name)
    return bad, compared


def train(model: nn.Module, rank: guide.Rank, steps: torch.Tensor = BATCHES):
    """AdamW on the trainable parameters, every collective counted; returns (optimizer, log,
    losses). The last step's gradients are left in place."""
    opt = make_optimizer("adamw", trainable(model))
    with CollectiveLog(model) as log:
        losses = train_steps(model, opt, steps, rank)
    return opt, log, losses


def per_step(log: CollectiveLog, steps: int = K) -> dict[tuple[str, str], dict[str, float]]:
    return {key: {k: v / steps for k, v in row.items()} for key, row in log.summary().items()}


def lora_run(rank: guide.Rank, mesh, path, exported) -> dict:
    with PeakMemory("cpu") as naive:
        model = load_naive(mesh, path)
    del model
    with PeakMemory("cpu") as sharded:
        model = load_sharded(mesh, path)
    bad, compared = file_mismatches(model, path, rank)  # checked here: no garbage into training
    checks.expect("pretrained load", f"rank {rank.rank}", not bad,
                  f"local shards unlike their rows of the file: {bad}.")
    checks.expect("pretrained load",
                  f"rank {rank.rank}",
                  torch.equal(model.positions, sinusoids(CFG.max_seq, CFG.d_model)),
                  "the non-persistent buffer is not the "
                  "sinusoids: re-initialise it after to_empty (init_buffers).")
    out = {"naive_peak": naive.peak_bytes, "sharded_peak": sharded.peak_bytes,
           "compared": compared}
    opt, log, out["losses"] = train(model, rank)
    out["comm"] = per_step(log)
    out["frozen_with_grad"] = [n for n, p in model.named_parameters()
                               if not p.requires_grad and p.grad is not None]
    out["trainable_without_grad"] = [n for n, p in model.named_parameters()
                                     if p.requires_grad and p.grad is None]
    out["held"] = measure(model, opt)
    with PeakMemory("cpu") as exported_peak:
        export(model, exported)
    out["export_peak"] = exported_peak.peak_bytes
    with torch.no_grad():
        out["logits"] = model(EVAL)
    return out


def full_ft_run(rank: guide.Rank, mesh) -> dict:
    """Full fine-tuning of the same model, one step: what LoRA's all-gathers are compared with."""
    model = shard(lora_model().requires_grad_(True), mesh)
    _, log, _ = train(model, rank, BATCHES[:1])
    return per_step(log, 1)


# %%
# Mixed dtypes and FSDP1
# ----------------------
# Four ways to hold a bf16 base with fp32 adapters, each trained ``K`` steps with its collectives
# counted: ``one_group`` (a block and its adapters in one ``fully_shard``), ``mixed_trainable`` (the
# same, with the blocks' bf16 LayerNorms trained too), ``adapters_apart`` (each adapter its own
# group) and ``mp_policy`` (everything stored in fp32, gathered in bf16 by
# ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``). Then FSDP1 on the fp32 model,
# wrapped per block, with ``use_orig_params=True`` and with ``False``.
VARIANTS = ("one_group", "mixed_trainable", "adapters_apart", "mp_policy")


def variant_run(rank: guide.Rank, mesh, how: str) -> dict:
    if how == "mp_policy":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = shard(lora_model(), mesh, mp_policy=policy)
    else:
        model = lora_model(torch.bfloat16)
        if how == "mixed_trainable":
            for block in model.blocks:
                block.ln2.requires_grad_(True)
        shard(model, mesh, adapters_apart=how == "adapters_apart")
    try:
        _, log, losses = train(model, rank)
    except AssertionError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"losses": losses, "comm": per_step(log)}


def fsdp1_run(rank: guide.Rank) -> dict:
    def wrap(use_orig_params: bool) -> nn.Module:
        return FSDP(lora_model(), auto_wrap_policy=ModuleWrapPolicy({Block}),
                    use_orig_params=use_orig_params, device_id=torch.device("cpu"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = wrap(use_orig_params=True)
    _, log, losses = train(model, rank)
    try:
        wrap(use_orig_params=False)
        refusal = ""
    except ValueError as exc:
        refusal = str(exc)
    warning = next((str(w.message) for w in caught if "requires_grad" in str(w.message)), "")
    return {"losses": losses, "comm": per_step(log), "warning": warning, "refusal": refusal}


def job(rank: guide.Rank, path, exported) -> dict:
    prepare()  # freed memory leaves the process: PeakMemory measures what is live
    mesh = init_device_mesh("cpu", (rank.world_size,))
    out = {"lora": lora_run(rank, mesh, path, exported), "full_ft": full_ft_run(rank, mesh)}
    out["variants"] = {how: variant_run(rank, mesh, how) for how in VARIANTS}
    out["fsdp1"] = fsdp1_run(rank)
    return out


RESULTS = guide.launch(job, WORLD_SIZE, PRETRAINED, EXPORTED)
LORA = [r["lora"] for r in RESULTS]

# %%
# LoRA under FSDP2: what is sent, what is held
# --------------------------------------------
# Frozen parameters get no gradient, so FSDP2 reduce-scatters only the adapters' gradients: the
# elements per step equal the trainable elements, each padded to ``ceil(dim0/N) * N`` rows. The
# frozen base is still all-gathered, in forward and again in backward: the same bytes as full
# fine-tuning. Each rank holds its shard of every parameter, but gradients and AdamW's two moments
# for its shard of the adapters only; :func:`guide.memory.finetune.finetune_state_bytes` predicts
# it and must equal, to the byte, what :func:`guide.memory.measure` reads off the live tensors.
# The loss must match the single process, and the merged weights in the exported file the
# reference's ``W + scale * B @ A``.
with torch.device("meta"):
    SHAPED = add_lora(PretrainedLM(CFG), LORA_RANK, ALPHA)
FROZEN = [tuple(p.shape) for p in SHAPED.parameters() if not p.requires_grad]
TRAINABLE = [tuple(p.shape) for p in SHAPED.parameters() if p.requires_grad]
N = WORLD_SIZE
with torch.device("meta"):  # the base's own block linears: an adapter rule that skips one fails
    linears = [tuple(m.weight.shape) for m in PretrainedLM(CFG).blocks.modules()
               if type(m) is nn.Linear]
checks.expect("adapters only", "add_lora", TRAINABLE == lora_shapes(linears, LORA_RANK),
              f"trainable shapes {TRAINABLE[:4]}..., a rank-{LORA_RANK} LoRA of the block linears "
              "is (r, d_in), (d_out, r) each: is the base frozen?")
for r, res in enumerate(LORA):
    checks.expect("frozen stays frozen",
                  f"rank {r}", not res["frozen_with_grad"] and not res["trainable_without_grad"],
                  f"frozen with a gradient: "
                  f"{res['frozen_with_grad']}; trainable without: {res['trainable_without_grad']}.")
comm, comm_full = LORA[0]["comm"], RESULTS[0]["full_ft"]
rs = int(comm["reduce_scatter", "float32"]["numel"])
rs_full = int(sum(v["numel"] for (kind, _), v in comm_full.items() if kind == "reduce_scatter"))
ag = int(sum(v["bytes"] for (kind, _), v in comm.items() if kind == "all_gather"))
ag_full = int(sum(v["bytes"] for (kind, _), v in comm_full.items() if kind == "all_gather"))
padded_trainable = sum(fsdp2_padded_numel(s, N) for s in TRAINABLE)
checks.expect("reduce-scatter volume", f"FSDP2 x{N}, LoRA", rs == padded_trainable,
              f"{rs:,} elements per step, the trainable ones padded are {padded_trainable:,}.")
checks.expect("all-gather volume", f"FSDP2 x{N}, LoRA", ag == ag_full,
              f"{ag:,} bytes per step, full fine-tuning {ag_full:,}.")
PRED = finetune_state_bytes(FROZEN, TRAINABLE, N, frozen_precision="fp32",
                            trainable_precision="fp32", optimizer="adamw")
for r, res in enumerate(LORA):
    checks.expect("fine-tuning memory", f"rank {r}", res["held"] == PRED[r],
                  f"measured {res['held']}, predicted {PRED[r]}.")
FULL_PRED = per_rank_state_bytes(FROZEN + TRAINABLE, "fsdp2", N, "fp32", "adamw",
                                 ddp_buckets=False)
LOSS_GAP = checks.assert_losses_match(f"FSDP2 x{N}, LoRA", REF_LOSSES,
                                      mean_over_ranks([r["losses"] for r in LORA]),
                                      against=checks.SINGLE_PROCESS)
EXPORTED_STATE = load_file(EXPORTED)
MERGED_GAP = checks.assert_params_match("exported merged weights", REF_MERGED, EXPORTED_STATE,
                                        checks.PARAM_TOL["adamw"], check="merged weights",
                                        against="the single-process run's merged weights")
n_trainable = PAGE.state("finetune.lora.trainable_params", sum(map(math.prod, TRAINABLE)),
                         "parameters", model="finetune-lm", lora_rank=LORA_RANK)
RS_RUN = f"FSDP2 x{N}, LoRA"
rows = [["trainable parameters", n_trainable, N_PARAMS + n_trainable],
        ["reduce-scattered elements per step",
         PAGE.check("finetune.lora.fsdp2.reduce_scatter_elements", checks.expect_close(
             "reduce-scatter volume", RS_RUN, rs, padded_trainable, 0, "elements",
             unit="elements/step", against="the trainable elements, padded"), fmt=",.0f",
             **RUN),
         PAGE.state("finetune.full.fsdp2.reduce_scatter_elements", rs_full, "elements/step",
                    **RUN)],
        ["all-gathered bytes per step",
         PAGE.check("finetune.lora.fsdp2.all_gather_bytes", checks.expect_close(
             "all-gather volume", RS_RUN, ag, ag_full, 0, "bytes", unit="bytes/step",
             against="full fine-tuning's all-gathered bytes"), fmt=",.0f", **RUN),
         PAGE.state("finetune.full.fsdp2.all_gather_bytes", ag_full, "bytes/step", **RUN)]]
for part in ("params", "grads", "optimizer"):  # LoRA: measured on rank 0 = predicted
    rows.append([f"{part} bytes on rank 0",
                 PAGE.check(f"finetune.lora.rank0.{part}_bytes", checks.expect_close(
                     "fine-tuning memory", "rank 0", getattr(LORA[0]["held"], part),
                     getattr(PRED[0], part), 0, part, unit="bytes",
                     against="finetune_state_bytes"), fmt=",.0f", optimizer="adamw", **RUN),
                 PAGE.state(f"finetune.full.rank0.{part}_bytes", getattr(FULL_PRED, part),
                            "bytes", optimizer="adamw", **RUN)])
# Each cell is a named claim (a check's value, or computed for full fine-tuning), so the table
# itself records nothing more.
report.show(report.table(rows, ["", f"LoRA, FSDP2 x{N}", "full fine-tuning"],
                         formats={f"LoRA, FSDP2 x{N}": ",.0f", "full fine-tuning": ",.0f"},
                         title="Measured (full fine-tuning's memory: predicted); AdamW, fp32"))
moments = PAGE.state("finetune.lora.adam_moments_bytes", 2 * 4 * n_trainable, "bytes",
                     model="finetune-lm", lora_rank=LORA_RANK)
loss_gap, merged_gap = (PAGE.check(f"finetune.lora.max_{what}_gap", gap, unit, fmt=".1e",
                                   **RUN)
                        for what, gap, unit in (("loss", LOSS_GAP, "nats"),
                                                ("merged_weight", MERGED_GAP, "absolute")))
counters = PAGE.state("finetune.lora.step_counters", len(TRAINABLE), "tensors", **RUN)
PAGE.conclude(
    f"Adam's moments of all adapters: {moments:,} bytes; rank 0 holds {PRED[0].optimizer:,} (its "
    f"1/N, plus {counters} step counters). Frozen parameters with a gradient: none. Against "
    f"one process: max |Δloss| {loss_gap:.1e}, max |Δ merged weight| {merged_gap:.1e}.")

# %%
# Mixed dtypes, as torch 2.13 behaves
# -----------------------------------
# A bf16 base with fp32 adapters in **one** ``fully_shard`` group trains: FSDP2 all-gathers the
# group's mixed dtypes as raw bytes (``uint8`` on the wire). It refuses, at the first forward, a
# group whose *trainable* parameters mix dtypes: train the blocks' bf16 LayerNorms beside the fp32
# adapters and ``lazy_init`` raises. The two clean ways: the adapters in their own groups (every
# group's trainable parameters share one dtype, whatever else you unfreeze), or everything stored
# in fp32 and gathered in bf16 by ``MixedPrecisionPolicy``. Each run must stay within one bf16
# rounding of the loss (:func:`guide.precision.loss_gap_bound`) of a single process: the same
# dtypes for the bf16-base runs (a 1-ulp change of a bf16 activation moves the loss that much), the
# fp32 reference for the policy run, which computes in bf16 what that computes in fp32.
variants = RESULTS[0]["variants"]
error = variants["mixed_trainable"].get("error", "")
checks.expect("mixed trainable dtypes", f"FSDP2 x{N}",
              "FSDP expects uniform original parameter dtype" in error,
              f"expected torch's AssertionError, got {error or 'no error'!r}.")
rows = []
for how, res in variants.items():
    if how == "mixed_trainable":
        rows.append([how, "raises", "-", "-", "-", "-", "-"])
        continue
    per_rank = [r["variants"][how]["losses"] for r in RESULTS]
    v_comm, losses = res["comm"], mean_over_ranks(per_rank)
    checks.expect("reduce-scatter volume",
                  how, v_comm.get(("reduce_scatter", "float32"), {}).get("numel") == rs,
                  f"reduce-scatter {v_comm}, want {rs:,} fp32.")
    ref, name = (REF_LOSSES, "fp32") if how == "mp_policy" else (REF_BF16_LOSSES, "bf16 base")
    bounds = precision.loss_gap_bound(ref)
    precision.assert_loss_gap_within(how, ref, losses, bounds)
    gap = checks.expect_close("loss gap", how, losses, ref, max(bounds), "loss", unit="nats",
                              against=f"one process, {name}, within one bf16 rounding")
    wire = sorted({dtype for kind, dtype in v_comm if kind == "all_gather"})
    ag_v = int(sum(v["bytes"] for (kind, _), v in v_comm.items() if kind == "all_gather"))
    calls = int(sum(v["calls"] for v in v_comm.values()))
    key = f"finetune.dtypes.{how}"
    rows.append([how, "trains", "+".join(wire),
                 PAGE.state(f"{key}.all_gather_bytes", ag_v, "bytes/step", **RUN),
                 PAGE.state(f"{key}.collectives", calls, "calls/step", **RUN), name,
                 PAGE.check(f"{key}.max_loss_gap", gap, "nats", fmt=".1e", **RUN)])
checks.expect("bytes on the wire", "one_group",
              ("all_gather", "uint8") in variants["one_group"]["comm"],
              f"all-gathers {sorted(variants['one_group']['comm'])}.")
report.show(report.table(rows, ["layout", "", "all-gather dtype", "bytes/step",
                                "collectives/step", "reference", "max |Δloss|"],
                         formats={"max |Δloss|": ".1e"}))
print(f"\nmixed_trainable: {error}")
at_rest = {p: PAGE.state(f"finetune.dtypes.{name}.rank0.params_bytes",
                         finetune_state_bytes(FROZEN, TRAINABLE, N, frozen_precision=p,
                                              trainable_precision="fp32",
                                              optimizer="adamw")[0].params, "bytes", **RUN)
           for p, name in (("bf16", "adapters_apart"), ("fp32", "mp_policy"))}
print(f"Parameters held by rank 0 between steps: {at_rest['bf16']:,} bytes with a bf16 base, "
      f"{at_rest['fp32']:,} with everything in fp32 (MixedPrecisionPolicy).")

# %%
# Which to choose: for LoRA, the adapters in their own groups. The frozen base is the largest thing
# a rank holds, and a bf16 base halves it; the adapters keep fp32 weights and moments. The price is
# one small all-gather and reduce-scatter per adapter: the collectives per step above. The policy
# keeps one code path with full fine-tuning (fp32 master weights for everything), at twice the
# memory for the frozen weights. One group happens to work on torch 2.13, but the first parameter
# of another dtype you unfreeze in it breaks it.
#
# FSDP1, side by side
# -------------------
# FSDP1 runs on gloo when given ``device_id=torch.device("cpu")``. With ``use_orig_params=True`` it
# accepts the frozen/trainable mix, but it reduce-scatters each block's whole flat parameter,
# frozen elements included (it warns when it auto-wraps such a module); with
# ``use_orig_params=False`` it refuses the mix.
f1 = RESULTS[0]["fsdp1"]
rs_f1 = int(sum(v["numel"] for (kind, _), v in f1["comm"].items() if kind == "reduce_scatter"))
block_elements = sum(p.numel() for p in SHAPED.blocks.parameters())
checks.expect("FSDP1 reduce-scatter volume", f"FSDP1 x{N}", rs_f1 >= block_elements,
              f"{rs_f1:,} elements per step, fewer than the blocks' {block_elements:,}.")
checks.assert_losses_match(f"FSDP1 x{N}, LoRA", REF_LOSSES,
                           mean_over_ranks([r["fsdp1"]["losses"] for r in RESULTS]),
                           against=checks.SINGLE_PROCESS)
checks.expect("FSDP1 refuses", "use_orig_params=False", "use_orig_params=False" in f1["refusal"],
              f"expected a ValueError, got {f1['refusal']!r}.")
rs_f1 = PAGE.check("finetune.lora.fsdp1.reduce_scatter_elements", checks.expect_order(
    "FSDP1 reduce-scatter volume", f"FSDP1 x{N}", block_elements, rs_f1, strict=False,
    low_name="the blocks' elements", high_name="FSDP1's reduce-scattered elements",
    unit="elements/step", keep="high"), fmt=",.0f", **RUN)
report.show(report.table([["trainable", n_trainable], ["FSDP2", rs],
                          ["FSDP1, use_orig_params=True", rs_f1]],
                         ["", "reduce-scattered elements per step"],
                         formats={"reduce-scattered elements per step": ",.0f"}))
warning = f1["warning"].splitlines()[0]
for i, numel in enumerate(re.findall(r"(\d+) numel", warning)):  # torch's own numbers, quoted
    PAGE.state(f"finetune.fsdp1.warning.numel{i}", int(numel), "elements",
               guard="cited: torch's FSDP1 warning, this run", **RUN)
print(f"\nFSDP1's warning: {warning}")
print(f"use_orig_params=False: ValueError: {f1['refusal'].splitlines()[0]}")

# %%
# Pretrained weights in, without a full copy per rank
# ---------------------------------------------------
# Every rank's shard must equal its rows of the file, bit for bit (each rank reads its rows back
# with ``safe_open(...).get_slice``), and the re-initialised buffer the sinusoids; each rank checks
# both before it trains. The memory is each rank's resident peak during the load, to within
# :data:`guide.memory.RESOLUTION_BYTES`. The naive way holds at least the whole model on every rank,
# about twice here (the model built, the file read, before ``fully_shard`` keeps the rank's rows).
# With the recipe, rank 0 holds the file plus its shard, and every other rank its shard plus one
# tensor in flight: ``set_model_state_dict`` broadcasts one whole tensor at a time and keeps the
# receiver's rows. The peak is the process's resident memory, so the bound allows one more slot of
# the largest tensor: glibc's heap can keep a freed tensor's block split by small allocations made
# meanwhile, and the next large tensor then takes fresh pages (a CI build beside other jobs went
# over the bound without that slot; quiet builds stay under it).
LARGEST = max(p.numel() * 4 for p in SHAPED.parameters())  # bytes of the largest fp32 tensor
ADAPTER_BYTES = 4 * n_trainable
res_mib = PAGE.state("memory.resolution_mib", RESOLUTION_BYTES / 2**20, "MiB", fmt=".0f")
MIB = 2**20
naive, broadcast = [], []
for r, res in enumerate(LORA):
    naive.append(checks.expect_order(
        "naive load", f"rank {r}", MODEL_BYTES - RESOLUTION_BYTES, res["naive_peak"],
        strict=False, low_name="the model less the resolution", high_name="the naive peak",
        unit="bytes", keep="high").scaled(1 / MIB, "MiB"))
    in_flight = LARGEST + math.ceil(LARGEST / N)  # the tensor received, and the rows kept
    bound = PRED[r].params + in_flight + LARGEST + RESOLUTION_BYTES  # + one heap slot (above)
    if r == 0:  # rank 0 reads the whole file
        peak = checks.expect_order(
            "broadcast load", "rank 0", MODEL_BYTES - RESOLUTION_BYTES, res["sharded_peak"],
            strict=False, low_name="the file less the resolution",
            high_name="rank 0's peak", unit="bytes", keep="high")
    else:
        peak = checks.expect_order(
            "broadcast load", f"rank {r}", res["sharded_peak"], bound, strict=False,
            low_name=f"rank {r}'s peak",
            high_name="its shard + one tensor in flight + one heap slot",
            unit="bytes")
    broadcast.append(peak.scaled(1 / MIB, "MiB"))
# Computed: each rank compared its shards with the file bitwise before training (above).
compared = PAGE.state("finetune.load.tensors_equal_to_file", LORA[0]["compared"], "tensors", **RUN)
print(f"Each rank's shards of the {compared} pretrained tensors equal their rows of the file, "
      "bit for bit; the buffer is re-initialised.")
rows = [[f"rank {r}",
         PAGE.check(f"finetune.load.naive.rank{r}.peak_mib", naive[r], fmt=".1f", **RUN),
         PAGE.check(f"finetune.load.broadcast.rank{r}.peak_mib", broadcast[r], fmt=".1f",
                    **RUN),
         PAGE.state(f"finetune.load.rank{r}.shard_mib", PRED[r].params / MIB, "MiB",
                    fmt=".1f", **RUN)] for r in range(len(LORA))]
model_mib = PAGE.state("finetune.model_mib", MODEL_BYTES / MIB, "MiB", fmt=".1f", **RUN)
report.show(report.table(
    rows, ["", "naive: every rank loads the file", "rank 0 loads, broadcasts", "the rank's shard"],
    formats={c: ".1f" for c in ("naive: every rank loads the file", "rank 0 loads, broadcasts",
                                "the rank's shard")},
    title=f"Peak resident memory during the load (MiB); the model is {model_mib:.1f} MiB, "
          f"resolution {res_mib:.0f} MiB"))

# %%
# One file out
# ------------
# ``export`` gathers the full state dict onto rank 0's CPU one tensor at a time
# (``cpu_offload=True``; the other ranks drop what they gather), merges the adapters into the
# weights in place and writes one ``safetensors`` file, the tied pair under one name with the alias
# in the metadata, as ``save_model`` writes it. Rank 0's peak is the model plus its adapters (and a
# tensor in flight: its gather buffer, padded, the unpadded copy and the rank's padded rows); the
# others' one tensor in flight. A plain single process loads the file into
# the plain model with ``load_model`` and must compute what the sharded, unmerged model computed.
exp0 = LORA[0]["export_peak"]
padded = max(fsdp2_padded_numel(s, N) * 4 for s in TRAINABLE + FROZEN)  # the largest, gathered
gathering = 2 * padded + math.ceil(padded / N)  # gather buffer, unpadded copy, padded local rows
low, high = MODEL_BYTES + ADAPTER_BYTES - RESOLUTION_BYTES, MODEL_BYTES + ADAPTER_BYTES
checks.expect("export memory", "rank 0", low <= exp0 <= high + gathering + RESOLUTION_BYTES,
              f"peak {exp0:,} B; the model and adapters are {high:,} B, one tensor in flight "
              f"{gathering:,} B.")
for r, res in enumerate(LORA[1:], start=1):
    checks.expect("export memory", f"rank {r}",
                  res["export_peak"] <= gathering + RESOLUTION_BYTES,
                  f"peak {res['export_peak']:,} B, above one tensor in flight "
                  f"{gathering:,} B + {RESOLUTION_BYTES:,}.")
plain = PretrainedLM(CFG)
load_model(plain, EXPORTED)
with torch.no_grad():
    out_gap = (plain(EVAL) - LORA[0]["logits"]).abs().max().item()
OUT_TOL = 1e-4  # merged W + sBA against W x + s B A x in fp32: rounding only (logits of size ~1)
out_gap = checks.expect_close("exported model", "load_model, 1 process", out_gap, 0.0, OUT_TOL,
                              "logits", unit="absolute", against="the sharded, unmerged model")
peak0 = PAGE.check("finetune.export.rank0.peak_mib", checks.expect_order(
    "export memory", "rank 0", exp0, high + gathering + RESOLUTION_BYTES, strict=False,
    low_name="rank 0's export peak", high_name="model + adapters + one tensor in flight",
    unit="bytes").scaled(1 / MIB, "MiB"), fmt=".1f", **RUN)
peak_other = PAGE.check("finetune.export.others.max_peak_mib", checks.expect_order(
    "export memory", "other ranks", max([r["export_peak"] for r in LORA[1:]], default=0),
    gathering + RESOLUTION_BYTES, strict=False, low_name="the others' export peak",
    high_name="one tensor in flight", unit="bytes").scaled(1 / MIB, "MiB"), fmt=".1f", **RUN)
out_gap = PAGE.check("finetune.export.max_logit_gap", out_gap, "absolute", fmt=".1e", **RUN)
file_bytes = PAGE.state("finetune.export.file_bytes", EXPORTED.stat().st_size, "bytes", **RUN)
PAGE.conclude(
    f"Export: rank 0 peaked at {peak0:.1f} MiB for a {model_mib:.1f} MiB model, the others at "
    f"{peak_other:.1f} MiB at most; the file {file_bytes:,} bytes. One process loaded it: max "
    f"|Δlogit| {out_gap:.1e} against the sharded model.")

# %%
# The two numbers to remember
# ---------------------------
# Left: what a step reduce-scatters; right: what loading costs each rank.
plotting.style()
fig, (left, right) = plt.subplots(1, 2, figsize=(10.4, 3.6))
left.barh(["trainable", "FSDP2", "FSDP1"], [n_trainable, rs, rs_f1],
          color=[plotting.REFERENCE_COLOR, "#ff7f0e", "#7f7f7f"])
left.set(xscale="log", xlabel="elements reduce-scattered per step",
         title=f"LoRA rank {LORA_RANK}, {N} ranks")
ranks = range(len(LORA))
right.bar([r - 0.2 for r in ranks], [res["naive_peak"] / MIB for res in LORA], 0.4,
          label="every rank loads the file", color="#7f7f7f")
right.bar([r + 0.2 for r in ranks], [res["sharded_peak"] / MIB for res in LORA], 0.4,
          label="rank 0 loads, broadcasts", color="#ff7f0e")
right.axhline(MODEL_BYTES / MIB, color="black", ls="--", lw=1, label="the model")
right.set(xticks=list(ranks), xlabel="rank", ylabel="peak during the load (MiB)")
right.legend(loc="upper right", fontsize=8)
plt.show()
# sphinx_gallery_thumbnail_number = 1

if not guide.under_torchrun():
    shutil.rmtree(ROOT)
shutil.rmtree(LOCAL)
print("All checks passed.")
