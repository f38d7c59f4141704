// Tensor storage, factories, views and host-side value access.
#include "mixprec/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/fenced.h"
#include "kernels/kernels.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"

namespace mixprec {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

namespace {
std::atomic<uint64_t> g_versions{0};
thread_local Device tl_default_device;
}  // namespace

Device default_device() { return tl_default_device; }
DefaultDevice::DefaultDevice(Device d) : prev_(tl_default_device) { tl_default_device = d; }
DefaultDevice::~DefaultDevice() { tl_default_device = prev_; }

Storage::Storage(size_t bytes, MemCategory cat, Device device)
    : data_(detail::device_allocator(device).allocate(bytes, cat)),
      bytes_(bytes),
      device_(device),
      cat_(cat),
      version_(++g_versions) {}
void Storage::bump_version() { version_ = ++g_versions; }
Storage::~Storage() { detail::device_allocator(device_).deallocate(data_, bytes_, cat_); }
void Storage::set_category(MemCategory c) {
  detail::device_allocator(device_).recategorize(bytes_, cat_, c);
  cat_ = c;
}

// ---------------------------------------------------------------- factories

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) MIXPREC_CHECK(d >= 0, "tensor dimensions must be >= 0, got ", shape_str(shape));
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage =
      std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), current_mem_category(), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

namespace {
// A host tensor of `dtype` filled by `fill(ptr)`, then moved to `device` (detached: factories
// make leaves).
template <class Fill>
Tensor host_then_move(const Shape& shape, DType dtype, Device device, Fill fill) {
  Tensor t = Tensor::empty(shape, dtype, Device::cpu());
  fill(t.data_ptr());
  return device.is_cpu() ? t : t.to(device).detach();
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype, Device device) {
  MIXPREC_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
                " values do not fill shape ", shape_str(shape));
  return host_then_move(shape, dtype, device,
                        [&](void* p) { convert(values.data(), DType::f32, p, dtype, values.size()); });
}
Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  MIXPREC_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
                " values do not fill shape ", shape_str(shape));
  return host_then_move(shape, dtype, device,
                        [&](void* p) { convert(values.data(), DType::f64, p, dtype, values.size()); });
}
Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  MIXPREC_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
                " values do not fill shape ", shape_str(shape));
  return host_then_move(shape, DType::i64, device,
                        [&](void* p) { std::memcpy(p, values.data(), values.size() * sizeof(int64_t)); });
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, DType dtype, double std, Device device) {
  return host_then_move(shape, dtype, device,
                        [&](void* p) { fill_normal(p, dtype, shape_numel(shape), 0.0, std, gen); });
}
Tensor Tensor::uniform(const Shape& shape, Generator& gen, double lo, double hi, DType dtype, Device device) {
  return host_then_move(shape, dtype, device,
                        [&](void* p) { fill_uniform(p, dtype, shape_numel(shape), lo, hi, gen); });
}
Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = double(i);
  return from_vector(v, {n}, dtype, device);
}

// ---------------------------------------------------------------- metadata

int64_t Tensor::size(int64_t d) const {
  const int64_t nd = dim();
  if (d < 0) d += nd;
  MIXPREC_CHECK(d >= 0 && d < nd, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return impl_->shape[size_t(d)];
}

bool Tensor::is_contiguous() const {
  int64_t expect = 1;
  for (size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expect) return false;
    expect *= impl_->shape[i];
  }
  return true;
}

Device Tensor::device() const { return impl_->storage ? impl_->storage->device() : Device::cpu(); }

void* Tensor::data_ptr() const {
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * int64_t(dtype_size(impl_->dtype));
}

void* Tensor::host_data_ptr() const {
  const Device d = device();
  MIXPREC_CHECK(d.is_cpu() || (d.is_fenced() && detail::fenced_access_open()), "host code read a tensor on ", d.str(),
                " (", dtype_name(dtype()), " ", shape_str(shape()),
                "): device memory is reached through kernels; copy it with .to(Device::cpu()) first");
  return data_ptr();
}

// ---------------------------------------------------------------- values

namespace {
// t's values in host memory, in logical order: t itself when it is already that (no new handle on
// item()'s path), else a detached contiguous host copy.
Tensor on_host(const Tensor& t) {
  if (t.device().is_cpu() && t.is_contiguous()) return t;
  return t.detach().to(Device::cpu()).contiguous();
}
}  // namespace

std::vector<float> Tensor::to_vector() const {
  Tensor c = on_host(*this);
  std::vector<float> out(size_t(c.numel()));
  convert(c.data_ptr(), c.dtype(), out.data(), DType::f32, out.size());
  return out;
}
std::vector<double> Tensor::to_vector_f64() const {
  Tensor c = on_host(*this);
  std::vector<double> out(size_t(c.numel()));
  convert(c.data_ptr(), c.dtype(), out.data(), DType::f64, out.size());
  return out;
}
std::vector<int64_t> Tensor::to_vector_i64() const {
  Tensor c = on_host(*this);
  std::vector<int64_t> out(size_t(c.numel()));
  convert(c.data_ptr(), c.dtype(), out.data(), DType::i64, out.size());
  return out;
}

double Tensor::item() const {
  MIXPREC_CHECK(numel() == 1, "item() needs a one-element tensor, got shape ", shape_str(shape()));
  double v = 0;
  convert(on_host(*this).data_ptr(), dtype(), &v, DType::f64, 1);
  return v;
}

Tensor Tensor::clone() const {
  Tensor dst = empty(shape(), dtype(), device());
  kernels::copy(*this, dst);
  return dst;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<detail::TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::copy_(const Tensor& src) {
  MIXPREC_CHECK(src.shape() == shape(), "copy_: source shape ", shape_str(src.shape()),
                " does not match destination shape ", shape_str(shape()));
  Tensor dst = *this;
  kernels::copy(src, dst);
  bump_version();
}

uint64_t Tensor::version() const { return impl_->storage ? impl_->storage->version() : 0; }
void Tensor::bump_version() const {
  if (impl_->storage) impl_->storage->bump_version();
}

void Tensor::fill_(double value) {
  kernels::fill(*this, value);
  bump_version();
}

Tensor& Tensor::set_requires_grad(bool on) {
  MIXPREC_CHECK(!on || is_floating(dtype()), "only floating tensors can require grad, got ", dtype_name(dtype()));
  MIXPREC_CHECK(is_leaf(), "requires_grad can only be set on a leaf tensor");
  impl_->requires_grad = on;
  return *this;
}

void Tensor::backward(const Tensor& grad) const {
  Tensor g = grad;
  if (!g.defined()) {
    MIXPREC_CHECK(numel() == 1, "backward() without a gradient needs a one-element tensor, got shape ",
                  shape_str(shape()));
    g = Tensor::ones(shape(), dtype(), device());
  }
  autograd::backward({*this}, {g});
}

// ---------------------------------------------------------------- views (recorded in ops/shape.cpp)

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : ops::contiguous(*this); }
Tensor Tensor::reshape(const Shape& s) const { return ops::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const {
  MIXPREC_CHECK(is_contiguous(), "view", shape_str(s), " needs a contiguous tensor; use reshape");
  return ops::reshape(*this, s);
}
Tensor Tensor::flatten(int64_t start_dim) const { return ops::flatten(*this, start_dim); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return ops::transpose(*this, d0, d1); }
Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const { return ops::slice(*this, d, start, end); }
Tensor Tensor::to(DType t) const { return t == dtype() ? *this : ops::cast(*this, t); }
Tensor Tensor::to(const Device& d) const { return d == device() ? *this : ops::to_device(*this, d); }

}  // namespace mixprec
