#include "fuzz/fuzz_support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "m3sa/numeric.h"

namespace m3sa::fuzz {
namespace {
constexpr int kMaxPlanThreads = 1024; // make_plan's cap (docs/contract.md §9)
} // namespace

void fail(const std::string& what) {
  std::fprintf(stderr, "\n[m3sa fuzz] %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

int64_t Input::hostile_int() {
  switch (pick(8)) {
  case 0:
    return 0;
  case 1:
    return -1;
  case 2:
    return 1;
  case 3:
    return range(0, 1100);
  case 4:
    return std::numeric_limits<int32_t>::max();
  case 5:
    return std::numeric_limits<int32_t>::min();
  case 6:
    return range(-3, 3) + 128 * range(1, 8);
  default:
    return static_cast<int32_t>(raw64());
  }
}

ValueMode ValueMode::from(Input& in, bool allow_specials, int max_magnitude) {
  ValueMode m;
  m.magnitude = 1 + in.pick(max_magnitude);
  static constexpr float kScales[] = {1.f, 0.5f, 0.25f, 2.f};
  m.scale = kScales[in.pick(max_magnitude > 2 ? 4 : 3)];
  if (allow_specials && in.one_in(4)) m.special_one_in = 1 + in.pick(64);
  return m;
}

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float Rng::value(const ValueMode& mode) {
  const uint64_t r = next();
  if (mode.special_one_in > 0 && (r >> 32) % mode.special_one_in == 0) {
    switch ((r >> 8) % 5) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return -0.f;
    case 2:
      if (mode.allow_huge) return 0x1p100f * ((r & 1) ? 1.f : -1.f);
      return std::numeric_limits<float>::quiet_NaN();
    default:
      if (mode.allow_infinity)
        return std::numeric_limits<float>::infinity() * ((r & 1) ? 1.f : -1.f);
      return std::numeric_limits<float>::quiet_NaN();
    }
  }
  const int span = 2 * mode.magnitude + 1;
  return static_cast<float>(static_cast<int>(r % span) - mode.magnitude) * mode.scale;
}

// ---- views ---------------------------------------------------------------------------------

namespace {

int stored_rank(const TensorView& v) { return std::clamp(v.rank, 0, TensorView::kMaxRank); }

int64_t numel_of(const TensorView& v) {
  if (v.rank <= 0) return 0;
  int64_t n = 1;
  for (int d = 0; d < stored_rank(v); ++d) {
    if (v.shape[d] <= 0) return 0;
    if (__builtin_mul_overflow(n, v.shape[d], &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::shared_ptr<uint8_t> allocate_exactly(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, std::max<size_t>(bytes, 1)) != 0) fail("out of memory");
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

} // namespace

int64_t span_bytes(const TensorView& v) {
  if (numel_of(v) == 0) return 0;
  const int64_t elem = static_cast<int64_t>(dtype_size(v.dtype));
  int64_t last = 0;
  for (int d = 0; d < stored_rank(v); ++d) {
    int64_t step;
    if (v.strides[d] < 0) return 0; // rejected by every op; nothing to back
    if (__builtin_mul_overflow(v.shape[d] - 1, v.strides[d], &step) ||
        __builtin_add_overflow(last, step, &last))
      return std::numeric_limits<int64_t>::max();
  }
  int64_t bytes;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elem, &bytes))
    return std::numeric_limits<int64_t>::max();
  return bytes;
}

// ---- arena ---------------------------------------------------------------------------------

int Arena::new_block(int64_t bytes) {
  blocks_.push_back({static_cast<size_t>(bytes), nullptr});
  return static_cast<int>(blocks_.size()) - 1;
}

int Arena::add(Input& in, const char* name, DType dtype, std::initializer_list<int64_t> shape,
               bool rows_contiguous, bool allow_mutation) {
  Slot s;
  s.name = name;
  TensorView& v = s.view;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape);
  // Layout: contiguous, padded (each dim's stride a few elements past the dense one), outer dims
  // permuted, or both. All valid: strides are free except stride 1 in 128-wide rows.
  const int layout = in.pick(4);
  int order[TensorView::kMaxRank]; // innermost first
  for (int i = 0; i < v.rank; ++i) order[i] = v.rank - 1 - i;
  const int fixed = rows_contiguous ? 1 : 0;
  if (layout & 2)
    for (int i = v.rank - 1; i > fixed; --i) std::swap(order[i], order[fixed + in.pick(i - fixed + 1)]);
  int64_t stride = 1;
  for (int i = 0; i < v.rank; ++i) {
    const int d = order[i];
    v.strides[d] = stride;
    stride = stride * std::max<int64_t>(v.shape[d], 1) + ((layout & 1) ? in.pick(4) : 0);
  }

  enum Break { none, dtype_raw, rank, extent, stride_edit, device, null_data, overlap, misalign, absurd };
  const Break brk = allow_mutation && in.one_in(10) ? static_cast<Break>(1 + in.pick(9)) : none;
  int overlap_with = -1;
  int64_t overlap_delta = 0, misalignment = 0;
  const int rank_now = v.rank;
  switch (brk) {
  case none:
    break;
  case dtype_raw: {
    static constexpr uint8_t kDtypes[] = {0, 1, 2, 3, 4, 5, 77, 255};
    DType d = static_cast<DType>(kDtypes[in.pick(8)]);
    if (d == v.dtype) d = static_cast<DType>(5);
    v.dtype = d;
    mutated_.push_back("*"); // another tensor checked against this one's dtype may be named
    break;
  }
  case rank: {
    int r = in.pick(7);
    if (r == v.rank) r = v.rank + 1;
    v.rank = r;
    for (int d = rank_now; d < stored_rank(v); ++d) v.shape[d] = 1, v.strides[d] = 1;
    mutated_.push_back(name);
    break;
  }
  case extent: {
    if (v.rank == 0) break;
    const int d = in.pick(v.rank);
    static constexpr int64_t kDelta[] = {1, -1, 2, -3};
    v.shape[d] += kDelta[in.pick(4)];
    if (in.one_in(4)) v.shape[d] = -v.shape[d] - 1;
    mutated_.push_back("*"); // the op may name the tensor whose extent it compares with
    break;
  }
  case stride_edit: {
    if (v.rank == 0) break;
    const int d = in.pick(v.rank);
    const int how = in.pick(4);
    v.strides[d] = how == 0 ? 0 : how == 1 ? -1 - in.pick(4) : how == 2 ? v.strides[d] + 1 : v.strides[d] * 2;
    mutated_.push_back("*"); // zero / larger strides are valid for some tensors
    break;
  }
  case device:
    v.device = {DeviceKind::cuda, in.pick(2)};
    mutated_.push_back(name);
    break;
  case null_data:
    mutated_.push_back(name);
    break;
  case overlap:
    if (slots_.empty()) break;
    overlap_with = in.pick(static_cast<int>(slots_.size()));
    overlap_delta = in.range(0, std::max<int64_t>(0, slots_[overlap_with].bytes - 1));
    overlap_delta -= overlap_delta % static_cast<int64_t>(std::max<size_t>(dtype_size(v.dtype), 1));
    mutated_.push_back("*");
    break;
  case misalign:
    misalignment = 1 + in.pick(7);
    mutated_.push_back(name);
    break;
  case absurd:
    if (v.rank == 0) break;
    if (in.pick(2))
      v.shape[0] = (int64_t{1} << 49) + in.pick(3); // > 2^48 bytes in every dtype
    else
      v.strides[0] = (int64_t{1} << 50) + in.pick(3);
    mutated_.push_back(name);
    break;
  }
  int64_t bytes = span_bytes(v);
  const bool claims_absurd = bytes > (int64_t{1} << 48);
  if (!claims_absurd && bytes > kMaxBytes) fail(std::string("harness: ") + name + " too large");
  if (claims_absurd) {
    lied_ = true;
    bytes = 1; // a real but tiny allocation: a read past it is an ASan report
  }
  s.bytes = bytes;
  s.lie = claims_absurd;
  if (brk == null_data) {
    s.block = -1;
  } else if (overlap_with >= 0 && slots_[overlap_with].block >= 0) {
    const Slot& other = slots_[overlap_with];
    s.block = other.block;
    s.offset = other.offset + overlap_delta;
    blocks_[s.block].size = std::max<size_t>(blocks_[s.block].size, s.offset + bytes);
  } else {
    s.block = new_block(misalignment + bytes);
    s.offset = misalignment;
  }
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

int Arena::add_absent(const char* name) {
  Slot s;
  s.name = name;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

int Arena::add_bytes_over(const char* name, int64_t bytes, int over, int64_t delta) {
  Slot s;
  s.name = name;
  s.view = TensorView::contiguous(nullptr, DType::fp8_e4m3, {bytes});
  s.bytes = bytes;
  if (over >= 0 && slots_[over].block >= 0) {
    s.block = slots_[over].block;
    s.offset = slots_[over].offset + delta;
    blocks_[s.block].size = std::max<size_t>(blocks_[s.block].size, s.offset + bytes);
  } else {
    s.block = new_block(bytes);
  }
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

void Arena::allocate(uint8_t poison) {
  for (Block& b : blocks_) {
    b.data = allocate_exactly(b.size);
    std::memset(b.data.get(), poison, b.size);
  }
}

Arena Arena::clone() const {
  Arena copy = *this;
  for (Block& b : copy.blocks_) {
    auto fresh = allocate_exactly(b.size);
    std::memcpy(fresh.get(), b.data.get(), b.size);
    b.data = fresh;
  }
  return copy;
}

Arena::Snapshot Arena::snapshot() const {
  Snapshot s;
  for (const Block& b : blocks_) s.emplace_back(b.data.get(), b.data.get() + b.size);
  return s;
}

bool Arena::equals(const Snapshot& other) const {
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (blocks_[i].size > 0 &&
        std::memcmp(blocks_[i].data.get(), other[i].data(), blocks_[i].size) != 0)
      return false;
  return true;
}

TensorView Arena::view(int id) const {
  const Slot& s = slots_[id];
  TensorView v = s.view;
  v.data = s.block >= 0 ? blocks_[s.block].data.get() + s.offset : nullptr;
  return v;
}

bool Arena::has_memory(int id) const {
  const Slot& s = slots_[id];
  return s.block >= 0 && !s.lie && s.bytes > 0;
}

void Arena::fill(int id, Rng& rng, const ValueMode& mode) {
  if (!has_memory(id)) return;
  const TensorView v = view(id);
  for_each_element(v, [&](int64_t offset) {
    uint8_t* p =
        static_cast<uint8_t*>(v.data) + offset * static_cast<int64_t>(dtype_size(v.dtype));
    switch (v.dtype) {
    case DType::bf16: {
      const uint16_t bits = float_to_bf16_bits(rng.value(mode));
      std::memcpy(p, &bits, 2);
      break;
    }
    case DType::fp8_e4m3:
      *p = float_to_e4m3_bits(rng.value(mode));
      break;
    case DType::f32: {
      const float x = rng.value(mode);
      std::memcpy(p, &x, 4);
      break;
    }
    default: {
      const uint64_t bits = rng.next();
      std::memcpy(p, &bits, dtype_size(v.dtype));
    }
    }
  });
}

void Arena::set_int(int id, int64_t index, int64_t value) {
  if (!has_memory(id)) return;
  const TensorView v = view(id);
  int64_t i = 0;
  const size_t elem = dtype_size(v.dtype);
  for_each_element(v, [&](int64_t offset) {
    if (i++ != index) return;
    uint8_t* p = static_cast<uint8_t*>(v.data) + offset * static_cast<int64_t>(elem);
    if (elem == 8) std::memcpy(p, &value, 8);
    if (elem == 4) {
      const int32_t x = static_cast<int32_t>(value);
      std::memcpy(p, &x, 4);
    }
    if (elem == 2) {
      const int16_t x = static_cast<int16_t>(value);
      std::memcpy(p, &x, 2);
    }
    if (elem == 1) *p = static_cast<uint8_t>(value);
  });
}

void Arena::mark(int id, bool whole, Snapshot* mask) const {
  const Slot& s = slots_[id];
  if (s.block < 0 || s.lie || s.bytes == 0) return;
  std::vector<uint8_t>& m = (*mask)[s.block];
  if (whole) {
    std::fill(m.begin() + s.offset, m.begin() + s.offset + s.bytes, 1);
    return;
  }
  const int64_t elem = static_cast<int64_t>(dtype_size(s.view.dtype));
  for_each_element(s.view, [&](int64_t offset) {
    std::fill_n(m.begin() + s.offset + offset * elem, elem, 1);
  });
}

// ---- workspace and plans -------------------------------------------------------------------

WorkspaceBuffer::WorkspaceBuffer(Input& in, size_t bytes, Arena* arena) : bytes_(bytes) {
  switch (in.one_in(6) ? 1 + in.pick(5) : 0) {
  case 0: // exactly the plan's size
    own_bytes_ = bytes;
    break;
  case 1: // larger
    own_bytes_ = bytes + 1 + in.pick(256);
    bytes_ = own_bytes_;
    break;
  case 2: // too small
    if (bytes == 0) break;
    own_bytes_ = bytes - std::min<size_t>(bytes, 1 + in.pick(128));
    bytes_ = own_bytes_;
    broken_ = "workspace.bytes";
    break;
  case 3: // misaligned
    misalignment_ = 1 + in.pick(63);
    own_bytes_ = bytes + misalignment_;
    broken_ = "workspace.data"; // checked even when the plan needs no bytes
    break;
  case 4: // null
    null_ = true;
    broken_ = bytes > 0 ? "workspace.data" : "";
    break;
  case 5: // over a tensor of the call
    if (arena->count() == 0 || bytes == 0) break;
    const int over = in.pick(arena->count());
    arena_id_ = arena->add_bytes_over("workspace", static_cast<int64_t>(bytes), over, 64 * in.pick(4));
    broken_ = "*"; // "workspace.data" when the tensor is non-empty, else nothing
    break;
  }
  if (arena_id_ < 0 && !null_) {
    own_ = allocate_exactly(own_bytes_);
    std::memset(own_.get(), 0xc3, std::max<size_t>(own_bytes_, 1));
  }
}

Workspace WorkspaceBuffer::get(const Arena& arena) const {
  if (null_) return {nullptr, bytes_};
  if (arena_id_ >= 0) return {arena.view(arena_id_).data, bytes_};
  return {own_.get() + misalignment_, bytes_};
}

std::vector<uint8_t> WorkspaceBuffer::snapshot(const Arena&) const {
  if (!own_) return {};
  return std::vector<uint8_t>(own_.get(), own_.get() + own_bytes_);
}

PlanEdit PlanEdit::apply(Input& in, OpPlan* plan) {
  PlanEdit edit;
  if (!in.one_in(12)) return edit;
  switch (in.pick(9)) {
  case 0:
    plan->num_threads += 1 + in.pick(64);
    edit.edited = "num_threads";
    break;
  case 1:
    plan->workspace_bytes = plan->workspace_bytes > 0 ? plan->workspace_bytes / 2 : 64;
    edit.edited = "workspace_bytes";
    break;
  case 2:
    plan->request.config.top_k += 1 + in.pick(200);
    edit.edited = "config.top_k";
    break;
  case 3:
    plan->request.capacities.max_tokens += 1 + in.pick(1 << 20);
    edit.edited = "capacities.max_tokens";
    break;
  case 4:
    plan->request.capacities.max_blocks_per_request += 1 + in.pick(1 << 20);
    edit.edited = "capacities.max_blocks_per_request";
    break;
  case 5:
  {
    const int32_t original = plan->implementation;
    plan->implementation = static_cast<int32_t>(in.hostile_int());
    if (plan->implementation == original) plan->implementation = original + 100;
  }
    edit.edited = "implementation";
    break;
  case 6:
    plan->plan_info[in.pick(16)] ^= int64_t{1} << in.pick(64);
    edit.edited = "plan_info";
    break;
  case 7:
    plan->request.op = static_cast<OpKind>((static_cast<int>(plan->request.op) + 1 + in.pick(5)) % 6);
    edit.edited = "request.op";
    break;
  default:
    plan->request.config.num_index_heads += 1;
    edit.edited = "config.num_index_heads";
    break;
  }
  return edit;
}

// ---- oracles -------------------------------------------------------------------------------

std::string argument_of(const Status& status, OpKind op) {
  const std::string prefix = std::string("m3sa::") + to_string(op) + ": ";
  const std::string& m = status.message();
  if (m.rfind(prefix, 0) != 0) return "";
  const size_t expected = m.find(": expected ", prefix.size());
  if (expected == std::string::npos) return "";
  return m.substr(prefix.size(), expected - prefix.size());
}

void check_rejection(const Status& status, OpKind op, std::initializer_list<const char*> arguments,
                     const std::vector<std::string>& blamed) {
  const std::string& m = status.message();
  const std::string prefix = std::string("m3sa::") + to_string(op) + ": ";
  M3SA_FUZZ_CHECK(!status.ok(), "a rejection");
  M3SA_FUZZ_CHECK(m.rfind(prefix, 0) == 0, "the message starts with " + prefix + ": " + m);
  if (status.code() == StatusCode::unsupported) {
    M3SA_FUZZ_CHECK(m.find(": unsupported: ") != std::string::npos, m);
    return;
  }
  M3SA_FUZZ_CHECK(status.code() == StatusCode::invalid_argument,
                  "invalid_argument or unsupported: " + status.to_string());
  const std::string argument = argument_of(status, op);
  M3SA_FUZZ_CHECK(!argument.empty(), "'<argument>: expected ...': " + m);
  M3SA_FUZZ_CHECK(m.find(", got ", prefix.size() + argument.size()) != std::string::npos,
                  "', got <value>': " + m);
  bool known = false;
  for (const char* a : arguments) known = known || argument == a;
  M3SA_FUZZ_CHECK(known, "an argument of " + std::string(to_string(op)) + " is named: " + m);
  if (blamed.empty() || std::find(blamed.begin(), blamed.end(), "*") != blamed.end()) return;
  std::string list;
  for (const std::string& b : blamed) list += b + " ";
  M3SA_FUZZ_CHECK(std::find(blamed.begin(), blamed.end(), argument) != blamed.end(),
                  "the rejection names what the input broke (" + list + "): " + m);
}

namespace {

// Fails with `what` at the first byte that differs between `a` and `b` (blocks of one layout)
// outside the masked bytes; blocks that are equal as a whole are not masked at all.
void compare_blocks(const Arena& arena, const std::function<const uint8_t*(int)>& other,
                    const std::function<void(Arena::Snapshot*)>& mark, const std::string& what) {
  Arena::Snapshot mask;
  for (int k = 0; k < arena.blocks(); ++k) {
    const size_t n = arena.block_size(k);
    if (n == 0 || std::memcmp(arena.block(k), other(k), n) == 0) continue;
    if (mask.empty()) {
      for (int j = 0; j < arena.blocks(); ++j) mask.emplace_back(arena.block_size(j), 0);
      mark(&mask);
    }
    for (size_t i = 0; i < n; ++i)
      if (!mask[k][i] && arena.block(k)[i] != other(k)[i])
        fail(what + ": block " + std::to_string(k) + " byte " + std::to_string(i));
  }
}

} // namespace

void check_only_outputs_written(const Arena& arena, const Arena::Snapshot& before,
                                std::initializer_list<int> outputs, int workspace_id, OpKind op) {
  const std::vector<int> ids(outputs);
  compare_blocks(
      arena, [&](int k) { return before[k].data(); },
      [&](Arena::Snapshot* mask) {
        for (int id : ids) arena.mark(id, false, mask);
        if (workspace_id >= 0) arena.mark(workspace_id, true, mask);
      },
      std::string(to_string(op)) + " wrote outside its outputs");
}

bool check_outcome(const Status& status, OpKind op, std::initializer_list<const char*> arguments,
                   bool expect_ok, const std::vector<std::string>& blamed, const Arena& arena,
                   const Arena::Snapshot& before, const WorkspaceBuffer& workspace,
                   const std::vector<uint8_t>& workspace_before) {
  if (expect_ok)
    M3SA_FUZZ_CHECK(status.ok(), "a valid call is accepted: " + status.to_string());
  if (arena.lied())
    M3SA_FUZZ_CHECK(!status.ok(), "a view claiming more than 2^48 bytes is rejected");
  if (status.ok()) return true;
  check_rejection(status, op, arguments, blamed);
  M3SA_FUZZ_CHECK(arena.equals(before), "a rejected call wrote nothing: " + status.message());
  M3SA_FUZZ_CHECK(workspace.snapshot(arena) == workspace_before,
                  "a rejected call left its workspace alone: " + status.message());
  return false;
}

// ---- batches and requests ------------------------------------------------------------------

BatchCase BatchCase::draw(Input& in, int max_width, int max_pages) {
  BatchCase b;
  b.width = 1 + in.pick(max_width);
  b.num_pages = 1 + in.pick(max_pages);
  b.num_requests = in.pick(5);
  b.decode_q_len = 1 + in.pick(3);
  b.num_decode = in.pick(b.num_requests + 1);
  b.cu_q_lens = {0};
  const int capacity = b.width * 128;
  for (int r = 0; r < b.num_requests; ++r) {
    const int q_len = r < b.num_decode ? b.decode_q_len : in.pick(6);
    // Short contexts as often as any (cheaper runs, more executions), or anywhere up to capacity.
    int seq_len = q_len + static_cast<int>(in.pick(2) ? in.range(0, capacity - q_len) : in.pick(4));
    if (in.one_in(6)) seq_len = 0; // padding row
    b.seq_lens.push_back(seq_len);
    for (int i = 0; i < q_len; ++i) b.positions.push_back(seq_len == 0 ? -1 : seq_len - q_len + i);
    b.cu_q_lens.push_back(b.cu_q_lens.back() + q_len);
    for (int c = 0; c < b.width; ++c) b.block_table.push_back(in.pick(b.num_pages));
  }
  b.num_tokens = b.cu_q_lens.back();
  b.claimed_requests_ = b.num_requests;
  b.claimed_decode_ = b.num_decode;
  b.claimed_q_len_ = b.decode_q_len;
  b.claimed_tokens_ = b.num_tokens;
  return b;
}

void BatchCase::add_tensors(Input& in, Arena* arena) {
  cu_id = arena->add(in, "batch.cu_q_lens", DType::i32, {num_requests + 1}, false);
  seq_id = arena->add(in, "batch.seq_lens", DType::i32, {num_requests}, false);
  table_id = arena->add(in, "batch.block_table", DType::i32, {num_requests, width}, false);
}

void BatchCase::write(Input& in, Arena* arena) {
  for (size_t i = 0; i < cu_q_lens.size(); ++i) arena->set_int(cu_id, i, cu_q_lens[i]);
  for (size_t i = 0; i < seq_lens.size(); ++i) arena->set_int(seq_id, i, seq_lens[i]);
  for (size_t i = 0; i < block_table.size(); ++i) arena->set_int(table_id, i, block_table[i]);
  while (in.one_in(5)) {
    corrupted = true;
    const int64_t value = in.hostile_int();
    switch (in.pick(7)) {
    case 0:
      arena->set_int(cu_id, in.pick(num_requests + 1), value);
      break;
    case 1:
      arena->set_int(seq_id, in.pick(std::max(num_requests, 1)), value);
      break;
    case 2:
      arena->set_int(table_id, in.pick(std::max(num_requests * width, 1)), value);
      break;
    case 3:
      claimed_requests_ = static_cast<int>(value);
      break;
    case 4:
      claimed_decode_ = static_cast<int>(value);
      break;
    case 5:
      claimed_q_len_ = static_cast<int>(value);
      break;
    default:
      claimed_tokens_ = static_cast<int>(value);
      break;
    }
  }
}

BatchMetadata BatchCase::metadata(const Arena& arena) const {
  BatchMetadata m;
  m.cu_q_lens = arena.view(cu_id);
  m.seq_lens = arena.view(seq_id);
  m.block_table = arena.view(table_id);
  m.num_requests = claimed_requests_;
  m.num_decode_requests = claimed_decode_;
  m.decode_q_len = claimed_q_len_;
  m.num_tokens = claimed_tokens_;
  return m;
}

RequestCase RequestCase::draw(Input& in, OpKind op, int64_t requests, int64_t tokens,
                              int64_t width, int max_heads, DType cache_dtype) {
  RequestCase rc;
  PlanRequest& r = rc.request;
  r.op = op;
  r.backend = Backend::cpu;
  r.cache_dtype = cache_dtype;
  MsaConfig& c = r.config;
  c.top_k = 1 + (in.pick(2) ? in.pick(32) : in.pick(4));
  c.local_blocks = in.pick(std::min(c.top_k, 3) + 1);
  c.init_blocks = in.pick(std::min(c.top_k - c.local_blocks, 2) + 1);
  c.num_index_heads = 1 + in.pick(max_heads);
  static constexpr float kScales[] = {1.f, 2.f, 0.5f, 0.25f};
  c.score_scale = kScales[in.pick(4)];
  c.reduce_heads = in.one_in(3);
  // Capacities: what the batch needs plus a margin, sometimes one short.
  const auto capacity = [&](int64_t need) {
    switch (in.pick(4)) {
    case 0:
      return std::max<int64_t>(need, 1);
    case 1:
      return need + 1 + in.pick(8);
    case 2:
      return std::max<int64_t>(need, 1) + in.pick(1 << 12);
    default:
      if (need > 1) rc.broken = true;
      return std::max<int64_t>(need - 1, 1);
    }
  };
  r.capacities.max_requests = capacity(requests);
  r.capacities.max_tokens = capacity(tokens);
  r.capacities.max_blocks_per_request = capacity(width);
  r.num_threads = in.pick(3);
  if (in.one_in(16)) {
    rc.broken = true;
    const int64_t value = in.hostile_int();
    switch (in.pick(7)) {
    case 0:
      c.top_k = static_cast<int>(value);
      break;
    case 1:
      c.local_blocks = static_cast<int>(value);
      break;
    case 2:
      c.init_blocks = static_cast<int>(value);
      break;
    case 3:
      c.num_index_heads = static_cast<int>(value);
      break;
    case 4:
      c.score_scale = in.raw_float();
      break;
    case 5:
      r.cache_dtype = static_cast<DType>(in.pick(256));
      break;
    default: // out of range only: up to 1024 valid threads would spawn that many per input
      r.num_threads = in.pick(2) ? -1 - in.pick(4) : kMaxPlanThreads + 1 + in.pick(4);
      break;
    }
  }
  return rc;
}

ReferencePlan::ReferencePlan(PlanRequest request) {
  request.backend = Backend::reference;
  const Status s = make_plan(request, &plan);
  M3SA_FUZZ_CHECK(s.ok(), "the reference plans what the cpu planned: " + s.to_string());
  buffer = allocate_exactly(plan.workspace_bytes);
  workspace = {buffer.get(), plan.workspace_bytes};
}

ExecContext draw_context(Input& in, const WorkspaceBuffer& workspace, const PlanEdit& edit,
                         const RequestCase& request, std::vector<std::string>* blamed) {
  if (!workspace.broken().empty()) blamed->push_back(workspace.broken());
  if (!edit.edited.empty()) blamed->push_back("plan");
  if (request.broken) blamed->push_back("*");
  ExecContext ctx;
  ctx.num_threads = in.pick(3);
  if (in.one_in(24)) {
    ctx.num_threads = -1 - in.pick(100);
    blamed->push_back("ctx.num_threads");
  }
  return ctx;
}

KvScales draw_kv_scales(Input& in, std::vector<std::string>* blamed) {
  static constexpr float kScales[] = {1.f, 0.5f, 2.f};
  KvScales drawn{kScales[in.pick(3)], kScales[in.pick(3)], true}; // braces: k's pick first
  for (float* scale : {&drawn.k, &drawn.v})
    if (in.one_in(24)) {
      *scale = in.raw_float();
      blamed->push_back("*");
      drawn.bounded = false;
    }
  return drawn;
}

void check_same_bytes(const Arena& cpu, const Arena& reference, std::initializer_list<int> skip,
                      OpKind op) {
  const std::vector<int> ids(skip);
  compare_blocks(
      cpu, [&](int k) { return reference.block(k); },
      [&](Arena::Snapshot* mask) {
        for (int id : ids)
          if (id >= 0) cpu.mark(id, true, mask);
      },
      std::string(to_string(op)) + ": cpu and reference differ");
}

bool RequestCase::plan(Input& in, OpKind op, OpPlan* plan, PlanEdit* edit) const {
  const Status planned = make_plan(request, plan);
  if (!planned.ok()) {
    M3SA_FUZZ_CHECK(broken, "a valid request is planned: " + planned.to_string());
    check_plan_rejection(planned, op);
    return false;
  }
  *edit = PlanEdit::apply(in, plan);
  return true;
}

void check_plan_rejection(const Status& status, OpKind op) {
  check_rejection(status, op,
                  {"op", "backend", "config.top_k", "config.local_blocks", "config.init_blocks",
                   "config.local_blocks + config.init_blocks", "config.num_index_heads",
                   "config.score_scale", "capacities.max_requests", "capacities.max_tokens",
                   "capacities.max_blocks_per_request", "cache_dtype", "num_threads", "plan"});
}

} // namespace m3sa::fuzz
