#!/usr/bin/env python3
"""PyTorch against `mixprec bench` on the GPU, interleaved: the step-time and memory race of issue 17.

One process runs the PyTorch side (eager and torch.compile) and starts `mixprec bench` between its
own runs, so both see the same GPU minutes apart at most:
    for repeat: for config: for precision: mixprec (subprocess), pytorch-eager, pytorch-compile
Each run's figure is its median step time; the summary per config is bench/compare.py's
(min/median/max over repeats, ratios pair-wise within a repeat). The PyTorch side follows the issue:
the same model (bench/peers/models.py, the CLI's layers), batch and precision; fp32 with TF32 off;
amp-fp16 with GradScaler, amp-bf16 without; fused AdamW (no per-step host sync in GradScaler.step);
cudnn.benchmark; data generated on the GPU once; no per-step .item(); the cnns also in channels-last
memory (modes eager-cl, compile-cl: PyTorch's fastest convolution layout on tensor cores is often
NHWC). Steps are timed with CUDA
events recorded between steps and read after one synchronize. Peak memory is
torch.cuda.max_memory_allocated over the timed steps of the run's first repeat (its peak reset after
the warm-up, as `mixprec bench` resets its own) less what was allocated before its model was built:
the model's parameters, gradients, optimizer state, data and the step's transients (cuBLAS's
workspace is allocated before any run, so it is in neither). Kernel launches per step come from
torch.profiler over a few extra steps.

The mixprec side is one command line, MIXPREC_CMD below (or --mixprec-cmd): change it there when
the CLI's flags change.

Runs on the CPU too (Debian's torch 1.13: /usr/bin/python3 bench/peers/torch_gpu.py --device cpu),
as a smoke test: what that torch cannot do (torch.compile, fused AdamW, fp16 autocast on the CPU) is
skipped and said so in the output.

Usage:
    python3 bench/peers/torch_gpu.py --mixprec build/mixprec --json-out bench.json
    python3 bench/peers/torch_gpu.py --configs 'mlp@512' 'cnn:420,1000@256' --repeats 5 \\
        --precisions fp32,amp-fp16,amp-bf16 --modes eager,compile
    /usr/bin/python3 bench/peers/torch_gpu.py --device cpu --configs 'mlp:64@32' --steps 3 \\
        --warmup 1 --repeats 2 --impls pytorch          # smoke test without a GPU
"""

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import compare  # noqa: E402  (bench/compare.py: run_command, parse_result, summarise)
import gpt  # noqa: E402  (the char GPT, nanoGPT's names: the peer of --model gpt)
import models  # noqa: E402
from recipes import ADAMW_LR  # noqa: E402  (the CLI's AdamW learning rates)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The mixprec side. {device_flag} is DEVICE_FLAG[device]; {widths} is --hidden or --channels.
MIXPREC_CMD = ("{mixprec} bench {device_flag} --model {model} {widths} --precision {precision} "
               "--batch-size {batch} --steps {steps} --warmup {warmup} --optimizer adamw --lr {lr} "
               "--weight-decay 0")
DEVICE_FLAG = {"cuda": "--device cuda", "cpu": ""}  # the CPU is the CLI's default device
# gpt widths: LAYERS,HEADS,D_MODEL,BLOCK,VOCAB (the CLI's gpt defaults; GPT-2 124M: 12,12,768,1024,50304).
# Its recipe as the CLI's: AdamW betas (0.9, 0.95), gradients clipped to norm 1 (unscaled first).
GPT_FIELDS = ("layers", "heads", "d-model", "block-size", "vocab-size")
# PyTorch's modes: eager; torch.compile by default and in max-autotune; eager and compiled with the
# cnns' model and input in channels-last memory (PyTorch at its best where that is faster: the
# issue's peer), which Inductor may also choose by itself for convolutions (layout optimisation).
MODES = ("eager", "compile", "eager-cl", "compile-cl", "compile-max")
GPT_CLIP = 1.0
PRECISIONS = ("fp32", "amp-fp16", "amp-bf16")
AMP_DTYPE = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}


