// The decode rows of index_topk against the host backends, each implementation forced by name so
// that both run on a Hopper GPU: cuda.index_topk.sm80 (the portable split-K kernel) and
// cuda.index_topk.sm90 (the TMA page-ring kernel for requests of at most 8 rows whose cache view
// TMA can address; the portable kernel otherwise). The cases cross the Hopper kernel's regimes:
// 1..8 rows a request (12 and 16 take the portable kernel on both), page-boundary lengths, 1 to
// 13 and more causal blocks a split (the splits follow the SM count and the plan's max_requests,
// so lengths are given in blocks a split), padding requests, bf16 and e4m3. Integer data: every
// sum is exact, so selections match bit for bit; random data: near-ties only (compare.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cuda/indexer.h"
#include "cuda/kernels/indexer_traits.h"
#include "gpu/cuda_test_util.h"
#include "gpu/device_batch.h"
#include "registry/registry.h"
#include "support/e4m3_data.h"
#include "support/test_util.h"

namespace m3sa::testing {
namespace {

constexpr const char* kArchs[] = {"sm80", "sm90"};

MsaConfig cfg(int heads, int k, int local, int init) {
  MsaConfig c;
  c.num_index_heads = heads, c.top_k = k, c.local_blocks = local, c.init_blocks = init;
  return c;
}

int sm_count() {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return 1;
  return std::max(sms, 1);
}

// Splits a request of the Hopper decode kernel: its CTAs an SM over a call's decode requests, at
// most the portable kernel's splits. Taken from the kernel's constants so that the cases keep
// meeting the regimes they name when the kernel's residency changes.
int64_t sm90_splits(int64_t decode_requests) {
  const int64_t requests = std::max<int64_t>(decode_requests, 1);
  const int64_t portable =
      std::max<int64_t>(1, cuda::kScoringCtasPerSm * int64_t{sm_count()} / requests);
  return std::clamp<int64_t>(cuda::kDecodeSm90CtasPerSm * int64_t{sm_count()} / requests, 1,
                             portable);
}

// A decode request's seq_len: `tokens`, or where per_split > 0, per_split causal blocks for each
// split the Hopper kernel gives the request on this GPU, plus `delta` tokens (so that any SM count
// and any residency of the kernel meet the same blocks-a-split regimes).
struct Len {
  Len(int32_t t) : tokens(t) {} // implicit: most lists are plain lengths
  int32_t tokens = 0;
  int per_split = 0;
  int delta = 0;
};

Len split_len(int blocks, int delta) {
  Len l(0);
  l.per_split = blocks, l.delta = delta;
  return l;
}

int32_t resolve(const Len& l, int64_t splits) {
  if (l.per_split == 0) return l.tokens;
  return static_cast<int32_t>(int64_t{kBlockTokens} * l.per_split * splits + l.delta);
}

// Blocks a split 1, 3, 4, 5, 6, 7, 12, 13: odd ones fill every split exactly, even ones spill
// one block, so that the last splits get a partial range or none.
std::vector<Len> split_regimes() {
  std::vector<Len> lens;
  for (int k : {1, 3, 4, 5, 6, 7, 12, 13}) lens.push_back(split_len(k, k % 2 ? -1 : 1));
  return lens;
}

// `count` lengths: `lens` first, then every ninth a padding request and the others uniform in
// [1, max_len].
std::vector<Len> varied(int count, int max_len, uint64_t seed, std::vector<Len> lens = {}) {
  Rng rng(seed);
  while (static_cast<int>(lens.size()) < count)
    lens.push_back(lens.size() % 9 == 4 ? 0 : rng.uniform_int(1, max_len));
  return lens;
}

struct DecodeCase {
  const char* name;
  std::vector<Len> seq_lens; // decode requests of q_len tokens each; 0 = padding
  int q_len;
  MsaConfig config;
  DType dtype;
  bool integers;      // integer data: exact sums, selections must match bit for bit
  bool use_reference; // small enough for the reference; else the CPU backend is the oracle
  // > 0: the batch padded with empty decode requests (and the plan sized for them) so that a call
  // gets this many Hopper ranges a request.
  int plan_splits;
  std::vector<std::pair<int32_t, int32_t>> prefill; // (q_len, seq_len) after the decode requests
  // > batch: the plan's max_requests (an engine's plan for its largest batch).
  int plan_capacity = 0;
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

DecodeCase decode_case(const char* name, std::vector<Len> lens, int q_len, MsaConfig config,
                       DType dtype, bool integers = true, bool use_reference = false,
                       int plan_splits = 0) {
  return {name, std::move(lens), q_len, config, dtype, integers, use_reference, plan_splits, {}};
}

DecodeCase with_prefill(DecodeCase c, std::vector<std::pair<int32_t, int32_t>> prefill) {
  c.prefill = std::move(prefill);
  return c;
}

DecodeCase planned_for(DecodeCase c, int max_requests) {
  c.plan_capacity = max_requests;
  return c;
}

// The decode requests of case c's batch: its own, then (plan_splits > 0) padding requests up to
// the count whose calls get plan_splits Hopper ranges a request - the decode grid follows the
// call's decode requests (launch_decode_topk), so a regime of few ranges needs many requests.
int64_t decode_requests_of(const DecodeCase& c) {
  const int64_t own = static_cast<int64_t>(c.seq_lens.size());
  if (c.plan_splits == 0) return own;
  return std::max(own, cuda::kDecodeSm90CtasPerSm * int64_t{sm_count()} / c.plan_splits);
}

int64_t plan_requests_of(const DecodeCase& c) {
  return std::max<int64_t>(decode_requests_of(c) + static_cast<int64_t>(c.prefill.size()),
                           c.plan_capacity);
}

BatchSpec spec_of(const DecodeCase& c, int64_t splits, uint64_t seed) {
  BatchSpec s;
  for (const Len& l : c.seq_lens) {
    s.q_lens.push_back(c.q_len);
    s.seq_lens.push_back(resolve(l, splits));
  }
  while (static_cast<int64_t>(s.q_lens.size()) < decode_requests_of(c)) {
    s.q_lens.push_back(c.q_len);
    s.seq_lens.push_back(0);
  }
  for (const auto& request : c.prefill) {
    s.q_lens.push_back(request.first);
    s.seq_lens.push_back(request.second);
  }
  s.num_decode = static_cast<int>(decode_requests_of(c));
  s.decode_q_len = c.q_len;
  s.index_heads = c.config.num_index_heads;
  s.index_dtype = c.dtype;
  s.seed = seed;
  return s;
}

std::vector<DecodeCase> decode_cases() {
  const DType bf = DType::bf16, f8 = DType::fp8_e4m3;
  const std::vector<Len> boundaries = {1, 127, 128, 129, 255, 256, 257, 0, 2049, 5000};
  // An MTP request needs q_len <= seq_len: 1 becomes 4.
  const std::vector<Len> mtp_boundaries = {4, 127, 128, 129, 255, 256, 257, 0, 2049, 5000};
  return {
      // Page-boundary lengths (last pages of 1, 127 and 128 tokens, 1 to 3 pages: the masking of
      // the last page), rows with n <= top_k and ranked ones, a padding request.
      decode_case("SmallBoundaryLengthsH4", boundaries, 1, cfg(4, 16, 1, 0), bf, true, true),
      decode_case("SmallBoundaryLengthsH4Fp8", boundaries, 1, cfg(4, 16, 1, 0), f8, true, true),
      decode_case("SmallBoundaryLengthsH1K8NoForcedBlocks", boundaries, 1, cfg(1, 8, 0, 0), bf,
                  true, true),
      decode_case("SmallBoundaryLengthsH2Mtp4K32Local2Init2Fp8", mtp_boundaries, 4,
                  cfg(2, 32, 2, 2), f8, true, true),
      // The Hopper kernel's cluster instantiation (e4m3, <= 16 ranked slots: each tile's ranges one
      // cluster, the lists pushed into rank 0's shared memory): batch 1 at 40 blocks (ranges of 3
      // in a cluster of 16, the last ones empty), and three requests of up to 21 blocks (clusters
      // of 11, two padding tiles).
      decode_case("SmallB1ClusterOf16H4Fp8", {5000}, 1, cfg(4, 16, 1, 0), f8, true, true),
      decode_case("SmallB3ClustersOf11Init2Fp8", {2600, 129, 0}, 1, cfg(1, 16, 1, 2), f8, true,
                  true),
      // Batch 1 H=1 at 128 blocks: 64 ranges of two one-block warp lists, 128 keys that are all
      // list heads (the group merge's one-key-list regime, S=16K-32K below), under the sanitizers.
      decode_case("SmallB1H1Seq16384OneKeyLists", {16384}, 1, cfg(1, 16, 1, 0), bf, true, true),
      // Batch 1: the most splits a request, each 1 to 13 blocks (a full last split, or one
      // block more than the splits hold: ragged ranges and empty last splits). The Hopper
      // kernel's ranges hold at least 2 blocks (kDecodeSm90MinBlocksPerRange): 1 a split fills
      // half of them, 2 a split all, and one block more makes ranges of 3, the last ones empty.
      decode_case("H1OnePerSplit", {split_len(1, 0)}, 1, cfg(1, 16, 1, 0), bf),
      decode_case("H1OnePerSplitPlusOneBlockFp8", {split_len(1, 1)}, 1, cfg(1, 16, 0, 0), f8),
      decode_case("H1TwoPerSplit", {split_len(2, 0)}, 1, cfg(1, 16, 1, 0), bf),
      decode_case("H4TwoPerSplitPlusOneBlockFp8", {split_len(2, 1)}, 1, cfg(4, 16, 1, 0), f8),
      decode_case("H2ThreePerSplit", {split_len(3, -1)}, 1, cfg(2, 16, 1, 1), bf),
      decode_case("H8ThreePerSplitPlusOneBlockK32Local2Init2Fp8", {split_len(3, 5)}, 1,
                  cfg(8, 32, 2, 2), f8),
      decode_case("H1Mtp2FourPerSplitInit1", {split_len(4, 0)}, 2, cfg(1, 16, 1, 1), bf),
      decode_case("H1Mtp4FivePerSplitNoForcedFp8", {split_len(5, -3)}, 4, cfg(1, 16, 0, 0), f8),
      decode_case("H1Mtp8SixPerSplitK32Init2", {split_len(6, -2)}, 8, cfg(1, 32, 1, 2), bf),
      decode_case("H2Mtp4SevenPerSplitLocal2Fp8", {split_len(7, -1)}, 4, cfg(2, 16, 2, 1), f8),
      // 4 heads x 2 tokens: 8 rows, still the Hopper kernel.
      decode_case("H4Mtp2TwelvePerSplitK32", {split_len(12, -64)}, 2, cfg(4, 32, 1, 0), bf),
      decode_case("H4ThirteenPerSplitFp8", {split_len(13, -3)}, 1, cfg(4, 16, 1, 0), f8),
      decode_case("H2TwelvePerSplitPlusOneBlock", {split_len(12, 1)}, 1, cfg(2, 16, 1, 0), bf),
      decode_case("H4Seq131072", {131072}, 1, cfg(4, 16, 1, 0), bf),
      // Batch 1 at long contexts (S ~ 128K: 528 warp lists of 2 a row): H=1 merged by the four
      // worker warps (merge_row_in_group), H=4 by a warp a row (merge_row), q_len 2 by two warps.
      decode_case("H1Seq131072", {131072}, 1, cfg(1, 16, 1, 0), bf),
      decode_case("H1Seq130772RandomDataFp8", {131072 - 300}, 1, cfg(1, 16, 1, 0), f8, false),
      decode_case("H4Seq130072RandomData", {131072 - 1000}, 1, cfg(4, 16, 1, 0), bf, false),
      decode_case("H1Mtp2Seq60000RandomDataK32", {60000}, 2, cfg(1, 32, 1, 0), bf, false),
      // Batch 1 at S=16K-32K: ranges of two blocks publish one-block warp lists, so every key is
      // a list head, at most two a merge thread (bench/patches/s63-decode-rank-all-heads.patch
      // ranks them all at once there): 256 keys over four warps (S=32K, the bound), 250 with 6
      // padding keys and K32 / init 2, and two rows (q_len 2) of 128 keys over two warps each.
      decode_case("H1Seq32768OneKeyListsRandomData", {32768}, 1, cfg(1, 16, 1, 0), bf, false),
      decode_case("H1Seq32000OneKeyListsK32Init2Fp8", {32000}, 1, cfg(1, 32, 1, 2), f8),
      decode_case("H1Mtp2Seq16384OneKeyListsLocal2RandomData", {16384}, 2, cfg(1, 16, 2, 0), bf,
                  false),
      // 12 and 16 rows a request: the portable kernel under both names.
      decode_case("H4Mtp3Rows12Portable", {40000, 0, 3000, 131072}, 3, cfg(4, 16, 1, 1), bf),
      decode_case("H2Mtp8Rows16PortableK32Fp8", {9000, 8, 0, 131072}, 8, cfg(2, 32, 2, 2), f8),
      // A plan for more requests than the batch: two splits and one, each of hundreds of blocks.
      decode_case("B3PlannedForTwoSplits", {131072, 0, 129}, 1, cfg(8, 16, 1, 0), bf, true, false,
                  2),
      decode_case("B3Mtp4PlannedForOneSplit", {40000, 129, 0}, 4, cfg(2, 16, 1, 0), bf, true, false,
                  1),
      // Two ranges whose four warp lists hold 4 x 16 = 64 keys a row (fill 32: more than the row
      // ranks, as many as the bitonic network holds), then 4 x 17 = 68 (more than it holds): the
      // two sides of the bound under which a range may rank its lists into one before publishing
      // (bench/patches/s23-decode-ranked-ranges.patch).
      decode_case("B3TwoRangesOf64BlocksK32", {128 * kBlockTokens, 0, 129}, 1, cfg(2, 32, 0, 0), bf,
                  true, false, 2),
      decode_case("B3TwoRangesOf68BlocksK32Fp8", {136 * kBlockTokens, 129, 0}, 1, cfg(2, 32, 0, 0),
                  f8, true, false, 2),
      // Many requests: few splits a request, the regimes among random lengths.
      decode_case("B64H4VariedLengths", varied(64, 20000, 11, split_regimes()), 1, cfg(4, 16, 1, 0),
                  bf),
      decode_case("B128H8VariedLengthsFp8", varied(128, 4000, 12, split_regimes()), 1,
                  cfg(8, 16, 1, 0), f8),
      decode_case("B256H1VariedLengthsK32Init2", varied(256, 9000, 13), 1, cfg(1, 32, 1, 2), bf),
      // Random data: near-ties only.
      decode_case("H4FivePerSplitPlusOneBlockRandomData", {split_len(5, 1)}, 1, cfg(4, 16, 1, 0),
                  bf, false),
      decode_case("B3H2Mtp4Fp8RandomData", {40000, 0, 131072}, 4, cfg(2, 16, 1, 0), f8, false),
      decode_case("B256H4Fp8RandomData", varied(256, 9000, 14), 1, cfg(4, 16, 1, 0), f8, false),
      // Decode rows in front of prefill requests (the prefill rows take the block scorer).
      with_prefill(
          decode_case("DecodeRowsBeforePrefillH4Fp8", {9000, 0, 257}, 1, cfg(4, 16, 1, 0), f8),
          {{700, 5000}, {33, 33}}),
      decode_case("MillionTokensH1", {1 << 20}, 1, cfg(1, 16, 1, 0), bf),
      // Ranges of at least 4 x fill blocks, where every warp's list of the Hopper kernel is
      // published whole, next to shorter requests: 16 ranges a tile, fill 15 at 15-51 blocks a
      // warp; then one range a tile, fill 30 at 31-256 blocks a warp. The regime in which
      // bench/patches/s25-decode-block-claims.patch let warps claim blocks from a tile counter.
      decode_case("B8LongRangesFp8RandomData",
                  {split_len(64, -5), split_len(61, 3), 0, split_len(60, 0), split_len(59, 0),
                   split_len(64, 0), 2049, split_len(200, 77)},
                  1, cfg(4, 16, 1, 0), f8, false),
      decode_case("B4OneRangeEachK32Local2", {split_len(256, -1), 0, 131072, split_len(124, 0)}, 1,
                  cfg(1, 32, 2, 0), bf, true, false, 1),
      // One range a tile with 72-120 keys in its 8 warp lists (batch 128 at S >= 16K: 8 lists of
      // fill = 15): the one-range finish merging more than 64 keys from fewer lists than lanes.
      decode_case("B4OneRangeOfEightListsUpTo16Fp8",
                  {split_len(128, 0), split_len(128, -77), split_len(120, 9), split_len(72, 0)}, 1,
                  cfg(2, 16, 1, 0), f8, true, false, 1),
      // One range a tile and one row (batch 128 H=1 at S <= 8K): warp lists of at most 64 keys,
      // which every worker warp ranks together (rank_only_row_of_64) - 64 blocks (8 lists of 8),
      // 57 (ragged), 21 (7 lists of 3 and the empty one), 17 (the least a ranked row has) - and 65
      // blocks on the other side (72 keys: the one warp's floor and survivors).
      decode_case("B6OneRangeLoneRowUpTo64Keys",
                  {64 * kBlockTokens, 57 * kBlockTokens - 5, 20 * kBlockTokens + 1,
                   17 * kBlockTokens, 0, 65 * kBlockTokens - 77},
                  1, cfg(1, 16, 1, 0), bf, true, false, 1),
      decode_case("B6OneRangeLoneRowUpTo64KeysFp8",
                  {64 * kBlockTokens, 57 * kBlockTokens - 5, 20 * kBlockTokens + 1,
                   17 * kBlockTokens, 0, 65 * kBlockTokens - 77},
                  1, cfg(1, 16, 1, 0), f8, true, false, 1),
      // Either side of the plan's choice of the Hopper kernel's CTA (decode_sm90_warps): the most
      // splits of the 8-warp CTA, then one more (4 warps). Ranges of 3 blocks (warps without
      // blocks), and of 5 and 21 (8 warps) or 9 (4 warps): an odd count of lists x keys, so that
      // the publish adds its empty list.
      decode_case("B3WidestEightWarpPlanFp8", {split_len(5, -1), split_len(20, 1), split_len(3, 0)},
                  1, cfg(1, 16, 1, 0), f8, true, false, cuda::kDecodeSm90WideMaxSplits),
      decode_case("B3NarrowestFourWarpPlanK32", {split_len(3, 0), split_len(9, -1), 0}, 1,
                  cfg(1, 32, 1, 1), bf, true, false, cuda::kDecodeSm90WideMaxSplits + 1),
      // Short contexts of e4m3 caches, where the Hopper plan makes each tile's ranges one cluster
      // (decode_sm90_cluster_splits; the cluster instantiation): batch 1 at S=8K (16 ranges of 4
      // blocks) and at 40 blocks (ranges of 3), 20 blocks (a cluster of 10), 3 blocks (of 2,
      // 8-warp CTAs); 8 rows a request; four requests of up to 63 blocks (clusters of 16); batch 32
      // (clusters of 4 ranges of 8-warp CTAs). Where the device cannot hold a cluster a tile, the
      // plan keeps the workspace finish; bf16 caches and 32 ranked slots always do (the K32 and
      // bf16 twins).
      decode_case("B1S8KClusterOf16Fp8", {8192}, 1, cfg(1, 16, 1, 0), f8),
      decode_case("B1S8KWorkspaceFinishBf16", {8192}, 1, cfg(1, 16, 1, 0), bf),
      decode_case("B1H4RaggedClusterInit2Fp8", {40 * kBlockTokens - 5}, 1, cfg(4, 16, 1, 2), f8),
      decode_case("B1H4RaggedWorkspaceFinishK32Init2Fp8", {40 * kBlockTokens - 5}, 1,
                  cfg(4, 32, 1, 2), f8),
      decode_case("B1H2ClusterOf10Fp8", {20 * kBlockTokens}, 1, cfg(2, 16, 1, 0), f8),
      decode_case("B1ThreeBlocksClusterOf2Fp8", {2 * kBlockTokens + 1}, 1, cfg(1, 16, 1, 0), f8),
      decode_case("B1H4Mtp2ClusterRows8Fp8", {64 * kBlockTokens - 77}, 2, cfg(4, 16, 1, 0), f8),
      decode_case("B1H2Mtp4ClusterFp8RandomData", {6000}, 4, cfg(2, 16, 1, 0), f8, false),
      decode_case("B4ClustersOf16Fp8", {8000, 0, 3000, 129}, 1, cfg(1, 16, 1, 0), f8),
      decode_case("B32ClustersOf4H4Fp8", varied(32, 20000, 15), 1, cfg(4, 16, 1, 0), f8),
      decode_case("B32ClustersOf4Init1Fp8RandomData", varied(32, 9000, 16), 1, cfg(1, 16, 1, 1), f8,
                  false),
      // Plans for 256 requests (an engine's, sized once for its largest batch) running small
      // batches: the call's grid follows its own decode requests (one CTA an SM's worth of ranges
      // for batch 1, not the plan's one a request), its lists within the plan's workspace.
      planned_for(decode_case("B1H4PlannedFor256", {131072 - 77}, 1, cfg(4, 16, 1, 0), bf), 256),
      planned_for(decode_case("B1H1PlannedFor256K32Init1Fp8", {40000}, 1, cfg(1, 32, 1, 1), f8),
                  256),
      planned_for(decode_case("B3H2Mtp2PlannedFor256Fp8RandomData", {9000, 0, 70000}, 2,
                              cfg(2, 16, 1, 0), f8, false),
                  256),
      planned_for(with_prefill(decode_case("B2H4PlannedFor256BeforePrefill", {20000, 5000}, 1,
                                           cfg(4, 16, 1, 0), bf),
                               {{300, 4000}}),
                  256),
  };
}

// An index_topk plan of the implementation cuda.index_topk.<arch> for `plan_requests` requests (0:
// the batch's), or nothing when it cannot run here (printed; on a Hopper GPU both must run).
bool plan_named(const char* arch, const MsaConfig& config, const SyntheticBatch& sb,
                int64_t plan_requests, CudaRun* run) {
  const std::string name = std::string("cuda.index_topk.") + arch;
  PlanRequest request = plan_request(OpKind::index_topk, config, sb, {Backend::cuda});
  request.implementation = name.c_str();
  if (plan_requests > 0) {
    request.capacities.max_requests = plan_requests;
    request.capacities.max_tokens =
        std::max<int64_t>(request.capacities.max_tokens, plan_requests * sb.spec().decode_q_len);
  }
  return plan_named_implementation(request, run);
}

// One index_topk over `cache` into a poisoned output; the status is expected OK.
HostTensor run_topk(const CudaRun& run, const MsaConfig& config, const DeviceBatch& db,
                    const TensorView& cache) {
  DeviceBuffer topk(DType::i32, {config.num_index_heads, db.num_tokens, config.top_k}, 0x5a);
  M3SA_EXPECT_OK(index_topk(run.plan, {db.index_q.view(), cache, db.batch(), topk.view()},
                            run.workspace.workspace()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return topk.download();
}

// What the Hopper kernel's schedule makes of a batch: rows a request (so which kernel), splits a
// request and the most causal blocks one split scans.
std::string regime(const SyntheticBatch& sb, int heads, int64_t splits) {
  int64_t most = 0;
  for (int r = 0; r < sb.spec().num_decode; ++r) {
    const int64_t s = sb.spec().seq_lens[r];
    if (s > 0) most = std::max(most, ((s - 1) / kBlockTokens + splits) / splits);
  }
  const int rows = sb.spec().decode_q_len * heads;
  const std::string kernel =
      rows <= cuda::kDecodeSm90MaxRows
          ? "ring kernel of " + std::to_string(cuda::decode_sm90_warps(static_cast<int>(splits))) +
                " warps"
          : "portable kernel";
  return std::to_string(rows) + " rows a request (sm90: " + kernel + "), " +
         std::to_string(splits) + " splits a request, up to " + std::to_string(most) +
         " blocks a split";
}

class GpuDecodeIndexer : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(GpuDecodeIndexer, EveryImplementationMatchesTheHostBackend) {
  M3SA_SKIP_WITHOUT_CUDA();
  const DecodeCase& c = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t plan_requests = plan_requests_of(c);
  SyntheticBatch sb(spec_of(c, sm90_splits(decode_requests_of(c)), seed));
  M3SA_ASSERT_OK(sb.status());
  const IndexerOracle oracle = indexer_oracle(c.config, sb, seed, c.integers, c.use_reference);
  const DeviceBatch db(sb);
  const SelectionRules rules = selection_rules(c.config, sb);
  std::printf("[ %s ] %s\n", c.name,
              regime(sb, c.config.num_index_heads, sm90_splits(decode_requests_of(c))).c_str());

  HostTensor previous;
  for (const char* arch : kArchs) {
    CudaRun run;
    if (!plan_named(arch, c.config, sb, plan_requests, &run)) continue;
    if (std::string(arch) == "sm90") {
      const auto info = detail::load_plan_info<cuda::ScoringPlanInfo>(run.plan);
      std::printf("[ %s sm90 ] Hopper decode plan: %d ranges a tile at %lld requests, %s\n", c.name,
                  info.decode_sm90_splits, static_cast<long long>(plan_requests),
                  info.decode_sm90_cluster > 1 ? "each tile one cluster" : "workspace finish");
      // Clusters only where a cluster instantiation exists (e4m3, <= 16 ranked slots), of the
      // tile's ranges, 2..16 of them; which of those cases takes one depends on the device.
      if (info.decode_sm90_cluster != 1) {
        EXPECT_EQ(c.dtype, DType::fp8_e4m3);
        EXPECT_LE(c.config.top_k - c.config.init_blocks - c.config.local_blocks, 16);
        EXPECT_EQ(info.decode_sm90_cluster, info.decode_sm90_splits);
        EXPECT_GE(info.decode_sm90_cluster, 2);
        EXPECT_LE(info.decode_sm90_cluster, cuda::kDecodeSm90MaxCluster);
      }
    }
    HostTensor got = run_topk(run, c.config, db, db.index_k_cache.view());
    EXPECT_EQ(device_flags(run), 0) << arch;
    const TopkComparison cmp = compare_topk(
        oracle.topk.view(), got.view(), c.integers ? TensorView{} : oracle.scores.view(), rules);
    std::printf("[ %s %s ] %s: %s\n", c.name, arch, to_string(oracle.backend),
                describe(cmp).c_str());
    EXPECT_TRUE(cmp.ok()) << arch << ": " << describe(cmp);
    if (c.integers) {
      EXPECT_EQ(cmp.identical_rows, cmp.rows) << arch;
      if (previous.bytes() > 0) {
        EXPECT_TRUE(same_bytes(previous, got)) << "sm90 and sm80 must select bit-identically";
      }
    }
    previous = std::move(got);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuDecodeIndexer, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

float query_value(const SyntheticBatch& sb, int64_t token, int head, int d) {
  return load(sb.spec().index_dtype, sb.index_q.view().data,
              (token * sb.spec().index_heads + head) * kHeadDim + d);
}

float sign_of(float v) { return v > 0 ? 1.f : v < 0 ? -1.f : 0.f; }

bool selects(const std::vector<int32_t>& row, int64_t block) {
  return std::find(row.begin(), row.end(), block) != row.end();
}

// Keys past seq_len in a request's last page hold huge values aimed at its queries (or NaN in one
// request) in the device cache after the oracle ran: a kernel that scored them would select that
// last block (or, for the NaN request, drop it). local 0 keeps the last block ranked, and the
// batch is made so that either change shows: the valid keys of the last page are zero (the block
// scores 0, below every full block of random integer keys) except in the NaN request, whose
// valid keys give each row its best score (3 x sign of the row's query).
TEST(GpuDecodeIndexerRuns, DecodeKeysPastSeqLenNeverCount) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct PoisonBatch {
    std::vector<Len> lens; // every live seq_len % 128 >= rows + q_len: room for the aimed keys
    int q_len, heads, nan_request;
  };
  const std::vector<PoisonBatch> batches = {
      {{2100, 0, 3000, 5050, 9000, 40000}, 1, 4, 2},
      {{3000, 9000, 0, 2100}, 8, 1, 0},
      {{3000, 9000, 2100}, 8, 2, 1}, // 16 rows: the portable kernel
      {{split_len(3, 40)}, 1, 4, -1},
      {{split_len(1, 100)}, 2, 4, 0},
  };
  for (DType dtype : {DType::bf16, DType::fp8_e4m3})
    for (size_t i = 0; i < batches.size(); ++i) {
      const PoisonBatch& pb = batches[i];
      SCOPED_TRACE(std::string(to_string(dtype)) + " batch " + std::to_string(i));
      const MsaConfig config = cfg(pb.heads, 16, 0, 0);
      const DecodeCase c = decode_case("", pb.lens, pb.q_len, config, dtype);
      SyntheticBatch sb(spec_of(c, sm90_splits(decode_requests_of(c)), seed));
      M3SA_ASSERT_OK(sb.status());
      sb.fill_index_integers(seed, -3, 3);
      const int rows = pb.q_len * pb.heads;
      const int32_t* cu = sb.cu_q_lens.data<int32_t>();
      // Key `o` of a last page aims at row o % rows of its request (token-major, then head).
      const auto aimed = [&](int r, int o, int d) {
        const int row = o % rows;
        return sign_of(query_value(sb, cu[r] + row / pb.heads, row % pb.heads, d));
      };
      const int requests = static_cast<int>(pb.lens.size());
      for (int r = 0; r < requests; ++r) {
        const int32_t s = sb.spec().seq_lens[r];
        if (s == 0) continue;
        ASSERT_GE(s % kBlockTokens, rows + pb.q_len) << "request " << r;
        const int64_t last = (s - 1) / kBlockTokens;
        for (int o = 0; o < s % kBlockTokens; ++o)
          for (int d = 0; d < kHeadDim; ++d)
            sb.set_index_k(r, last * kBlockTokens + o, d,
                           r == pb.nan_request && o < rows ? 3 * aimed(r, o, d) : 0.f);
      }
      HostTensor want;
      M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::reference}, &want));
      for (int r = 0; r < requests; ++r) {
        const int32_t s = sb.spec().seq_lens[r];
        if (s == 0) continue;
        for (int64_t t = cu[r]; t < cu[r + 1]; ++t)
          for (int h = 0; h < pb.heads; ++h)
            ASSERT_EQ(selects(topk_row(want, h, t), (s - 1) / kBlockTokens), r == pb.nan_request)
                << "the poison could not show: request " << r << " token " << t << " head " << h;
      }

      const DeviceBatch db(sb);
      HostTensor cache = db.index_k_cache.download();
      const float huge = dtype == DType::bf16 ? 1e30f : 448.f;
      for (int r = 0; r < requests; ++r) {
        const int32_t s = sb.spec().seq_lens[r];
        if (s == 0) continue;
        const int64_t page = sb.page(r, (s - 1) / kBlockTokens);
        for (int o = s % kBlockTokens; o < kBlockTokens; ++o)
          for (int d = 0; d < kHeadDim; ++d)
            store(dtype, cache.view().data, (page * kBlockTokens + o) * kHeadDim + d,
                  r == pb.nan_request ? std::numeric_limits<float>::quiet_NaN()
                                      : huge * aimed(r, o, d));
      }
      M3SA_ASSERT_OK(db.index_k_cache.upload(cache));

      for (const char* arch : kArchs) {
        CudaRun run;
        if (!plan_named(arch, config, sb, 0, &run)) continue;
        const HostTensor got = run_topk(run, config, db, db.index_k_cache.view());
        EXPECT_EQ(device_flags(run), 0) << arch;
        const TopkComparison cmp =
            compare_topk(want.view(), got.view(), TensorView{}, selection_rules(config, sb));
        std::printf("[ PoisonedTail %s batch %zu %s ] reference: %s\n", to_string(dtype), i, arch,
                    describe(cmp).c_str());
        EXPECT_TRUE(same_bytes(want, got)) << arch << ": " << describe(cmp);
      }
    }
}

// Decode metadata the kernels cannot serve is flagged and never read (the name holds "Small":
// compute-sanitizer's memcheck runs it, so a read of the bad page would show): a page id out of
// range in a middle block and in the partial last block (bit 1), then a seq_len beyond the block
// table (bit 2). Rows of a flagged run are unspecified: only the flags are checked.
TEST(GpuDecodeIndexerSmall, DecodeBadPageIsFlaggedNotRead) {
  M3SA_SKIP_WITHOUT_CUDA();
  struct Shape {
    std::vector<int32_t> lens;
    int heads;
  };
  for (DType dtype : {DType::bf16, DType::fp8_e4m3})
    for (const Shape& shape : {Shape{{3000, 200}, 4}, Shape{{3000, 200}, 1}, Shape{{3000}, 4}})
      for (const char* arch : kArchs) {
        SCOPED_TRACE(std::string(arch) + " " + to_string(dtype) + " H" +
                     std::to_string(shape.heads) + " B" + std::to_string(shape.lens.size()));
        const MsaConfig config = cfg(shape.heads, 16, 1, 0);
        std::vector<Len> lens(shape.lens.begin(), shape.lens.end());
        const DecodeCase c = decode_case("", lens, 1, config, dtype);
        SyntheticBatch sb(spec_of(c, 1, test_seed()));
        M3SA_ASSERT_OK(sb.status());
        sb.fill_index_integers(1, -2, 2);
        CudaRun run;
        if (!plan_named(arch, config, sb, 0, &run)) continue;
        const DeviceBatch db(sb);
        const auto flags = [&] {
          run_topk(run, config, db, db.index_k_cache.view());
          return device_flags(run);
        };
        const int64_t last_block = (shape.lens[0] - 1) / kBlockTokens;
        for (int64_t block : {int64_t{5}, last_block}) {
          HostTensor table = db.block_table.download();
          table.data<int32_t>()[block] = 1 << 20; // request 0
          M3SA_ASSERT_OK(db.block_table.upload(table));
          EXPECT_EQ(flags(), 1) << "bad page in block " << block;
          M3SA_ASSERT_OK(db.block_table.upload(sb.block_table));
        }
        HostTensor lens_now = db.seq_lens.download();
        lens_now.data<int32_t>()[shape.lens.size() - 1] = sb.width() * kBlockTokens + 1;
        M3SA_ASSERT_OK(db.seq_lens.upload(lens_now));
        EXPECT_EQ(flags(), 2);
      }
}

// A device view of a [pages, 128, 128] index-K cache with the given strides (elements).
TensorView cache_view(void* data, DType dtype, int64_t pages, int64_t page_stride,
                      int64_t token_stride) {
  TensorView v =
      TensorView::contiguous(data, dtype, {pages, kBlockTokens, kHeadDim}, {DeviceKind::cuda, 0});
  v.strides[0] = page_stride, v.strides[1] = token_stride;
  return v;
}

// Strides of the index-K cache are free within what the API accepts (16-byte aligned base and
// row strides, last dim contiguous): padded tokens and padded pages (TMA-addressable, the Hopper
// kernel) select exactly as the contiguous cache, their padding holding NaN so that a read of it
// shows. A token stride of 0 (each page repeats its first key) is accepted but TMA cannot address
// it (zero stride): the portable kernel must serve it, equal to the CPU backend on the same view.
// An unaligned base or a token stride that is not a multiple of 16 bytes is rejected up front.
TEST(GpuDecodeIndexerRuns, DecodeStridedCacheViews) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Shape {
    std::vector<Len> lens;
    int q_len, heads;
  };
  const std::vector<Shape> shapes = {
      {{40007, 0, 3000}, 1, 4}, {{split_len(3, 9)}, 8, 1}, {{9000, 2100}, 3, 4}};
  constexpr int64_t kWideToken = kHeadDim + 64, kPagePad = 64;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3})
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& shape = shapes[i];
      SCOPED_TRACE(std::string(to_string(dtype)) + " shape " + std::to_string(i));
      const MsaConfig config = cfg(shape.heads, 16, 1, 0);
      const DecodeCase c = decode_case("", shape.lens, shape.q_len, config, dtype);
      SyntheticBatch sb(spec_of(c, sm90_splits(decode_requests_of(c)), seed));
      M3SA_ASSERT_OK(sb.status());
      sb.fill_index_integers(seed, -3, 3);
      HostTensor want, want_repeated;
      M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::cpu}, &want));
      {
        TensorView repeated = sb.index_k_cache.view();
        repeated.strides[1] = 0;
        PlannedOp cpu(plan_request(OpKind::index_topk, config, sb, {Backend::cpu}));
        M3SA_ASSERT_OK(cpu.status);
        want_repeated.reset(DType::i32, {shape.heads, sb.num_tokens(), config.top_k});
        want_repeated.fill_bytes(0x5a);
        M3SA_ASSERT_OK(index_topk(cpu.plan,
                                  {sb.index_q.view(), repeated, sb.batch(), want_repeated.view()},
                                  cpu.workspace()));
      }

      const DeviceBatch db(sb);
      const int64_t pages = sb.num_pages();
      const size_t elem = dtype_size(dtype);
      // 0xff is NaN in bf16 and in e4m3: the padding poisons whatever reads it.
      DeviceBuffer wide(static_cast<size_t>(pages * kBlockTokens * kWideToken) * elem);
      DeviceBuffer tall(static_cast<size_t>(pages * (kBlockTokens * kHeadDim + kPagePad)) * elem);
      M3SA_ASSERT_OK(wide.fill(0xff));
      M3SA_ASSERT_OK(tall.fill(0xff));
      M3SA_CUDA_ASSERT(cudaMemcpy2D(wide.data(), kWideToken * elem, db.index_k_cache.data(),
                                    kHeadDim * elem, kHeadDim * elem, pages * kBlockTokens,
                                    cudaMemcpyDeviceToDevice));
      M3SA_CUDA_ASSERT(cudaMemcpy2D(tall.data(), (kBlockTokens * kHeadDim + kPagePad) * elem,
                                    db.index_k_cache.data(), kBlockTokens * kHeadDim * elem,
                                    kBlockTokens * kHeadDim * elem, pages,
                                    cudaMemcpyDeviceToDevice));
      const TensorView wide_view =
          cache_view(wide.data(), dtype, pages, kBlockTokens * kWideToken, kWideToken);
      const TensorView tall_view =
          cache_view(tall.data(), dtype, pages, kBlockTokens * kHeadDim + kPagePad, kHeadDim);
      TensorView repeated_view = db.index_k_cache.view();
      repeated_view.strides[1] = 0;

      for (const char* arch : kArchs) {
        CudaRun run;
        if (!plan_named(arch, config, sb, 0, &run)) continue;
        const HostTensor contiguous = run_topk(run, config, db, db.index_k_cache.view());
        const TopkComparison cmp =
            compare_topk(want.view(), contiguous.view(), TensorView{}, selection_rules(config, sb));
        std::printf("[ StridedViews %s shape %zu %s ] cpu: %s\n", to_string(dtype), i, arch,
                    describe(cmp).c_str());
        EXPECT_TRUE(same_bytes(want, contiguous)) << arch << ": " << describe(cmp);
        EXPECT_TRUE(same_bytes(contiguous, run_topk(run, config, db, wide_view)))
            << arch << ": token stride " << kWideToken;
        EXPECT_TRUE(same_bytes(contiguous, run_topk(run, config, db, tall_view)))
            << arch << ": page stride " << kBlockTokens * kHeadDim + kPagePad;
        EXPECT_TRUE(same_bytes(want_repeated, run_topk(run, config, db, repeated_view)))
            << arch << ": token stride 0";
        EXPECT_EQ(device_flags(run), 0) << arch;

        const TensorView rejected[] = {
            cache_view(static_cast<char*>(wide.data()) + 2, dtype, pages, kBlockTokens * kWideToken,
                       kWideToken),
            cache_view(wide.data(), dtype, pages, kBlockTokens * (kHeadDim + 4), kHeadDim + 4)};
        for (const TensorView& view : rejected) {
          DeviceBuffer topk(DType::i32, {shape.heads, sb.num_tokens(), config.top_k}, 0x5a);
          const Status s = index_topk(run.plan, {db.index_q.view(), view, db.batch(), topk.view()},
                                      run.workspace.workspace());
          EXPECT_EQ(s.code(), StatusCode::invalid_argument) << arch << ": " << view.describe();
          EXPECT_NE(s.to_string().find("index_k_cache"), std::string::npos) << s.to_string();
          EXPECT_NE(s.to_string().find("16-byte aligned"), std::string::npos) << s.to_string();
        }
      }
    }
}

