// The chart of `compare` and `plot`: metrics files -> gnuplot data blocks and script -> PNG.
#include "chart.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "mixprec/error.h"

namespace mixprec::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Point {
  double x, y;
};

// One run's series, as read from its metrics file.
struct Run {
  std::string label;
  std::vector<Point> loss, scale, accuracy, val_loss;  // per step, step, epoch (percent), eval
  bool loss_scaling = false;  // a scale other than 1 in any step line, or an fp16 preset's summary
};

bool is_integer(const json& j, const char* key) { return j.contains(key) && j[key].is_number_integer(); }
bool is_number(const json& j, const char* key) { return j.contains(key) && j[key].is_number(); }

Run read_run(const std::string& path, std::string label) {
  std::ifstream in(path);
  MIXPREC_CHECK(in.is_open(), "chart: cannot read metrics file ", path);
  Run run;
  run.label = std::move(label);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const auto bad = [&](const char* what) {
      return Error(detail::concat(path, ":", n, ": ", what, " (not a `mixprec train --metrics` line)"));
    };
    if (!j.is_object() || !j.contains("event") || !j["event"].is_string()) throw bad("not a JSON object with an event");
    const std::string event = j["event"].get<std::string>();
    if (event == "step") {
      // The loss is null when it was inf/NaN (JSON has neither): a gap in the line, gnuplot's NaN.
      if (!is_integer(j, "step") || !j.contains("loss") || !(j["loss"].is_number() || j["loss"].is_null()) ||
          !is_number(j, "scale"))
        throw bad("a step line needs an integer step, a loss and a scale");
      const double step = j["step"].get<double>(), scale = j["scale"].get<double>();
      run.loss.push_back({step, j["loss"].is_null() ? NAN : j["loss"].get<double>()});
      run.scale.push_back({step, scale});
      run.loss_scaling = run.loss_scaling || scale != 1.0;
    } else if (event == "epoch") {
      if (!is_integer(j, "epoch") || !is_number(j, "test_accuracy"))
        throw bad("an epoch line needs an integer epoch and a test_accuracy");
      run.accuracy.push_back({j["epoch"].get<double>(), 100 * j["test_accuracy"].get<double>()});
    } else if (event == "eval") {
      if (!is_integer(j, "step") || !is_number(j, "val_loss"))
        throw bad("an eval line needs an integer step and a val_loss");
      run.val_loss.push_back({j["step"].get<double>(), j["val_loss"].get<double>()});
    } else if (event == "summary") {
      // A run whose scale stayed 1 throughout (a static scale of 1) still used the fp16 recipe.
      if (j.contains("precision") && j["precision"].is_string() &&
          j["precision"].get<std::string>().find("fp16") != std::string::npos)
        run.loss_scaling = true;
    }
    // diagnose, rounding and any later event: not charted.
  }
  MIXPREC_CHECK(!in.bad(), "chart: reading ", path, " failed");
  MIXPREC_CHECK(!run.loss.empty() || !run.accuracy.empty() || !run.val_loss.empty(), "chart: ", path,
                " has no step, epoch or eval lines (not a `mixprec train --metrics` file)");
  return run;
}

// ".chart.png.tmp-PID": the temporary that becomes path, in its directory (rename stays on one filesystem).
std::string temp_name(const fs::path& path) { return detail::concat(".", path.filename().string(), ".tmp-", getpid()); }

// The file's contents replace path's whole, or not at all: written beside it and renamed.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.parent_path() / temp_name(path);
  {
    std::ofstream out(tmp, std::ios::trunc);
    MIXPREC_CHECK(out.is_open(), "chart: cannot write ", path.string());
    out << text;
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(detail::concat("chart: writing ", path.string(), " failed"));
    }
  }
  std::error_code ec, ignored;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ignored);
    throw Error(detail::concat("chart: cannot write ", path.string(), ": ", ec.message()));
  }
}

// A gnuplot string in single quotes, where '' is a quote.
std::string gp_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}
// A shell word in single quotes.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// One panel: a data file with a block per run that has points (gnuplot's `index`), and its plot.
struct Panel {
  std::string name, title, xlabel, ylabel, extra;  // extra: gnuplot settings for this panel only
  std::vector<Point> Run::*series;
  bool (*wanted)(const Run&);
};

std::string data_text(const Panel& p, const std::vector<Run>& runs, std::vector<size_t>& plotted) {
  std::ostringstream os;
  os.precision(9);
  os << "# mixprec chart: " << p.title << "; one block per run (gnuplot index 0, 1, ...)\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const std::vector<Point>& pts = runs[r].*p.series;
    if (pts.empty() || !p.wanted(runs[r])) continue;
    if (!plotted.empty()) os << "\n\n";
    plotted.push_back(r);
    os << "# " << runs[r].label << "\n# " << p.xlabel << " " << p.ylabel << "\n";
    for (const Point& q : pts) {
      os << q.x << " ";
      if (std::isnan(q.y))
        os << "NaN\n";
      else
        os << q.y << "\n";
    }
  }
  return os.str();
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path exe = fs::path(dir.empty() ? "." : dir) / "gnuplot";
    if (access(exe.c_str(), X_OK) == 0 && fs::is_regular_file(exe)) return exe.string();
  }
  return "";
}

bool has_png_signature(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == "\x89PNG\r\n\x1a\n";
}

}  // namespace

