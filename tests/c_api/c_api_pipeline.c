/* The C API from C (C11, -pedantic -Werror), linked against the shared library libm3sa_c alone:
 * one MSA layer's index branch and attention on the CPU backend, checked against the reference
 * backend through the same API, then the error paths a C caller meets. Exit status 0 when every
 * check holds; each failure prints what differed.
 *
 * The index keys and queries are small integers, exact in bf16 with every dot product exact in
 * fp32, so the block scores are exact integers (ties broken by the contract's rule, the lower
 * block first): the CPU backend and the reference must select identical blocks, and this file
 * works out one row's selection itself. The attention outputs are compared with the contract's
 * bound for another fp32 order (relative L2 <= 1e-3). */
#include <m3sa/c_api.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  kRequests = 3,
  kDecode = 2,
  kPrefillTokens = 40,
  kTokens = kDecode + kPrefillTokens,
  kIndexHeads = 2,
  kKvHeads = 2,
  kQHeads = 8,
  kTopK = 4,
  kWidth = 12, /* block-table width: 12 blocks = 1536 tokens */
  kPages = kRequests * kWidth,
  kDim = 128,
  kPage = 128
};

static int failures = 0;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      ++failures;                                                                                  \
      printf("FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);                                     \
      printf(__VA_ARGS__);                                                                         \
      printf("\n");                                                                                \
    }                                                                                              \
  } while (0)
#define CHECK_OK(expr)                                                                             \
  do {                                                                                             \
    const m3sa_status status_ = (expr);                                                            \
    CHECK(status_ == M3SA_OK, "%s", m3sa_last_error_message());                                    \
  } while (0)

static m3sa_tensor_view view(void* data, int32_t dtype, int32_t rank, const int64_t* shape) {
  m3sa_tensor_view v;
  const m3sa_status status = m3sa_tensor_view_contiguous(data, dtype, rank, shape, &v);
  CHECK(status == M3SA_OK, "view: %s", m3sa_last_error_message());
  return v;
}

static uint64_t rng_state = 12345;
static uint32_t next_random(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng_state >> 33);
}

/* A plan and its workspace (64-byte aligned, as m3sa asks). */
typedef struct planned {
  m3sa_plan plan;
  void* memory;
  m3sa_workspace workspace;
} planned;

static planned plan_op(int32_t op, int32_t backend, const m3sa_config* config, int64_t tokens) {
  planned p;
  memset(&p, 0, sizeof p);
  m3sa_plan_request request;
  m3sa_plan_request_init(&request);
  request.op = op;
  request.backend = backend;
  request.config = *config;
  request.capacities.max_requests = kRequests;
  request.capacities.max_tokens = tokens;
  request.capacities.max_blocks_per_request = kWidth;
  request.num_threads = 2;
  CHECK_OK(m3sa_make_plan(&request, &p.plan));
  const size_t bytes = (size_t)p.plan.workspace_bytes;
  p.memory = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  p.workspace.data = p.memory;
  p.workspace.bytes = bytes;
  CHECK_OK(m3sa_prepare_workspace(&p.plan, p.workspace, NULL));
  return p;
}

