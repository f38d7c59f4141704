// Conv2d and the pooling layers, with PyTorch's names, printing and default initialisation.
#include <cmath>
#include <sstream>
#include <string_view>

#include "mixprec/error.h"
#include "mixprec/nn.h"

namespace mixprec::nn {
namespace {

std::string pair_str(ops::IntPair p) {
  std::ostringstream os;
  os << "(" << p.h << ", " << p.w << ")";
  return os.str();
}
// PyTorch prints what it was given: 2 for an int, (2, 3) for a tuple; we print the int form when equal.
std::string size_str(ops::IntPair p) { return p.h == p.w ? std::to_string(p.h) : pair_str(p); }

// Runs f, prefixing a user error with the layer's description: "Conv2d(8, 16, ...): conv2d: ...".
template <class F>
Tensor named(const Module& m, F&& f) {
  try {
    return f();
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    throw Error(m.name() + ": " + e.what());
  }
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, ops::IntPair k, Conv2dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  MIXPREC_CHECK(in > 0 && out > 0 && k.h > 0 && k.w > 0, "Conv2d(", in, ", ", out, ", kernel_size=", pair_str(k),
                "): channels and kernel size must be positive");
  MIXPREC_CHECK(o.groups >= 1 && in % o.groups == 0 && out % o.groups == 0, "Conv2d(", in, ", ", out,
                "): in_channels and out_channels must be divisible by groups=", o.groups);
  MemoryScope scope(MemCategory::parameters);
  // PyTorch: kaiming_uniform_(a=sqrt(5)) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)); bias the same bound.
  const int64_t fan_in = in / o.groups * k.h * k.w;
  const double bound = 1.0 / std::sqrt(double(fan_in));
  weight =
      register_parameter("weight", Tensor::uniform({out, in / o.groups, k.h, k.w}, default_generator(), -bound, bound));
  if (o.bias) bias = register_parameter("bias", Tensor::uniform({out}, default_generator(), -bound, bound));
}

Tensor Conv2d::forward(const Tensor& x) {
  return named(*this, [&] {
    return ops::conv2d(
        x, weight, bias,
        {options.stride, options.padding, options.dilation, options.groups, false, options.channels_last});
  });
}

Tensor Conv2d::forward_relu(const Tensor& x) {
  return named(*this, [&] {
    return ops::conv2d(
        x, weight, bias,
        {options.stride, options.padding, options.dilation, options.groups, true, options.channels_last});
  });
}

Tensor Conv2d::forward_max_pool(const Tensor& x, const MaxPool2d& pool, bool relu) {
  try {
    return ops::conv2d_max_pool2d(
        x, weight, bias,
        {options.stride, options.padding, options.dilation, options.groups, relu, options.channels_last},
        pool.kernel_size(), pool.options());
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {  // the op names its pool's checks max_pool2d's
    const bool pool_error = std::string_view(e.what()).starts_with("max_pool2d:");
    throw Error((pool_error ? pool.name() : name()) + ": " + e.what());
  }
}

void Conv2d::bind_parameter(const std::string& name, const Tensor& t) { (name == "weight" ? weight : bias) = t; }
std::string Conv2d::name() const {
  std::ostringstream os;
  os << "Conv2d(" << in_channels << ", " << out_channels << ", kernel_size=" << pair_str(kernel_size)
     << ", stride=" << pair_str(options.stride);
  if (options.padding != ops::IntPair(0)) os << ", padding=" << pair_str(options.padding);
  if (options.dilation != ops::IntPair(1)) os << ", dilation=" << pair_str(options.dilation);
  if (options.groups != 1) os << ", groups=" << options.groups;
  if (!bias.defined()) os << ", bias=False";
  os << ")";
  return os.str();
}

MaxPool2d::MaxPool2d(ops::IntPair k, ops::Pool2dOptions o) : kernel_size_(k), o_(o) {
  if (o_.stride == ops::IntPair(0)) o_.stride = k;
}
Tensor MaxPool2d::forward(const Tensor& x) {
  return named(*this, [&] { return ops::max_pool2d(x, kernel_size_, o_); });
}
std::string MaxPool2d::name() const {
  std::ostringstream os;
  os << "MaxPool2d(kernel_size=" << size_str(kernel_size_) << ", stride=" << size_str(o_.stride)
     << ", padding=" << size_str(o_.padding) << ", dilation=" << size_str(o_.dilation)
     << ", ceil_mode=" << (o_.ceil_mode ? "True" : "False") << ")";
  return os.str();
}

AvgPool2d::AvgPool2d(ops::IntPair k, ops::Pool2dOptions o) : kernel_size_(k), o_(o) {
  if (o_.stride == ops::IntPair(0)) o_.stride = k;
}
Tensor AvgPool2d::forward(const Tensor& x) {
  return named(*this, [&] { return ops::avg_pool2d(x, kernel_size_, o_); });
}
std::string AvgPool2d::name() const {
  std::ostringstream os;
  os << "AvgPool2d(kernel_size=" << size_str(kernel_size_) << ", stride=" << size_str(o_.stride)
     << ", padding=" << size_str(o_.padding) << ")";
  return os.str();
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  return named(*this, [&] { return ops::adaptive_avg_pool2d(x, output_size_); });
}
std::string AdaptiveAvgPool2d::name() const { return "AdaptiveAvgPool2d(output_size=" + size_str(output_size_) + ")"; }

}  // namespace mixprec::nn
