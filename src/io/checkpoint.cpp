// Checkpoint: gathers the state dicts of a model, its optimizer (renamed from parameter indices
// to parameter names), its GradScaler and a generator into one list of named tensors, and back.
#include "mixprec/checkpoint.h"

#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "mixprec/error.h"

namespace mixprec {
namespace {

constexpr std::string_view kOptimizer = "optimizer.", kScaler = "scaler.", kRng = "rng.", kRun = "run.";
constexpr std::string_view kReserved[] = {kOptimizer, kScaler, kRng, kRun};
constexpr size_t kNamesShown = 8;  // names listed per kind of mismatch before "(+N more)"

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }
bool is_reserved(const std::string& name) {
  for (std::string_view p : kReserved)
    if (starts_with(name, p)) return true;
  return false;
}

// The entries under `prefix`, with the prefix removed.
StateDict under(const StateDict& sd, std::string_view prefix) {
  StateDict out;
  for (const auto& [k, t] : sd)
    if (starts_with(k, prefix)) out.emplace_back(k.substr(prefix.size()), t);
  return out;
}

void append(StateDict& dst, std::string_view prefix, const StateDict& src) {
  for (const auto& [k, t] : src) dst.emplace_back(std::string(prefix) + k, t);
}

// "a, b, c (+4 more)"
std::string name_list(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > kNamesShown) os << " (+" << names.size() - kNamesShown << " more)";
  return os.str();
}

}  // namespace

Checkpoint::Checkpoint(nn::Module& model, optim::Optimizer* optimizer, amp::GradScaler* scaler, Generator* generator)
    : model_(model), optimizer_(optimizer), scaler_(scaler), generator_(generator) {
  for (const auto& [name, t] : model.state_dict())
    MIXPREC_CHECK(!is_reserved(name), "Checkpoint: the model's tensor '", name,
                  "' starts with a prefix the checkpoint keeps for itself (optimizer., scaler., rng., run.)");
  if (!optimizer_) return;
  // The optimizer knows its parameters by index, the model knows their names.
  std::map<const detail::TensorImpl*, std::string> names;
  for (const auto& [name, t] : model.named_parameters()) names.emplace(t.impl(), name);
  for (size_t i = 0; i < optimizer_->params().size(); ++i) {
    const auto it = names.find(optimizer_->params()[i].impl());
    MIXPREC_CHECK(it != names.end(), "Checkpoint: the optimizer's parameter ", i, " is not a parameter of the model");
    param_names_.push_back(it->second);
  }
}

StateDict Checkpoint::state_dict(const StateDict& run) const {
  StateDict sd = model_.state_dict();
  if (optimizer_) {
    for (const auto& [key, t] : optimizer_->state_dict()) {
      if (starts_with(key, "state.")) {  // state.<i>.<name> -> <param name>.<name>
        const size_t dot = key.find('.', 6);
        const size_t i = std::stoul(key.substr(6, dot - 6));
        sd.emplace_back(std::string(kOptimizer) + param_names_.at(i) + key.substr(dot), t);
      } else {
        sd.emplace_back(std::string(kOptimizer) + key, t);  // step, param_groups.<g>.<key>
      }
    }
  }
  if (scaler_) append(sd, kScaler, scaler_->state_dict());
  if (generator_) append(sd, kRng, generator_->state_dict());
  for (const auto& [k, t] : run) {
    MIXPREC_CHECK(starts_with(k, kRun), "Checkpoint: the caller's entry '", k, "' must be named run.<key>");
    sd.emplace_back(k, t);
  }
  return sd;
}

StateDict Checkpoint::model_tensors(const StateDict& sd) {
  StateDict out;
  for (const auto& [k, t] : sd)
    if (!is_reserved(k)) out.emplace_back(k, t);
  return out;
}