int main(void) {
  printf("m3sa %s (C API %d, built from %s) from C\n", m3sa_version_string(),
         (int)m3sa_c_api_version(), m3sa_build_commit());
  CHECK(m3sa_c_api_version() == M3SA_C_API_VERSION, "library %d, header %d",
        (int)m3sa_c_api_version(), M3SA_C_API_VERSION);

  m3sa_config config;
  m3sa_config_init(&config);
  config.top_k = kTopK;
  config.num_index_heads = kIndexHeads;

  /* Batch: two decode requests (1300 and 700 tokens), then a 40-token prefill chunk after a
   * 1000-token prefix. Pages shuffled over the requests. */
  int32_t cu_q_lens[kRequests + 1] = {0, 1, 2, kTokens};
  int32_t seq_lens[kRequests] = {1300, 700, 1040};
  int32_t block_table[kRequests * kWidth];
  for (int i = 0; i < kPages; ++i) block_table[i] = (i * 7) % kPages;
  const int64_t requests_shape[1] = {kRequests};
  const int64_t cu_shape[1] = {kRequests + 1};
  const int64_t table_shape[2] = {kRequests, kWidth};
  m3sa_batch batch;
  batch.cu_q_lens = view(cu_q_lens, M3SA_DTYPE_I32, 1, cu_shape);
  batch.seq_lens = view(seq_lens, M3SA_DTYPE_I32, 1, requests_shape);
  batch.block_table = view(block_table, M3SA_DTYPE_I32, 2, table_shape);
  batch.num_requests = kRequests;
  batch.num_decode_requests = kDecode;
  batch.decode_q_len = 1;
  batch.num_tokens = kTokens;

  /* Index-K rows of every request's tokens, inserted through insert_index_k: block b's keys are
   * (b mod 7) - 3 plus a per-dim integer in {-1, 0, 1}. */
  uint16_t* index_cache = malloc(sizeof(uint16_t) * kPages * kPage * kDim);
  float* request0_keys = NULL; /* kept for the selection worked out below */
  memset(index_cache, 0, sizeof(uint16_t) * kPages * kPage * kDim);
  {
    planned insert = plan_op(M3SA_OP_INSERT_INDEX_K, M3SA_BACKEND_CPU, &config, 2048);
    for (int r = 0; r < kRequests; ++r) {
      const int64_t rows = seq_lens[r];
      float* keys = malloc(sizeof(float) * (size_t)rows * kDim);
      int64_t* slots = malloc(sizeof(int64_t) * (size_t)rows);
      for (int64_t j = 0; j < rows; ++j) {
        const int block = (int)(j / kPage);
        slots[j] = (int64_t)block_table[r * kWidth + block] * kPage + j % kPage;
        for (int d = 0; d < kDim; ++d)
          keys[j * kDim + d] = (float)((block * (r + 2)) % 7 - 3 + (int)(next_random() % 3) - 1);
      }
      const int64_t key_shape[2] = {rows, kDim};
      const int64_t cache_shape[3] = {kPages, kPage, kDim};
      m3sa_insert_index_k_args args;
      args.index_k = view(keys, M3SA_DTYPE_F32, 2, key_shape);
      args.slot_mapping = view(slots, M3SA_DTYPE_I64, 1, &key_shape[0]);
      args.index_k_cache = view(index_cache, M3SA_DTYPE_BF16, 3, cache_shape);
      CHECK_OK(m3sa_insert_index_k(&insert.plan, &args, insert.workspace, NULL));
      if (r == 0)
        request0_keys = keys;
      else
        free(keys);
      free(slots);
    }
    free(insert.memory);
  }

  /* index_topk on the CPU backend and on the reference: identical selections. */
  uint16_t index_q[kTokens * kIndexHeads * kDim];
  for (int i = 0; i < kTokens * kIndexHeads * kDim; ++i)
    index_q[i] = m3sa_float_to_bf16_bits((float)((int)(next_random() % 3) - 1));
  int32_t topk[2][kIndexHeads * kTokens * kTopK];
  const int32_t backends[2] = {M3SA_BACKEND_CPU, M3SA_BACKEND_REFERENCE};
  const int64_t q_shape[3] = {kTokens, kIndexHeads, kDim};
  const int64_t cache_shape[3] = {kPages, kPage, kDim};
  const int64_t topk_shape[3] = {kIndexHeads, kTokens, kTopK};
  for (int b = 0; b < 2; ++b) {
    planned p = plan_op(M3SA_OP_INDEX_TOPK, backends[b], &config, kTokens);
    memset(topk[b], 0x5a, sizeof topk[b]);
    m3sa_index_topk_args args;
    args.index_q = view(index_q, M3SA_DTYPE_BF16, 3, q_shape);
    args.index_k_cache = view(index_cache, M3SA_DTYPE_BF16, 3, cache_shape);
    args.batch = batch;
    args.topk = view(topk[b], M3SA_DTYPE_I32, 3, topk_shape);
    CHECK_OK(m3sa_index_topk(&p.plan, &args, p.workspace, NULL));
    printf("index_topk on %s (%s): token 0 head 0 selects %d %d %d %d\n",
           m3sa_backend_name(backends[b]), m3sa_plan_implementation_name(&p.plan), (int)topk[b][0],
           (int)topk[b][1], (int)topk[b][2], (int)topk[b][3]);
    free(p.memory);
  }
  CHECK(memcmp(topk[0], topk[1], sizeof topk[0]) == 0, "CPU and reference selections differ");
  /* The decode row of request 0 (1300 tokens, blocks 0..10), each index head: its own block 10
   * (local 1) and the 3 best of blocks 0..9 by exact score (max over the block's keys of q.k),
   * the lower block first among equals, all in ascending order. */
  for (int h = 0; h < kIndexHeads; ++h) {
    double score[10];
    for (int block = 0; block < 10; ++block) {
      score[block] = -1e30;
      for (int j = block * kPage; j < (block + 1) * kPage; ++j) {
        double dot = 0;
        for (int d = 0; d < kDim; ++d)
          dot += m3sa_bf16_bits_to_float(index_q[h * kDim + d]) * request0_keys[j * kDim + d];
        if (dot > score[block]) score[block] = dot;
      }
    }
    int chosen[11] = {0};
    for (int pick = 0; pick < kTopK - 1; ++pick) {
      int best = -1;
      for (int block = 0; block < 10; ++block)
        if (!chosen[block] && (best < 0 || score[block] > score[best])) best = block;
      chosen[best] = 1;
    }
    chosen[10] = 1;
    int want[kTopK], n = 0;
    for (int block = 0; block <= 10; ++block)
      if (chosen[block]) want[n++] = block;
    const int32_t* got = &topk[0][h * kTokens * kTopK]; /* token 0 of head h */
    CHECK(memcmp(got, want, sizeof want) == 0, "head %d: selected %d %d %d %d, want %d %d %d %d", h,
          (int)got[0], (int)got[1], (int)got[2], (int)got[3], want[0], want[1], want[2], want[3]);
  }
  free(request0_keys);

  /* sparse_attention over those selections (index heads == KV heads here), CPU vs reference. */
  const size_t kv_elements = (size_t)kPages * kPage * kKvHeads * kDim;
  uint16_t* k_cache = malloc(sizeof(uint16_t) * kv_elements);
  uint16_t* v_cache = malloc(sizeof(uint16_t) * kv_elements);
  for (size_t i = 0; i < kv_elements; ++i) {
    k_cache[i] = m3sa_float_to_bf16_bits((float)next_random() / 4294967296.f * 4.f - 2.f);
    v_cache[i] = m3sa_float_to_bf16_bits((float)next_random() / 4294967296.f * 4.f - 2.f);
  }
  uint16_t q[kTokens * kQHeads * kDim];
  for (int i = 0; i < kTokens * kQHeads * kDim; ++i)
    q[i] = m3sa_float_to_bf16_bits((float)next_random() / 4294967296.f * 4.f - 2.f);
  uint16_t out[2][kTokens * kQHeads * kDim];
  float lse[2][kTokens * kQHeads];
  const int64_t attention_q_shape[3] = {kTokens, kQHeads, kDim};
  const int64_t kv_shape[4] = {kPages, kPage, kKvHeads, kDim};
  const int64_t lse_shape[2] = {kTokens, kQHeads};
  for (int b = 0; b < 2; ++b) {
    planned p = plan_op(M3SA_OP_SPARSE_ATTENTION, backends[b], &config, kTokens);
    memset(out[b], 0x5a, sizeof out[b]);
    memset(lse[b], 0x5a, sizeof lse[b]);
    m3sa_sparse_attention_args args;
    memset(&args, 0, sizeof args); /* kv_block_table absent: the batch's table */
    args.q = view(q, M3SA_DTYPE_BF16, 3, attention_q_shape);
    args.k_cache = view(k_cache, M3SA_DTYPE_BF16, 4, kv_shape);
    args.v_cache = view(v_cache, M3SA_DTYPE_BF16, 4, kv_shape);
    args.k_scale = 1.f;
    args.v_scale = 1.f;
    args.topk = view(topk[0], M3SA_DTYPE_I32, 3, topk_shape);
    args.batch = batch;
    args.out = view(out[b], M3SA_DTYPE_BF16, 3, attention_q_shape);
    args.lse = view(lse[b], M3SA_DTYPE_F32, 2, lse_shape);
    CHECK_OK(m3sa_sparse_attention(&p.plan, &args, p.workspace, NULL));
    free(p.memory);
  }
  double diff = 0, norm = 0, lse_error = 0;
  for (int i = 0; i < kTokens * kQHeads * kDim; ++i) {
    const double want = m3sa_bf16_bits_to_float(out[1][i]);
    const double got = m3sa_bf16_bits_to_float(out[0][i]);
    diff += (want - got) * (want - got);
    norm += want * want;
  }
  for (int i = 0; i < kTokens * kQHeads; ++i)
    lse_error = fmax(lse_error, fabs((double)lse[1][i] - (double)lse[0][i]));
  const double relative_l2 = sqrt(diff / norm);
  printf("sparse_attention: CPU vs reference relative L2 %.2e, lse max abs %.2e\n", relative_l2,
         lse_error);
  CHECK(norm > 0 && relative_l2 <= 1e-3, "relative L2 %.3e", relative_l2);
  CHECK(lse_error <= 1e-4, "lse error %.3e", lse_error);

  /* Errors a C caller meets: a value outside an enum, a null struct, a wrong shape. */
  {
    planned p = plan_op(M3SA_OP_INDEX_TOPK, M3SA_BACKEND_CPU, &config, kTokens);
    m3sa_index_topk_args args;
    args.index_q = view(index_q, M3SA_DTYPE_BF16, 3, q_shape);
    args.index_k_cache = view(index_cache, M3SA_DTYPE_BF16, 3, cache_shape);
    args.batch = batch;
    args.topk = view(topk[1], M3SA_DTYPE_I32, 3, topk_shape);
    args.topk.dtype = 42;
    CHECK(m3sa_index_topk(&p.plan, &args, p.workspace, NULL) == M3SA_INVALID_ARGUMENT,
          "dtype 42 accepted");
    CHECK(strcmp(m3sa_last_error_message(),
                 "invalid_argument: m3sa::index_topk: topk.dtype: expected one of 0..4, got 42") ==
              0,
          "message: %s", m3sa_last_error_message());
    CHECK(m3sa_index_topk(&p.plan, NULL, p.workspace, NULL) == M3SA_INVALID_ARGUMENT,
          "NULL args accepted");
    args.topk.dtype = M3SA_DTYPE_I32;
    args.topk.shape[2] = kTopK - 1;
    CHECK(m3sa_index_topk(&p.plan, &args, p.workspace, NULL) == M3SA_INVALID_ARGUMENT,
          "a topk of K-1 accepted");
    CHECK(strstr(m3sa_last_error_message(), "topk") != NULL, "message: %s",
          m3sa_last_error_message());
    printf("a wrong top-k shape: %s\n", m3sa_last_error_message());
    free(p.memory);
  }

  free(k_cache);
  free(v_cache);
  free(index_cache);
  printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