// Each implementation's selections for case c on the data `fill` writes (every sum exact), bit
// for bit the CPU backend's; `data` names the data in the printed comparison.
template <typename Fill>
void expect_selects_as_cpu(const DecodeCase& c, Fill&& fill, const char* data) {
  const int64_t plan_requests = plan_requests_of(c);
  SyntheticBatch sb(spec_of(c, sm90_splits(decode_requests_of(c)), test_seed()));
  M3SA_ASSERT_OK(sb.status());
  fill(sb);
  HostTensor want;
  M3SA_ASSERT_OK(run_index_topk(c.config, sb, {Backend::cpu}, &want));
  const DeviceBatch db(sb);
  for (const char* arch : kArchs) {
    CudaRun run;
    if (!plan_named(arch, c.config, sb, plan_requests, &run)) continue;
    const HostTensor got = run_topk(run, c.config, db, db.index_k_cache.view());
    EXPECT_EQ(device_flags(run), 0) << arch;
    const TopkComparison cmp =
        compare_topk(want.view(), got.view(), TensorView{}, selection_rules(c.config, sb));
    std::printf("[ %s, %s, %s ] %s\n", c.name, data, arch, describe(cmp).c_str());
    EXPECT_TRUE(same_bytes(want, got)) << arch << ", " << data << ": " << describe(cmp);
  }
}