namespace {

// Throws, listing every missing, unexpected and misshapen name, unless `tensors` has exactly the
// model's names and shapes.
void check_model_names(const nn::Module& model, const StateDict& tensors, const std::string& source) {
  std::map<std::string, Shape> mine;
  for (const auto& [k, t] : model.state_dict()) mine.emplace(k, t.shape());
  std::vector<std::string> missing, unexpected, misshapen;
  std::set<std::string> seen;
  for (const auto& [k, t] : tensors) {
    seen.insert(k);
    const auto it = mine.find(k);
    if (it == mine.end())
      unexpected.push_back(k);
    else if (t.shape() != it->second)
      misshapen.push_back(k + " " + shape_str(t.shape()) + " (model: " + shape_str(it->second) + ")");
  }
  for (const auto& [k, t] : model.state_dict())
    if (!seen.count(k)) missing.push_back(k);
  if (!missing.empty() || !unexpected.empty() || !misshapen.empty()) {
    std::ostringstream os;
    os << source << " does not hold this model's tensors:";
    const char* sep = " ";
    if (!missing.empty()) os << sep << "missing " << name_list(missing), sep = "; ";
    if (!unexpected.empty()) os << sep << "unexpected " << name_list(unexpected), sep = "; ";
    if (!misshapen.empty()) os << sep << "other shape " << name_list(misshapen);
    throw Error(os.str());
  }
}

}  // namespace

void Checkpoint::load_model(nn::Module& model, const StateDict& tensors, const std::string& source) {
  check_model_names(model, tensors, source);
  try {
    model.load_state_dict(tensors);  // the dtypes
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

void Checkpoint::load_state_dict(const StateDict& sd, const std::string& source) {
  // Everything whose absence or presence can be seen from the names first, then each part.
  const StateDict model = model_tensors(sd);
  check_model_names(model_, model, source);
  const StateDict opt = under(sd, kOptimizer), scaler = under(sd, kScaler), rng = under(sd, kRng);
  MIXPREC_CHECK(!optimizer_ || !opt.empty(), source, " holds no optimizer state (optimizer.*)");
  MIXPREC_CHECK(!generator_ || !rng.empty(), source, " holds no generator state (rng.*)");
  if (scaler_) {
    MIXPREC_CHECK(scaler_->is_enabled() || scaler.empty(), source,
                  " holds GradScaler state (scaler.*) but this GradScaler is disabled");
    MIXPREC_CHECK(!scaler_->is_enabled() || !scaler.empty(), source,
                  " holds no GradScaler state (scaler.*) but this GradScaler is enabled");
  }
  StateDict opt_sd;  // back to the optimizer's own names: state.<i>.<name>
  if (optimizer_) {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < param_names_.size(); ++i) index.emplace(param_names_[i], i);
    for (const auto& [key, t] : opt) {
      if (key == "step" || starts_with(key, "param_groups.")) {
        opt_sd.emplace_back(key, t);
        continue;
      }
      const size_t dot = key.rfind('.');
      const auto it = dot == std::string::npos ? index.end() : index.find(key.substr(0, dot));
      MIXPREC_CHECK(it != index.end(), source, ": 'optimizer.", key,
                    "' is the state of no parameter of this optimizer (expected optimizer.<parameter>.<state>)");
      opt_sd.emplace_back("state." + std::to_string(it->second) + key.substr(dot), t);
    }
  }
  load_model(model_, model, source);
  try {
    if (optimizer_) optimizer_->load_state_dict(opt_sd);
    if (scaler_) scaler_->load_state_dict(scaler);
    if (generator_) generator_->load_state_dict(rng);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

void Checkpoint::save(const std::string& path, const std::map<std::string, std::string>& metadata,
                      const StateDict& run) const {
  io::save_safetensors(path, state_dict(run), metadata);
}

io::SafetensorsFile Checkpoint::load(const std::string& path) {
  io::SafetensorsFile f = io::load_safetensors(path);
  load_state_dict(f.tensors, path);
  return f;
}

}  // namespace mixprec