def parse_config(spec):
    """'mlp@512', 'mlp:1024,1024@512', 'cnn:420,1000@256' -> namespace(model, widths, batch, name)."""
    name, _, batch = spec.partition("@")
    model, _, widths = name.partition(":")
    if model not in models.MODELS + ("gpt",) or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"config {spec!r}: expected MODEL[:WIDTHS]@BATCH, MODEL in "
                                         f"{models.MODELS + ('gpt',)}")
    if not widths:
        widths = {"mlp": "1024,1024", "cnn": "8,16", "gpt": "4,4,128,128,81"}.get(model, "")
    if model == "gpt":
        v = widths.split(",")
        if len(v) != len(GPT_FIELDS) or not all(x.isdigit() and int(x) > 0 for x in v) or int(v[2]) % int(v[1]):
            raise argparse.ArgumentTypeError(f"config {spec!r}: gpt takes {','.join(GPT_FIELDS).upper()} (positive, "
                                             "D_MODEL a multiple of HEADS)")
    return types.SimpleNamespace(model=model, widths=widths, batch=int(batch),
                                 name=f"{model}{'-' + widths.replace(',', '-') if widths else ''}@{batch}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", type=parse_config,
                   default=[parse_config("mlp@512"), parse_config("cnn:420,1000@256")],
                   help="MODEL[:WIDTHS]@BATCH ... (default: mlp@512 cnn:420,1000@256; gpt's WIDTHS: "
                        "LAYERS,HEADS,D_MODEL,BLOCK,VOCAB, default 4,4,128,128,81)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--modes", default="eager,compile",
                   help=f"PyTorch modes: {', '.join(MODES)} (-cl: channels-last model and input, cnns only; "
                        "compile-max: torch.compile's max-autotune, minutes of tuning per configuration)")
    p.add_argument("--impls", default="mixprec,pytorch",
                   help="mixprec, mixprec-graph (the CLI with --cuda-graph: one graph launch a step), mixprec-cl "
                        "(the CLI with --channels-last: NHWC activations, cnns only), pytorch")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda where torch sees a GPU, else cpu")
    p.add_argument("--mixprec", default="build/mixprec", help="the CLI (relative: to the repo root)")
    p.add_argument("--mixprec-cmd", default=MIXPREC_CMD, help="the mixprec command line template")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=5, help="steps profiled to count kernel launches (0: off)")
    p.add_argument("--budget-s", type=float, default=0, help="start no repeat after this many seconds (0: none)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per mixprec run")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch CPU threads (--device cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", metavar="FILE", help="every run and the summary (rewritten after each run)")
    a = p.parse_args(argv)
    a.precisions = [s for s in a.precisions.split(",") if s]
    a.modes = [s for s in a.modes.split(",") if s]
    a.impls = [s for s in a.impls.split(",") if s]
    bad = [x for x in a.precisions if x not in PRECISIONS] + [x for x in a.modes if x not in MODES] \
        + [x for x in a.impls if x not in ("mixprec", "mixprec-graph", "mixprec-cl", "pytorch")]
    if bad:
        p.error(f"unknown precision, mode or impl: {bad}")
    if a.steps < 1 or a.repeats < 1 or a.warmup < 0:
        p.error("--steps and --repeats must be >= 1, --warmup >= 0")
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no GPU (torch.cuda.is_available() is False)")
    if not os.path.isabs(a.mixprec):
        a.mixprec = os.path.join(compare.REPO, a.mixprec)
    return a


def setup_torch(a):
    """Global settings of the race; returns what was set, read back."""
    torch.manual_seed(a.seed)
    s = {"torch": torch.__version__, "device": a.device}
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
        s["threads"] = a.threads
        return s
    # fp32 is true fp32 on both sides: no TF32 in matmuls or convolutions. PyTorch >= 2.9 has the
    # fp32_precision settings (and refuses mixing them with the legacy flags); older ones the flags.
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        s["fp32_precision"] = {"matmul": torch.backends.cuda.matmul.fp32_precision,
                               "conv": torch.backends.cudnn.conv.fp32_precision}
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        s["allow_tf32"] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    torch.backends.cudnn.benchmark = True
    p = torch.cuda.get_device_properties(0)
    s.update(gpu=p.name, sms=p.multi_processor_count, memory_bytes=p.total_memory, cuda=torch.version.cuda,
             cudnn=torch.backends.cudnn.version(), cudnn_benchmark=True)
    # Load cuBLAS(Lt) and cuDNN and allocate cuBLAS's workspaces now, outside every run's figures.
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        w = torch.randn(64, 64, device="cuda", dtype=dt, requires_grad=True)
        (w @ w).sum().backward()
        x = torch.randn(2, 4, 8, 8, device="cuda", dtype=dt, requires_grad=True)
        F.conv2d(x, torch.randn(4, 4, 3, 3, device="cuda", dtype=dt)).sum().backward()
    torch.cuda.synchronize()
    return s


class TorchRun:
    """One PyTorch configuration (model, precision, mode), built once and timed once per repeat."""

    def __init__(self, a, cfg, precision, mode):
        self.a, self.device, self.notes = a, a.device, []
        self.amp = precision in AMP_DTYPE
        self.dtype = AMP_DTYPE.get(precision)
        if self.device == "cpu" and precision == "amp-fp16":
            raise Unsupported("amp-fp16 on the CPU (no GradScaler or fp16 autocast for the CPU in this torch)")
        channels_last = mode.endswith("-cl")
        if channels_last and cfg.model not in ("cnn", "cnn-bn"):
            raise Unsupported(f"{mode}: channels-last is for the cnns' convolutions")
        if mode.startswith("compile") and not hasattr(torch, "compile"):
            raise Unsupported(f"torch.compile (torch {torch.__version__} has none)")
        torch.manual_seed(a.seed)
        self.clip = None
        betas = (0.9, 0.999)
        if cfg.model == "gpt":
            layers, heads, d, block, vocab = map(int, cfg.widths.split(","))
            self.model = gpt.GPT(gpt.GPTConfig(vocab_size=vocab, block_size=block, n_layer=layers, n_head=heads,
                                               n_embd=d)).to(self.device)
            self.clip, betas = GPT_CLIP, (0.9, 0.95)
        else:
            kw = {"hidden": cfg.widths} if cfg.model == "mlp" else {"channels": cfg.widths} if cfg.model == "cnn" else {}
            self.model = models.build(cfg.model, **kw).to(self.device)
        if channels_last:  # before the optimizer sees the parameters
            self.model = self.model.to(memory_format=torch.channels_last)
        self.model.train()
        params = list(self.model.parameters())
        try:
            self.opt = torch.optim.AdamW(params, lr=ADAMW_LR[cfg.model], betas=betas, weight_decay=0.0, fused=True)
            self.fused = True
        except (TypeError, RuntimeError) as e:  # torch < 2.0 has no fused=; < 2.4 none on the CPU
            self.opt = torch.optim.AdamW(params, lr=ADAMW_LR[cfg.model], betas=betas, weight_decay=0.0)
            self.fused = False
            self.notes.append(f"AdamW not fused ({str(e).splitlines()[0][:80]})")
        self.scaler = None
        if precision == "amp-fp16":
            self.scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
                           else torch.cuda.amp.GradScaler())
        g = torch.Generator(device=self.device).manual_seed(a.seed + 1)
        if cfg.model == "gpt":  # random tokens, as `mixprec bench --model gpt`
            self.x = torch.randint(0, vocab, (cfg.batch, block), device=self.device, generator=g)
            self.y = torch.randint(0, vocab, (cfg.batch * block,), device=self.device, generator=g)
        else:
            self.x = torch.randn(cfg.batch, 1, 28, 28, device=self.device, generator=g)
            self.y = torch.randint(0, 10, (cfg.batch,), device=self.device, generator=g)
        if channels_last:
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        if mode == "compile-max":
            self.forward = torch.compile(self.model, mode="max-autotune")
        elif mode.startswith("compile"):
            self.forward = torch.compile(self.model)
        else:
            self.forward = self.model
        self.peak_bytes = self.reserved_bytes = self.launches = None

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=self.device, dtype=self.dtype or torch.bfloat16, enabled=self.amp):
            out = self.forward(self.x)
            loss = F.cross_entropy(out.view(-1, out.shape[-1]), self.y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.clip:
                self.scaler.unscale_(self.opt)  # found_inf stays on the device
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)  # foreach on CUDA by default
            self.scaler.step(self.opt)  # fused AdamW: reads found_inf on the device, no .item()
            self.scaler.update()
        else:
            loss.backward()
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)  # foreach on CUDA by default
            self.opt.step()

    def time_steps(self, steps):
        """Per-step milliseconds. On the GPU: events between steps, one synchronize at the end."""
        if self.device == "cpu":
            ms = []
            for _ in range(steps):
                t0 = time.perf_counter()
                self.step()
                ms.append((time.perf_counter() - t0) * 1000.0)
            return ms
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        ev[0].record()
        for i in range(steps):
            self.step()
            ev[i + 1].record()
        ev[-1].synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) for i in range(steps)]

    def count_launches(self, steps):
        """Kernels per step (library kernels included) seen by the profiler's CUDA activity."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                self.step()
            torch.cuda.synchronize()
        kernels = copies = 0
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                if e.name.startswith(("Memcpy", "Memset")):
                    copies += 1
                else:
                    kernels += 1
        return {"kernels_per_step": kernels / steps, "memcpy_memset_per_step": copies / steps}

    def run(self, first):
        """One repeat: warm-up (first repeat only, with the memory figure) and the timed steps."""
        a = self.a
        if first:
            base = 0
            if self.device == "cuda":
                torch.cuda.synchronize()
                base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            for _ in range(a.warmup):
                self.step()
            if self.device == "cuda":
                # The steady step's peak, as `mixprec bench` reports it (its peak is reset after the
                # warm-up too): cudnn.benchmark's trial workspaces and compilation stay out.
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
        ms = self.time_steps(a.steps)
        if first and self.device == "cuda":
            self.peak_bytes = torch.cuda.max_memory_allocated() - base
            self.reserved_bytes = torch.cuda.max_memory_reserved() - base_reserved
            if a.profile_steps > 0:
                try:
                    self.launches = self.count_launches(a.profile_steps)
                except Exception as e:  # a profiler failure must not cost the timings
                    self.notes.append(f"profiler failed: {e}")
        res = {"impl": "pytorch", "step_ms": {"best": min(ms), "median": statistics.median(ms)},
               "optimizer": "AdamW (fused)" if self.fused else "AdamW"}
        res["steps_per_s"] = {k: 1000.0 / v for k, v in res["step_ms"].items()}
        if self.peak_bytes is not None:
            res.update(max_memory_allocated=self.peak_bytes, max_memory_reserved=self.reserved_bytes)
        if self.launches:
            res.update(self.launches)
        if self.notes:
            res["notes"] = self.notes
        return res


class Unsupported(Exception):
    pass


def mixprec_command(a, cfg, precision):
    if cfg.model == "gpt":
        widths = " ".join(f"--{k} {v}" for k, v in zip(GPT_FIELDS, cfg.widths.split(",")))
    else:
        widths = {"mlp": f"--hidden {cfg.widths}", "cnn": f"--channels {cfg.widths}"}.get(cfg.model, "")
    line = a.mixprec_cmd.format(mixprec=shlex.quote(a.mixprec), device_flag=DEVICE_FLAG[a.device], model=cfg.model,
                                widths=widths, precision=precision, batch=cfg.batch, steps=a.steps,
                                warmup=a.warmup, lr=ADAMW_LR[cfg.model])
    return shlex.split(line)


def write_json(a, env, runs, skipped, summaries, complete, error):
    if not a.json_out:
        return
    cfg = {k: (v if k != "configs" else [c.name for c in v]) for k, v in vars(a).items() if k != "json_out"}
    tmp = a.json_out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"config": cfg, "environment": env, "complete": complete, "error": error, "runs": runs,
                   "skipped": skipped, "summary": summaries}, f, indent=1)
    os.replace(tmp, a.json_out)


def summarise(a, runs, impls):
    """compare.py's summary per config (ratios pair-wise per repeat)."""
    out = {}
    for cfg in a.configs:
        ns = types.SimpleNamespace(impls=impls, precisions=a.precisions, batch_size=cfg.batch)
        mine = [r for r in runs if r["config"] == cfg.name]
        if mine:
            out[cfg.name] = compare.summarise(ns, mine)
    return out


