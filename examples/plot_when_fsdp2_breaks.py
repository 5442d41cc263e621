"""
When FSDP2 hangs or stops learning: order mistakes, skipped modules, methods other than forward
===============================================================================================

.. admonition:: Verdict
   :class: tip

   Three mistakes whose symptom shows far from the line that made them. **Build the optimizer right
   after ``fully_shard(model)``, before any forward**: built between the blocks' ``fully_shard``
   and the root's, or after one forward (a smoke test, an evaluation), it holds
   :claim:`whenbreaks.order.forward_first.frozen_tensors` of the root's parameter tensors
   (:claim:`whenbreaks.order.forward_first.frozen_params` numbers) as plain tensors that FSDP2 no
   longer trains: they never move, and the loss still falls. **Call the model, or register the
   method**: a ``generate`` that calls ``self.forward`` raises ``got mixed torch.Tensor and
   DTensor``; after ``register_fsdp_forward_method(model, "generate")`` it gives one process's
   tokens, and :claim:`whenbreaks.generate.new_tokens` new tokens cost
   :claim:`whenbreaks.generate.registered.first_call` all-gathers
   (:claim:`whenbreaks.generate.keep.first_call` with ``set_reshard_after_forward(False)``). **Run
   every FSDP2 module on every rank**: a rank that skips an idle expert leaves the others waiting
   in a collective, for the process group's ``timeout`` (on gloo 30 minutes unless you pass one;
   here :claim:`whenbreaks.hang.timeout_s` s), or gloo aborts a rank on the size mismatch. Call the
   expert on zero tokens instead, or ``set_reduce_scatter_unused_params(True)`` when it shares an
   FSDP group.

Measured on CPU gloo processes (tiny models, two shared cores); nothing here is predicted for a
GPU. The :ref:`pitfalls page <sphx_glr_auto_examples_plot_pitfalls.py>` shows the mistakes these
grow from (the optimizer built before any ``fully_shard``, an ``embed`` method that bypasses
``forward``); this page shows the variants users meet next, and the hangs. As there, each section
makes the mistake on purpose, shows torch's symptom, runs the fix, and asserts both: the wrong way
must still go wrong (``[pitfall reproduces]`` fails the build otherwise) and the right way must
equal one process. Every hang below is bounded twice: the process group's ``timeout`` turns it
into an error after a few seconds, and the launcher kills a job that outlives its deadline.
"""

# %%
# The order that works, in plain PyTorch: ``fully_shard`` each block, then the root, then the
# optimizer, nothing in between; and a one-line check that the optimizer holds FSDP2's shards.
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor


def shard_then_optimizer(model: nn.Module, mesh, make_optimizer) -> torch.optim.Optimizer:
    """Blocks, root, optimizer: no forward and no optimizer before the last ``fully_shard``."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return make_optimizer(model.parameters())


def optimizer_holds_shards(optimizer: torch.optim.Optimizer) -> None:
    """Raise if the optimizer steps a tensor that is not an FSDP2 shard (it would never move)."""
    plain = [p for group in optimizer.param_groups for p in group["params"]
             if not isinstance(p, DTensor)]
    if plain:
        raise RuntimeError(f"the optimizer holds {len(plain)} plain tensors, not FSDP2 shards: "
                           "build it right after fully_shard(model), before any forward")


# %%
# Symptom → fix
# -------------
# Each row links to its section; every symptom is reproduced there by this page's run.

# sphinx_gallery_start_ignore
from guide import report
from guide.report import Link

SYMPTOMS = [  # (section label, symptom, cause, fix)
    ("order", "the loss falls, the embeddings and the head never change",
     "optimizer built before the root's fully_shard, or after a forward",
     "build it right after fully_shard(model), or call model.reshard() first"),
    ("methods", "RuntimeError: ...got mixed torch.Tensor and DTensor, in generate() or "
     "model.forward(x)", "a method that bypasses model(...)",
     'register_fsdp_forward_method(model, "generate")'),
    ("hangs", "RuntimeError: Timed out waiting ...ms for send (or recv) operation to complete; "
     "until then, silence", "a rank skipped a module that has its own fully_shard group",
     "run the module on every rank (on zero tokens)"),
    ("hangs", "Received data size doesn't match expected size. Is there a distributed collective "
     "mismatch in your code? (SIGABRT)", "a rank skipped a module inside a larger group",
     "set_reduce_scatter_unused_params(True), or run it"),
]
report.show(report.table([[Link(symptom, f"#whenbreaks-{label}"), cause, fix]
                          for label, symptom, cause, fix in SYMPTOMS],
                         ["symptom", "cause", "fix"]))
# sphinx_gallery_end_ignore

# %%
# Setup
# -----
# The site's model with 2 blocks (:class:`guide.model.TinyLM`), SGD, one global batch repeated,
# each rank taking its own slice; the single-process reference runs here, on the full batches. Each
# section runs one short job on the ranks.

# sphinx_gallery_start_ignore
import matplotlib.pyplot as plt

import guide
from guide import checks, plotting
from guide.comm import CollectiveLog
from guide.data import rank_slice, synthetic_batches
from guide.hangs import expect_failure, gist, witness
from guide.layout import full_state
from guide.model import ModelConfig, TinyLM, build_model
from guide.pitfalls import assert_reproduces, caught
from guide.reference import reference_run
from guide.training import make_optimizer, mean_over_ranks, train_steps

PAGE = guide.Page(section="Migrate and pitfalls", order=3, key_api="fully_shard(", world_size=2,
                  supports=(2, 4))
WORLD_SIZE = PAGE.world_size  # the default under python; torchrun's WORLD_SIZE under torchrun
CFG = ModelConfig(n_layers=2)
STEPS = 5
# the same global batch every step: a loss that falls is learning, not a change of data
BATCHES = synthetic_batches(steps=1, batch_size=4 * WORLD_SIZE, seq_len=16,
                            vocab=CFG.vocab).expand(STEPS, -1, -1)
REFERENCE = reference_run(CFG, "sgd", BATCHES)  # (losses, final params), one process
TOL = checks.PARAM_TOL["sgd"]  # fp32: the gap to one process is reduction order only
RUN = dict(model="tinylm-2-blocks", optimizer="sgd", world_size=WORLD_SIZE)
SGD = lambda params: make_optimizer("sgd", params)  # noqa: E731 (the site's SGD, lr 0.1)
# the root's own parameters: those of no block (what the last fully_shard call takes)
ROOT_PARAMS = {n: p.numel() for n, p in build_model(CFG).named_parameters()
               if not n.startswith("blocks.")}
print(f"torch {torch.__version__}, {WORLD_SIZE} ranks, TinyLM with {CFG.n_layers} blocks; the "
      f"root's own parameters: {', '.join(ROOT_PARAMS)}")
# sphinx_gallery_end_ignore

# %%
# .. _whenbreaks-order:
#
# 1. Order mistakes: an optimizer that holds the wrong tensors
# ------------------------------------------------------------
# Built before any ``fully_shard``, an optimizer trains nothing (:ref:`pitfalls, section 1
# <pitfalls-optimizer-first>`). Two variants fail halfway, which is worse: the blocks train, the
# loss falls, and the embeddings, the final norm and the head never move.
#
# * **Optimizer between the blocks' and the root's** ``fully_shard``: the blocks' parameters are
#   already FSDP2's ``DTensor`` shards, the root's are not yet; ``fully_shard(model)`` then replaces
#   the root's with new ones, and the optimizer keeps the old.
# * **A forward between** ``fully_shard`` **and the optimizer** (a shape check, a first evaluation):
#   after a forward the root *keeps its parameters unsharded* (the root's
#   ``reshard_after_forward`` is ``False``: backward needs them first), so ``model.parameters()``
#   yields the root's unsharded plain tensors for as long as no backward runs, and an optimizer
#   built then holds those. In backward FSDP2 reduce-scatters their gradients into the shards and
#   clears them, so the optimizer finds no gradient to step; the next forward all-gathers them
#   again from the unchanged shards. ``model.reshard()`` after the forward puts the shards back.
#
# ``optimizer_holds_shards`` (above) catches both.


def order_job(rank: guide.Rank, way: str) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = build_model(CFG, device=rank.device)
    probe = rank_slice(BATCHES[0], rank.rank, rank.world_size)[:, :-1].to(rank.device)
    if way == "optimizer between":
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        opt = SGD(model.parameters())  # WRONG: the root's parameters are replaced next
        fully_shard(model, mesh=mesh)
    elif way in ("forward first", "forward, reshard()"):
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        with torch.no_grad():
            model(probe)  # a smoke test: the root now holds unsharded parameters
        if way == "forward, reshard()":
            model.reshard()  # right: the root's shards are registered again
        opt = SGD(model.parameters())  # WRONG without the reshard() above
    else:
        opt = shard_then_optimizer(model, mesh, SGD)  # right
    _, guard = caught(optimizer_holds_shards, opt)
    before = full_state(model)
    losses = train_steps(model, opt, BATCHES, rank)
    after = full_state(model)
    frozen = sorted(n for n in before if torch.equal(before[n], after[n]))
    return {"losses": losses, "params": after, "frozen": frozen, "guard": guard}


ORDER_WAYS = {"fully_shard, then optimizer": "right", "optimizer between": "optimizer_between",
              "forward first": "forward_first", "forward, reshard()": "forward_reshard"}


def section_1(rank: guide.Rank) -> dict:
    return {way: order_job(rank, way) for way in ORDER_WAYS}


ORDER = guide.launch(section_1, WORLD_SIZE)

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "1. order"
ORDER_ROWS = []
for way in ORDER_WAYS:
    mine = ORDER[0][way]
    losses = mean_over_ranks([r[way]["losses"] for r in ORDER])
    wrong = way in ("optimizer between", "forward first")
    key = ORDER_WAYS[way]
    if wrong:
        checks.expect("pitfall reproduces", f"{run}: {way}",
                      set(mine["frozen"]) == set(ROOT_PARAMS),
                      f"frozen {mine['frozen']}, expected exactly the root's {sorted(ROOT_PARAMS)} "
                      f"on torch {torch.__version__}: update this section.")
        checks.expect("pitfall reproduces", f"{run}: {way}", losses[-1] < losses[0],
                      f"the loss did not fall ({losses}): the mistake is no longer silent.")
        assert_reproduces(f"{run}: {way}", mine["guard"], "plain tensors, not FSDP2 shards")
        gap = PAGE.state(f"whenbreaks.order.{key}.gap", max(
            (mine["params"][n] - REFERENCE[1][n]).abs().max().item() for n in REFERENCE[1]),
            "absolute", fmt=".1e", **RUN)
        frozen = PAGE.check(f"whenbreaks.order.{key}.frozen_tensors", checks.expect_close(
            "frozen parameters", f"{run}: {way}", len(mine["frozen"]), len(ROOT_PARAMS), 0,
            what="tensors that never moved", unit="tensors",
            against="the root's own parameters, counted on the model"), fmt=".0f", **RUN)
        elements = PAGE.check(f"whenbreaks.order.{key}.frozen_params", checks.expect_close(
            "frozen parameters", f"{run}: {way}",
            sum(mine["params"][n].numel() for n in mine["frozen"]), sum(ROOT_PARAMS.values()), 0,
            what="parameters that never moved", unit="parameters",
            against="the root's own parameters, counted on the model"), fmt=",.0f", **RUN)
    else:
        checks.expect("optimizer order", f"{run}: {way}", not mine["guard"] and not mine["frozen"],
                      f"guard {mine['guard']}, frozen {mine['frozen']}")
        checks.assert_losses_match(f"{run}: {way}", REFERENCE[0], losses,
                                   against=checks.SINGLE_PROCESS)
        gap = PAGE.check(f"whenbreaks.order.{key}.gap", checks.assert_params_match(
            f"{run}: {way}", REFERENCE[1], mine["params"], TOL, against=checks.SINGLE_PROCESS),
            fmt=".1e", **RUN)
        frozen, elements = 0, 0
    ORDER_ROWS.append([way, frozen, elements, losses[0], losses[-1], gap,
                       "raises" if mine["guard"] else "passes"])
FORWARD_FIRST = ORDER[0]["forward first"]
print("never moved (forward first):", ", ".join(FORWARD_FIRST["frozen"]))
PAGE.show("whenbreaks.order.table",
          ORDER_ROWS, ["order", "tensors frozen", "parameters frozen", "loss, first step",
                       "loss, last step", "max gap to one process", "optimizer_holds_shards"],
          formats={"parameters frozen": ",.0f", "loss, first step": ".4f", "loss, last step": ".4f",
                   "max gap to one process": ".1e"},
          title=f"{STEPS} SGD steps on one batch, loss the mean over ranks", **RUN)
# sphinx_gallery_end_ignore

# %%
# The loss, step by step: with the root frozen it still falls, a little slower, so the curve alone
# does not reveal the mistake.

# sphinx_gallery_start_ignore
plotting.style()
fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot(REFERENCE[0], color=plotting.REFERENCE_COLOR, lw=5, alpha=0.3, label="1 process")
for way, style_ in (("fully_shard, then optimizer", "o-"), ("forward first", "s--")):
    ax.plot(mean_over_ranks([r[way]["losses"] for r in ORDER]), style_,
            label=f"{way}, {WORLD_SIZE} ranks")
ax.set_xlabel("SGD step (same batch every step)")
ax.set_ylabel("training loss (nats/token)")
ax.set_title("A forward before the optimizer: the root is frozen, the loss still falls")
ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
ax.legend()
plt.show()
# sphinx_gallery_thumbnail_number = 1
# sphinx_gallery_end_ignore

# %%
# .. _whenbreaks-methods:
#
# 2. Methods other than ``forward``: ``generate``
# -----------------------------------------------
#
# .. index::
#    ! register_fsdp_forward_method
#    ! mixed torch.Tensor and DTensor
#
# FSDP2 all-gathers a group's parameters in hooks that ``model(x)`` runs around ``forward``.
# ``model.forward(x)``, or a method that calls ``self.forward`` (a hand-written ``generate``), skips
# the root's hooks: the root's parameters are still ``DTensor`` shards and torch raises the error
# :ref:`pitfalls, section 10 <pitfalls-other-method>` shows for an ``embed`` method. The fix is
# ``register_fsdp_forward_method(model, "generate")``, or ``self(...)`` inside the method.
#
# What each call all-gathers in evaluation: a block's group is gathered at every forward and freed
# after it (``reshard_after_forward``); the root's is gathered once and then *kept*, since the root
# does not reshard after forward. A generation of ``T`` tokens through a 2-block model thus
# all-gathers ``1 + 2T`` times. ``model.set_reshard_after_forward(False)`` keeps every group
# gathered: one all-gather per group for the whole generation, at the price of the whole model on
# every rank until ``reshard()`` is called on each FSDP module.
class GenerateLM(TinyLM):
    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy decoding; calls ``self.forward``, not ``self(...)``, as hand-written loops do."""
        tokens = prompt
        for _ in range(new_tokens):
            logits = self.forward(tokens)
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return tokens


