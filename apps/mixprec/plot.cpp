// `mixprec plot`: the chart of compare (chart.h) for any runs' `train --metrics` files.
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "chart.h"
#include "commands.h"
#include "mixprec/error.h"

namespace mixprec::cli {

std::function<int()> declare_plot(Command& c) {
  struct PlotFlags {
    std::vector<std::string> files;
    std::string out, labels;
  };
  auto f = std::make_shared<PlotFlags>();
  c.positionals("metrics", f->files, "METRICS.jsonl files written by train --metrics (or compare --out), one run each");
  c.text("o,out", f->out, "PNG", "the chart to write; its data and gnuplot script go beside it");
  c.required("out");
  c.text("labels", f->labels, "L,L,...", "the runs' names in the legend, one per file", "the files' names");
  return [f] {
    std::vector<std::string> labels;
    if (!f->labels.empty()) {
      std::stringstream ss(f->labels);
      for (std::string l; std::getline(ss, l, ',');) labels.push_back(l);
      MIXPREC_CHECK(labels.size() == f->files.size(), "--labels names ", labels.size(), " runs for ", f->files.size(),
                    " metrics files");
    }
    const ChartOutcome outcome = write_chart(f->files, labels, f->out);
    std::printf("%s\n", outcome.message.c_str());
    return 0;
  };
}

}  // namespace mixprec::cli