# Dense bf16 (= fp16) tensor-core peaks in FLOP/s by device name, without sparsity (NVIDIA's data
# sheets): the denominator of model FLOP utilisation, as the issue asks, for every precision.
BF16_PEAK = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))


def bf16_peak(gpu_name):
    return next((flops for key, flops in BF16_PEAK if key in (gpu_name or "")), None)


def gpt_flops_per_token(widths):
    """nanoGPT's estimate_mfu: 6 N + 12 L H Q T model FLOPs per token (forward and backward), N the
    parameters without the position embedding (the head is tied to the token embedding), attention
    counted over the whole block (not halved for the causal mask)."""
    layers, heads, d, block, vocab = map(int, widths.split(","))
    per_layer = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)
    n = vocab * d + layers * per_layer + 2 * d
    return 6 * n + 12 * layers * heads * (d // heads) * block, n


def peak_of(result):
    """PyTorch's max_memory_allocated figure, or the total of mixprec's peak_bytes."""
    if result.get("max_memory_allocated") is not None:
        return result["max_memory_allocated"]
    pb = result.get("peak_bytes")
    return pb.get("total") if isinstance(pb, dict) else None


def print_tables(a, runs, summaries, env=None):
    for cfg in a.configs:
        s = summaries.get(cfg.name)
        if not s:
            continue
        print(f"\n{cfg.name} on {a.device}: median step ms over repeats (min-max), peak memory of the step")
        print(f"{'impl':<16} {'precision':<9} {'ms median':>9} {'ms min':>8} {'ms max':>8} {'peak MiB':>9} "
              f"{'kernels/step':>12}")
        for row in s["per_impl"]:
            last = [r["result"] for r in runs if r["config"] == cfg.name and r["impl"] == row["impl"]
                    and r["precision"] == row["precision"]]
            peak = next((p for p in map(peak_of, last) if p is not None), None)
            peak_s = f"{peak / 2**20:9.1f}" if isinstance(peak, (int, float)) else f"{'-':>9}"
            kern = next((x.get("kernels_per_step") for x in last if x.get("kernels_per_step") is not None), None)
            kern_s = f"{kern:12.1f}" if kern is not None else f"{'-':>12}"
            print(f"{row['impl']:<16} {row['precision']:<9} {row['step_ms_median']:9.3f} {row['step_ms_min']:8.3f} "
                  f"{row['step_ms_max']:8.3f} {peak_s} {kern_s}")
        for r in s["ratios"]:
            print(f"  {r['name']:<52} {r['median']:6.2f}  ({r['min']:.2f}-{r['max']:.2f})")
        if cfg.model == "gpt":
            per_token, n = gpt_flops_per_token(cfg.widths)
            tokens = cfg.batch * int(cfg.widths.split(",")[3])
            peak = bf16_peak((env or {}).get("gpu"))
            print(f"  throughput ({n / 1e6:.2f}M parameters, {per_token / 1e9:.2f} GFLOP per token by nanoGPT's count; "
                  f"MFU against the dense bf16 peak, {peak / 1e12:.0f} TFLOP/s)" if peak else
                  f"  throughput ({n / 1e6:.2f}M parameters; no bf16 peak known for this device: no MFU)")
            for row in s["per_impl"]:
                tok_s = tokens * 1000.0 / row["step_ms_median"]
                mfu = f"  MFU {100 * per_token * tok_s / peak:5.1f}%" if peak else ""
                print(f"  {row['impl']:<16} {row['precision']:<9} {tok_s:12,.0f} tokens/s{mfu}")


def main(argv=None):
    a = parse_args(argv)
    env = setup_torch(a)
    t_start = time.perf_counter()
    impls = [i for i in ("mixprec", "mixprec-graph", "mixprec-cl") if i in a.impls] + \
        [f"pytorch-{m}" for m in a.modes if "pytorch" in a.impls]
    if any(i.startswith("mixprec") for i in a.impls) and not os.access(a.mixprec, os.X_OK):
        print(f"torch_gpu.py: mixprec CLI not found: {a.mixprec} (--mixprec PATH, or --impls pytorch)",
              file=sys.stderr)
        return 2
    print(f"torch_gpu.py: {env}", flush=True)

    torch_runs = {}  # (config, precision, mode) -> TorchRun, or the reason it cannot run
    runs, skipped, error = [], {}, None
    mixprec_failed = set()  # (config, precision): a failed command is not retried every repeat
    for rep in range(a.repeats):
        for cfg in a.configs:
            for prec in a.precisions:
                # Checked per cell (its impls run together, so its ratios stay pair-wise); the first
                # repeat always completes.
                if rep > 0 and a.budget_s and time.perf_counter() - t_start > a.budget_s and error is None:
                    error = f"stopped in repeat {rep + 1}: --budget-s {a.budget_s:.0f} spent"
                    print(f"torch_gpu.py: {error}", flush=True)
                if error:
                    break
                for impl in impls:
                    t0 = time.perf_counter()
                    key = (cfg.name, prec, impl)
                    if impl.startswith("mixprec"):
                        if key in mixprec_failed or (impl == "mixprec-cl" and cfg.model != "cnn"):
                            continue
                        try:
                            cmd = mixprec_command(a, cfg, prec) + {"mixprec-graph": ["--cuda-graph"],
                                                                   "mixprec-cl": ["--channels-last"]}.get(impl, [])
                            out = compare.run_command(cmd, f"{impl} {cfg.name} {prec}", a.timeout)
                            res = out["result"]
                        except compare.RunError as e:
                            mixprec_failed.add(key)
                            skipped[" ".join(key)] = str(e)
                            print(f"torch_gpu.py: {e}", file=sys.stderr, flush=True)
                            continue
                    else:
                        mode = impl.split("-", 1)[1]
                        run = torch_runs.get(key)
                        first = run is None
                        if first:
                            try:
                                run = torch_runs[key] = TorchRun(a, cfg, prec, mode)
                            except Unsupported as e:
                                run = torch_runs[key] = f"skipped: {e}"
                        if isinstance(run, str):
                            if first:
                                skipped[" ".join(key)] = run
                                print(f"torch_gpu.py: {impl} {cfg.name} {prec}: {run}", flush=True)
                            continue
                        try:
                            res = run.run(first)
                        except Exception as e:  # one failing configuration must not end the race
                            torch_runs[key] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                            skipped[" ".join(key)] = torch_runs[key]
                            print(f"torch_gpu.py: {impl} {cfg.name} {prec}: {torch_runs[key]}", flush=True)
                            continue
                    wall = time.perf_counter() - t0
                    runs.append({"repeat": rep, "config": cfg.name, "impl": impl, "precision": prec, "wall_s": wall,
                                 "result": res})
                    print(f"[{rep + 1}/{a.repeats}] {cfg.name:<18} {prec:<9} {impl:<16} median "
                          f"{res['step_ms']['median']:9.3f} ms  best {res['step_ms']['best']:9.3f} ms  ({wall:.1f} s)",
                          flush=True)
                    write_json(a, env, runs, skipped, summarise(a, runs, impls), False, error)
        if error:
            break
        if a.device == "cuda":
            gc.collect()

    summaries = summarise(a, runs, impls)
    write_json(a, env, runs, skipped, summaries, error is None, error)
    print_tables(a, runs, summaries, env)
    for k, why in skipped.items():
        print(f"not run: {k}: {why.splitlines()[0]}")
    for note in sorted({f"{r['impl']}: {n}" for r in runs for n in r["result"].get("notes", [])}):
        print(f"note: {note}")
    if a.json_out:
        print(f"\nwrote {a.json_out}")
    # A repeat left out for --budget-s is what was asked for (the JSON says so: complete false),
    # not a failure; a mixprec run that failed is.
    return 0 if runs and not mixprec_failed else 1


if __name__ == "__main__":
    sys.exit(main())
