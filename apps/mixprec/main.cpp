// mixprec command-line entry point: the subcommands, declared with CLI11 (cli.h), and their runs.
#include "commands.h"

int main(int argc, char** argv) {
  using namespace mixprec::cli;
  const std::vector<CommandDef> commands = {
      {"train",
       "train a model on Fashion-MNIST (or --data DIR of idx files), evaluating each epoch; --model gpt: a "
       "character-level GPT on a text (Moby Dick), evaluated every --eval-every steps",
       declare_train},
      {"eval",
       "test accuracy and loss of a checkpoint (or of a PyTorch state_dict in safetensors); of a gpt "
       "checkpoint: its validation loss",
       declare_eval},
      {"export", "a checkpoint's model tensors alone, in safetensors, for PyTorch and other tools", declare_export},
      {"sample", "text from a gpt checkpoint", declare_sample},
      {"bench", "time training steps on synthetic data, print one JSON object", declare_bench},
      {"compare",
       "the same training run in each of --precisions, one after the other: one table of accuracy, time, "
       "speed-up, peak memory and skipped steps (--out DIR: the runs' metrics and a chart)",
       declare_compare},
      {"max-batch",
       "for each of --precisions the largest batch whose whole training step fits --memory-limit, and its ratio "
       "to fp32's",
       declare_max_batch},
      {"plot", "the chart of training loss, test accuracy (or validation loss) and loss scale of train --metrics files",
       declare_plot},
      {"devices", "this machine's CPU features and GPUs (`mixprec --version`: is CUDA built in)", declare_devices},
  };
  return run_main(argc, argv, commands, version_text());
}
