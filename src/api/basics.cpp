// Names, sizes and messages of the public value types.
#include <algorithm>
#include <sstream>

#include "common/check.h"
#include "common/checked_math.h"
#include "m3sa/ops.h"
#include "m3sa/status.h"
#include "m3sa/tensor_view.h"
#include "m3sa/types.h"
#include "m3sa/version.h"
#include "m3sa_build_commit.h" // generated at build time

namespace m3sa {

const char* to_string(StatusCode code) {
  switch (code) {
  case StatusCode::ok:
    return "ok";
  case StatusCode::invalid_argument:
    return "invalid_argument";
  case StatusCode::unsupported:
    return "unsupported";
  case StatusCode::cuda_error:
    return "cuda_error";
  case StatusCode::internal:
    return "internal";
  }
  return "unknown";
}

Status Status::invalid_argument(const std::string& argument, const std::string& expectation,
                                const std::string& received) {
  return {StatusCode::invalid_argument,
          argument + ": expected " + expectation + ", got " + received};
}

Status Status::unsupported(const std::string& what, const std::string& reason) {
  return {StatusCode::unsupported, what + ": unsupported: " + reason};
}

std::string Status::to_string() const {
  return ok() ? "ok" : std::string(m3sa::to_string(code_)) + ": " + message_;
}

const char* to_string(DType dtype) {
  switch (dtype) {
  case DType::bf16:
    return "bf16";
  case DType::fp8_e4m3:
    return "fp8_e4m3";
  case DType::f32:
    return "f32";
  case DType::i32:
    return "i32";
  case DType::i64:
    return "i64";
  }
  return "unknown-dtype";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
  case DType::bf16:
    return 2;
  case DType::fp8_e4m3:
    return 1;
  case DType::f32:
    return 4;
  case DType::i32:
    return 4;
  case DType::i64:
    return 8;
  }
  return 0;
}

const char* to_string(DeviceKind kind) { return kind == DeviceKind::cpu ? "cpu" : "cuda"; }

const char* to_string(Backend backend) {
  switch (backend) {
  case Backend::reference:
    return "reference";
  case Backend::cpu:
    return "cpu";
  case Backend::cuda:
    return "cuda";
  }
  return "unknown-backend";
}

const char* to_string(OpKind op) {
  switch (op) {
  case OpKind::insert_index_k:
    return "insert_index_k";
  case OpKind::score_blocks:
    return "score_blocks";
  case OpKind::select_topk_blocks:
    return "select_topk_blocks";
  case OpKind::index_topk:
    return "index_topk";
  case OpKind::sparse_attention:
    return "sparse_attention";
  case OpKind::norm_rope_insert:
    return "norm_rope_insert";
  }
  return "unknown-op";
}

namespace {
// The dims a view stores: a rank above kMaxRank (an invalid view every op rejects) keeps only the
// first kMaxRank extents, so nothing here reads or writes past shape[] / strides[].
int stored_rank(const TensorView& t) { return std::clamp(t.rank, 0, TensorView::kMaxRank); }
} // namespace

TensorView TensorView::contiguous(const void* data, DType dtype,
                                  std::initializer_list<int64_t> shape, Device device) {
  TensorView t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  t.device = device;
  const int rank = stored_rank(t);
  std::copy_n(shape.begin(), rank, t.shape);
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride = detail::saturating_mul(stride, t.shape[i]);
  }
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < stored_rank(*this); ++d) n = detail::saturating_mul(n, shape[d]);
  return rank == 0 ? 0 : n;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int d = stored_rank(*this) - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != stride) return false;
    stride = detail::saturating_mul(stride, shape[d]);
  }
  return true;
}

std::string TensorView::describe() const {
  if (!present()) return "absent tensor";
  std::ostringstream out;
  if (rank != stored_rank(*this)) out << "rank " << rank << " (at most " << kMaxRank << ") ";
  out << to_string(dtype) << " [";
  for (int d = 0; d < stored_rank(*this); ++d) out << (d ? ", " : "") << shape[d];
  out << "] strides [";
  for (int d = 0; d < stored_rank(*this); ++d) out << (d ? ", " : "") << strides[d];
  out << "] on " << to_string(device.kind);
  if (device.kind == DeviceKind::cuda) out << ":" << device.ordinal;
  if (data == nullptr) out << " (null data)";
  return out.str();
}

const char* version_string() { return "0.1.0"; }
const char* build_commit() { return M3SA_BUILD_COMMIT; }

} // namespace m3sa