// Equal scores everywhere (all index data 0): the contract ranks ties by block id, so every split's
// list holds its range's lowest ids and every key of the first fill - 1 ranges lies above the
// floor the last CTA's merge derives from the lists' heads - hundreds of survivors at K = 32, more
// than the survivor ranking holds, so the merge takes its full ranking; K = 16 stays below its
// capacity. Both must equal the CPU backend bit for bit.
TEST(GpuDecodeIndexerRuns, DecodeTiedScoresDefeatTheMergeFloor) {
  M3SA_SKIP_WITHOUT_CUDA();
  const DecodeCase cases[] = {
      decode_case("B1H1K32", {split_len(40, 0)}, 1, cfg(1, 32, 1, 0), DType::bf16),
      decode_case("B1H4K32Init2Fp8", {split_len(33, -5)}, 1, cfg(4, 32, 1, 2), DType::fp8_e4m3),
      decode_case("B1H2Mtp2K16", {split_len(20, 7)}, 2, cfg(2, 16, 1, 0), DType::bf16),
      decode_case("B3H1K32PlannedForTwoSplits", {131072, 0, 20000}, 1, cfg(1, 32, 0, 0),
                  DType::bf16, true, false, 2),
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(c.name);
    expect_selects_as_cpu(
        c, [](SyntheticBatch& sb) { sb.fill_index_integers(1, 0, 0); }, "all tied");
  }
}

