// CUDA sparse attention against the host backends. Selections come from the CPU indexer on random
// index data (what an engine feeds the attention); outputs are compared with the CPU backend
// (which the cpu suite holds to the reference and to a dense masked softmax) and, on small cases,
// with the reference itself. Device outputs are poisoned before every run, and cache slots past
// each request's seq_len hold NaN, so a read past the visible keys shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/launchers.h"
#include "gpu/cuda_test_util.h"

namespace m3sa::testing {
namespace {

struct AttentionCase {
  const char* name;
  BatchSpec spec;
  int top_k;
  float k_scale = 1.f, v_scale = 1.f;
  bool use_reference = false; // small enough for the reference as a second oracle
  // Tokens of an even 128-token position block share their selections within aligned spans of
  // this many positions (an engine's real selections are close to 128: a whole block), so the
  // sm90 plan's page-union tiles and its block-major path both run, in one pass; a span of 4
  // gives each half of an 8-token union tile its own selections, so that each of the union
  // kernel's consumers skips the pages only the other half selected. 0: no sharing.
  int shared_span = 0;
  // V of every third page scaled past fp16's range (x 2^16: up to 2^17) and of the next one below
  // the page-union kernel's fp16 floor (x 2^-10: below 2^-9), so that its fp16 V and its bf16
  // fallback (P's fp16 weights split into bf16 parts) both run, page by page, in one tile.
  bool values_past_half = false;
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

// Scales V page by page as AttentionCase::values_past_half says (powers of two: exact in bf16).
void scale_values_past_half(SyntheticBatch& sb) {
  const TensorView v = sb.v_cache.view(); // [P, 128, Hkv, 128], contiguous
  const int64_t page_values = v.shape[1] * v.shape[2] * v.shape[3];
  for (int64_t page = 0; page < v.shape[0]; ++page) {
    const float factor = page % 3 == 1 ? 65536.f : page % 3 == 2 ? 1.f / 1024.f : 1.f;
    for (int64_t i = page * page_values; i < (page + 1) * page_values; ++i)
      store(v.dtype, v.data, i, load(v.dtype, v.data, i) * factor);
  }
}

MsaConfig attention_config(const BatchSpec& spec, int top_k) {
  MsaConfig c;
  c.num_index_heads = spec.kv_heads;
  c.top_k = top_k;
  return c;
}

// Selections by the CPU indexer on random index data.
HostTensor indexer_selections(SyntheticBatch& sb, const MsaConfig& config, uint64_t seed) {
  sb.fill_index_random(seed);
  HostTensor topk;
  const Status s = run_index_topk(config, sb, {Backend::cpu}, &topk);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return topk;
}

// Every token of an even 128-token position block takes the selections (every head) of its
// request's first token in that block: the same own block, so still causal and ascending.
void share_selections_within_even_blocks(const SyntheticBatch& sb, int span, HostTensor& topk) {
  const TensorView v = topk.view(); // [Hkv, T, K]
  int32_t* ids = topk.data<int32_t>();
  std::vector<int64_t> leader(sb.num_tokens(), -1);
  for (int64_t t = 0; t < sb.num_tokens(); ++t) {
    const int64_t position = sb.position(t);
    if (position < 0 || (position / kBlockTokens) % 2 != 0) continue;
    leader[t] = t;
    if (t > 0 && leader[t - 1] >= 0 && sb.request_of(t - 1) == sb.request_of(t) &&
        sb.position(t - 1) / kBlockTokens == position / kBlockTokens &&
        sb.position(t - 1) / span == position / span)
      leader[t] = leader[t - 1];
    for (int64_t h = 0; h < v.shape[0]; ++h)
      for (int64_t k = 0; k < v.shape[2]; ++k)
        ids[h * v.strides[0] + t * v.strides[1] + k * v.strides[2]] =
            ids[h * v.strides[0] + leader[t] * v.strides[1] + k * v.strides[2]];
  }
}

// Device copies of the attention inputs of a SyntheticBatch; out and lse poisoned.
struct DeviceAttention {
  DeviceBuffer q, k_cache, v_cache, topk, cu_q_lens, seq_lens, block_table, kv_block_table, out,
      lse;
  BatchMetadata batch;
  DeviceAttention(const SyntheticBatch& sb, const HostTensor& selections)
      : q(sb.q), k_cache(sb.k_cache), v_cache(sb.v_cache), topk(selections),
        cu_q_lens(sb.cu_q_lens), seq_lens(sb.seq_lens), block_table(sb.block_table),
        kv_block_table(sb.kv_block_table),
        out(DType::bf16, {sb.num_tokens(), sb.spec().q_heads, kHeadDim}, 0xff),
        lse(DType::f32, {sb.num_tokens(), sb.spec().q_heads}, 0xff) {
    batch = sb.batch();
    batch.cu_q_lens = cu_q_lens.view();
    batch.seq_lens = seq_lens.view();
    batch.block_table = block_table.view();
  }
  SparseAttentionArgs args(float k_scale, float v_scale) const {
    SparseAttentionArgs a;
    a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
    a.k_scale = k_scale, a.v_scale = v_scale;
    a.topk = topk.view(), a.batch = batch, a.kv_block_table = kv_block_table.view();
    a.out = out.view(), a.lse = lse.view();
    return a;
  }
};

// Both CUDA implementations run every test: cuda.sparse_attention.sm80 (cp.async decode kernel)
// and .sm90 (TMA decode kernel; the prefill path is shared).
constexpr const char* kArchs[] = {"sm80", "sm90"};

// A plan of cuda.sparse_attention.<arch>, or false when it cannot run here (printed; on a Hopper
// GPU both must run).
bool attention_run(const char* arch, const MsaConfig& config, const SyntheticBatch& sb,
                   CudaRun* run) {
  const std::string name = std::string("cuda.sparse_attention.") + arch;
  PlanRequest request = plan_request(OpKind::sparse_attention, config, sb, {Backend::cuda});
  request.implementation = name.c_str();
  if (!plan_named_implementation(request, run)) return false;
  std::printf("[ %s ]\n", name.c_str());
  return true;
}

struct HostAttention {
  HostTensor out, lse;
};

HostAttention host_attention(Backend backend, const MsaConfig& config, const SyntheticBatch& sb,
                             const HostTensor& topk, float k_scale, float v_scale) {
  PlannedOp planned(plan_request(OpKind::sparse_attention, config, sb, {backend}));
  EXPECT_TRUE(planned.status.ok()) << planned.status.to_string();
  HostAttention h;
  h.out.reset(DType::bf16, {sb.num_tokens(), sb.spec().q_heads, kHeadDim});
  h.lse.reset(DType::f32, {sb.num_tokens(), sb.spec().q_heads});
  SparseAttentionArgs args = attention_args(sb, topk, h.out, h.lse, true);
  args.k_scale = k_scale, args.v_scale = v_scale;
  const Status s = sparse_attention(planned.plan, args, planned.workspace());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return h;
}

void expect_close(const HostAttention& expected, const HostTensor& out, const HostTensor& lse,
                  const char* oracle) {
  const AttentionComparison c =
      compare_attention(expected.out.view(), out.view(), expected.lse.view(), lse.view());
  std::printf("  vs %s: %s\n", oracle, describe(c).c_str());
  EXPECT_EQ(c.nonfinite_mismatches, 0) << oracle << ": " << describe(c);
  EXPECT_EQ(c.lse_inf_mismatches, 0) << oracle << ": " << describe(c);
  EXPECT_LE(c.relative_l2_error, kGpuAttentionRelativeL2) << oracle << ": " << describe(c);
  EXPECT_LE(c.max_lse_error, kGpuAttentionLse) << oracle << ": " << describe(c);
}

// Both CUDA implementations on case c against the CPU backend (and the reference where asked);
// check_batch and check_selections, where given, first check what the case is meant to exercise.
void expect_matches_host_backends(
    const AttentionCase& c, const std::function<void(const SyntheticBatch&)>& check_batch = {},
    const std::function<void(const SyntheticBatch&, const HostTensor&)>& check_selections = {}) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  BatchSpec spec = c.spec;
  spec.seed = seed;
  SyntheticBatch sb(spec);
  if (check_batch) check_batch(sb);
  const MsaConfig config = attention_config(spec, c.top_k);
  HostTensor topk = indexer_selections(sb, config, seed + 1);
  if (c.shared_span > 0) share_selections_within_even_blocks(sb, c.shared_span, topk);
  if (check_selections) check_selections(sb, topk);
  sb.fill_attention_random(seed + 2);
  if (c.values_past_half) scale_values_past_half(sb);

