// mixprec command-line entry point: subcommand dispatch and one-line errors.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "mixprec/error.h"

namespace {

const char* kUsage = R"(usage: mixprec <command> [flags]

commands:
  train   train a model on Fashion-MNIST (or --data DIR of idx files), evaluate each epoch;
          --model gpt: a character-level GPT on a text (Moby Dick), evaluated every --eval-every steps
  eval    test accuracy and loss of a checkpoint (or of a PyTorch state_dict in safetensors);
          of a gpt checkpoint: its validation loss
  export  a checkpoint's model tensors alone, in safetensors, for PyTorch and other tools
  sample  text from a gpt checkpoint
  bench   time training steps on synthetic data, print one JSON object
  devices list this machine's CPU features and GPUs (`mixprec --version`: is CUDA built in)

shared flags (train, bench):
  --device cpu|cuda|cuda:N|auto   where to train (cpu); auto: GPU 0 where there is one, else the CPU.
                               The model is built on the CPU (the same weights everywhere), then moved
  --model mlp|cnn|cnn-bn|gpt   model to build (mlp: 784-hidden...-10; cnn: the PyTorch tutorial's
                               two conv/ReLU/max-pool stages; cnn-bn: conv-BN-ReLU stages, dropout;
                               gpt: nanoGPT's decoder, pre-norm blocks, embedding tied to the head)
  --hidden 1024,1024           mlp hidden widths
  --channels 8,16              cnn conv widths (420,1000: the wide one)
  --layers 4  --heads 4  --d-model 128  --block-size 128  --dropout 0   the gpt's shape (context: block size)
  --precision auto|fp32|amp-bf16|amp-fp16|half-bf16|half-fp16|pure-bf16|pure-fp16
                               auto: on a GPU amp-bf16 from compute capability 8.0 on, else amp-fp16;
                               on the CPU amp-bf16 where it has AMX-BF16 or AVX512-BF16, else fp32;
                               amp-*: autocast, f32 parameters; half-*: 16-bit parameters, f32 master
                               weights and optimizer state, norms f32; pure-bf16: no master copy,
                               stochastic rounding (--stochastic-rounding false: round to nearest);
                               pure-fp16: the naive baseline (no master, round to nearest)
  --loss-scale dynamic|static:N|none   (default: dynamic for the fp16 presets, else none)
  --init-scale X (65536)  --growth-interval N (2000)  --hysteresis N (1: back off at once)
  --accumulate N               split each batch into N micro-batches (one optimizer step)
  --clip-grad-norm X  --clip-grad-value X   clip the unscaled gradients
  --loss-weight W              multiply the loss by W before backward (an auxiliary-loss weight;
                               W = 1e-5 shows fp16 gradient underflow)
  --optimizer adamw|sgd        (adamw: lr 1e-3, cnn 2e-3; sgd: lr 0.05, --momentum 0.9)
  --lr X  --weight-decay X  --momentum X  --beta2 X (gpt: AdamW's second beta)
  --batch-size N (mlp 512, cnn 64, cnn-bn 128, gpt 32)  --seed N (0)  --threads N (available cores)
  gpt's recipe (nanoGPT's): AdamW betas 0.9/0.95, weight decay 0.1 on the parameters of dim >= 2
  only (biases and LayerNorms: none), lr 1e-3, 100 warm-up steps then cosine to --min-lr 1e-4,
  --clip-grad-norm 1.0, batch 32

train:   --epochs N (5)  --data DIR  --metrics FILE (JSON lines)  --log-every K (1)  --detect-anomaly
         (on a GPU the loss is read, a sync, only for a metrics line or a progress line)
         --diagnose K   every K steps: per-parameter share of gradient values fp16 flushes to zero or
                        overflows, at the loss scale and without; autocast trace; scale trace
         --lr-schedule cosine|constant (cosine: anneal to 0 over the run)  --lr-warmup STEPS (0)
         --save FILE    a checkpoint (safetensors) at each epoch end; --save-every N: also every N steps
         --resume FILE  continue a checkpoint's run bit-exactly (its settings; an explicit flag must agree)
         --stop-after-steps N   stop after step N (saving first with --save), as a preempted job would
train --model gpt:  --text FILE (/usr/local/share/mixprec/mobydick.txt, from scripts/dev.sh; any UTF-8
         text)  --steps N (2000)  --eval-every K (250; and at the last step)  --eval-batches N (50 fixed
         validation batches of 32 x block size)  --min-lr X (1e-4); --seed picks the training batches;
         --save FILE saves at each evaluation (and --save-every N), --resume, --stop-after-steps and
         --diagnose as above
eval:    --checkpoint FILE  [--data DIR] [--precision P (the file's)] [--json] [--threads N]
         --model/--hidden/--channels for a file that does not name its model (a PyTorch state_dict)
         a gpt checkpoint: [--text FILE (the run's)] [--eval-batches N (the run's)]
export:  --checkpoint FILE --out FILE [--dtype f32|bf16|f16 (default: as stored)]
sample:  --checkpoint FILE (train --model gpt --save)  --prompt TEXT ("\n")  --tokens N (500)
         --temperature T (0.8)  --top-k K (200; 0: all)  --seed S (1337)  [--device D] [--precision P]
         [--threads N]; the context is cropped to the block size; the same seed gives the same text
bench:   --steps N (30)  --warmup N (5); gpt: random tokens, --vocab-size V (81, Moby Dick's)
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") return mixprec::cli::cmd_version();
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (const auto& r : rest)
    if (r == "--help" || r == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    mixprec::cli::Args args(cmd, rest);
    if (cmd == "train") return mixprec::cli::cmd_train(args);
    if (cmd == "eval") return mixprec::cli::cmd_eval(args);
    if (cmd == "export") return mixprec::cli::cmd_export(args);
    if (cmd == "bench") return mixprec::cli::cmd_bench(args);
    if (cmd == "sample") return mixprec::cli::cmd_sample(args);
    if (cmd == "devices") return mixprec::cli::cmd_devices(args);
    std::fprintf(stderr, "mixprec: unknown command '%s' (try `mixprec --help`)\n", cmd.c_str());
    return 2;
  } catch (const mixprec::Error& e) {
    std::fprintf(stderr, "mixprec %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mixprec %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