ChartOutcome write_chart(const std::vector<std::string>& metrics_files, const std::vector<std::string>& labels,
                         const std::string& png_path) {
  MIXPREC_CHECK(!metrics_files.empty(), "chart: no metrics files");
  MIXPREC_CHECK(labels.empty() || labels.size() == metrics_files.size(), "chart: ", labels.size(), " labels for ",
                metrics_files.size(), " metrics files");
  std::vector<Run> runs;
  for (size_t i = 0; i < metrics_files.size(); ++i) {
    std::string label = labels.empty() ? fs::path(metrics_files[i]).stem().string() : labels[i];
    for (char& c : label)
      if (c == '\n' || c == '\r') c = ' ';  // a label is one comment line of the data files
    runs.push_back(read_run(metrics_files[i], std::move(label)));
  }

  const fs::path png = fs::absolute(png_path);
  const fs::path dir = png.parent_path();
  const std::string stem = png.extension() == ".png" ? png.stem().string() : png.filename().string();
  const auto all = [](const Run&) { return true; };
  const std::vector<Panel> panels = {
      {"loss", "training loss per step", "step", "loss", "", &Run::loss, all},
      {"accuracy", "test accuracy per epoch", "epoch", "test accuracy (%)", "set xtics 1\n", &Run::accuracy, all},
      {"val_loss", "validation loss per eval", "step", "validation loss", "", &Run::val_loss, all},
      {"scale", "loss scale per step (runs with loss scaling)", "step", "loss scale", "set logscale y 2\n", &Run::scale,
       [](const Run& r) { return r.loss_scaling; }},
  };

  // Only the panels some run has points for; each data file's blocks are the runs it holds.
  std::ostringstream gp;
  std::vector<std::pair<fs::path, std::string>> files;
  std::ostringstream plots;
  int n_panels = 0;
  for (const Panel& p : panels) {
    std::vector<size_t> plotted;
    const std::string data = data_text(p, runs, plotted);
    if (plotted.empty()) continue;
    const std::string data_name = stem + "." + p.name + ".dat";
    files.emplace_back(dir / data_name, data);
    ++n_panels;
    plots << "\n# " << p.title << "\nreset\n"
          << "set title " << gp_quote(p.title) << " noenhanced\nset xlabel " << gp_quote(p.xlabel) << "\nset ylabel "
          << gp_quote(p.ylabel) << "\nset grid\nset key outside right top noenhanced\n"
          << "set lmargin 12\n"  // the panels' x axes line up whatever their tick labels' widths
          << p.extra << "plot ";
    for (size_t k = 0; k < plotted.size(); ++k)
      plots << (k ? ", \\\n     " : "") << gp_quote(data_name) << " index " << k << " using 1:2 with "
            << (p.name == "accuracy" ? "linespoints pointtype 7 pointsize 0.8" : "lines") << " linetype "
            << plotted[k] + 1 << " title " << gp_quote(runs[plotted[k]].label);
    plots << "\n";
  }
  const std::string script_name = stem + ".gp";
  gp << "# mixprec chart: " << n_panels << " panels, one line per run. Draw it with:\n"
     << "#   cd " << sh_quote(dir.string()) << " && gnuplot " << sh_quote(script_name) << "\n"
     << "# (gnuplot -e \"out='other.png'\" writes elsewhere.)\n"
     << "if (!exists(\"out\")) out = " << gp_quote(png.filename().string()) << "\n"
     << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
     << "  set terminal pngcairo size 1000," << 320 * n_panels << " noenhanced font ',10'\n"
     << "} else {\n"
     << "  set terminal png size 1000," << 320 * n_panels << " noenhanced\n"
     << "}\n"
     << "set output out\n";
  // One colour per run across every panel (a run keeps its colour where it is missing from a panel);
  // linetypes, unlike line styles, outlive each panel's reset.
  const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (size_t r = 0; r < runs.size(); ++r)
    gp << "set linetype " << r + 1 << " linecolor rgb '" << colours[r % std::size(colours)] << "' linewidth 1.5\n";
  gp << "set multiplot layout " << n_panels << ",1\n" << plots.str() << "\nunset multiplot\nset output\n";
  files.emplace_back(dir / script_name, gp.str());
  for (const auto& [path, text] : files) write_atomically(path, text);

  const std::string draw = "cd " + sh_quote(dir.string()) + " && gnuplot " + sh_quote(script_name);
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    return {false, "gnuplot not found: the chart's data and script are in " + dir.string() +
                       "; to draw it: apt-get install gnuplot-nox, then: " + draw};

  // gnuplot draws into a temporary beside the PNG, renamed once it is a whole PNG.
  const std::string tmp_name = temp_name(png);
  const fs::path tmp = dir / tmp_name;
  const std::string cmd = "cd " + sh_quote(dir.string()) + " && " + sh_quote(gnuplot) + " -e " +
                          sh_quote("out=" + gp_quote(tmp_name)) + " " + sh_quote(script_name) + " 2>&1";
  std::string output;
  int status = -1;
  if (FILE* pipe = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
    const int wait_status = pclose(pipe);
    status = wait_status != -1 && WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  }
  std::error_code ec;
  if (status != 0 || !has_png_signature(tmp)) {
    fs::remove(tmp, ec);
    // gnuplot's error names the script's line ("chart.gp" line 9: ...): that line, else its last.
    std::string first;
    std::istringstream lines(output);
    for (std::string l; std::getline(lines, l);)
      if (l.find_first_not_of(" \t^") != std::string::npos) {
        first = l;
        if (l.find("line") != std::string::npos) break;
      }
    throw Error(detail::concat("chart: gnuplot failed on ", (dir / script_name).string(), " (exit status ", status, ")",
                               first.empty() ? "" : ": ", first));
  }
  fs::rename(tmp, png, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw Error(detail::concat("chart: cannot write ", png.string(), ": ", ec.message()));
  }
  return {true, "chart: " + png.string() + " (data and script: " + (dir / script_name).string() + ")"};
}

}  // namespace mixprec::cli
