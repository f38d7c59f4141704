// nn::Embedding: a [num_embeddings, embedding_dim] table looked up by i64 indices (ops::embedding).
#include <sstream>

#include "mixprec/error.h"
#include "mixprec/nn.h"

namespace mixprec::nn {

Embedding::Embedding(int64_t num, int64_t dim) : num_embeddings(num), embedding_dim(dim) {
  MIXPREC_CHECK(num > 0 && dim > 0, "Embedding(", num, ", ", dim, "): sizes must be positive");
  const MemoryScope scope(MemCategory::parameters);
  weight = register_parameter("weight", Tensor::randn({num, dim}, default_generator()));  // PyTorch: normal_(0, 1)
}

void Embedding::bind_parameter(const std::string& name, const Tensor& t) {
  if (name == "weight") weight = t;
}

std::string Embedding::name() const {
  std::ostringstream os;
  os << "Embedding(" << num_embeddings << ", " << embedding_dim << ")";
  return os.str();
}

}  // namespace mixprec::nn
