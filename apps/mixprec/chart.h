// The chart of `mixprec compare` and `mixprec plot`: runs read from `train --metrics` files, drawn
// by gnuplot (Debian's gnuplot-nox) into one PNG with a panel per quantity, one line per run.
#pragma once
#include <string>
#include <vector>

namespace mixprec::cli {

struct ChartOutcome {
  bool drawn = false;   // the PNG was written
  std::string message;  // where it was written, or how to get gnuplot and the command that draws it
};

// Reads `train --metrics` JSON-lines files, one run each (labels: the legend names, one per file;
// empty: each file's name without its extension), writes the chart's data and gnuplot script beside
// png_path (chart.png: chart.loss.dat, chart.accuracy.dat, chart.val_loss.dat, chart.scale.dat as the
// runs have them, and chart.gp), and runs gnuplot when it is installed. The panels: training loss per
// step; test accuracy per epoch (image models) and validation loss per eval (gpt), for the runs that
// have them; the loss scale per step of the runs that used loss scaling (fp16).
// Throws mixprec::Error, before writing anything, for a file that cannot be read or is not a metrics
// file (naming the file and line), and when gnuplot fails. Every file is written to a temporary and
// renamed: a failure leaves no half-written PNG.
ChartOutcome write_chart(const std::vector<std::string>& metrics_files, const std::vector<std::string>& labels,
                         const std::string& png_path);

}  // namespace mixprec::cli