// The e4m3 decode kernels multiply on the e4m3 tensor cores (mma.sync m16n8k32), whose sums must
// be as exact as fp32's: on data where an aligned-and-truncated sum (Hopper's e4m3 wgmma) ranks the
// blocks the other way (fill_dropped_products), and at e4m3's extremes (fill_e4m3_extremes), the
// selections are the CPU backend's, bit for bit; at batch 1 (4-warp CTAs, many splits) and at
// batch 32 (8-warp CTAs).
TEST(GpuDecodeIndexerSmall, DecodeFp8SumsAreExactOnAdversarialData) {
  M3SA_SKIP_WITHOUT_CUDA();
  const DecodeCase cases[] = {
      decode_case("B1H4", {6144}, 1, cfg(4, 16, 1, 0), DType::fp8_e4m3),
      decode_case("B32H1", std::vector<Len>(32, Len(6144 - 77)), 1, cfg(1, 16, 1, 0),
                  DType::fp8_e4m3),
      decode_case("B2H2Mtp3", {5000, 6144}, 3, cfg(2, 16, 1, 0), DType::fp8_e4m3),
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(c.name);
    expect_selects_as_cpu(c, fill_dropped_products, "dropped products");
    expect_selects_as_cpu(
        c, [](SyntheticBatch& sb) { fill_e4m3_extremes(sb, sb.spec().seed); }, "extremes");
  }
}

