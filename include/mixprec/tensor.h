// Tensor: a reference-counted view (shape, strides, offset, dtype) onto counted storage, with
// the autograd fields (requires_grad, grad, grad_fn). Copying a Tensor copies the handle.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/device.h"
#include "mixprec/dtype.h"

namespace mixprec {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[512, 784]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);

namespace autograd {
struct Node;
struct LeafHooks;  // mixprec/autograd.h
}  // namespace autograd

// Bytes owned through a device's allocator, tagged with the category they were allocated under.
class Storage {
 public:
  Storage(size_t bytes, MemCategory cat, Device device = Device::cpu());
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }
  MemCategory category() const { return cat_; }
  void set_category(MemCategory c);  // ownership moved (e.g. a temporary becomes a .grad)

  // The version of the bytes, shared by every view of them: a new storage and every in-place
  // write through the API take a fresh value from one process-wide counter, so equal versions
  // mean the same bytes in the same state (caches of derived data key on it; saved tensors
  // check it).
  uint64_t version() const { return version_; }
  void bump_version();

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  MemCategory cat_;
  uint64_t version_;
};

namespace detail {
// The state behind a Tensor handle (internal: code outside the library goes through Tensor).
// Views share `storage`; the autograd fields are written by the engine and by record().
struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;
  DType dtype = DType::f32;
  bool requires_grad = false;
  bool is_leaf = true;  // false once produced by a recorded op
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  std::weak_ptr<autograd::Node> grad_accumulator;
  std::shared_ptr<autograd::LeafHooks> hooks;  // a leaf's post-accumulate-grad hooks (autograd.h)
  // An f32 parameter's 16-bit copy kept by autocast's cast-ahead, and the parameter's version whose
  // values it holds (src/autocast/autocast_state.h).
  std::shared_ptr<TensorImpl> shadow;
  uint64_t shadow_version = 0;
};
}  // namespace detail

class Generator;  // mixprec/random.h

// The device the factories allocate on when none is given: the CPU, unless a DefaultDevice scope
// on this thread says otherwise (PyTorch's `with torch.device(...)`). Kernels run under one, so
// the tensors they make land on their inputs' device.
Device default_device();
class DefaultDevice {
 public:
  explicit DefaultDevice(Device d);
  ~DefaultDevice();
  DefaultDevice(const DefaultDevice&) = delete;
  DefaultDevice& operator=(const DefaultDevice&) = delete;

 private:
  Device prev_;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}  // internal

  // ---- factories (allocate under the current MemoryScope category, on `device`) ----
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = default_device());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = default_device());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = default_device());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = default_device());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = default_device());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::f32,
                            Device device = default_device());
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::f64,
                            Device device = default_device());
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            Device device = default_device());  // i64
  // Random (one use of gen each, see mixprec/random.h): N(0, std^2), and U[lo, hi). The numbers
  // are drawn on the host, then moved: the same values on every device.
  static Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, double std = 1.0,
                      Device device = default_device());
  static Tensor uniform(const Shape& shape, Generator& gen, double lo, double hi, DType dtype = DType::f32,
                        Device device = default_device());
  static Tensor arange(int64_t n, DType dtype = DType::f32, Device device = default_device());

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Shape& strides() const { return impl_->strides; }
  int64_t dim() const { return int64_t(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const;
  int64_t offset() const { return impl_->offset; }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  // The handle's state (internal, for the engine and caches keyed by tensor identity).
  detail::TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<detail::TensorImpl>& impl_ptr() const { return impl_; }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // Raw element pointer at this view's offset, on the tensor's device (kernels).
  void* data_ptr() const;
  // The same, for host code: throws mixprec::Error when the bytes are not host memory the caller
  // may touch (a GPU's; the fenced device's outside a kernel). Use .to(Device::cpu()) first.
  void* host_data_ptr() const;
  template <class T>
  T* data() const {
    return static_cast<T*>(host_data_ptr());
  }

  // ---- values (host-side conveniences, not differentiable; a device tensor is copied to the
  // host first, which waits for the device) ----
  double item() const;                   // one-element tensor -> double
  std::vector<float> to_vector() const;  // any dtype, any layout -> row-major floats
  std::vector<double> to_vector_f64() const;
  std::vector<int64_t> to_vector_i64() const;
  Tensor clone() const;       // contiguous copy, same dtype, not recorded
  Tensor contiguous() const;  // this if contiguous, else clone (differentiable)
  Tensor detach() const;      // same storage, no autograd history
  // The storage's version (see Storage::version); bump_version() after writing the bytes
  // directly (the optimizers, clipping): in-place writes through the methods below bump it.
  uint64_t version() const;
  void bump_version() const;
  void copy_(const Tensor& src);  // in-place copy with dtype conversion and broadcasting-free shape check
  void fill_(double value);
  void zero_() { fill_(0.0); }

  // ---- views and casts (differentiable) ----
  Tensor reshape(const Shape& shape) const;  // -1 allowed once; copies only if not viewable
  Tensor view(const Shape& shape) const;     // must be contiguous
  Tensor flatten(int64_t start_dim = 1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;  // [start, end) along dim
  Tensor to(DType dtype) const;                                 // differentiable cast; same dtype returns *this
  Tensor to(const Device& device) const;  // differentiable copy to another device; same device returns *this

  // ---- autograd ----
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool on = true);
  bool is_leaf() const { return impl_->is_leaf; }
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->grad_fn; }
  // Backpropagate from this tensor. grad defaults to ones for a one-element tensor.
  void backward(const Tensor& grad = Tensor()) const;

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

}  // namespace mixprec
