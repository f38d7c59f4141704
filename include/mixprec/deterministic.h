// Deterministic algorithms, PyTorch's torch.use_deterministic_algorithms: the same bits on every
// rerun of the same program with the same inputs, on the same machine, library versions and thread
// count. Process-wide, off by default.
//
// What it changes: on a GPU, each convolution runs the first engine cuDNN's heuristics list among
// those whose numerical notes do not say "non-deterministic", instead of the fastest of several
// timed on first use (timing may pick another engine in another process, as PyTorch's
// cudnn.benchmark does). What holds with it off too: no kernel of mixprec adds floating-point
// values with atomics (the CUDA embedding gradient sums each row in index order), cuBLASLt's
// algorithm comes from its heuristics, the CPU's threads sum in a fixed order (OpenMP static
// schedules, per-thread partials combined in thread order) and oneDNN's CPU primitives are
// run-to-run deterministic at a fixed thread count. docs/design.md, "Determinism".
#pragma once

namespace mixprec {

void use_deterministic_algorithms(bool on);
bool deterministic_algorithms();

}  // namespace mixprec