// The Hopper kernel's result does not depend on which split finishes last: twenty runs on random
// data (no exact ties to hide a race) are bit-identical, at batch 1 (the most splits a request)
// and at batch 128 (two splits, many requests merging at once).
TEST(GpuDecodeIndexerRuns, DecodeTwentyRunsAreBitwiseIdentical) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<Len> around_9000;
  for (int r = 0; r < 128; ++r)
    around_9000.push_back(r % 16 == 7 ? 0 : rng.uniform_int(8800, 9200));
  const DecodeCase cases[] = {
      decode_case("B1S131072H4", {131072}, 1, cfg(4, 16, 1, 0), DType::bf16, false),
      decode_case("B128S9000H4Fp8", around_9000, 1, cfg(4, 16, 1, 0), DType::fp8_e4m3, false),
      // Eight requests of 16 ranges, each warp's list published whole.
      decode_case("B8S131072H1Fp8", std::vector<Len>(8, split_len(64, -7)), 1, cfg(1, 16, 1, 0),
                  DType::fp8_e4m3, false),
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE(c.name);
    SyntheticBatch sb(spec_of(c, sm90_splits(decode_requests_of(c)), seed));
    M3SA_ASSERT_OK(sb.status());
    CudaRun run;
    if (!plan_named("sm90", c.config, sb, 0, &run))
      GTEST_SKIP() << "cuda.index_topk.sm90 cannot run here";
    const IndexerOracle oracle = indexer_oracle(c.config, sb, seed, false, false);
    const DeviceBatch db(sb);
    const HostTensor first = run_topk(run, c.config, db, db.index_k_cache.view());
    const TopkComparison cmp = compare_topk(oracle.topk.view(), first.view(), oracle.scores.view(),
                                            selection_rules(c.config, sb));
    std::printf("[ TwentyRuns %s sm90 ] %s: %s\n", c.name, to_string(oracle.backend),
                describe(cmp).c_str());
    EXPECT_TRUE(cmp.ok()) << describe(cmp);
    for (int i = 1; i < 20; ++i)
      ASSERT_TRUE(same_bytes(first, run_topk(run, c.config, db, db.index_k_cache.view())))
          << "run " << i;
    EXPECT_EQ(device_flags(run), 0);
  }
}