NEW_TOKENS = 4
PROMPT = BATCHES[0, :WORLD_SIZE, :8]


def generate_lm() -> GenerateLM:
    model = GenerateLM(CFG)
    model.load_state_dict(build_model(CFG).state_dict())
    return model


def generation(rank: guide.Rank, mesh, way: str) -> dict:
    model = generate_lm().to(rank.device)
    shard_then_optimizer(model, mesh, SGD)
    if way != "not registered":
        register_fsdp_forward_method(model, "generate")  # right
    if way == "registered, set_reshard_after_forward(False)":
        model.set_reshard_after_forward(False)  # every group stays gathered after its forward
    model.eval()
    calls = []
    for _ in range(2):  # the second call meets what the first left gathered
        with CollectiveLog(model) as log:
            out, messages = caught(model.generate, PROMPT.to(rank.device), NEW_TOKENS)
        calls.append(log.count("all_gather"))
    return {"tokens": out, "messages": messages, "all_gathers": calls}


def forwards_in_eval(rank: guide.Rank, mesh) -> dict:
    model = generate_lm().to(rank.device)
    shard_then_optimizer(model, mesh, SGD)
    _, direct = caught(model.forward, PROMPT.to(rank.device))  # WRONG: bypasses the hooks
    model.eval()
    counts = []
    with torch.no_grad():
        for _ in range(3):
            with CollectiveLog(model) as log:
                model(PROMPT.to(rank.device))
            counts.append(log.count("all_gather"))
    return {"direct": direct, "all_gathers": counts,
            "root kept": not isinstance(model.tok_emb.weight, DTensor)}


