#pragma once
// What the libFuzzer harnesses share (tests/fuzz/README.md): the input as a stream of choices,
// an arena that lays out every tensor of a call (fresh, strided, overlapping, misaligned or
// lying about its size, as the input says), the workspace placements, and the oracles:
//   - a rejected call names an argument of its op (`m3sa::<op>: <argument>: expected .., got ..`)
//     and wrote nothing (the arena and the workspace are byte-for-byte what they were);
//   - an accepted call wrote only inside its outputs, and the same call on the reference
//     backend gives the same result (exactly, or within the contract's documented tolerance);
//   - a view claiming more than 2^48 bytes is never accepted.
// Every choice reads 0 from an exhausted input, and 0 always means "the valid default", so a
// short input is a valid call and the fuzzer mutates towards the hostile ones.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <initializer_list>
#include <string>
#include <vector>

#include "m3sa/m3sa.h"

namespace m3sa::fuzz {

// Prints `what` and aborts: libFuzzer saves the input as a crash.
[[noreturn]] void fail(const std::string& what);

#define M3SA_FUZZ_CHECK(condition, message)                                                       \
  do {                                                                                             \
    if (!(condition)) ::m3sa::fuzz::fail(std::string("check failed: " #condition ": ") + (message)); \
  } while (0)

class Input {
public:
  Input(const uint8_t* data, size_t size) : provider_(data, size) {}
  // One of n choices, 0 once the input is exhausted.
  int pick(int n) { return n <= 1 ? 0 : provider_.ConsumeIntegralInRange<int>(0, n - 1); }
  int64_t range(int64_t lo, int64_t hi) { return provider_.ConsumeIntegralInRange(lo, hi); }
  // True about once in n calls on random bytes, never on an exhausted input.
  bool one_in(int n) { return pick(n) == n - 1; }
  uint64_t seed() { return provider_.ConsumeIntegral<uint64_t>(); }
  int64_t raw64() { return provider_.ConsumeIntegral<int64_t>(); }
  float raw_float() { return provider_.ConsumeFloatingPoint<float>(); }
  // A 32-bit value a hostile caller would try: 0, -1, 1, a small one, a limit, or any.
  int64_t hostile_int();

private:
  FuzzedDataProvider provider_;
};

// Values written into float inputs: small integers (so sums are exact in fp32 and the CPU must
// equal the reference), optionally with NaN, +-inf, -0 and huge values mixed in.
struct ValueMode {
  int magnitude = 2;     // integers in [-magnitude, magnitude]
  float scale = 1.f;     // each value multiplied by this (a power of two: exact)
  int special_one_in = 0; // 0: none; else about one element in this many is special
  bool allow_infinity = true; // else NaN in its place
  bool allow_huge = true;     // +-2^100 (overflows fp32 products); else NaN in its place
  static ValueMode from(Input& in, bool allow_specials, int max_magnitude = 8);
  bool has_specials() const { return special_one_in > 0; }
};

// SplitMix64, seeded by the input: fills tensors far larger than the input itself.
class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  float value(const ValueMode& mode);

private:
  uint64_t state_;
};

// Every tensor of a call lives in an arena: each fresh tensor in an allocation of exactly its
// size (so AddressSanitizer sees a read one byte past it), a tensor the input overlaps with an
// earlier one inside that one's allocation. Snapshots of the arena say what a call wrote; a clone
// runs the same call on another backend.
class Arena {
public:
  using Snapshot = std::vector<std::vector<uint8_t>>;
  static constexpr int64_t kMaxBytes = int64_t{8} << 20; // per tensor

  // Adds a tensor of `dtype` and `shape` under `name`, laid out and perhaps broken as the input
  // says (strides, dtype, rank, extents, device, null data, overlap with an earlier tensor,
  // misalignment, an absurd size). Returns its id.
  int add(Input& in, const char* name, DType dtype, std::initializer_list<int64_t> shape,
          bool rows_contiguous, bool allow_mutation = true);
  // An absent optional tensor.
  int add_absent(const char* name);
  // A byte region of `bytes` inside tensor `over`'s allocation, `delta` bytes after its start.
  int add_bytes_over(const char* name, int64_t bytes, int over, int64_t delta);

  // Allocates every block and fills it with `poison` (after every add).
  void allocate(uint8_t poison);
  Arena clone() const; // the same layout over copies of the bytes
  Snapshot snapshot() const;
  bool equals(const Snapshot& other) const;
  int blocks() const { return static_cast<int>(blocks_.size()); }
  const uint8_t* block(int k) const { return blocks_[k].data.get(); }
  size_t block_size(int k) const { return blocks_[k].size; }

  TensorView view(int id) const;
  const char* name(int id) const { return slots_[id].name; }
  int count() const { return static_cast<int>(slots_.size()); }
  bool has_memory(int id) const; // non-null, non-empty, honest about its size

  // Names of tensors the input broke ("*" for a break whose blame may land on another
  // argument); `lied`: a view claims more than 2^48 bytes, so the call must fail.
  const std::vector<std::string>& mutated() const { return mutated_; }
  bool lied() const { return lied_; }

  // Fills every element of tensor `id` from `rng` (integer dtypes get raw bits).
  void fill(int id, Rng& rng, const ValueMode& mode);
  // Writes element `index` (row-major over the view's shape) as an integer of the view's size.
  void set_int(int id, int64_t index, int64_t value);

  // Marks the bytes of tensor `id`'s elements (`whole`: its whole region) in per-block masks.
  void mark(int id, bool whole, Snapshot* mask) const;

private:
  struct Slot {
    const char* name;
    TensorView view; // data unused: block and offset place it
    int block = -1;  // -1: null data
    int64_t offset = 0, bytes = 0;
    bool lie = false; // claims more than 2^48 bytes over a 1-byte allocation
  };
  struct Block {
    size_t size = 0;
    std::shared_ptr<uint8_t> data;
  };
  int new_block(int64_t bytes);
  std::vector<Slot> slots_;
  std::vector<Block> blocks_;
  std::vector<std::string> mutated_;
  bool lied_ = false;
};

// Bytes a view spans from its first element (0 for an empty view, INT64_MAX when absurd).
int64_t span_bytes(const TensorView& view);
// Visits the element offsets of a view in row-major index order (inline: the harnesses visit
// every element of the caches on each input).
template <typename Fn> void for_each_element(const TensorView& v, Fn&& fn) {
  const int rank = v.rank < 0 ? 0 : v.rank > TensorView::kMaxRank ? TensorView::kMaxRank : v.rank;
  if (v.rank <= 0) return;
  for (int d = 0; d < rank; ++d)
    if (v.shape[d] <= 0) return;
  int64_t index[TensorView::kMaxRank] = {};
  const int last = rank - 1;
  for (;;) {
    int64_t offset = 0;
    for (int d = 0; d < last; ++d) offset += index[d] * v.strides[d];
    for (int64_t i = 0; i < v.shape[last]; ++i) fn(offset + i * v.strides[last]);
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Where the workspace of a call goes: an allocation of its own of exactly the plan's size (the
// default), larger, too small, misaligned, null, or inside the arena over a tensor.
class WorkspaceBuffer {
public:
  // Draws the placement; an in-arena one is added to `arena` now (before it is allocated).
  WorkspaceBuffer(Input& in, size_t bytes, Arena* arena);
  Workspace get(const Arena& arena) const;
  std::vector<uint8_t> snapshot(const Arena& arena) const;
  int arena_id() const { return arena_id_; }
  // "" for a valid placement, else the argument a rejection must name ("*": any).
  const std::string& broken() const { return broken_; }

private:
  size_t bytes_ = 0;
  int64_t misalignment_ = 0;
  int arena_id_ = -1;
  bool null_ = false;
  std::string broken_;
  std::shared_ptr<uint8_t> own_;
  size_t own_bytes_ = 0;
};

// Perhaps edits one field of a sealed plan, as the input says; `edited` names the field ("" when
// none). Every run must then reject the plan as `plan`.
struct PlanEdit {
  std::string edited; // "" when none
  static PlanEdit apply(Input& in, OpPlan* plan);
};

// A rejection: invalid_argument naming one of `arguments` in the documented form, or
// unsupported, with the op's prefix. `blamed` (when not empty) lists the only arguments a
// rejection may name.
void check_rejection(const Status& status, OpKind op, std::initializer_list<const char*> arguments,
                     const std::vector<std::string>& blamed = {});
std::string argument_of(const Status& status, OpKind op);

// After an accepted call: every arena byte outside `outputs`' elements (and an in-arena
// workspace) is as in `before`.
void check_only_outputs_written(const Arena& arena, const Arena::Snapshot& before,
                                std::initializer_list<int> outputs, int workspace_id, OpKind op);

// The common ending of every harness: `expect_ok` (nothing was broken) demands OK, a lie demands
// a rejection; a rejection must name an argument (one of `blamed` when given) and leave the arena
// and workspace untouched. Returns whether the call was accepted.
bool check_outcome(const Status& status, OpKind op, std::initializer_list<const char*> arguments,
                   bool expect_ok, const std::vector<std::string>& blamed, const Arena& arena,
                   const Arena::Snapshot& before, const WorkspaceBuffer& workspace,
                   const std::vector<uint8_t>& workspace_before);

// Batch metadata (contract §2), valid unless the input corrupts it: up to 4 requests, decode
// first (q_len 1..3), prefill q_len 0..5, seq_lens up to the block table's capacity, padding rows.
struct BatchCase {
  int num_requests = 0, num_decode = 0, decode_q_len = 1, num_tokens = 0;
  int width = 1, num_pages = 1;
  std::vector<int32_t> cu_q_lens, seq_lens, block_table; // as generated, valid
  std::vector<int64_t> positions;                        // per token, -1 for padding rows
  int cu_id = -1, seq_id = -1, table_id = -1;
  bool corrupted = false; // a metadata value or scalar was overwritten after generation

  static BatchCase draw(Input& in, int max_width, int max_pages);
  void add_tensors(Input& in, Arena* arena); // before the arena is allocated
  void write(Input& in, Arena* arena);       // after: values, then the input's corruptions
  BatchMetadata metadata(const Arena& arena) const;

private:
  int claimed_requests_ = 0, claimed_decode_ = 0, claimed_q_len_ = 1, claimed_tokens_ = 0;
};

// A cpu plan request for `op`: config (valid unless `broken`), capacities around what the batch
// needs (sometimes too small: `broken` then too), 0..2 threads.
struct RequestCase {
  PlanRequest request;
  bool broken = false;
  static RequestCase draw(Input& in, OpKind op, int64_t requests, int64_t tokens, int64_t width,
                          int max_heads, DType cache_dtype);
  // Plans the request into `plan`, then perhaps edits it (`edit`). False when make_plan refused
  // it, after checking that only a broken request is refused and that the refusal names a field.
  bool plan(Input& in, OpKind op, OpPlan* plan, PlanEdit* edit) const;
};

// The same plan request on the reference backend, planned, with a workspace of its own.
struct ReferencePlan {
  OpPlan plan;
  std::shared_ptr<uint8_t> buffer;
  Workspace workspace;
  explicit ReferencePlan(PlanRequest request);
};

// Blames what the harness broke before the call (a misplaced workspace, an edited plan, a broken
// request), then draws the run's threads: 0..2, rarely a negative count (then `blamed` gets
// ctx.num_threads).
ExecContext draw_context(Input& in, const WorkspaceBuffer& workspace, const PlanEdit& edit,
                         const RequestCase& request, std::vector<std::string>* blamed);

// k_scale and v_scale of a call: 1, 0.5 or 2 each, rarely a raw float (then `blamed` gets "*").
struct KvScales {
  float k = 1.f, v = 1.f;
  bool bounded = true; // no raw float among them
};
KvScales draw_kv_scales(Input& in, std::vector<std::string>* blamed);

// The cpu and reference arenas after the same accepted call are byte-identical outside `skip`
// (whole regions: the workspace, outputs compared with a tolerance).
void check_same_bytes(const Arena& cpu, const Arena& reference, std::initializer_list<int> skip,
                      OpKind op);

// A make_plan rejection names a field of the request.
void check_plan_rejection(const Status& status, OpKind op);

} // namespace m3sa::fuzz