// Back-to-back decode calls in one graph on one workspace, alternating two data sets (each into
// its own output): every output equals the eager run of its set, which equals the CPU backend's.
// Tiles of many ranges: a tile counter in the workspace (the ranges' arrivals) that a call left
// non-zero, or that the next call (launched early by programmatic dependent launch) read before
// the reset, merges too early or never; the workspace's published lists hold the other set's.
TEST(GpuDecodeIndexerRuns, DecodeGraphOfAlternatingBatchesEqualsEagerRuns) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(dtype == DType::bf16 ? "bf16" : "e4m3");
    const DecodeCase c = decode_case(
        "B6LongRanges", {split_len(64, -3), split_len(70, 9), 0, split_len(64, 0), 3000, 131072}, 1,
        cfg(4, 16, 1, 0), dtype, false);
    const int64_t splits = sm90_splits(decode_requests_of(c));
    SyntheticBatch sa(spec_of(c, splits, seed)), sb(spec_of(c, splits, seed));
    M3SA_ASSERT_OK(sa.status());
    M3SA_ASSERT_OK(sb.status());
    const IndexerOracle oracle_a = indexer_oracle(c.config, sa, seed, false, false);
    const IndexerOracle oracle_b = indexer_oracle(c.config, sb, seed + 1, false, false);
    CudaRun run;
    if (!plan_named("sm90", c.config, sa, 0, &run))
      GTEST_SKIP() << "cuda.index_topk.sm90 cannot run here";
    const DeviceBatch da(sa), db(sb);
    const HostTensor want_a = run_topk(run, c.config, da, da.index_k_cache.view());
    const HostTensor want_b = run_topk(run, c.config, db, db.index_k_cache.view());
    ASSERT_FALSE(same_bytes(want_a, want_b)) << "the data sets must select differently";
    const auto expect_oracle = [&](const IndexerOracle& oracle, const HostTensor& got,
                                   const SyntheticBatch& batch) {
      const TopkComparison cmp = compare_topk(oracle.topk.view(), got.view(), oracle.scores.view(),
                                              selection_rules(c.config, batch));
      EXPECT_TRUE(cmp.ok()) << describe(cmp);
    };
    expect_oracle(oracle_a, want_a, sa);
    expect_oracle(oracle_b, want_b, sb);

    expect_graph_of_alternating_calls(run, da, db, want_a, want_b, {4, sa.num_tokens(), 16}, 8);
  }
}