GEN_WAYS = ("not registered", "registered", "registered, set_reshard_after_forward(False)")


def section_2(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    return {"eval": forwards_in_eval(rank, mesh),
            **{way: generation(rank, mesh, way) for way in GEN_WAYS}}


METHODS = guide.launch(section_2, WORLD_SIZE)[0]

# %%
# **Outcome.**

# sphinx_gallery_start_ignore
run = "2. methods other than forward"
GROUPS = CFG.n_layers + 1  # fully_shard groups: each block, and the root
expected_direct = "got mixed torch.Tensor and DTensor"
error = assert_reproduces(run + ": model.forward(x)", METHODS["eval"]["direct"], expected_direct)
error = assert_reproduces(run + ": generate", METHODS["not registered"]["messages"],
                          expected_direct)
print(f"model.forward(x), or generate() calling self.forward, on torch {torch.__version__}:\n"
      f"  {error}\n")
one_process = generate_lm().generate(PROMPT, NEW_TOKENS)
PAGE.state("whenbreaks.generate.new_tokens", NEW_TOKENS, "tokens", **RUN)
EXPECTED_GATHERS = {  # (first call, second call, the rule): the rules above, for this model
    "registered": (1 + CFG.n_layers * NEW_TOKENS, CFG.n_layers * NEW_TOKENS,
                   "one per block per token, the root's once, then kept"),
    "registered, set_reshard_after_forward(False)": (GROUPS, 0,
                                                     "one per group, then every group kept"),
}
GEN_ROWS = [["not registered", "RuntimeError", 0, 0]]
for way, (first, second, rule) in EXPECTED_GATHERS.items():
    got = METHODS[way]
    checks.expect("method output", f"{run}: {way}",
                  got["tokens"] is not None and torch.equal(got["tokens"], one_process),
                  f"generated {got['tokens']}, one process generated {one_process} "
                  f"({got['messages']})")
    key = "registered" if way == "registered" else "keep"
    counts = [PAGE.check(f"whenbreaks.generate.{key}.{call}", checks.expect_close(
        "comm calls", f"{run}: {way}", measured, want, 0, what="all-gathers", unit="calls",
        against=rule),
        fmt=".0f", **RUN) for call, measured, want in
        zip(("first_call", "second_call"), got["all_gathers"], (first, second))]
    GEN_ROWS.append([way, "one process's tokens", *counts])
EVAL = METHODS["eval"]
eval_counts = [PAGE.check(f"whenbreaks.eval.forward_{i + 1}.all_gathers", checks.expect_close(
    "comm calls", f"{run}: eval forward {i + 1}", measured, GROUPS if i == 0 else CFG.n_layers, 0,
    what="all-gathers", unit="calls", against="every group first, then the blocks (root kept)"),
    fmt=".0f", **RUN) for i, measured in enumerate(EVAL["all_gathers"])]
checks.expect("root kept", run, EVAL["root kept"],
              "after an eval forward the root's tok_emb.weight is a DTensor again")
PAGE.show("whenbreaks.generate.table",
          GEN_ROWS, ["generate()", "result", "all-gathers, 1st call", "all-gathers, 2nd call"],
          title=f"{NEW_TOKENS} new tokens, greedy, model.eval(); TinyLM with {CFG.n_layers} blocks",
          **RUN)
print(f"model(x) in eval, three forwards in a row: {eval_counts} all-gathers; the root's "
      "parameters stay gathered after the first")
# sphinx_gallery_end_ignore

# %%
# .. _whenbreaks-hangs:
#
# 3. Hangs: a module some ranks skip
# ----------------------------------
#
# .. index::
#    ! set_reduce_scatter_unused_params
#    ! timeout
#
# Conditional computation (mixture-of-experts routing, a modality missing from some batches)
# makes a rank skip a module the others run. Every FSDP2 collective needs every rank: an
# all-gather before the module's forward when it is its own ``fully_shard`` group, and a
# reduce-scatter of the group's gradients after backward either way. A tiny router model shows
# both: tokens whose first feature is positive go through the expert, and one rank's batch has
# none. The wrong line is the early return; the fix is to run the expert on zero tokens: it
# computes nothing, takes part in the expert's collectives, and gives the expert a zero gradient
# on that rank.
class TinyMoE(nn.Module):
    """A shared layer for every token, an expert for the tokens the router picks, a head."""

    def __init__(self, d_in: int = 8, d: int = 16) -> None:
        super().__init__()
        self.shared = nn.Linear(d_in, d)
        self.expert = nn.Linear(d, d)
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor, skip_idle_expert: bool = False) -> torch.Tensor:
        h = torch.relu(self.shared(x))
        picked = (x[:, 0] > 0).nonzero().squeeze(1)  # the router: this batch's expert tokens
        if skip_idle_expert and picked.numel() == 0:
            return self.head(h)  # WRONG under FSDP2: this rank skips the expert's collectives
        h = h.index_add(0, picked, self.expert(h[picked]))  # right: runs on zero tokens too
        return self.head(h)