  const HostAttention cpu = host_attention(Backend::cpu, config, sb, topk, c.k_scale, c.v_scale);
  HostAttention reference;
  if (c.use_reference)
    reference = host_attention(Backend::reference, config, sb, topk, c.k_scale, c.v_scale);
  for (const char* arch : kArchs) {
    SCOPED_TRACE(arch);
    DeviceAttention d(sb, topk);
    CudaRun run;
    if (!attention_run(arch, config, sb, &run)) continue;
    M3SA_ASSERT_OK(
        sparse_attention(run.plan, d.args(c.k_scale, c.v_scale), run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(device_flags(run), 0);
    const HostTensor out = d.out.download(), lse = d.lse.download();
    expect_close(cpu, out, lse, "cpu");
    if (c.use_reference) expect_close(reference, out, lse, "reference");
  }
}

class CudaAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaAttention, MatchesHostBackends) {
  M3SA_SKIP_WITHOUT_CUDA();
  expect_matches_host_backends(GetParam());
}

BatchSpec spec(std::vector<int32_t> q_lens, std::vector<int32_t> seq_lens, int num_decode,
               int decode_q_len, int q_heads, int kv_heads, DType kv = DType::bf16) {
  BatchSpec s;
  s.q_lens = std::move(q_lens), s.seq_lens = std::move(seq_lens);
  s.num_decode = num_decode, s.decode_q_len = decode_q_len;
  s.index_heads = kv_heads, s.q_heads = q_heads, s.kv_heads = kv_heads, s.kv_dtype = kv;
  return s;
}

// n contexts of 600 .. 30K tokens.
std::vector<int32_t> long_contexts(int n) {
  std::vector<int32_t> lengths(n);
  for (int i = 0; i < n; ++i) lengths[i] = 600 + (i * 7919) % 29000 + (i % 3 == 0 ? 1 : 0);
  return lengths;
}

// `decode` single-token requests of long contexts, then one prefill chunk: enough (token, KV
// head) pairs that an sm90 plan runs the decode rows on the TMA kernel (no cluster merge): 12
// requests x 4 KV heads merge splits through the workspace, 40 x 4 take one split each.
BatchSpec decode_batch_and_prefill(int decode, int32_t prefill_q, int32_t prefill_seq) {
  std::vector<int32_t> q_lens(decode, 1), seq_lens = long_contexts(decode);
  q_lens.push_back(prefill_q), seq_lens.push_back(prefill_seq);
  return spec(q_lens, seq_lens, decode, 1, 64, 4);
}

const AttentionCase kCases[] = {
    {"SmallDecodeTp1", spec({1, 1, 1, 1}, {1000, 5000, 77, 20000}, 4, 1, 64, 4), 16, 1, 1, true},
    {"DecodeTp4Batch1", spec({1}, {33000}, 1, 1, 16, 1), 16},
    {"DecodeMtp4", spec({4, 4, 4}, {4000, 700, 9000}, 3, 4, 64, 4), 16},
    {"DecodeMtp16K32", spec({16, 16}, {6000, 2100}, 2, 16, 16, 1), 32},
    {"DecodeK1", spec({1, 1}, {3000, 500}, 2, 1, 64, 4), 1, 1, 1, true},
    {"SmallDecodeK8Group8", spec({1, 1, 1}, {3000, 900, 40}, 3, 1, 32, 4), 8, 1, 1, true},
    {"SmallDecodeShortContextsPadded", spec({1, 1, 1, 1}, {1, 129, 640, 0}, 4, 1, 64, 4), 16, 1, 1,
     true},
    {"DecodeFp8Scales", spec({1, 1, 1}, {4000, 20000, 300}, 3, 1, 64, 4, DType::fp8_e4m3), 16, 0.5f,
     2.f, true},
    {"DecodeFp8Batch1", spec({1}, {70000}, 1, 1, 16, 1, DType::fp8_e4m3), 16, 1.5f, 0.75f},
    // Batch 1 with one selected block a CTA (the decode kernel's one-pass path): the token's own
    // block visible only in its first 64 keys (warps 2-3 of that CTA attend no key), and a short
    // context whose selection is mostly -1 padding.
    {"DecodeBatch1OwnBlockFirstHalf", spec({1}, {32950}, 1, 1, 64, 4), 16, 1, 1, true},
    {"DecodeFp8Batch1OwnBlockFirstHalf", spec({1}, {69900}, 1, 1, 64, 4, DType::fp8_e4m3), 16, 0.5f,
     2.f},
    {"DecodeFp8Batch1ShortPadded", spec({1}, {300}, 1, 1, 16, 1, DType::fp8_e4m3), 16, 1.5f, 0.75f,
     true},
    // Batch 1 in clusters with GQA groups under 8 (bf16: the warps split P.V by dims, and the
    // rows past the group, which hold zero queries, must not reach a peer): group 2 in clusters
    // of 8 (top_k 8, sanitizer-sized), group 4 in clusters of 16.
    {"SmallDecodeBatch1Group2K8", spec({1}, {20000}, 1, 1, 8, 4), 8, 1, 1, true},
    {"DecodeBatch1Group4", spec({1}, {50000}, 1, 1, 16, 4), 16, 1, 1, true},
    // 48 (token, KV head) pairs: more than the clusters an sm90 plan takes, so its TMA kernel
    // splits the selections and merge_decode_splits_kernel merges them; short, padded and
    // one-token contexts leave ranges without keys.
    {"DecodeBatch12SplitsMergedByKernel",
     spec(std::vector<int32_t>(12, 1), long_contexts(12), 12, 1, 64, 4), 16, 1, 1, true},
    {"DecodeBatch12ShortPaddedFp8",
     spec(std::vector<int32_t>(12, 1), {1, 129, 640, 0, 5000, 300, 20000, 77, 0, 1000, 2500, 128},
          12, 1, 64, 4, DType::fp8_e4m3),
     16, 0.5f, 2.f, true},
    // The merge kernel with a GQA group of 8 (two CTAs a pair) and top_k 8, and with MTP rows
    // (12 requests x 4 query tokens, one KV head).
    {"DecodeGroup8K8SplitsMergedByKernel",
     spec(std::vector<int32_t>(12, 1), long_contexts(12), 12, 1, 32, 4), 8, 1, 1, true},
    {"DecodeMtp4SplitsMergedByKernel",
     spec(std::vector<int32_t>(12, 4), long_contexts(12), 12, 4, 16, 1), 16},
    // 80 pairs: three ranges a pair on an H200, merged by the last CTA to arrive.
    {"DecodeBatch20SplitsMergedByLastArrival",
     spec(std::vector<int32_t>(20, 1), long_contexts(20), 20, 1, 64, 4), 16},
    // More (token, KV head) pairs than two a resident CTA: one range a pair, no merge of splits.
    {"DecodeBatch40Tp1", spec(std::vector<int32_t>(40, 1), long_contexts(40), 40, 1, 64, 4), 16},
    {"DecodeBatch40Fp8",
     spec(std::vector<int32_t>(40, 1), long_contexts(40), 40, 1, 64, 4, DType::fp8_e4m3), 16, 0.5f,
     1.5f},
    {"PrefillNoPrefix", spec({700}, {700}, 0, 1, 16, 1), 16, 1, 1, true},
    {"PrefillUnalignedPrefix", spec({300}, {2333}, 0, 1, 64, 4), 16},
    {"PrefillChunkAfterPrefixK32", spec({1000}, {9000}, 0, 1, 16, 1), 32},
    {"PrefillGroup8K8Scales", spec({400}, {3000}, 0, 1, 32, 4), 8, 0.5f, 2.f, true},
    {"PrefillK1", spec({257}, {4000}, 0, 1, 16, 1), 1, 1.f, 1.f, true},
    // 4 KV heads x top_k 32 x 4.2 KB partials: 2,200 tokens a pass (1.125 GiB), so 3,001 tokens
    // take two passes of 1,504 and 1,497.
    {"PrefillTwoPassesK32", spec({3001}, {6000}, 0, 1, 64, 4), 32},
    {"PrefillFp8", spec({513}, {5000}, 0, 1, 64, 4, DType::fp8_e4m3), 16, 0.25f, 4.f},
    // Rows of one to three blocks from the start of their requests: where fp16 P (the sm90 e4m3
    // kernel's single part) costs the most of the bound in a model of this comparison (9.4e-4 of
    // 1e-3 at one block a row and k scale 0.25; design doc, session 47).
    {"PrefillFp8ShortRows", spec({256, 300}, {256, 300}, 0, 1, 64, 4, DType::fp8_e4m3), 16, 0.25f,
     4.f},
    // Shared selections: page-union tiles (bf16 caches on sm90; tiles inside an even block, some
    // across a block boundary) next to block-major ones, GQA groups of 16 and 8; e4m3 caches
    // run them block-major.
    {"PrefillSharedSelections", spec({1500}, {20004}, 0, 1, 64, 4), 16, 1.f, 1.f, false,
     kBlockTokens},
    {"PrefillSharedSelectionsGroup8Scales", spec({700}, {9000}, 0, 1, 32, 4), 16, 0.5f, 2.f, false,
     kBlockTokens},
    {"PrefillSharedSelectionsFp8", spec({700}, {9000}, 0, 1, 32, 4, DType::fp8_e4m3), 16, 0.5f, 2.f,
     false, kBlockTokens},
    {"PrefillSharedSelectionsK32", spec({600}, {12000}, 0, 1, 16, 1), 32, 1.f, 1.f, false,
     kBlockTokens},
    {"PrefillSharedSelectionsValuesPastHalf", spec({700}, {9000}, 0, 1, 16, 1), 16, 1.f, 1.f,
     false, kBlockTokens, true},
    // Each half of a union tile with selections of its own (prefix 8,000: tiles start at
    // multiples of 8 positions): two sets of 16 of ~70 pages, most unions within 32 pages.
    {"PrefillHalfTileSelections", spec({1000}, {9000}, 0, 1, 16, 1), 16, 1.f, 1.f, false, 4},
    {"SmallPrefillShortRequests", spec({3, 5, 1, 2, 7}, {3, 130, 1, 300, 7}, 0, 1, 16, 1), 16, 1, 1,
     true},
    {"MixedBatchWithPadding", spec({1, 1, 1, 260, 17, 0}, {5000, 0, 300, 2000, 17, 0}, 3, 1, 64, 4),
     16, 1, 1, true},
    // Prefill padding rows (seq_len 0) inside page-union tiles and next to block-major ones: zeros
    // and lse -inf, whatever their queries hold.
    {"SmallPrefillPaddingRows", spec({5, 6, 3, 11}, {0, 300, 0, 2000}, 0, 1, 16, 1), 16, 1, 1,
     true},
    {"MixedMtpBatchFp8", spec({2, 2, 200}, {3000, 90, 7000}, 2, 2, 32, 2, DType::fp8_e4m3), 16, 2.f,
     0.5f},
    {"LongPrefixSpotCheck", spec({64}, {(1 << 20) - 16 * 1024 + 64}, 0, 1, 16, 1), 16},
};

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// An sm90 plan's prefill pass sorts its entries by counting where its keys (KV heads x pool pages)
// number at most kCountingSortBins, else with CUB's radix sort (as every sm80 plan does).
// Counting: 2,048 tokens of one KV head over 64 pages, so every key holds hundreds of entries
// (token bitmaps of 64 words, words shared by many warps' atomics). Radix: a prefill beside 40
// long decode contexts, whose pool of ~4,800 pages x 4 KV heads exceeds the bound.
TEST(CudaAttentionSort, CountingAndRadixSortsMatchTheHostBackends) {
  M3SA_SKIP_WITHOUT_CUDA();
  const auto keys = [](const SyntheticBatch& sb) {
    return int64_t{sb.num_pages()} * sb.spec().kv_heads;
  };
  expect_matches_host_backends({"Counting", spec({2048}, {8192}, 0, 1, 16, 1), 16},
                               [&](const SyntheticBatch& sb) {
                                 ASSERT_LE(keys(sb), cuda::kCountingSortBins);
                                 ASSERT_GE(sb.num_tokens() * 16 / keys(sb), 256);
                               });
  expect_matches_host_backends(
      {"Radix", decode_batch_and_prefill(40, 300, 4000), 16},
      [&](const SyntheticBatch& sb) { ASSERT_GT(keys(sb), cuda::kCountingSortBins); });
}

// More (KV head, page) pairs in one pass's page-union tiles than union_values has cells
// (kUnionValueCells): the pages whose claims find no cell keep bf16 V (P's fp16 weights split in
// bf16 parts) in the same tiles as pages read in fp16. 16 requests of 256 tokens, each an even
// block shared by spans of 8 (union tiles) and an odd block of per-token selections
// (block-major), over 64-94 pages of their own, 8 KV heads in GQA groups of 2: ~9,600 pairs.
TEST(CudaAttentionUnionValues, PagesPastTheCellsKeepBf16Values) {
  M3SA_SKIP_WITHOUT_CUDA();
  std::vector<int32_t> q_lens(16, 256), seq_lens(16);
  for (int i = 0; i < 16; ++i) seq_lens[i] = 8192 + 256 * i; // prefixes of whole 256-token spans
  expect_matches_host_backends(
      {"PagesPastTheCells", spec(q_lens, seq_lens, 0, 1, 16, 8), 16, 1.f, 1.f, false, 8}, {},
      [](const SyntheticBatch& sb, const HostTensor& topk) {
        // Each request's pages are its own, so distinct (head, request, block) = (head, page).
        const TensorView v = topk.view(); // [Hkv, T, K]
        const int32_t* ids = topk.data<int32_t>();
        std::set<std::tuple<int64_t, int64_t, int32_t>> pairs;
        for (int64_t t = 0; t < sb.num_tokens(); ++t) {
          const int64_t position = sb.position(t);
          if (position < 0 || (position / kBlockTokens) % 2 != 0) continue;
          for (int64_t h = 0; h < v.shape[0]; ++h)
            for (int64_t k = 0; k < v.shape[2]; ++k) {
              const int32_t id = ids[h * v.strides[0] + t * v.strides[1] + k * v.strides[2]];
              if (id >= 0) pairs.emplace(h, sb.request_of(t), id);
            }
        }
        ASSERT_GT(static_cast<int64_t>(pairs.size()), int64_t{cuda::kUnionValueCells});
      });
}

// The split merges of an sm90 plan on short contexts, small enough for compute-sanitizer's round
// (`*Small*`): 48 pairs (five ranges a pair, merged by merge_decode_splits_kernel), with padding,
// one-token and empty ranges; and 80 pairs (three ranges, merged by the last CTA to arrive).
TEST(CudaAttentionSmall, DecodeSplitMergesMatchTheReference) {
  M3SA_SKIP_WITHOUT_CUDA();
  expect_matches_host_backends(
      {"SplitsMergedByKernel",
       spec(std::vector<int32_t>(12, 1), {1, 129, 640, 0, 2000, 300, 2100, 77, 0, 1000, 2500, 128},
            12, 1, 64, 4),
       16, 0.5f, 2.f, true});
  std::vector<int32_t> lengths(20);
  for (int i = 0; i < 20; ++i) lengths[i] = 100 + 97 * i;
  expect_matches_host_backends({"SplitsMergedByArrival",
                                spec(std::vector<int32_t>(20, 1), lengths, 20, 1, 64, 4), 16, 1.f,
                                1.f, true});
}

// More decode items than resident CTAs (320 pairs, one range each, on an H200's 264 TMA-kernel
// CTAs): a second wave of the grid, sanitizer-sized - 80 short contexts x 4 KV heads, one-token,
// empty and padding rows among them, e4m3 with scales.
TEST(CudaAttentionSmall, DecodeSecondWaveMatchesTheReference) {
  M3SA_SKIP_WITHOUT_CUDA();
  std::vector<int32_t> lengths(80);
  for (int i = 0; i < 80; ++i) lengths[i] = i % 9 == 0 ? 0 : i % 7 == 0 ? 1 : 60 + 53 * i;
  expect_matches_host_backends(
      {"SecondWaveFp8", spec(std::vector<int32_t>(80, 1), lengths, 80, 1, 64, 4, DType::fp8_e4m3),
       16, 0.5f, 2.f, true});
}

// The prefill gather (gather_selection_entries_kernel, launched directly) on one pass of every
// token: its inputs, and a host listing of what it must write - per tile of 8 tokens and KV head,
// the distinct pages (ascending) with each token's visible keys where they are at most
// min(32, 2 top_k) and no token names a page twice, else -1 and (KV head, page) entries.
struct GatherCase {
  std::vector<int32_t> cu_q_lens, seq_lens, table, topk; // topk [Hkv, T, K]
  int width, pages, kv_heads, top_k;
  int tokens() const { return cu_q_lens.back(); }
  int tiles() const { return (tokens() + 7) / 8; }
};
struct GatherItem {
  uint32_t key = 0, value = 0;
  bool live = false;
};
struct GatherListing {
  std::vector<int32_t> counts; // [Hkv * tiles]
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> lists;
  std::vector<GatherItem> items; // [Hkv, T, K]
};

GatherListing host_gather_listing(const GatherCase& c) {
  const int tokens = c.tokens(), tiles = c.tiles();
  GatherListing want;
  want.counts.resize(c.kv_heads * tiles);
  want.lists.resize(c.kv_heads * tiles);
  want.items.resize(c.kv_heads * tokens * c.top_k);
  for (int g = 0; g < c.kv_heads; ++g)
    for (int tile = 0; tile < tiles; ++tile) {
      std::map<uint32_t, uint64_t> pages;
      bool twice = false;
      for (int t = 8 * tile; t < std::min(tokens, 8 * tile + 8); ++t) {
        const int r = static_cast<int>(std::upper_bound(c.cu_q_lens.begin(), c.cu_q_lens.end(), t) -
                                       c.cu_q_lens.begin() - 1);
        const int q_len = c.cu_q_lens[r + 1] - c.cu_q_lens[r];
        const int position = c.seq_lens[r] > 0 ? c.seq_lens[r] - q_len + (t - c.cu_q_lens[r]) : -1;
        for (int k = 0; k < c.top_k; ++k) {
          const int block = c.topk[(g * tokens + t) * c.top_k + k];
          if (block < 0 || position < 0 || block > position / 128) continue;
          const int page = c.table[r * c.width + block];
          if (page >= c.pages) continue;
          const int visible = std::min(128, position - block * 128 + 1);
          uint64_t& bytes = pages[static_cast<uint32_t>(page)];
          twice |= (bytes >> (8 * (t % 8)) & 255) != 0;
          bytes |= uint64_t(visible) << (8 * (t % 8));
          GatherItem& item = want.items[(g * tokens + t) * c.top_k + k];
          item.key = static_cast<uint32_t>(g * c.pages + page);
          item.value = (static_cast<uint32_t>(t) << 13) | (k << 8) | (visible - 1);
          item.live = true;
        }
      }
      const bool listed = !twice && static_cast<int>(pages.size()) <= std::min(32, 2 * c.top_k);
      want.counts[g * tiles + tile] = listed ? static_cast<int>(pages.size()) : -1;
      if (listed) want.lists[g * tiles + tile].assign(pages.begin(), pages.end());
    }
  return want;
}

// Runs the gather with union lists and without (then every tile's entries are keyed) on poisoned
// outputs and checks lists, counts, entries, the error flag and the block-major flag against the
// host listing; then the counting sort on its entries: the live entries' number, each exactly
// once, keys ascending, and within a key each token's first entry in token order (stable, as
// CUB's) before the repeats.
void expect_gather_matches(const GatherCase& c, const GatherListing& want, int32_t want_flag) {
  using cuda::kCompactPartialBytes, cuda::kUnionPages;
  const int tokens = c.tokens(), tiles = c.tiles();
  uint32_t sentinel = 1;
  while (sentinel <= static_cast<uint32_t>(c.kv_heads * c.pages)) sentinel = 2 * sentinel + 1;
  const auto upload = [](const std::vector<int32_t>& v) {
    DeviceBuffer d(v.size() * 4);
    EXPECT_TRUE(d.upload(v.data(), v.size() * 4).ok());
    return d;
  };
  DeviceBuffer d_cu = upload(c.cu_q_lens), d_seq = upload(c.seq_lens), d_table = upload(c.table),
               d_topk = upload(c.topk), d_flags = upload({0});
  const int entries = c.kv_heads * tokens * c.top_k;
  const int key_space = c.kv_heads * c.pages;
  const int token_words = static_cast<int>(cuda::token_bitmap_words(tokens));
  const int zeroed_words =
      static_cast<int>(cuda::counting_zeroed_words(key_space, key_space * token_words));
  DeviceBuffer d_keys(entries * 4), d_values(entries * 4), d_sorted_keys(entries * 4),
      d_sorted_values(entries * 4), d_zeroed(zeroed_words * 4),
      d_ranks(key_space * token_words * 4), d_totals(key_space * 4), d_live(4),
      d_partials(static_cast<size_t>(entries) * kCompactPartialBytes),
      d_counts(c.kv_heads * tiles * 4), d_pages(c.kv_heads * tiles * kUnionPages * 4),
      d_visible(c.kv_heads * tiles * kUnionPages * 8),
      d_listed(c.kv_heads * tiles * kUnionPages * 4);
  for (bool unions : {true, false}) {
    SCOPED_TRACE(unions ? "with union lists" : "without");
    for (const DeviceBuffer* b :
         {&d_keys, &d_values, &d_counts, &d_pages, &d_visible, &d_flags, &d_zeroed, &d_ranks,
          &d_totals, &d_sorted_keys, &d_sorted_values, &d_live, &d_listed})
      ASSERT_TRUE(b->fill(b == &d_flags || b == &d_zeroed ? 0 : 0xcd).ok());
    cuda::SparseAttentionParams p{};
    p.num_pages = c.pages;
    p.topk = d_topk.data_as<const int32_t>();
    p.topk_stride_head = tokens * c.top_k, p.topk_stride_token = c.top_k, p.topk_stride_k = 1;
    p.cu_q_lens = d_cu.data_as<const int32_t>(), p.seq_lens = d_seq.data_as<const int32_t>();
    p.block_table = d_table.data_as<const int32_t>();
    p.block_table_stride = c.width, p.block_table_width = c.width;
    p.num_requests = static_cast<int32_t>(c.seq_lens.size()), p.token_begin = 0,
    p.token_end = tokens;
    p.kv_heads = c.kv_heads, p.group = 16, p.top_k = c.top_k;
    p.error_flags = d_flags.data_as<int32_t>();
    p.entry_keys = d_keys.data_as<uint32_t>(), p.entry_values = d_values.data_as<uint32_t>();
    p.entry_count = entries, p.entry_sentinel = sentinel;
    p.prefill_partials = d_partials.data_as<unsigned char>();
    if (unions) {
      p.union_counts = d_counts.data_as<int32_t>(), p.union_pages = d_pages.data_as<uint32_t>();
      p.union_visible = d_visible.data_as<uint64_t>();
    }
    p.key_space = key_space, p.token_words = token_words;
    p.key_repeats = d_zeroed.data_as<uint32_t>(), p.key_tokens = p.key_repeats + 2 * key_space;
    p.key_token_ranks = d_ranks.data_as<uint32_t>(), p.key_totals = d_totals.data_as<uint32_t>();
    if (unions) {
      p.block_major_flag = p.key_tokens + key_space * token_words;
      p.union_queue = p.block_major_flag + 1, p.union_listed = d_listed.data_as<uint32_t>();
    }
    p.live_entries = d_live.data_as<int32_t>();
    M3SA_CUDA_ASSERT(cuda::launch_gather_selection_entries(p, 1, nullptr));
    // Two scatter CTAs, each scanning the totals on its own.
    M3SA_CUDA_ASSERT(cuda::sort_selection_entries_by_counting(
        p, d_sorted_keys.data_as<uint32_t>(), d_sorted_values.data_as<uint32_t>(), 2, nullptr));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint32_t> sorted_keys(entries), sorted_values(entries);
    int32_t live = -1;
    std::vector<uint32_t> zeroed(zeroed_words);
    ASSERT_TRUE(d_zeroed.download(zeroed.data(), zeroed.size() * 4).ok());
    // The block-major flag: set where the gather lists unions and sent a tile block-major.
    const bool block_major = std::count(want.counts.begin(), want.counts.end(), -1) > 0;
    const size_t flag = zeroed.size() - 1 - cuda::kUnionQueueWords;
    EXPECT_EQ(zeroed[flag], unions && block_major ? 1u : 0u);
    // The union queue: every listed tile appended once to its size's bucket, none claimed.
    const uint32_t* const queue = zeroed.data() + flag + 1;
    std::vector<uint32_t> listed(c.kv_heads * tiles * kUnionPages);
    ASSERT_TRUE(d_listed.download(listed.data(), listed.size() * 4).ok());
    for (int bucket = 0; bucket < kUnionPages; ++bucket) {
      SCOPED_TRACE("bucket " + std::to_string(bucket));
      std::vector<uint32_t> want_listed;
      for (int i = 0; unions && i < static_cast<int>(want.counts.size()); ++i)
        if (want.counts[i] >= 0 && cuda::union_size_bucket(want.counts[i]) == bucket)
          want_listed.push_back(static_cast<uint32_t>(i));
      ASSERT_EQ(queue[bucket], static_cast<uint32_t>(want_listed.size()));
      const auto begin = listed.begin() + int64_t{bucket} * c.kv_heads * tiles;
      std::vector<uint32_t> got(begin, begin + static_cast<int64_t>(want_listed.size()));
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want_listed);
    }
    EXPECT_EQ(queue[kUnionPages], 0u);
    ASSERT_TRUE(d_sorted_keys.download(sorted_keys.data(), entries * 4).ok());
    ASSERT_TRUE(d_sorted_values.download(sorted_values.data(), entries * 4).ok());
    ASSERT_TRUE(d_live.download(&live, 4).ok());
    // Per key: its tokens in order (each once) and its entries.
    std::map<uint32_t, std::vector<int>> key_tokens;
    std::vector<std::pair<uint32_t, uint32_t>> keyed, placed;
    for (int g = 0; g < c.kv_heads; ++g)
      for (int t = 0; t < tokens; ++t)
        for (int k = 0; k < c.top_k; ++k) {
          const GatherItem& item = want.items[(g * tokens + t) * c.top_k + k];
          if (!item.live || (unions && want.counts[g * tiles + t / 8] >= 0)) continue;
          std::vector<int>& in_order = key_tokens[item.key];
          if (in_order.empty() || in_order.back() != t) in_order.push_back(t);
          keyed.emplace_back(item.key, item.value);
        }
    ASSERT_EQ(live, static_cast<int32_t>(keyed.size()));
    for (int i = 0; i < live; ++i) placed.emplace_back(sorted_keys[i], sorted_values[i]);
    for (int i = 0; i < live;) { // a key's range: its tokens' first entries, then the repeats
      const uint32_t key = sorted_keys[i];
      if (i > 0) {
        EXPECT_LT(sorted_keys[i - 1], key) << i;
      }
      const std::vector<int>& in_order = key_tokens[key];
      for (size_t r = 0; r < in_order.size() && i + static_cast<int>(r) < live; ++r)
        EXPECT_EQ(sorted_values[i + r] >> 13, static_cast<uint32_t>(in_order[r]))
            << "key " << key << " rank " << r;
      while (i < live && sorted_keys[i] == key) ++i;
    }
    std::sort(keyed.begin(), keyed.end());
    std::sort(placed.begin(), placed.end());
    EXPECT_EQ(placed, keyed);
    std::vector<int32_t> counts(c.kv_heads * tiles), flags(1);
    std::vector<uint32_t> keys(entries), values(entries), pages(c.kv_heads * tiles * kUnionPages);
    std::vector<uint64_t> visible(c.kv_heads * tiles * kUnionPages);
    ASSERT_TRUE(d_flags.download(flags.data(), 4).ok());
    ASSERT_TRUE(d_keys.download(keys.data(), entries * 4).ok());
    ASSERT_TRUE(d_values.download(values.data(), entries * 4).ok());
    ASSERT_TRUE(d_counts.download(counts.data(), counts.size() * 4).ok());
    ASSERT_TRUE(d_pages.download(pages.data(), pages.size() * 4).ok());
    ASSERT_TRUE(d_visible.download(visible.data(), visible.size() * 8).ok());
    EXPECT_EQ(flags[0], want_flag);
    for (int g = 0; g < c.kv_heads; ++g)
      for (int tile = 0; tile < tiles; ++tile) {
        const int i = g * tiles + tile, count = unions ? want.counts[i] : -1;
        if (unions) {
          EXPECT_EQ(counts[i], count) << "head " << g << " tile " << tile;
        }
        for (int k = 0; unions && k < count; ++k) {
          EXPECT_EQ(pages[i * kUnionPages + k], want.lists[i][k].first) << g << " " << tile;
          EXPECT_EQ(visible[i * kUnionPages + k], want.lists[i][k].second) << g << " " << tile;
        }
        // Entries: keyed where the tile goes block-major, sentinels where it is listed.
        for (int t = 8 * tile; t < std::min(tokens, 8 * tile + 8); ++t)
          for (int k = 0; k < c.top_k; ++k) {
            const int e = (g * tokens + t) * c.top_k + k;
            const GatherItem& item = want.items[e];
            if (count < 0 && item.live) { // a token's repeated page flagged for the sort
              EXPECT_EQ(keys[e] & ~cuda::kRepeatedEntry, item.key) << g << " " << t << " " << k;
              EXPECT_EQ(values[e], item.value) << g << " " << t << " " << k;
            } else {
              EXPECT_EQ(keys[e], sentinel) << g << " " << t << " " << k;
            }
          }
      }
  }
}

// Lists and entries on a hand-made pass: tiles across requests and padding rows, a page named
// twice, too many pages, and bad page ids flagged and left out.
TEST(CudaAttentionSmall, PrefillGatherListsPageUnions) {
  constexpr int kHkv = 2, kTopK = 4, kWidth = 16, kTokens = 36;
  GatherCase c{{0, 20, 33, 36},
               {300, 2000, 0},
               std::vector<int32_t>(3 * kWidth, 0),
               std::vector<int32_t>(kHkv * kTokens * kTopK, -1),
               kWidth,
               64,
               kHkv,
               kTopK};
  // r0: 20 tokens at positions 280..299 (own block 2); r1: 13 at 1987..1999 (own block 15);
  // r2: 3 padding rows. Tile 2 spans r0 and r1, tile 4 r1 and r2.
  for (int b = 0; b < 3; ++b) c.table[0 * kWidth + b] = 10 + b;
  for (int b = 0; b < kWidth; ++b) c.table[1 * kWidth + b] = 20 + b;
  c.table[1 * kWidth + 5] = 20;  // blocks 0 and 5 of r1 share a page
  c.table[1 * kWidth + 7] = 999; // out of range: flagged, never listed
  const auto select = [&](int g, int t, std::vector<int32_t> blocks) {
    for (int k = 0; k < static_cast<int>(blocks.size()); ++k)
      c.topk[(g * kTokens + t) * kTopK + k] = blocks[k];
  };
  for (int t = 0; t < 20; ++t) select(0, t, {0, 1, 2}), select(1, t, {2});
  for (int i = 0; i < 13; ++i) {
    const int t = 20 + i;
    if (i < 4)
      select(0, t, {12, 13, 14, 15});
    else if (i < 12) { // tile 3: nine distinct blocks (block 7's page out of range)
      std::vector<int32_t> b = {i, i + 1, 9 + i % 3, 15};
      std::sort(b.begin(), b.end());
      b.erase(std::unique(b.begin(), b.end()), b.end());
      select(0, t, b);
    } else
      select(0, t, {0, 5, 15}); // two slots, one page
    select(1, t, {3, 15});
  }
  for (int t = 33; t < 36; ++t) select(0, t, {0}), select(1, t, {0});

  const GatherListing want = host_gather_listing(c);
  ASSERT_TRUE(std::count(want.counts.begin(), want.counts.end(), -1) > 0 &&
              std::count(want.counts.begin(), want.counts.end(), -1) < c.kv_heads * c.tiles())
      << "the case covers both outcomes";
  EXPECT_EQ(want.counts[0 * c.tiles() + 3], -1) << "nine pages";
  EXPECT_EQ(want.counts[0 * c.tiles() + 4], -1) << "a page named twice";
  EXPECT_EQ(want.counts[0 * c.tiles() + 2], 7) << "a tile across two requests";
  M3SA_SKIP_WITHOUT_CUDA(); // the case's own checks above run everywhere
  expect_gather_matches(c, want, cuda::kPageOutOfRange);
}

// A pass whose every tile is listed (structured selections): the gather leaves the block-major
// flag clear, and the rank and scatter steps return at once with no live entry.
TEST(CudaAttentionSmall, PrefillGatherEveryTileListed) {
  constexpr int kHkv = 2, kTopK = 4, kWidth = 8, kTokens = 20;
  GatherCase c{{0, 20},
               {700},
               std::vector<int32_t>(kWidth, 0),
               std::vector<int32_t>(kHkv * kTokens * kTopK, -1),
               kWidth,
               16,
               kHkv,
               kTopK};
  for (int b = 0; b < 6; ++b) c.table[b] = 9 - b;
  // Positions 680..699 (own block 5); head 0 every block but 1, head 1 the last four.
  for (int t = 0; t < kTokens; ++t)
    for (int k = 0; k < kTopK; ++k) {
      c.topk[(0 * kTokens + t) * kTopK + k] = std::vector<int32_t>{0, 2, 4, 5}[k];
      c.topk[(1 * kTokens + t) * kTopK + k] = 2 + k;
    }
  const GatherListing want = host_gather_listing(c);
  ASSERT_EQ(std::count(want.counts.begin(), want.counts.end(), -1), 0) << "every tile listed";
  M3SA_SKIP_WITHOUT_CUDA(); // the case's own check above runs everywhere
  expect_gather_matches(c, want, 0);
}

// Unions at the limit of top_k 16 (32 pages): tiles of 31, 32, 33, 40 and 64 distinct pages,
// listed up to 32 and block-major above. The gather first bounds a union from below by its pages'
// distinct hashes (cuda::union_page_hash) and skips the listing above the limit: request 0's
// pages have distinct hashes, so its tiles over 32 pages stop at the bound; request 1's share 8
// hash values, so its tiles over 32 pages reach -1 by the listing itself. Both must agree with
// the host listing.
TEST(CudaAttentionSmall, PrefillGatherUnionsAtTheLimit) {
  constexpr int kTopK = 16, kWidth = 64, kPages = 4096;
  const std::vector<int> distinct = {31, 32, 33, 40, 64}; // a tile each, in both requests
  const int per_request = 8 * static_cast<int>(distinct.size());
  GatherCase c{{0, per_request, 2 * per_request},
               {kWidth * 128, kWidth * 128},
               std::vector<int32_t>(2 * kWidth),
               std::vector<int32_t>(2 * per_request * kTopK, -1),
               kWidth,
               kPages,
               1,
               kTopK};
  const auto hash = [](int page) { return static_cast<int>(cuda::union_page_hash(page)); };
  // Request 0: 64 pages with 64 distinct hashes (the bound is the union's size); request 1: 64
  // pages on 8 hash values, 8 each (the bound is at most 8).
  std::vector<int> first_of(64, 0), per_hash(64, 0);
  int spread = 0, shared = 0;
  for (int page = 1; page < kPages && (spread < 64 || shared < 64); ++page) {
    const int h = hash(page);
    if (first_of[h] == 0 && spread < 64)
      first_of[h] = page, c.table[spread++] = page;
    else if (page >= 2048 && h < 8 && per_hash[h] < 8 && shared < 64)
      ++per_hash[h], c.table[kWidth + shared++] = page;
  }
  ASSERT_TRUE(spread == 64 && shared == 64);
  for (int r = 0; r < 2; ++r)
    for (int tile = 0; tile < static_cast<int>(distinct.size()); ++tile) {
      // The tile's blocks: `d` of the 64 (all visible: the tokens sit in the last block), token
      // k taking 16 consecutive of them (mod d), so that the 8 tokens name every one.
      const int d = distinct[tile];
      for (int k = 0; k < 8; ++k) {
        std::vector<int32_t> blocks;
        for (int i = 0; i < kTopK; ++i) blocks.push_back((k * kTopK + i) % d * kWidth / d);
        std::sort(blocks.begin(), blocks.end());
        const int t = r * per_request + 8 * tile + k;
        std::copy(blocks.begin(), blocks.end(), c.topk.begin() + t * kTopK);
      }
    }
  const GatherListing want = host_gather_listing(c);
  for (int r = 0; r < 2; ++r)
    for (int tile = 0; tile < static_cast<int>(distinct.size()); ++tile)
      EXPECT_EQ(want.counts[r * static_cast<int>(distinct.size()) + tile],
                distinct[tile] <= 32 ? distinct[tile] : -1)
          << "request " << r << " tile " << tile;
  M3SA_SKIP_WITHOUT_CUDA(); // the case's own checks above run everywhere
  expect_gather_matches(c, want, 0);
}

// A batch and its device copies, reused by the tests below.
struct Fixture {
  SyntheticBatch sb;
  MsaConfig config;
  HostTensor topk;
  Fixture(BatchSpec s, int top_k, uint64_t seed)
      : sb((s.seed = seed, s)), config(attention_config(s, top_k)),
        topk(indexer_selections(sb, config, seed + 1)) {
    sb.fill_attention_random(seed + 2);
  }
};

// On Hopper the decode kernel's splits merge in clusters (sparse_attention_decode.cuh): every
// cluster size the plan may pick (2..16 CTAs) fits the device, larger clusters no more often than
// smaller ones, and sizes outside 2..16 are refused. The counts pick the plan's split count
// (attention.cu decode_splits); printed for bench/NOTES.md.
TEST(CudaAttentionSmall, DecodeClustersFitOnHopper) {
  M3SA_SKIP_WITHOUT_CUDA();
  int major = 0;
  M3SA_CUDA_ASSERT(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) GTEST_SKIP() << "clusters of the decode kernel are compiled for SM90";
  int previous = 1 << 30;
  for (int cluster = 2; cluster <= 16; cluster *= 2) {
    const int bf16 = cuda::sparse_attention_decode_bf16_active_clusters(cluster);
    const int fp8 = cuda::sparse_attention_decode_fp8_active_clusters(cluster);
    std::printf("  decode clusters of %2d CTAs held at once: bf16 %d, fp8 %d\n", cluster, bf16,
                fp8);
    EXPECT_GE(std::min(bf16, fp8), 1) << cluster;
    EXPECT_LE(std::min(bf16, fp8), previous) << cluster;
    previous = std::min(bf16, fp8);
  }
  for (int cluster : {0, 1, 32}) {
    EXPECT_EQ(cuda::sparse_attention_decode_bf16_active_clusters(cluster), 0) << cluster;
    EXPECT_EQ(cuda::sparse_attention_decode_fp8_active_clusters(cluster), 0) << cluster;
  }
}

// vLLM keeps K and V of a token side by side ([pages, Hkv, 128, 2 * 128]): two strided views of
// that buffer give what the separate caches give.
void expect_combined_views_match(const BatchSpec& batch) {
  Fixture f(batch, 16, test_seed());
  const SyntheticBatch& sb = f.sb;
  const int64_t pages = sb.k_cache.view().shape[0], hkv = sb.spec().kv_heads;
  HostTensor combined(DType::bf16, {pages, hkv, kBlockTokens, 2 * kHeadDim});
  for (int64_t p = 0; p < pages; ++p)
    for (int64_t j = 0; j < kBlockTokens; ++j)
      for (int64_t g = 0; g < hkv; ++g)
        for (int64_t half = 0; half < 2; ++half)
          std::memcpy(combined.data<uint16_t>() + ((p * hkv + g) * kBlockTokens + j) * 256 +
                          half * 128,
                      (half ? sb.v_cache : sb.k_cache).data<uint16_t>() +
                          ((p * kBlockTokens + j) * hkv + g) * kHeadDim,
                      kHeadDim * 2);
  DeviceAttention d(sb, f.topk);
  DeviceBuffer d_combined(combined);
  SparseAttentionArgs args = d.args(1.f, 1.f);
  for (int half = 0; half < 2; ++half) {
    TensorView v = d_combined.view();
    v.rank = 4;
    v.shape[0] = pages, v.shape[1] = kBlockTokens, v.shape[2] = hkv, v.shape[3] = kHeadDim;
    v.strides[0] = hkv * kBlockTokens * 256, v.strides[1] = 256, v.strides[2] = kBlockTokens * 256;
    v.strides[3] = 1;
    v.data = static_cast<uint16_t*>(v.data) + half * kHeadDim;
    (half ? args.v_cache : args.k_cache) = v;
  }
  const HostAttention cpu = host_attention(Backend::cpu, f.config, sb, f.topk, 1.f, 1.f);
  for (const char* arch : kArchs) {
    SCOPED_TRACE(arch);
    CudaRun run;
    if (!attention_run(arch, f.config, sb, &run)) continue;
    M3SA_ASSERT_OK(d.out.fill(0xff));
    M3SA_ASSERT_OK(sparse_attention(run.plan, args, run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(device_flags(run), 0);
    expect_close(cpu, d.out.download(), d.lse.download(), "cpu");
  }
}
TEST(CudaAttentionLayouts, CombinedKvCacheViews) {
  M3SA_SKIP_WITHOUT_CUDA();
  expect_combined_views_match(spec({1, 1, 150}, {3000, 700, 1500}, 2, 1, 64, 4));
  expect_combined_views_match(decode_batch_and_prefill(12, 150, 1500));
  expect_combined_views_match(decode_batch_and_prefill(40, 150, 1500));
}

// Rows whose selection is empty attend to nothing: zeros and lse -inf, never NaN.
TEST(CudaAttentionSmall, EmptySelectionsGiveZerosAndMinusInfinity) {
  M3SA_SKIP_WITHOUT_CUDA();
  Fixture f(spec({1, 1, 40}, {2000, 300, 900}, 2, 1, 16, 1), 16, test_seed());
  for (int64_t t : {int64_t{0}, int64_t{5}})
    for (int k = 0; k < 16; ++k) f.topk.data<int32_t>()[t * 16 + k] = -1;
  const HostAttention cpu = host_attention(Backend::cpu, f.config, f.sb, f.topk, 1.f, 1.f);
  for (const char* arch : kArchs) {
    SCOPED_TRACE(arch);
    DeviceAttention d(f.sb, f.topk);
    CudaRun run;
    if (!attention_run(arch, f.config, f.sb, &run)) continue;
    M3SA_ASSERT_OK(sparse_attention(run.plan, d.args(1.f, 1.f), run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(device_flags(run), 0);
    const HostTensor out = d.out.download(), lse = d.lse.download();
    for (int64_t t : {int64_t{0}, int64_t{5}})
      for (int h = 0; h < 16; ++h) {
        EXPECT_EQ(lse.data<float>()[t * 16 + h], -INFINITY) << t << " " << h;
        for (int i = 0; i < kHeadDim; ++i)
          ASSERT_EQ(out.data<uint16_t>()[(t * 16 + h) * kHeadDim + i], 0) << t << " " << h;
      }
    expect_close(cpu, out, lse, "cpu");
  }
}

// Split merges sum in a fixed order: repeated runs are bitwise identical.
TEST(CudaAttentionLayouts, TwentyRunsBitwiseIdentical) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (const BatchSpec& batch :
       {spec({1, 1, 1, 300}, {9000, 40000, 128, 5000}, 3, 1, 64, 4),
        decode_batch_and_prefill(12, 300, 5000), decode_batch_and_prefill(40, 300, 5000)}) {
    Fixture f(batch, 16, test_seed());
    for (const char* arch : kArchs) {
      SCOPED_TRACE(arch);
      DeviceAttention d(f.sb, f.topk);
      CudaRun run;
      if (!attention_run(arch, f.config, f.sb, &run)) continue;
      HostTensor first_out, first_lse;
      for (int i = 0; i < 20; ++i) {
        M3SA_ASSERT_OK(d.out.fill(0xff));
        M3SA_ASSERT_OK(sparse_attention(run.plan, d.args(1.f, 1.f), run.workspace.workspace()));
        M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
        if (i == 0) {
          first_out = d.out.download(), first_lse = d.lse.download();
          continue;
        }
        ASSERT_TRUE(same_bytes(first_out, d.out.download())) << "run " << i;
        ASSERT_TRUE(same_bytes(first_lse, d.lse.download())) << "run " << i;
      }
      EXPECT_EQ(device_flags(run), 0);
    }
  }
}

// Captured once, replayed after q, the selections, the lengths, the block tables and the caches
// were rewritten in place: the replay equals an eager run on the new data. With
// `share_on_replay`, the new selections are shared within even position blocks, so prefill tiles
// that went block-major in the captured run become page-union tiles on replay (the sm90 plan
// decides per tile on the device).
void expect_graph_replay_matches_eager(const char* arch, const BatchSpec& s,
                                       bool share_on_replay = false) {
  SCOPED_TRACE(arch);
  const uint64_t seed = test_seed();
  Fixture f(s, 16, seed), g(s, 16, seed + 100);
  DeviceAttention d(f.sb, f.topk);
  CudaRun run;
  if (!attention_run(arch, f.config, f.sb, &run)) return;
  cudaStream_t stream;
  M3SA_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  M3SA_CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  M3SA_ASSERT_OK(
      sparse_attention(run.plan, d.args(1.f, 1.f), run.workspace.workspace(), {0, stream}));
  M3SA_CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  M3SA_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  // Same shapes (the same spec), new values: the page shuffle of seed + 100 differs too, and
  // request 1 is 999 tokens shorter (its selection recomputed for the new position).
  g.sb.seq_lens.data<int32_t>()[1] -= 999;
  M3SA_ASSERT_OK(run_index_topk(g.config, g.sb, {Backend::cpu}, &g.topk));
  if (share_on_replay) share_selections_within_even_blocks(g.sb, kBlockTokens, g.topk);
  M3SA_ASSERT_OK(d.seq_lens.upload(g.sb.seq_lens));
  M3SA_ASSERT_OK(d.q.upload(g.sb.q));
  M3SA_ASSERT_OK(d.k_cache.upload(g.sb.k_cache));
  M3SA_ASSERT_OK(d.v_cache.upload(g.sb.v_cache));
  M3SA_ASSERT_OK(d.topk.upload(g.topk));
  M3SA_ASSERT_OK(d.block_table.upload(g.sb.block_table));
  M3SA_ASSERT_OK(d.kv_block_table.upload(g.sb.kv_block_table));
  M3SA_ASSERT_OK(d.out.fill(0xff));
  M3SA_ASSERT_OK(d.lse.fill(0xff));
  M3SA_CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  const HostTensor replay_out = d.out.download(), replay_lse = d.lse.download();
  M3SA_ASSERT_OK(d.out.fill(0xff));
  M3SA_ASSERT_OK(d.lse.fill(0xff));
  M3SA_ASSERT_OK(
      sparse_attention(run.plan, d.args(1.f, 1.f), run.workspace.workspace(), {0, stream}));
  M3SA_CUDA_ASSERT(cudaStreamSynchronize(stream));
  EXPECT_TRUE(same_bytes(replay_out, d.out.download()));
  EXPECT_TRUE(same_bytes(replay_lse, d.lse.download()));
  expect_close(host_attention(Backend::cpu, g.config, g.sb, g.topk, 1.f, 1.f), replay_out,
               replay_lse, "cpu");
  EXPECT_EQ(device_flags(run), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}
TEST(CudaAttentionLayouts, GraphReplayOnRewrittenInputsMatchesEager) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (const char* arch : kArchs) {
    expect_graph_replay_matches_eager(
        arch, spec({1, 1, 1, 1, 100}, {3000, 12000, 640, 1, 2500}, 4, 1, 64, 4));
    expect_graph_replay_matches_eager(arch, decode_batch_and_prefill(12, 100, 2500));
    expect_graph_replay_matches_eager(arch, spec({1, 300}, {5000, 20000}, 1, 1, 64, 4), true);
  }
}

// A page id out of range in the KV block table is flagged and never read (compute-sanitizer runs
// this case); the other rows are still right.
TEST(CudaAttentionSmall, BadPageIdsAreFlaggedNotRead) {
  M3SA_SKIP_WITHOUT_CUDA();
  Fixture f(spec({1, 1}, {2000, 700}, 2, 1, 16, 1), 16, test_seed());
  const HostAttention expected = host_attention(Backend::cpu, f.config, f.sb, f.topk, 1.f, 1.f);
  for (const char* arch : kArchs) {
    SCOPED_TRACE(arch);
    DeviceAttention d(f.sb, f.topk);
    HostTensor bad_table = d.kv_block_table.download();
    bad_table.data<int32_t>()[0] = 1 << 30; // request 0, block 0: selected whenever n <= K
    M3SA_ASSERT_OK(d.kv_block_table.upload(bad_table));
    CudaRun run;
    if (!attention_run(arch, f.config, f.sb, &run)) continue;
    M3SA_ASSERT_OK(sparse_attention(run.plan, d.args(1.f, 1.f), run.workspace.workspace()));
    M3SA_CUDA_ASSERT(cudaDeviceSynchronize());
    EXPECT_EQ(device_flags(run) & 1, 1);
    const HostTensor out = d.out.download();
    for (int i = 16 * kHeadDim; i < 32 * kHeadDim; ++i) // request 1 (token 1) is untouched
      ASSERT_NEAR(load(DType::bf16, out.view().data, i),
                  load(DType::bf16, expected.out.view().data, i), 1e-2)
          << i;
  }
}

} // namespace
} // namespace m3sa::testing