// One plan for 48 requests (an engine's, sized once for its largest batch) captured in one graph
// at batch 1 and at batch 40, alternating: each call's grid follows its own decode requests (batch
// 1: an SM's worth of ranges; batch 40: a few a request) on the one workspace, whose arrival
// counters and lists both grids reuse. Eager runs equal the CPU backend bit for bit (integer data),
// and every replay equals the eager runs.
TEST(GpuDecodeIndexerRuns, DecodeGraphOfTwoBatchSizesOnOnePlanEqualsEagerRuns) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kPlanRequests = 48;
  for (DType dtype : {DType::bf16, DType::fp8_e4m3}) {
    SCOPED_TRACE(dtype == DType::bf16 ? "bf16" : "e4m3");
    const MsaConfig config = cfg(4, 16, 1, 0);
    // Both block tables as wide (the longest request of either): one plan's width.
    const int32_t longest = 131072 - 77;
    const DecodeCase one = decode_case("B1", {longest}, 1, config, dtype);
    const DecodeCase many = decode_case("B40", varied(40, 40000, 17, {longest}), 1, config, dtype);
    SyntheticBatch sa(spec_of(one, sm90_splits(1), seed)), sb(spec_of(many, sm90_splits(40), seed));
    M3SA_ASSERT_OK(sa.status());
    M3SA_ASSERT_OK(sb.status());
    ASSERT_EQ(sa.width(), sb.width());
    sa.fill_index_integers(seed, -3, 3);
    sb.fill_index_integers(seed + 1, -3, 3);
    HostTensor cpu_a, cpu_b;
    M3SA_ASSERT_OK(run_index_topk(config, sa, {Backend::cpu}, &cpu_a));
    M3SA_ASSERT_OK(run_index_topk(config, sb, {Backend::cpu}, &cpu_b));
    const DeviceBatch da(sa), db(sb);
    for (const char* arch : kArchs) {
      SCOPED_TRACE(arch);
      CudaRun run;
      if (!plan_named(arch, config, sb, kPlanRequests, &run)) continue;
      const HostTensor got_a = run_topk(run, config, da, da.index_k_cache.view());
      const HostTensor got_b = run_topk(run, config, db, db.index_k_cache.view());
      EXPECT_TRUE(same_bytes(cpu_a, got_a)) << "batch 1";
      EXPECT_TRUE(same_bytes(cpu_b, got_b)) << "batch 40";
      expect_graph_of_alternating_calls(run, da, db, got_a, got_b, {4, sa.num_tokens(), 16}, 6,
                                        {4, sb.num_tokens(), 16});
    }
  }
}

} // namespace
} // namespace m3sa::testing