def shard_moe(model: TinyMoE, mesh, expert_own_group: bool) -> TinyMoE:
    if expert_own_group:
        fully_shard(model.expert, mesh=mesh)  # its own all-gather and reduce-scatter
    fully_shard(model, mesh=mesh)  # else the expert shares the root's group
    return model


# %%
# Two ways to fix it, each run here: call the expert on every rank (above: drop the early
# return), or, when the skipped module shares a ``fully_shard`` group with modules that did run,
# tell FSDP2 to reduce-scatter zeros for parameters without a gradient
# (``model.set_reduce_scatter_unused_params(True)``, torch's counterpart of DDP's
# ``find_unused_parameters``). That flag cannot help a skipped module with its own group: the
# rank never enters the module, so its all-gather never starts.

# sphinx_gallery_start_ignore
MOE_STEPS = 2
HANG_TIMEOUT_S = 3.0  # the process group's timeout for the jobs meant to fail
DEADLINE_S = 60.0  # the launcher's bound on those jobs, whatever happens
GEN = torch.Generator().manual_seed(0)
MOE_X = torch.randn(2 * WORLD_SIZE, 8, generator=GEN)
HALF = WORLD_SIZE  # rows of the first half of the ranks: routed; the rest: none
MOE_X[:HALF, 0] = MOE_X[:HALF, 0].abs() + 0.1
MOE_X[HALF:, 0] = -MOE_X[HALF:, 0].abs()
MOE_Y = torch.randn(2 * WORLD_SIZE, 1, generator=GEN)
IDLE = [r for r in range(WORLD_SIZE) if not (rank_slice(MOE_X, r, WORLD_SIZE)[:, 0] > 0).any()]
HAS_UNUSED_FLAG = hasattr(FSDPModule, "set_reduce_scatter_unused_params")


