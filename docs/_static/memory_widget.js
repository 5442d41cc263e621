/* "Will it fit?": the site's memory model (guide.memory.fit) in the browser.
 *
 * A port of guide.memory.fit, guide.memory.predicted and guide.memory.activations to JavaScript
 * (and of guide-memory's --lora-rank and --cpu-offload: guide.memory.finetune, guide.memory.offload),
 * bytes as BigInt. tests/test_calculator_widget.py compares every number it computes with the
 * Python model's on hundreds of configurations; the DATA block below is written by
 * `python -m guide.memory.widget`, which stamps the hash of the Python model's sources the port
 * was checked against. The docs build fails when that hash is not the current one.
 *
 * Self-contained: no network, no dependency, no build step. Every element with the class
 * "memory-widget" becomes a calculator (data-widget="full") or a compact form ("compact").
 */
(function () {
  "use strict";

  // DATA-BEGIN (written by `python -m guide.memory.widget`; do not edit by hand)
  const DATA = {
   "analytic_strategies": [
    "zero2"
   ],
   "bounds": {
    "heads": {
     "example": "32",
     "high": 65536,
     "label": "Attention heads",
     "low": 1
    },
    "hidden": {
     "example": "4096",
     "high": 1048576,
     "label": "Hidden size",
     "low": 1
    },
    "kv_heads": {
     "example": "8",
     "high": 65536,
     "label": "KV heads",
     "low": 1
    },
    "layers": {
     "example": "32",
     "high": 512,
     "label": "Layers",
     "low": 1
    },
    "lora_rank": {
     "example": "16",
     "high": 65536,
     "label": "LoRA rank",
     "low": 1
    },
    "max_seq_len": {
     "example": "8192",
     "high": 16777216,
     "label": "Longest sequence",
     "low": 1
    },
    "micro_batch": {
     "example": "1",
     "high": 65536,
     "label": "Micro-batch",
     "low": 1
    },
    "mlp": {
     "example": "14336",
     "high": 4194304,
     "label": "MLP size",
     "low": 1
    },
    "params": {
     "example": "70e9",
     "high": 9007199254740991,
     "label": "Parameters",
     "low": 1
    },
    "seq_len": {
     "example": "4096",
     "high": 16777216,
     "label": "Sequence length",
     "low": 1
    },
    "shard_group": {
     "example": "8",
     "high": 16384,
     "label": "HSDP shard group",
     "low": 1
    },
    "vocab": {
     "example": "128256",
     "high": 16777216,
     "label": "Vocabulary",
     "low": 1
    },
    "world_size": {
     "example": "8",
     "high": 16384,
     "label": "Number of GPUs",
     "low": 1
    }
   },
   "checked_configs": 320,
   "checkpointing": [
    "none",
    "full",
    "selective"
   ],
   "default_shard_group": 8,
   "gib_max": 1048576,
   "gpus": {
    "H100 (80 GB)": 85520809984,
    "H200 (141 GB)": 150754820096
   },
   "korthikanti": {
    "bytes": 2,
    "sbh": 34,
    "scores": 5
   },
   "labels": {
    "ddp": "DDP",
    "fsdp2": "FSDP2",
    "fsdp2_no_reshard": "FSDP2, reshard_after_forward=False",
    "hsdp": "HSDP",
    "zero1": "DDP + ZeroRedundancyOptimizer",
    "zero2": "ZeRO-2 (the paper's, analytic)"
   },
   "optimizers": {
    "adamw": {
     "label": "AdamW",
     "moments": 2,
     "step_bytes": 4
    },
    "sgd": {
     "label": "SGD",
     "moments": 0,
     "step_bytes": 0
    },
    "sgd_momentum": {
     "label": "SGD + momentum",
     "moments": 1,
     "step_bytes": 0
    }
   },
   "order": {
    "gpus": [
     "H100 (80 GB)",
     "H200 (141 GB)"
    ],
    "optimizers": [
     "sgd",
     "sgd_momentum",
     "adamw"
    ],
    "precisions": [
     "fp32",
     "bf16_mixed",
     "bf16",
     "zero_mixed"
    ],
    "presets": [
     "gpt2-xl",
     "llama-3.2-1b",
     "llama-3.2-3b",
     "llama-2-7b",
     "mistral-7b",
     "llama-3-8b",
     "llama-3-70b",
     "llama-3.1-405b"
    ]
   },
   "precisions": {
    "bf16": {
     "compute": 2,
     "grad": 2,
     "label": "pure bf16",
     "master": 0,
     "moment": 2,
     "param": 2
    },
    "bf16_mixed": {
     "compute": 2,
     "grad": 4,
     "label": "bf16 compute, fp32 master",
     "master": 0,
     "moment": 4,
     "param": 4
    },
    "fp32": {
     "compute": 4,
     "grad": 4,
     "label": "fp32",
     "master": 0,
     "moment": 4,
     "param": 4
    },
    "zero_mixed": {
     "compute": 2,
     "grad": 2,
     "label": "ZeRO's mixed precision",
     "master": 4,
     "moment": 4,
     "param": 2
    }
   },
   "presets": {
    "gpt2-xl": {
     "bias": true,
     "gated_mlp": false,
     "heads": 25,
     "hidden": 1600,
     "kv_heads": null,
     "layernorm": true,
     "layers": 48,
     "learned_positions": true,
     "max_seq_len": 1024,
     "mlp": 6400,
     "tied_embeddings": true,
     "vocab": 50257
    },
    "llama-2-7b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 32,
     "hidden": 4096,
     "kv_heads": null,
     "layernorm": false,
     "layers": 32,
     "learned_positions": false,
     "max_seq_len": 4096,
     "mlp": 11008,
     "tied_embeddings": false,
     "vocab": 32000
    },
    "llama-3-70b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 64,
     "hidden": 8192,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 80,
     "learned_positions": false,
     "max_seq_len": 8192,
     "mlp": 28672,
     "tied_embeddings": false,
     "vocab": 128256
    },
    "llama-3-8b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 32,
     "hidden": 4096,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 32,
     "learned_positions": false,
     "max_seq_len": 8192,
     "mlp": 14336,
     "tied_embeddings": false,
     "vocab": 128256
    },
    "llama-3.1-405b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 128,
     "hidden": 16384,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 126,
     "learned_positions": false,
     "max_seq_len": 131072,
     "mlp": 53248,
     "tied_embeddings": false,
     "vocab": 128256
    },
    "llama-3.2-1b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 32,
     "hidden": 2048,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 16,
     "learned_positions": false,
     "max_seq_len": 131072,
     "mlp": 8192,
     "tied_embeddings": true,
     "vocab": 128256
    },
    "llama-3.2-3b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 24,
     "hidden": 3072,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 28,
     "learned_positions": false,
     "max_seq_len": 131072,
     "mlp": 8192,
     "tied_embeddings": true,
     "vocab": 128256
    },
    "mistral-7b": {
     "bias": false,
     "gated_mlp": true,
     "heads": 32,
     "hidden": 4096,
     "kv_heads": 8,
     "layernorm": false,
     "layers": 32,
     "learned_positions": false,
     "max_seq_len": 32768,
     "mlp": 14336,
     "tied_embeddings": false,
     "vocab": 32000
    }
   },
   "short": {
    "ddp": "DDP",
    "fsdp2": "FSDP2",
    "fsdp2_no_reshard": "ZeRO-2",
    "hsdp": "HSDP",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2 (paper)"
   },
   "source_hash": "055b33830ac7",
   "strategies": [
    "ddp",
    "zero1",
    "fsdp2_no_reshard",
    "fsdp2",
    "hsdp"
   ],
   "world_sizes": [
    1,
    2,
    4,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096
   ]
  };
  // DATA-END

  const B = (x) => BigInt(x);
  const PARTS = ["params", "unsharded", "grads", "optimizer", "buckets", "activations", "autocast",
    "buffers"];

  // -- the model: a line-by-line port; every function is called through M so a test can patch one.
  const M = {};

  /** [embeddings, one layer, tail] (Architecture._parts): the tail is the final norm and,
   * unless tied, the head. */
  M.archParts = function (a) {
    const h = a.hidden, f = a.mlp;
    const kv = (a.kv_heads || a.heads) * Math.floor(h / a.heads);
    const norm = a.layernorm ? [[h], [h]] : [[h]];
    const linear = (out, inp) => (a.bias ? [[out, inp], [out]] : [[out, inp]]);
    const mlp = a.gated_mlp ? [...linear(f, h), ...linear(f, h), ...linear(h, f)]
      : [...linear(f, h), ...linear(h, f)];
    const layer = [...norm, ...linear(h, h), ...linear(kv, h), ...linear(kv, h), ...linear(h, h),
      ...norm, ...mlp];
    const embeddings = [[a.vocab, h]];
    if (a.learned_positions) embeddings.push([a.max_seq_len || 0, h]);
    return [embeddings, layer, [...norm, ...(a.tied_embeddings ? [] : [[a.vocab, h]])]];
  };

  /** One shape per parameter tensor, in the order of Architecture.param_shapes. */
  M.paramShapes = function (a) {
    const [embeddings, layer, tail] = M.archParts(a);
    const shapes = [...embeddings];
    for (let i = 0; i < a.layers; i++) shapes.push(...layer);
    shapes.push(...tail);
    return shapes;
  };

  /** The fully_shard units (Architecture.fsdp2_units): the root (embeddings and tail), then
   * one unit per layer. */
  M.fsdp2Units = function (a) {
    const [embeddings, layer, tail] = M.archParts(a);
    return [[...embeddings, ...tail], ...Array.from({ length: a.layers }, () => layer.slice())];
  };

  M.numel = (shape) => shape.reduce((p, d) => p * B(d), 1n);
  /** (dim 0, elements per row); a 0-d tensor is one row of one element. */
  M.rows = (shape) => (shape.length ? [B(shape[0]), M.numel(shape.slice(1))] : [1n, 1n]);
  M.ceilDiv = (a, b) => (a + b - 1n) / b;
  /** How torch.chunk splits `length` rows over n ranks (guide.dtensor.chunk_sizes). */
  M.chunkSizes = function (length, n) {
    const chunk = M.ceilDiv(length, B(n)), out = [];
    for (let r = 0; r < n; r++) {
      const left = length - B(r) * chunk;
      out.push(left < 0n ? 0n : left < chunk ? left : chunk);
    }
    return out;
  };

  /** ZeroRedundancyOptimizer's greedy partition: largest first, to the rank with the fewest. */
  M.zero1Partition = function (shapes, n) {
    const sizes = shapes.map((s) => Number(M.numel(s)));  // element counts: safe integers
    const order = sizes.map((_, i) => i).sort((i, j) => sizes[j] - sizes[i]);  // stable
    const held = new Array(n).fill(0), owned = Array.from({ length: n }, () => []);
    for (const i of order) {
      let rank = 0;
      for (let r = 1; r < n; r++) if (held[r] < held[rank]) rank = r;
      owned[rank].push(i);
      held[rank] += sizes[i];
    }
    return owned;
  };

  M.bucketBytes = (strategy, total, pr, ddpBuckets) =>
    (ddpBuckets && (strategy === "ddp" || strategy === "zero1") ? total * B(pr.grad) : 0n);

  const state = (params, grads, optimizer, buckets) => ({ params, grads, optimizer, buckets });
  const stateTotal = (s) => s.params + s.grads + s.optimizer + s.buckets;

  /** Predicted bytes of every rank (guide.memory.state_bytes_by_rank). */
  M.stateBytesByRank = function (shapes, strategy, n, precision, optimizer, ddpBuckets) {
    const pr = DATA.precisions[precision], opt = DATA.optimizers[optimizer];
    const perElem = B(pr.master + opt.moments * pr.moment), step = B(opt.step_bytes);
    const count = B(shapes.length);
    const numels = shapes.map(M.numel);
    const total = numels.reduce((a, b) => a + b, 0n);
    const buckets = M.bucketBytes(strategy, total, pr, ddpBuckets);
    if (strategy === "ddp") {
      return [state(total * B(pr.param), total * B(pr.grad), total * perElem + count * step,
        buckets)];
    }
    if (strategy === "zero1") {
      return M.zero1Partition(shapes, n).map((idx) => state(total * B(pr.param),
        total * B(pr.grad),
        idx.reduce((a, i) => a + numels[i], 0n) * perElem + B(idx.length) * step, buckets));
    }
    if (strategy === "zero2") {
      return M.chunkSizes(total, n).map((mine) => state(total * B(pr.param), mine * B(pr.grad),
        mine * perElem + (mine ? count * step : 0n), buckets));
    }
    // FSDP2: every rank allocates ceil(dim0/N) rows (padded); optimizer state on its real rows.
    const groups = new Map();
    for (const s of shapes) {
      const [dim0, row] = M.rows(s), key = dim0 + "x" + row;
      const g = groups.get(key) || { dim0, row, count: 0n };
      g.count += 1n;
      groups.set(key, g);
    }
    let padded = 0n;
    const real = new Array(n).fill(0n);
    for (const { dim0, row, count: c } of groups.values()) {
      const sizes = M.chunkSizes(dim0, n);
      padded += sizes[0] * row * c;
      for (let r = 0; r < n; r++) real[r] += sizes[r] * row * c;
    }
    return real.map((mine) => state(padded * B(pr.param), padded * B(pr.grad),
      mine * perElem + count * step, buckets));
  };

  /** The rank that holds the most (ties: the lowest rank). */
  M.perRankStateBytes = function (shapes, strategy, n, precision, optimizer, ddpBuckets) {
    const ranks = M.stateBytesByRank(shapes, strategy, n, precision, optimizer, ddpBuckets);
    let best = ranks[0];
    for (const s of ranks) if (stateTotal(s) > stateTotal(best)) best = s;
    return best;
  };

  /** All parameters unsharded, padded to N chunks, in the compute dtype. */
  M.unshardedParamBytes = function (shapes, n, precision) {
    let padded = 0n;
    for (const s of shapes) {
      const [dim0, row] = M.rows(s);
      padded += M.ceilDiv(dim0, B(n)) * B(n) * row;
    }
    return padded * B(DATA.precisions[precision].compute);
  };

  const FP32 = 4n;  // statistics, SDPA's log-sum-exp and the loss's logits are fp32
  const kvWidth = (a) => B((a.kv_heads || a.heads) * Math.floor(a.hidden / a.heads));

  /** One normalization's saved bytes with its output (activations._norm_bytes), fused norm. */
  M.normBytes = (a, t, e) => t * (2n * e * B(a.hidden) + FP32 * (a.layernorm ? 2n : 1n));

  /** One block's saved bytes, operation by operation (activations.block_bytes: fused norm;
   * fused attention keeps an fp32 log-sum-exp per query and head, unfused attention its s x s
   * probabilities in `e` bytes and the causal mask, one byte per element). */
  M.blockBytes = function (a, s, b, e, fusedAttention = true) {
    const t = B(s) * B(b), h = B(a.hidden), m = B(a.mlp);
    const attention = t * e * (2n * h + 2n * kvWidth(a)) + (fusedAttention
      ? t * B(a.heads) * FP32 : B(a.heads) * B(s) * B(s) * B(b) * e + B(s) * B(s));
    return 2n * M.normBytes(a, t, e) + attention + t * e * m * (a.gated_mlp ? 4n : 2n);
  };

  /** torchtitan's op-level selective checkpointing (activations.selective_layer_bytes). */
  M.selectiveLayerBytes = function (a, s, b, e) {
    const t = B(s) * B(b), h = B(a.hidden), m = B(a.mlp), kv = kvWidth(a);
    const outs = [h, kv, kv, h, ...(a.gated_mlp ? [m, m, h] : [m, h])];
    const kept = outs.filter((_, i) => i % 2 === 0).reduce((x, d) => x + t * e * d, 0n);
    return t * e * h + kept + t * e * h + t * B(a.heads) * FP32;
  };

  /** The fp32 logits and their fp32 gradient (activations.logits_bytes). */
  M.logitsBytes = (a, s, b) => 2n * FP32 * B(a.vocab) * B(s) * B(b);

  /** Activation bytes per GPU (guide.memory.activation_bytes: fused norm; attention fused
   * unless `fusedAttention` is false; `e` bytes per element, the precision's compute dtype). */
  M.activationBytes = function (arch, s, b, checkpointing, e, fusedAttention = true) {
    e = B(e);
    const layer = M.blockBytes(arch, s, b, e, fusedAttention);
    const blocks = checkpointing === "none" ? B(arch.layers) * layer
      : checkpointing === "full" ? B(arch.layers) * B(s) * B(b) * B(arch.hidden) * e + layer
        : B(arch.layers) * M.selectiveLayerBytes(arch, s, b, e) + layer;
    return blocks + M.normBytes(arch, B(s) * B(b), e) + M.logitsBytes(arch, s, b);
  };

  /** autocast's saved weight copies (transient.autocast_weight_bytes). */
  M.autocastWeightBytes = function (a, strategy, precision) {
    const p = DATA.precisions[precision];
    if ((strategy !== "ddp" && strategy !== "zero1") || p.compute >= p.param) return 0n;
    const h = B(a.hidden), kv = kvWidth(a), m = B(a.mlp);
    const block = 2n * h * h + 2n * kv * h + (a.gated_mlp ? 3n : 2n) * m * h;
    return (B(a.layers) * block + B(a.vocab) * h) * B(p.compute);
  };

  /** FSDP2's transient buffers (transient.fsdp2_buffer_bytes): the root (embeddings, final norm,
   * head: the shapes of a model with no layers) and one block. */
  M.fsdp2BufferBytes = function (a, strategy, precision) {
    if (!["fsdp2", "fsdp2_no_reshard", "hsdp"].includes(strategy)) return 0n;
    const p = DATA.precisions[precision], c = B(p.compute), g = B(p.grad);
    const size = (layers) => M.paramShapes({ ...a, layers }).reduce((x, s) => x + M.numel(s), 0n);
    const root = size(0), block = size(1) - root;
    const grads = root * c + block * (c + g);
    return strategy === "fsdp2_no_reshard" ? grads : grads + root * c + 2n * block * c;
  };

  /** GPUs one HSDP shard group spans; null where the 2-D mesh cannot be built. */
  M.hsdpShardSize = (n, g) => (n > g && n % g ? null : Math.min(n, g));

  /** Per-GPU bytes from a parameter count alone (guide.memory.state_bytes_for_count): ideal
   * 1/N shares, no padding, no per-tensor step. */
  M.stateBytesForCount = function (count, strategy, n, precision, optimizer, ddpBuckets) {
    const pr = DATA.precisions[precision], opt = DATA.optimizers[optimizer];
    const share = M.ceilDiv(count, B(n));
    const fsdp2 = strategy === "fsdp2" || strategy === "fsdp2_no_reshard";
    const p = fsdp2 ? share : count;
    const g = strategy === "zero2" || fsdp2 ? share : count;
    const o = strategy === "ddp" ? count : share;
    return state(p * B(pr.param), g * B(pr.grad), o * B(pr.master + opt.moments * pr.moment),
      M.bucketBytes(strategy, count, pr, ddpBuckets));
  };

  /** The fullest GPU's bytes of one layout on n GPUs (guide.memory.fit.per_gpu); `shapes` is a
   * list of shapes, or a BigInt parameter count; `ddpBuckets`: false models DDP's
   * gradient_as_bucket_view=True (no separate gradient buckets). */
  M.perGpu = function (shapes, strategy, n, precision, optimizer, activations, shardGroup, arch,
    ddpBuckets = true) {
    const group = strategy === "hsdp" ? M.hsdpShardSize(n, shardGroup)
      : strategy === "ddp" || strategy === "zero1" ? 1 : n;
    if (group === null) return null;
    const priced = strategy === "hsdp" ? "fsdp2" : strategy;
    const width = strategy === "hsdp" ? group : n, count = typeof shapes === "bigint";
    const sb = count
      ? M.stateBytesForCount(shapes, priced, width, precision, optimizer, ddpBuckets)
      : M.perRankStateBytes(shapes, priced, width, precision, optimizer, ddpBuckets);
    const unsharded = strategy !== "fsdp2_no_reshard" ? 0n
      : count ? shapes * B(DATA.precisions[precision].compute)
        : M.unshardedParamBytes(shapes, n, precision);
    const autocast = count ? 0n : M.autocastWeightBytes(arch, strategy, precision);
    const buffers = count ? 0n : M.fsdp2BufferBytes(arch, strategy, precision);
    const split = { strategy, N: n, shard_group: group, params: sb.params, unsharded,
      grads: sb.grads, optimizer: sb.optimizer, buckets: sb.buckets, activations, autocast,
      buffers };
    split.total = PARTS.reduce((a, p) => a + split[p], 0n);
    return split;
  };

  /** The smallest N of DATA.world_sizes that fits in `capacity` bytes, or null. */
  M.smallestWorldSize = function (shapes, strategy, capacity, precision, optimizer, activations,
    shardGroup, arch, ddpBuckets = true) {
    for (const n of DATA.world_sizes) {
      if (strategy === "hsdp" && n > shardGroup && n % shardGroup) continue;
      const split = M.perGpu(shapes, strategy, n, precision, optimizer, activations, shardGroup,
        arch, ddpBuckets);
      if (split.total <= capacity) return n;
    }
    return null;
  };

  /** GPU memory in bytes: a preset, or floor(GiB * 2**30). */
  M.capacityBytes = (cfg) => (cfg.gpu ? B(DATA.gpus[cfg.gpu])
    : B(Math.floor(cfg.gib * 1073741824)));

  /** The architecture a configuration names: a preset, or Llama-style custom shapes. */
  M.architecture = function (cfg) {
    if (cfg.preset) return DATA.presets[cfg.preset];
    return { vocab: cfg.vocab, hidden: cfg.hidden, layers: cfg.layers, heads: cfg.heads,
      kv_heads: cfg.kv_heads || null, mlp: cfg.mlp, tied_embeddings: !!cfg.tied, gated_mlp: true,
      bias: false, layernorm: false, learned_positions: false,
      max_seq_len: cfg.max_seq_len || null };
  };

  /** Everything the calculator shows for one configuration (guide.memory.fit.fit_report, with
   * guide-memory's --unfused-attention and --bucket-view as cfg.unfused_attention and
   * cfg.bucket_view). */
  M.fitReport = function (cfg) {
    const counted = cfg.params !== undefined;  // a parameter count alone: no activations
    const arch = counted ? null : M.architecture(cfg);
    const shapes = counted ? B(cfg.params) : M.paramShapes(arch);
    const ddpBuckets = !cfg.bucket_view;
    const activations = counted ? 0n
      : M.activationBytes(arch, cfg.seq_len, cfg.micro_batch, cfg.checkpointing,
        DATA.precisions[cfg.precision].compute, !cfg.unfused_attention);
    const capacity = M.capacityBytes(cfg);
    const rows = [], smallest = {};
    for (const key of cfg.strategies) {
      for (const n of cfg.world_sizes) {
        const split = M.perGpu(shapes, key, n, cfg.precision, cfg.optimizer, activations,
          cfg.shard_group, arch, ddpBuckets);
        const row = { strategy: key, label: DATA.labels[key], N: n };
        if (split === null) {
          Object.assign(row, { shard_group: null, fits: null, headroom: null });
          for (const p of [...PARTS, "total"]) row[p] = null;
        } else {
          Object.assign(row, split, { fits: split.total <= capacity,
            headroom: capacity - split.total });
        }
        rows.push(row);
      }
      smallest[key] = M.smallestWorldSize(shapes, key, capacity, cfg.precision, cfg.optimizer,
        activations, cfg.shard_group, arch, ddpBuckets);
    }
    const report = { parameters: counted ? shapes : shapes.reduce((a, s) => a + M.numel(s), 0n),
      activations, capacity, ddp_buckets: ddpBuckets,
      attention: counted ? null : cfg.unfused_attention ? "unfused" : "fused",
      shard_group: cfg.shard_group, rows, smallest_world_size: smallest };
    if (cfg.lora_rank && !counted) {  // guide-memory --lora-rank R: rank 0's bytes per N
      report.lora = { rank: cfg.lora_rank, base_precision: cfg.base_precision,
        rows: cfg.world_sizes.map((n) => {
          const sb = M.loraStateBytes(arch, cfg.lora_rank, n, cfg.base_precision, cfg.precision,
            cfg.optimizer);
          return { N: n, params: sb.params, grads: sb.grads, optimizer: sb.optimizer,
            total: sb.params + sb.grads + sb.optimizer };
        }) };
    }
    if (cfg.cpu_offload && !counted) {  // guide-memory --cpu-offload
      report.cpu_offload = M.cpuOffload(arch, shapes, cfg, activations);
    }
    return report;
  };

  // -- FSDP2's CPUOffloadPolicy (guide.memory.offload) ------------------------------------------

  /** The host-device bytes of one synced micro-batch on `rank` (offload.offload_traffic):
   * each unit's padded shard in (the root gathered once, every other unit twice when it
   * reshards after forward), each parameter's real gradient shard out. */
  M.offloadTraffic = function (units, n, precision, rank = 0, reshardAfterForward = true) {
    const p = DATA.precisions[precision];
    let toDevice = 0n, toHost = 0n, copiesIn = 0, copiesOut = 0;
    const split = new Map();  // M.chunkSizes once per distinct dim 0: the blocks repeat
    units.forEach((unit, u) => {
      const gathers = u === 0 || !reshardAfterForward ? 1n : 2n;
      let padded = 0n, real = 0n;
      for (const shape of unit) {
        const [dim0, row] = M.rows(shape);
        if (!split.has(dim0)) split.set(dim0, M.chunkSizes(dim0, n));
        const sizes = split.get(dim0);
        padded += sizes[0] * row;
        real += sizes[rank] * row;
      }
      toDevice += gathers * padded * B(p.param);
      toHost += real * B(p.grad);
      copiesIn += Number(gathers) * unit.length;
      copiesOut += unit.length;
    });
    return { to_device: toDevice, to_host: toHost, to_device_copies: copiesIn,
      to_host_copies: copiesOut };
  };

  /** The FSDP2 model state the fullest rank moves to the host (offload.offload_memory): its
   * gpu_saved, equal to the host RAM it needs. */
  M.offloadMemory = function (shapes, n, precision, optimizer) {
    const s = M.perRankStateBytes(shapes, "fsdp2", n, precision, optimizer, false);
    const moved = s.params + s.grads + s.optimizer;
    return { params: s.params, grads: s.grads, optimizer: s.optimizer, gpu_saved: moved,
      host: moved };
  };

  /** guide-memory --cpu-offload (cli._offload): per N, FSDP2's fullest GPU without and with
   * CPUOffloadPolicy, the host bytes per rank and the host-device bytes per micro-batch. */
  M.cpuOffload = function (arch, shapes, cfg, activations) {
    return { estimate: "GPU-only, predicted", rows: cfg.world_sizes.map((n) => {
      const gpu = M.perGpu(shapes, "fsdp2", n, cfg.precision, cfg.optimizer, activations,
        cfg.shard_group, arch, false);
      const moved = M.offloadMemory(shapes, n, cfg.precision, cfg.optimizer);
      const traffic = M.offloadTraffic(M.fsdp2Units(arch), n, cfg.precision);
      return { N: n, gpu_without: gpu.total, gpu_saved: moved.gpu_saved,
        gpu_with: gpu.total - moved.gpu_saved, host: moved.host, to_device: traffic.to_device,
        to_host: traffic.to_host };
    }) };
  };

  // -- fine-tuning: a frozen base and LoRA adapters (guide.memory.finetune) ----------------------

  /** Rank 0's bytes for a rank-`r` LoRA of every linear of every layer, the base frozen in
   * `basePrecision` (guide.memory.finetune.lora_state_bytes(...)[0]). */
  M.loraStateBytes = function (arch, r, n, basePrecision, adapterPrecision, optimizer) {
    const shapes = M.paramShapes(arch);
    const head = 1 + (arch.learned_positions ? 1 : 0);
    const tail = (arch.layernorm ? 2 : 1) + (arch.tied_embeddings ? 0 : 1);
    const adapters = [];
    for (const s of shapes.slice(head, shapes.length - tail)) {
      if (s.length === 2) adapters.push([r, s[1]], [s[0], r]);
    }
    const trained = M.stateBytesByRank(adapters, "fsdp2", n, adapterPrecision, optimizer, false)[0];
    const frozen = M.stateBytesByRank(shapes, "fsdp2", n, basePrecision, "sgd", false)[0];
    return state(trained.params + frozen.params, trained.grads, trained.optimizer,
      trained.buckets);
  };

  // -- input checking: one table of bounds, one sentence per mistake (guide.memory.inputs) -------
  const NUMBER = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;
  const clean = (text) => String(text ?? "").replace(/[,_\s]/g, "");
  const grouped = (v) => v.toLocaleString("en-US");

  /** guide.memory.inputs.parse_int: an exact whole number within DATA.bounds[key], as
   * {value} (a Number: every bound is a safe integer) or {error}. */
  M.parseInt = function (key, text, what) {
    const b = DATA.bounds[key];
    what = what ?? b.label;
    const t = clean(text);
    if (t === "") return { error: `${what}: enter a whole number (it is empty).` };
    const m = NUMBER.exec(t);
    if (!m || !(m[2] || m[3])) {
      return { error: `${what}: "${text}" is not a number; enter a whole number such as ` +
        `${b.example}.` };
    }
    const frac = m[3] || "", digits = (m[2] + frac).replace(/^0+/, "");
    const exp = m[4] || "0";
    const expValue = exp.replace(/^[+-]/, "").length <= 9 ? Number(exp)
      : (exp[0] === "-" ? -1 : 1) * 1e9;
    const least = { error: `${what} must be at least ${grouped(b.low)}, got ${t}.` };
    if (digits === "" || m[1] === "-") return least;
    const stripped = digits.replace(/0+$/, "");
    const shift = expValue - frac.length + digits.length - stripped.length;
    if (shift < 0) return { error: `${what} must be a whole number, got ${t}.` };
    const most = { error: `${what} must be at most ${grouped(b.high)}, got ${t}.` };
    if (stripped.length + shift > String(b.high).length) return most;
    const value = BigInt(stripped) * 10n ** BigInt(shift);
    if (value < BigInt(b.low)) return least;
    if (value > BigInt(b.high)) return most;
    return { value: Number(value) };
  };

  /** guide.memory.inputs.parse_gib: a positive number of GiB up to DATA.gib_max. */
  M.parseGib = function (text, what = "GPU memory") {
    const t = clean(text), m = NUMBER.exec(t);
    const v = m && (m[2] || m[3]) ? Number(t) : NaN;
    if (!(v > 0) || m[1] === "-") {
      return { error: `${what} must be a positive number of GiB, such as 80; got "${t}".` };
    }
    if (v > DATA.gib_max) {
      return { error: `${what} must be at most ${grouped(DATA.gib_max)} GiB, got ${t}.` };
    }
    return { value: v };
  };

  /** guide.memory.inputs.unknown: a choice that is not one of `options`, naming them. */
  M.unknown = (what, value, options) =>
    `unknown ${what} "${value}"; choose one of ${options.join(", ")}.`;

  /** guide.memory.inputs.check_heads (with its HEAD_NAMES); null when the shape is valid. */
  M.checkHeads = function (hidden, heads, kvHeads, names = ["Attention heads", "the hidden size",
    "KV heads", "the attention heads"]) {
    if (hidden % heads) {
      const fit = hidden % 64 === 0;
      return `${names[0]} (${heads}) must divide ${names[1]} (${hidden}): try ` +
        `${fit ? hidden / 64 : 1} heads of ${fit ? 64 : hidden} dimensions.`;
    }
    if (kvHeads && heads % kvHeads) {
      return `${names[2]} (${kvHeads}) must divide ${names[3]} (${heads}).`;
    }
    return null;
  };

  /** guide.memory.inputs.check_seq_len; null when the model supports `s`. */
  M.checkSeqLen = (s, max, model, what = "Sequence length") => (max && s > max
    ? `${what} ${grouped(s)} is longer than ${model} supports (${grouped(max)} positions); ` +
      `use ${grouped(max)} or fewer.` : null);

  /** guide.memory.inputs.check_param_count; null within bounds. */
  M.checkParamCount = function (n) {
    const top = B(DATA.bounds.params.high);
    return n > top ? `this shape has ${grouped(n)} parameters, more than ${grouped(top)}: ` +
      "reduce a dimension." : null;
  };

  /** guide-memory --unfused-attention: the attention kinds (the report's "attention"). */
  const ATTENTION = ["fused", "unfused"];
  /** guide-memory --bucket-view: DDP's gradient_as_bucket_view, as a link spells it. */
  const BUCKET_VIEW = ["false", "true"];

  /** guide-memory --cpu-offload: FSDP2's CPUOffloadPolicy, as a link spells it. */
  const CPU_OFFLOAD = ["false", "true"];

  /** How the widget names each choice in a message, and the choices it accepts. */
  const CHOICES = {  // in guide-memory's order (DATA.order), so both sides list them alike
    preset: ["model", () => [...DATA.order.presets, "custom", "count"]],
    precision: ["precision", () => DATA.order.precisions],
    base_precision: ["base precision", () => DATA.order.precisions],
    optimizer: ["optimizer", () => DATA.order.optimizers],
    checkpointing: ["activation checkpointing", () => DATA.checkpointing],
    strategy: ["strategy", () => ["all", ...DATA.strategies, ...DATA.analytic_strategies]],
    gpu: ["GPU", () => [...DATA.order.gpus, "custom"]],
    attention: ["attention", () => ATTENTION],
    bucket_view: ["gradient_as_bucket_view", () => BUCKET_VIEW],
    cpu_offload: ["CPU offload", () => CPU_OFFLOAD],
  };

  /** One message per choice in `raw` that is not one of its options (a shared link's typo). */
  M.choiceErrors = (raw) => Object.entries(CHOICES)
    .filter(([k, [, opts]]) => raw[k] !== undefined && !opts().includes(raw[k]))
    .map(([k, [what, opts]]) => M.unknown(what, raw[k], opts()));

  /** A configuration from the form's raw values, or a list of messages. */
  M.parse = function (raw) {
    const errors = M.choiceErrors(raw), cfg = { precision: raw.precision,
      optimizer: raw.optimizer, checkpointing: raw.checkpointing, strategies: raw.strategy === "all"
        ? DATA.strategies.slice() : [raw.strategy], bucket_view: raw.bucket_view === "true" };
    const int = (key) => {
      const r = M.parseInt(key, raw[key]);
      if (r.error) errors.push(r.error); else cfg[key] = r.value;
    };
    if (raw.preset === "count") {
      int("params");
    } else if (raw.preset && raw.preset !== "custom") {
      if (raw.preset in DATA.presets) cfg.preset = raw.preset;
    } else {
      int("layers"); int("hidden"); int("heads"); int("vocab"); int("mlp");
      if (String(raw.kv_heads ?? "").trim() !== "") int("kv_heads");
      if (String(raw.max_seq_len ?? "").trim() !== "") int("max_seq_len");
      cfg.tied = !!raw.tied;
      if (cfg.hidden && cfg.heads) {
        const e = M.checkHeads(cfg.hidden, cfg.heads, cfg.kv_heads);
        if (e) errors.push(e);
      }
    }
    if (raw.preset !== "count") {
      int("seq_len"); int("micro_batch");
      cfg.unfused_attention = raw.attention === "unfused";
    }
    int("world_size"); int("shard_group");
    if (cfg.world_size) cfg.world_sizes = [cfg.world_size];
    if (raw.cpu_offload === "true") {
      if (raw.preset === "count") {
        errors.push("CPU offload prices FSDP2's shards unit by unit: choose a model or a " +
          "custom shape, not a parameter count.");
      } else cfg.cpu_offload = true;
    }
    if (String(raw.lora_rank ?? "").trim() !== "") {
      if (raw.preset === "count") {
        errors.push("LoRA rank adds adapters to every linear: choose a model or a custom " +
          "shape, not a parameter count.");
      } else {
        int("lora_rank");
        cfg.base_precision = raw.base_precision;
      }
    }
    if (raw.gpu && raw.gpu !== "custom") {
      if (raw.gpu in DATA.gpus) cfg.gpu = raw.gpu;
    } else {
      const r = M.parseGib(raw.gib);
      if (r.error) errors.push(r.error); else cfg.gib = r.value;
    }
    if (cfg.seq_len && (cfg.preset || cfg.max_seq_len)) {
      const e = cfg.preset
        ? M.checkSeqLen(cfg.seq_len, DATA.presets[cfg.preset].max_seq_len, cfg.preset)
        : M.checkSeqLen(cfg.seq_len, cfg.max_seq_len, "this architecture");
      if (e) errors.push(e);
    }
    if (!errors.length && cfg.params === undefined) {
      const e = M.checkParamCount(M.paramShapes(M.architecture(cfg))
        .reduce((a, s) => a + M.numel(s), 0n));
      if (e) errors.push(e);
    }
    return errors.length ? { errors } : { cfg };
  };

  // -- display ----------------------------------------------------------------------------------
  const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

  /** guide.memory.display.fixed: n / scale (BigInts) with `digits` decimals, rounded half to
   * even on the exact quotient, with thousands separators. */
  M.fixed = function (n, scale, digits = 2) {
    let sign = n < 0n ? "-" : "";
    const a = n < 0n ? -n : n, p = 10n ** BigInt(digits);
    let q = (a * p) / scale;
    const r = (a * p) % scale;
    if (2n * r > scale || (2n * r === scale && q % 2n === 1n)) q += 1n;
    if (q === 0n) sign = "";
    const frac = (q % p).toString().padStart(digits, "0");
    return sign + grouped(q / p) + (digits ? "." + frac : "");
  };

  /** guide.memory.display.format_bytes: a unit per value, two decimals, half to even. */
  function formatBytes(n) {
    const v = B(n), a = v < 0n ? -v : v;
    for (const [u, s] of UNITS) if (a >= B(s)) return M.fixed(v, B(s)) + " " + u;
    return grouped(v) + " B";
  }
  M.formatBytes = formatBytes;

  /** guide.memory.display.smallest_text. */
  M.smallestText = (n, largest) => (n === null ? `no N ≤ ${grouped(largest)} GPUs`
    : grouped(n));

  /** guide.memory.display.assumptions: the line guide-memory prints above its table. */
  M.assumptions = function (cfg, rep) {
    const model = cfg.preset || (cfg.params !== undefined ? "parameter count" : "architecture");
    let line = `${model}: ${grouped(rep.parameters)} parameters; ` +
      `${DATA.precisions[cfg.precision].label} (${cfg.precision}), ` +
      DATA.optimizers[cfg.optimizer].label;
    if (cfg.params === undefined) {
      line += `; activations of ${grouped(cfg.micro_batch)} x ${grouped(cfg.seq_len)} tokens, ` +
        `${cfg.unfused_attention ? "unfused" : "fused"} attention, ${cfg.checkpointing} ` +
        "checkpointing (estimate)";
    }
    return line;
  };

  const COLORS = { params: "#1f77b4", unsharded: "#9467bd", grads: "#ff7f0e",
    optimizer: "#2ca02c", buckets: "#8c564b", activations: "#d62728", autocast: "#e377c2",
    buffers: "#7f7f7f" };
  const PART_HEADS = { params: "params", unsharded: "unsharded", grads: "grads",
    optimizer: "optimizer", buckets: "DDP buckets", activations: "activations",
    autocast: "autocast copies", buffers: "FSDP2 buffers" };
  const PART_LABELS = { params: "parameters", unsharded: "unsharded params (kept fwd→bwd)",
    grads: "gradients", optimizer: "optimizer state", buckets: "DDP buckets",
    activations: "activations (with logits)", autocast: "autocast bf16 weight copies",
    buffers: "FSDP2 gathered blocks and gradient buffers" };

  const CSS = `
.memory-widget{--mw-border:var(--pst-color-border,#ccc);--mw-fg:var(--pst-color-text-base,#222);
 --mw-muted:var(--pst-color-text-muted,#666);--mw-bg:var(--pst-color-surface,#f6f6f6);
 --mw-ok:var(--pst-color-success,#1a7f37);--mw-bad:var(--pst-color-danger,#c62828);
 border:1px solid var(--mw-border);border-radius:.4rem;padding:.8rem;margin:1rem 0;
 background:var(--pst-color-background,transparent);color:var(--mw-fg);max-width:100%;
 box-sizing:border-box;overflow:hidden}
.memory-widget *{box-sizing:border-box}
.memory-widget form{display:grid;grid-template-columns:repeat(auto-fill,minmax(9.5rem,1fr));
 gap:.5rem .8rem;margin:0}
.memory-widget .mw-field{display:flex;flex-direction:column;gap:.15rem;min-width:0}
.memory-widget label{font-size:.85rem;color:var(--mw-muted)}
.memory-widget .mw-field[hidden],.memory-widget fieldset[hidden]{display:none}
.memory-widget label.mw-check{display:flex;align-items:center;gap:.4rem}
.memory-widget input,.memory-widget select{font:inherit;font-size:.95rem;padding:.3rem .4rem;
 color:var(--mw-fg);background:var(--mw-bg);border:1px solid var(--mw-border);
 border-radius:.25rem;width:100%;min-width:0}
.memory-widget input[type=checkbox]{width:auto}
.memory-widget input:focus-visible,.memory-widget select:focus-visible,
.memory-widget a:focus-visible{outline:3px solid var(--pst-color-accent,#0969da);
 outline-offset:1px}
.memory-widget fieldset{grid-column:1/-1;border:1px dashed var(--mw-border);border-radius:.3rem;
 display:grid;grid-template-columns:repeat(auto-fill,minmax(8rem,1fr));gap:.5rem .8rem;margin:0;
 padding:.4rem .6rem}
.memory-widget legend{font-size:.85rem;color:var(--mw-muted)}
.memory-widget .mw-errors{color:var(--mw-bad);font-weight:600;margin:.6rem 0}
.memory-widget .mw-errors:empty{display:none}
.memory-widget .mw-summary{margin:.6rem 0;font-size:1rem}
.memory-widget .mw-assumptions{margin:.6rem 0 0;font-size:.85rem;color:var(--mw-muted)}
.memory-widget .mw-scroll{overflow-x:auto;max-width:100%}
.memory-widget table{border-collapse:collapse;font-size:.8rem;width:100%;margin:.4rem 0}
.memory-widget th,.memory-widget td{border-bottom:1px solid var(--mw-border);padding:.2rem .3rem;
 text-align:right;white-space:nowrap}
.memory-widget th:first-child,.memory-widget td:first-child{text-align:left}
.memory-widget caption{color:var(--mw-fg);text-align:left;font-weight:600}
.memory-widget a{color:var(--pst-color-link,#0969da)}
.memory-widget .mw-yes{color:var(--mw-ok);font-weight:600}
.memory-widget .mw-no{color:var(--mw-bad);font-weight:600}
.memory-widget svg{display:block;width:100%;height:auto;margin:.4rem 0}
.memory-widget svg text{fill:var(--mw-fg);font-size:12px}
.memory-widget .mw-foot{font-size:.8rem;color:var(--mw-muted);margin:.4rem 0 0}
.memory-widget .mw-foot a{word-break:break-all}
.memory-widget .mw-legend{display:flex;flex-wrap:wrap;gap:.3rem .8rem;font-size:.8rem;
 margin:.2rem 0}
.memory-widget .mw-legend span::before{content:"";display:inline-block;width:.8em;height:.8em;
 margin-right:.3em;vertical-align:-.1em;background:var(--sw)}
`;

  const FIELDS = [  // [key, label, kind, compact?, the guide-memory option it is]
    ["preset", "Model", "select", true, "--preset"],
    ["params", "Parameters (e.g. 70e9)", "num", true, "--params"],
    ["precision", "Precision", "select", false, "--precision"],
    ["optimizer", "Optimizer", "select", false, "--optimizer"],
    ["seq_len", "Sequence length (tokens)", "int", true, "--seq-len"],
    ["micro_batch", "Micro-batch (sequences per GPU)", "int", false, "--micro-batch"],
    ["checkpointing", "Activation checkpointing", "select", false, "--activation-checkpointing"],
    ["attention", "Attention", "select", false, "--unfused-attention"],
    ["gpu", "GPU", "select", true, "--gpu"],
    ["gib", "GPU memory (GiB)", "num", true, "--gpu-memory"],
    ["world_size", "Number of GPUs (N)", "int", true, "--world-size"],
    ["strategy", "Strategy", "select", false, "--strategy"],
    ["shard_group", "HSDP shard group (GPUs)", "int", false, "--shard-group"],
    ["bucket_view", "DDP gradient_as_bucket_view", "select", false, "--bucket-view"],
    ["lora_rank", "LoRA rank (blank: train everything)", "int", false, "--lora-rank"],
    ["base_precision", "LoRA: frozen base in", "select", false, "--base-precision"],
    ["cpu_offload", "FSDP2 CPU offload", "select", false, "--cpu-offload"],
  ];
  const ARCH = [["layers", "Layers", "--layers"], ["hidden", "Hidden size", "--hidden"],
    ["heads", "Attention heads", "--heads"], ["kv_heads", "KV heads (blank: = heads)",
      "--kv-heads"], ["vocab", "Vocabulary", "--vocab"], ["mlp", "MLP size", "--mlp"],
    ["max_seq_len", "Longest sequence (blank: unknown)", "--max-seq-len"]];
  /** Every input of the full form (its field, and its parameter in a shared link) with the
   * guide-memory option it stands for (tests/memory/test_widget_js.py checks the command's
   * parser against it). */
  M.formInputs = () => Object.fromEntries([...FIELDS.map((f) => [f[0], f[4]]),
    ...ARCH.map((a) => [a[0], a[2]]), ["tied", "--tied"]]);
  /** The parameters a shared link carries (each input's default). */
  M.linkDefaults = () => ({ ...DEFAULTS });
  const DEFAULTS = { preset: "llama-3-8b", precision: "bf16_mixed", optimizer: "adamw",
    seq_len: "4096", micro_batch: "1", checkpointing: "none", gpu: "H100 (80 GB)", gib: "",
    world_size: "8", strategy: "all", shard_group: String(DATA.default_shard_group || 8),
    params: "70e9", layers: "32", hidden: "4096", heads: "32", kv_heads: "8", vocab: "128256",
    mlp: "14336", max_seq_len: "",
    tied: "", lora_rank: "", base_precision: "bf16", attention: "fused", bucket_view: "false",
    cpu_offload: "false" };

  function options(key) {
    switch (key) {
      case "preset": return [...Object.keys(DATA.presets).map((k) => [k, k]),
        ["custom", "custom shape…"], ["count", "parameter count only…"]];
      case "precision": case "base_precision": return Object.entries(DATA.precisions)
        .map(([k, p]) => [k, `${p.label} (${k})`]);
      case "optimizer": return Object.entries(DATA.optimizers).map(([k, o]) => [k, o.label]);
      case "checkpointing": return [["none", "none: keep all activations"],
        ["full", "full: keep block inputs"],
        ["selective", "selective: torchtitan's op policy"]];
      case "gpu": return [...Object.keys(DATA.gpus).map((k) => [k, k]), ["custom", "other…"]];
      case "strategy": return [["all", "all five"], ...[...DATA.strategies,
        ...DATA.analytic_strategies].map((k) => [k, DATA.labels[k]])];
      case "attention": return [["fused", "fused (SDPA, flash)"],
        ["unfused", "unfused: keeps s × s scores"]];
      case "bucket_view": return [["false", "False (default): buckets"],
        ["true", "True: no buckets"]];
      case "cpu_offload": return [["false", "off (default)"],
        ["true", "CPUOffloadPolicy: shards on the host"]];
    }
    return [];
  }

  let counter = 0;
  const el = (tag, attrs = {}, kids = []) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k);
    return e;
  };

  function field(id, key, label, kind) {
    const input = kind === "select" ? el("select", { id, name: key })
      : el("input", { id, name: key, type: "text",
        inputmode: kind === "num" ? "decimal" : "numeric", autocomplete: "off" });
    if (kind === "select") {
      for (const [v, t] of options(key)) input.append(el("option", { value: v, text: t }));
    }
    return el("div", { class: "mw-field", "data-field": key }, [el("label", { for: id,
      text: label }), input]);
  }

  /** Build one widget inside `root` (data-widget="full" or "compact"). */
  function mount(root) {
    const compact = root.dataset.widget === "compact", uid = "mw" + (++counter);
    const form = el("form", { "aria-label": compact ? "Will it fit?" : "Memory calculator",
      novalidate: "" });
    const inputs = {};
    for (const [key, label, kind, inCompact] of FIELDS) {
      if (compact && !inCompact) continue;
      const f = field(`${uid}-${key}`, key, label, kind);
      form.append(f);
      inputs[key] = f.querySelector("input,select");
      if (key === "preset") {
        const set = el("fieldset", { "data-arch": "" }, [el("legend",
          { text: "Custom shape (Llama-style: SwiGLU MLP, RMSNorm, no biases)" })]);
        for (const [k, l] of ARCH) {
          const g = field(`${uid}-${k}`, k, l, "int");
          set.append(g);
          inputs[k] = g.querySelector("input");
        }
        const tied = el("input", { id: `${uid}-tied`, name: "tied", type: "checkbox" });
        set.append(el("label", { for: `${uid}-tied`, class: "mw-check" }, [tied,
          "tied embeddings"]));
        inputs.tied = tied;
        form.append(set);
      }
    }
    const errors = el("div", { class: "mw-errors", role: "alert", "aria-live": "assertive" });
    const out = el("div", { class: "mw-out", "aria-live": "polite" });
    const foot = el("p", { class: "mw-foot" });
    root.replaceChildren(form, errors, out, foot);

    const raw = () => {
      const r = { ...DEFAULTS };
      for (const [k, i] of Object.entries(inputs)) {
        r[k] = i.type === "checkbox" ? i.checked : i.value;
      }
      return r;
    };
    let linkErrors = [];  // a shared link's unknown choices: said until the reader edits
    const fromUrl = () => {
      // the query string carries the inputs (a #fragment would read as a missing anchor)
      const h = location.search.replace(/^\?/, "") || location.hash.replace(/^#/, "");
      const p = new URLSearchParams(h), r = { ...DEFAULTS }, given = {};
      for (const k of Object.keys(r)) if (p.has(k)) r[k] = given[k] = p.get(k);
      linkErrors = M.choiceErrors(given);
      return r;
    };
    const set = (r) => {
      for (const [k, i] of Object.entries(inputs)) {
        if (i.type === "checkbox") i.checked = r[k] === true || r[k] === "1";
        else i.value = r[k];
        if (i.tagName === "SELECT" && i.value !== r[k]) i.value = DEFAULTS[k];  // not an option
      }
    };
    const link = (r, base) => {
      const p = new URLSearchParams();
      for (const k of Object.keys(DEFAULTS)) {
        if (r.preset !== "custom" && ARCH.some(([a]) => a === k)) continue;
        if (k === "tied" && r.preset !== "custom") continue;
        if (k === "gib" && r.gpu !== "custom") continue;
        if (k === "params" && r.preset !== "count") continue;
        if (k === "base_precision" && String(r.lora_rank).trim() === "") continue;
        p.set(k, r[k] === true ? "1" : r[k] === false ? "" : r[k]);
      }
      return base + "?" + p.toString();
    };

    const update = (push) => {
      const r = raw();
      const custom = r.preset === "custom";
      form.querySelector("[data-arch]").hidden = !custom;
      const counted = r.preset === "count";
      form.querySelector('[data-field="params"]').hidden = !counted;
      for (const k of ["seq_len", "micro_batch", "checkpointing", "attention", "lora_rank",
        "base_precision"]) {
        const f = form.querySelector(`[data-field="${k}"]`);
        if (f) f.hidden = counted;
      }
      const gib = form.querySelector('[data-field="gib"]');
      if (inputs.gpu.value !== "custom") {
        gib.hidden = true;
      } else gib.hidden = false;
      const parsed = linkErrors.length ? { errors: linkErrors } : M.parse(r);
      const calculator = root.dataset.calculator;
      const url = link(r, calculator || location.href.split(/[?#]/)[0]);
      if (push && !compact) history.replaceState(null, "", url.slice(url.indexOf("?")));
      if (parsed.errors) {
        errors.replaceChildren(...parsed.errors.map((m) => el("p", { text: m })));
        out.replaceChildren(el("p", { class: "mw-summary", text:
          "No result until the form is corrected (see above)." }));
        return;
      }
      errors.replaceChildren();
      const rep = M.fitReport(parsed.cfg);
      out.replaceChildren(...render(rep, parsed.cfg, compact, url, out.clientWidth));
    };
    set(fromUrl());
    inputs.preset.addEventListener("change", () => {  // a custom shape starts from the preset
      const a = DATA.presets[inputs.preset.value];
      if (!a) return;
      for (const [k] of ARCH) if (inputs[k]) inputs[k].value = a[k] === null ? "" : String(a[k]);
      if (inputs.tied) inputs.tied.checked = a.tied_embeddings;
    });
    const edited = () => { linkErrors = []; update(true); };
    form.addEventListener("input", edited);
    form.addEventListener("change", edited);
    form.addEventListener("submit", (e) => { e.preventDefault(); update(true); });
    window.addEventListener("popstate", () => { set(fromUrl()); update(false); });
    foot.textContent = `Computed in your browser by a port of guide.memory (model sources ` +
      `${DATA.source_hash}, checked against the Python model on ${DATA.checked_configs} ` +
      `configurations). Not counted: all-gather/reduce-scatter buffers, CUDA context, NCCL, ` +
      `allocator fragmentation — keep headroom for them.`;
    update(false);
  }

  function render(rep, cfg, compact, url, width) {
    const gpuName = cfg.gpu || `${cfg.gib} GiB GPU`;
    const fits = rep.rows.filter((r) => r.fits);
    const n = cfg.world_size;
    const assumed = el("p", { class: "mw-assumptions", text: M.assumptions(cfg, rep) +
      (compact ? ". Change them in the full calculator." : ".") });
    const summary = el("p", { class: "mw-summary" });
    summary.append(`${grouped(rep.parameters)} parameters on ` +
      `${grouped(n)} × ${gpuName} (${formatBytes(rep.capacity)} each): `);
    summary.append(el("strong", { text: fits.length ? "fits with " +
      fits.map((r) => DATA.short[r.strategy]).join(", ")
      : "fits with none of them" }), ". Smallest N that fits: " +
      Object.entries(rep.smallest_world_size).map(([k, v]) => `${DATA.short[k]}: ` +
        M.smallestText(v, DATA.world_sizes.at(-1))).join("; ") + ".");
    if (cfg.params !== undefined) {
      summary.append(" Activations are not priced: a parameter count has no shape (choose a " +
        "preset or a custom shape); sharded parts are ideal 1/N shares.");
    }
    const head = compact ? ["strategy", "per GPU", "fits", "headroom", "smallest N"]
      : ["strategy", ...PARTS.map((p) => PART_HEADS[p]), "total", "fits", "headroom",
        "smallest N"];
    const table = el("table", {}, [el("caption", { text:
      `Predicted bytes per GPU at N = ${n.toLocaleString("en-US")}` })]);
    table.append(el("thead", {}, [el("tr", {},
      head.map((h) => el("th", { scope: "col", text: h })))]));
    const body = el("tbody");
    for (const r of rep.rows) {
      const small = rep.smallest_world_size[r.strategy];
      const smallText = M.smallestText(small, DATA.world_sizes.at(-1));
      const tr = el("tr", { "data-strategy": r.strategy });
      tr.append(el("th", { scope: "row", text: DATA.short[r.strategy] }));
      if (r.total === null) {
        const msg = `N = ${n} is not a multiple of the shard group (${cfg.shard_group})`;
        tr.append(el("td", { colspan: String(head.length - 2), text: msg }));
      } else {
        if (!compact) {
          for (const p of PARTS) tr.append(el("td", { "data-part": p, text: formatBytes(r[p]) }));
        }
        tr.append(el("td", { "data-part": "total", text: formatBytes(r.total) }));
        tr.append(el("td", { class: r.fits ? "mw-yes" : "mw-no", "data-part": "fits",
          text: r.fits ? "yes" : "no" }));
        tr.append(el("td", { "data-part": "headroom", text: (r.headroom < 0n ? "short " : "") +
          formatBytes(r.headroom < 0n ? -r.headroom : r.headroom) }));
      }
      tr.append(el("td", { "data-part": "smallest", text: smallText }));
      body.append(tr);
    }
    table.append(body);
    const nodes = [assumed, summary, el("div", { class: "mw-scroll" }, [table])];
    if (rep.lora) {
      const l = rep.lora.rows[0];
      nodes.push(el("p", { class: "mw-lora", text: `FSDP2, LoRA rank ${rep.lora.rank} on every ` +
        `linear, base frozen in ${rep.lora.base_precision}: ${formatBytes(l.total)} on rank 0 ` +
        `at N = ${grouped(l.N)} (parameters ${formatBytes(l.params)}, gradients ` +
        `${formatBytes(l.grads)}, optimizer ${formatBytes(l.optimizer)}; activations not ` +
        "included)." }));
    }
    if (rep.cpu_offload) nodes.push(...offloadTable(rep.cpu_offload));
    if (!compact) {
      nodes.push(el("p", { class: "mw-buckets", text: rep.ddp_buckets
        ? "DDP buckets: held by DDP and ZeRO-1 with gradient_as_bucket_view=False (the " +
          "default); set it to True to drop them."
        : "DDP buckets: none, gradient_as_bucket_view=True (gradients are views into the " +
          "buckets)." }));
      nodes.push(...chart(rep, width));
    }
    const share = el("a", { href: url, class: "mw-share" });
    share.textContent = compact ? "Open in the full calculator →" : "Link to this result";
    nodes.push(el("p", {}, [share]));
    return nodes;
  }

  /** guide-memory --cpu-offload's table, one N: a row per column of the command's. */
  const OFFLOAD_ROWS = [["gpu_without", "GPU, without offload"],
    ["gpu_saved", "GPU saved (moved to the host)"], ["gpu_with", "GPU, with offload"],
    ["host", "host RAM per rank"], ["to_device", "host → device per synced micro-batch"],
    ["to_host", "device → host per synced micro-batch"]];

  function offloadTable(offload) {
    const o = offload.rows[0];
    const table = el("table", { class: "mw-offload" }, [el("caption", { text:
      `FSDP2 + CPUOffloadPolicy (${offload.estimate}) at N = ${grouped(o.N)}` })]);
    const body = el("tbody");
    for (const [k, label] of OFFLOAD_ROWS) {
      body.append(el("tr", {}, [el("th", { scope: "row", text: label }),
        el("td", { "data-part": k, text: formatBytes(o[k]) })]));
    }
    table.append(body);
    return [el("div", { class: "mw-scroll" }, [table]), el("p", { class: "mw-offload-note",
      text: "The shards, their gradients and the optimizer state move to the host (the " +
        "optimizer steps on the CPU); activations and FSDP2's gathered buffers stay on the " +
        "GPU. A node's host RAM must hold the host bytes for each of its GPUs. How long the " +
        "copies take is not priced." })];
  }

  /** A stacked horizontal bar per strategy, with the GPU's memory as a dashed line. */
  function chart(rep, width) {
    const rows = rep.rows.filter((r) => r.total !== null);
    const max = rows.reduce((m, r) => (r.total > m ? r.total : m), rep.capacity);
    const longest = Math.max(...rows.map((r) => DATA.short[r.strategy].length));
    const W = Math.max(300, Math.min(720, width || 640)), right = 8;
    const left = Math.max(64, 8 + 7 * longest);  // "ZeRO-2 (paper)" needs more than 64
    const barH = 20, gap = 8, top = 6;
    const H = top + rows.length * (barH + gap) + 18;
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "Bar chart: predicted bytes per GPU by part, per strategy, " +
      "against the GPU's memory");
    const x = (b) => left + (W - left - right) * (Number(b) / Number(max));
    const add = (tag, attrs, text) => {
      const e = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text) e.textContent = text;
      svg.append(e);
      return e;
    };
    rows.forEach((r, i) => {
      const y = top + i * (barH + gap);
      add("text", { x: 0, y: y + barH * 0.7 }, DATA.short[r.strategy]);
      let at = 0n;
      for (const p of PARTS) {
        if (r[p] === 0n) continue;
        const rect = add("rect", { x: x(at), y, width: Math.max(0, x(at + r[p]) - x(at)),
          height: barH, fill: COLORS[p] });
        rect.append(Object.assign(document.createElementNS(NS, "title"),
          { textContent: `${DATA.short[r.strategy]}: ${PART_LABELS[p]} ${formatBytes(r[p])}` }));
        at += r[p];
      }
    });
    const cx = x(rep.capacity);
    add("line", { x1: cx, x2: cx, y1: 0, y2: H - 14, stroke: "currentColor",
      "stroke-dasharray": "4 3", "stroke-width": 1.5 });
    add("text", { x: Math.min(cx, W - 4), y: H - 2, "text-anchor": "end" },
      `GPU memory ${formatBytes(rep.capacity)}`);
    const legend = el("div", { class: "mw-legend", "aria-hidden": "true" });
    for (const p of PARTS) {
      const s = el("span", { text: PART_LABELS[p] });
      s.style.setProperty("--sw", COLORS[p]);
      legend.append(s);
    }
    const wrap = el("div", { class: "mw-chart" });
    wrap.append(svg);
    return [wrap, legend];
  }

  function start() {
    if (!document.getElementById("memory-widget-css")) {
      document.head.append(el("style", { id: "memory-widget-css", text: CSS }));
    }
    for (const root of document.querySelectorAll(".memory-widget:not([data-mounted])")) {
      root.setAttribute("data-mounted", "");
      mount(root);
    }
  }

  window.MemoryWidget = { model: M, data: DATA, formatBytes, start };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