def moe(seed: int = 0) -> TinyMoE:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyMoE()


def moe_steps(model: nn.Module, rank: guide.Rank | None, skip: bool) -> dict:
    """MOE_STEPS SGD steps of mean squared error on this rank's rows (all rows: one process)."""
    index, n = (0, 1) if rank is None else (rank.rank, rank.world_size)
    x, y = rank_slice(MOE_X, index, n), rank_slice(MOE_Y, index, n)
    opt = SGD(model.parameters())
    for _ in range(MOE_STEPS):
        ((model(x, skip_idle_expert=skip) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    return full_state(model)


MOE_REFERENCE = moe_steps(moe(), None, skip=False)


def moe_fixes(rank: guide.Rank) -> dict:
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    out = {"zero tokens": moe_steps(shard_moe(moe(), mesh, True), rank, skip=False)}  # fault-point: fix
    if HAS_UNUSED_FLAG:
        model = shard_moe(moe(), mesh, False)
        model.set_reduce_scatter_unused_params(True)  # zeros for the skipped expert's gradients
        out["set_reduce_scatter_unused_params"] = moe_steps(model, rank, skip=True)
    return out


def moe_skips(rank: guide.Rank, folder: str, expert_own_group: bool) -> None:
    """The wrong way, meant to fail: witness() records what this rank saw."""
    mesh = init_device_mesh(rank.device.type, (rank.world_size,))
    model = shard_moe(moe(), mesh, expert_own_group)
    with witness(folder, rank.rank):
        moe_steps(model, rank, skip=True)  # fault-point: hang-steps


FIXES = guide.launch(moe_fixes, WORLD_SIZE)[0]  # fault-point: fixes-launch
HANGS = {} if guide.under_torchrun() else {  # a hang in torchrun's own group would end the run
    own: expect_failure(f"3. skipped expert ({'own' if own else 'shared'} group)", moe_skips,
                        WORLD_SIZE, own, timeout_s=HANG_TIMEOUT_S, deadline_s=DEADLINE_S)
    for own in (True, False)}
# sphinx_gallery_end_ignore

# %%
# **Outcome.** The expert in its own group: the routed rank waits in the expert's all-gather, the
# idle rank has gone on to backward and waits in the reduce-scatter. Neither can finish; gloo
# raises once the process group's ``timeout`` has passed. On gloo ``init_process_group`` waits 30
# minutes by default (``torch.distributed.constants.default_pg_timeout``): pass
# ``timeout=timedelta(seconds=...)`` of a few times your longest step, so a hang costs minutes, not
# half an hour. The expert in the root's group: every rank all-gathers it, but the idle rank has no
# expert gradient, so its reduce-scatter is smaller and gloo aborts a rank (the message goes to the
# rank's stderr: C++ ends the process). With either fix the run equals one process.

# sphinx_gallery_start_ignore
run = "3. skipped module"
DEFAULT_TIMEOUT = torch.distributed.constants.default_pg_timeout
default_min = PAGE.state("whenbreaks.hang.default_timeout_min",
                         DEFAULT_TIMEOUT.total_seconds() / 60, "minutes", fmt=".0f",
                         backend="gloo")
checks.expect("pitfall reproduces", run, default_min == 30,
              f"torch's default process-group timeout is now {DEFAULT_TIMEOUT}: update the text.")
timeout_s = PAGE.state("whenbreaks.hang.timeout_s", HANG_TIMEOUT_S, "s", fmt=".0f", **RUN)
for way, params in FIXES.items():
    checks.assert_params_match(f"{run}, fixed with {way}", MOE_REFERENCE, params, TOL,
                               against=checks.SINGLE_PROCESS)
if not HAS_UNUSED_FLAG:
    print(f"torch {torch.__version__} has no set_reduce_scatter_unused_params: run the expert on "
          "every rank.")
if guide.under_torchrun():
    print("The failing jobs run only outside torchrun (a hang would end torchrun's own group).")
else:
    own, shared = HANGS[True], HANGS[False]
    # own group: every rank waited in a collective, the routed in the all-gather, the idle in the
    # reduce-scatter, and some rank's wait ended by the timeout, about timeout_s after it began
    waits = {s.rank: s.waiting_in for s in own.ranks}
    want = {r: "reduce-scatter" if r in IDLE else "all-gather" for r in range(WORLD_SIZE)}
    checks.expect("pitfall reproduces", run + " (own group)", waits == want,
                  f"the ranks waited in {waits}, expected {want} on torch {torch.__version__}")
    timed_out = assert_reproduces(run + " (own group)", [s.error for s in own.ranks],
                                  f"Timed out waiting {HANG_TIMEOUT_S * 1000:.0f}ms")
    first = min(s.seconds for s in own.ranks if "Timed out waiting" in s.error)
    waited = PAGE.check("whenbreaks.hang.own_group.seconds", checks.expect_close(
        "timeout", run + " (own group)", first, HANG_TIMEOUT_S, 2.0, what="seconds to the error",
        unit="s", against="the timeout given to init_process_group"), fmt=".1f", **RUN)
    aborted = assert_reproduces(run + " (shared group)", [s.stderr for s in shared.ranks],
                                "Received data size doesn't match expected size")
    who = shared.ranks[shared.error.rank]  # the rank the launcher blames: gloo aborted it
    checks.expect("pitfall reproduces", run + " (shared group)",
                  who.rank in IDLE and who.waiting_in == "reduce-scatter"
                  and "Received data size" in who.stderr,
                  f"rank {who.rank} failed first, in {who.waiting_in!r}, saying {who.stderr!r}; "
                  f"expected an idle rank {IDLE} aborted by gloo in the reduce-scatter")
    job_s = {own_: PAGE.state(f"whenbreaks.hang.{name}.job_seconds", h.seconds, "s",
                              fmt=".1f", **RUN)
             for own_, name, h in ((True, "own_group", own), (False, "shared_group", shared))}
    rows = [[f"rank {s.rank}", "idle" if s.rank in IDLE else "routed", s.waiting_in,
             s.error or "(no Python error)"] for s in own.ranks]
    report.show(report.table(rows, ["rank", "expert tokens", "waiting in", "what torch raised"],
                             title=f"expert in its own group; timeout={timeout_s:.0f} s"))
    print(f"first error after {waited:.1f} s; the launcher ended the job after "
          f"{job_s[True]:.1f} s with {type(own.error).__name__}\n")
    text = gist(aborted)
    print(f"expert in the root's group: rank {who.rank} wrote\n  "
          f"{text[text.index('Received data size'):]}\nand was killed by SIGABRT in the "
          f"reduce-scatter; the launcher ended the job after {job_s[False]:.1f} s with "
          f"{type(shared.error).__name__}")
# What the tests (tests/test_when_fsdp2_breaks.py) read of this run, and nothing else.
RESULT = dict(ORDER=ORDER, ROOT_PARAMS=ROOT_PARAMS, HANGS=HANGS, HANG_TIMEOUT_S=HANG_TIMEOUT_S)
# sphinx_gallery_end_ignore

# %%
# A check that fails stops the page with its name, so this line prints only when every check
# above held (at any supported world size, under python, torchrun or in a notebook).
print("All checks passed.")
