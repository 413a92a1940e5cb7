#ifndef M3SA_C_API_H
#define M3SA_C_API_H
/* m3sa's C API: the plan/run API of m3sa/ops.h with C types, for C code and other languages' FFI
 * (ggml's C core, Rust, Go, Zig, Python's ctypes), and for programs that want a C ABI rather than
 * C++ types across a library boundary. It is a thin layer over the C++ API - the same plans,
 * validation, kernels and messages - and it is what the shared library libm3sa_c exports (every
 * other symbol is hidden).
 *
 * Conventions:
 * - Every function that can fail returns an m3sa_status (M3SA_OK = 0). The failure's message,
 *   "m3sa::<op>: <argument>: expected <expectation>, got <received>" as in the C++ API, stays
 *   readable through m3sa_last_error_message() on the calling thread until that thread's next
 *   m3sa call. Nothing here exits, aborts or throws, whatever the caller passes: an enum value
 *   outside its list, a null pointer or a bad shape is an M3SA_INVALID_ARGUMENT naming the field.
 * - Structs are plain data. Fill them from the m3sa_*_init functions, which set the C++
 *   defaults (the model's top_k 16, local 1, 4 index heads, ...), then change what differs.
 * - Enum-typed fields are int32_t, so every struct has one layout whatever the compiler's enum
 *   size. The layouts change only with M3SA_C_API_VERSION, which m3sa_c_api_version() reports
 *   for the library actually loaded.
 * - Semantics, shapes and dtypes are those of the C++ API: docs/contract.md and m3sa/ops.h. The
 *   context-parallel decode indexer (m3sa/context_parallel.h: CUDA and NCCL) is C++ only.
 */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define M3SA_C_API_VERSION 1

#if defined(_WIN32)
#define M3SA_C_EXPORT __declspec(dllexport)
#elif defined(__GNUC__)
#define M3SA_C_EXPORT __attribute__((visibility("default")))
#else
#define M3SA_C_EXPORT
#endif

typedef int32_t m3sa_status;
enum {
  M3SA_OK = 0,
  M3SA_INVALID_ARGUMENT = 1, /* outside the documented range or shape */
  M3SA_UNSUPPORTED = 2,      /* valid, but this backend / build / device cannot run it */
  M3SA_CUDA_ERROR = 3,       /* a CUDA runtime call failed */
  M3SA_INTERNAL = 4          /* a bug in m3sa (or the host ran out of memory for a message) */
};

enum {
  M3SA_DTYPE_BF16 = 0,
  M3SA_DTYPE_FP8_E4M3 = 1,
  M3SA_DTYPE_F32 = 2,
  M3SA_DTYPE_I32 = 3,
  M3SA_DTYPE_I64 = 4
};
enum { M3SA_DEVICE_CPU = 0, M3SA_DEVICE_CUDA = 1 };
enum { M3SA_BACKEND_REFERENCE = 0, M3SA_BACKEND_CPU = 1, M3SA_BACKEND_CUDA = 2 };
enum {
  M3SA_OP_INSERT_INDEX_K = 0,
  M3SA_OP_SCORE_BLOCKS = 1,
  M3SA_OP_SELECT_TOPK_BLOCKS = 2,
  M3SA_OP_INDEX_TOPK = 3,
  M3SA_OP_SPARSE_ATTENTION = 4,
  M3SA_OP_NORM_ROPE_INSERT = 5
};

#define M3SA_MAX_RANK 4
#define M3SA_PLAN_INFO_SIZE 16

/* A non-owning view: data, dtype, shape and strides in elements. rank 0 with data NULL (a
 * zero-filled struct) is "absent", for optional arguments. */
typedef struct m3sa_tensor_view {
  void* data;
  int32_t dtype; /* M3SA_DTYPE_* */
  int32_t rank;  /* 0..M3SA_MAX_RANK */
  int64_t shape[M3SA_MAX_RANK];
  int64_t strides[M3SA_MAX_RANK];
  int32_t device_kind; /* M3SA_DEVICE_* */
  int32_t device_ordinal;
} m3sa_tensor_view;

/* Packed varlen batch (contract §2): decode requests first, each with q_len decode_q_len. */
typedef struct m3sa_batch {
  m3sa_tensor_view cu_q_lens;   /* [num_requests + 1] i32 */
  m3sa_tensor_view seq_lens;    /* [num_requests] i32; 0 = padding row */
  m3sa_tensor_view block_table; /* [num_requests, max_blocks_per_request] i32 */
  int32_t num_requests;
  int32_t num_decode_requests;
  int32_t decode_q_len; /* 1..16 */
  int32_t num_tokens;   /* T == cu_q_lens[num_requests] */
} m3sa_batch;

typedef struct m3sa_capacities {
  int64_t max_requests;
  int64_t max_tokens;
  int64_t max_blocks_per_request;
} m3sa_capacities;

typedef struct m3sa_config {
  int32_t top_k;           /* 1..32 */
  int32_t local_blocks;    /* most recent blocks always selected */
  int32_t init_blocks;     /* first blocks always selected */
  int32_t num_index_heads; /* 1..16 */
  float score_scale;       /* > 0 */
  int32_t reduce_heads;    /* 0 or 1 */
  float rms_norm_eps;
  float norm_weight_offset;
  double rope_theta;
} m3sa_config;

typedef struct m3sa_plan_request {
  int32_t op;      /* M3SA_OP_* */
  int32_t backend; /* M3SA_BACKEND_* */
  m3sa_config config;
  m3sa_capacities capacities;
  int32_t cache_dtype;        /* M3SA_DTYPE_BF16 or M3SA_DTYPE_FP8_E4M3 */
  int32_t num_threads;        /* CPU backend: 0 = OpenMP's default */
  int32_t device_ordinal;     /* CUDA backend */
  const char* implementation; /* NULL or "": the best that runs here; else this exact name */
} m3sa_plan_request;

/* Made by m3sa_make_plan and read by every run; copy it freely, never edit it. */
typedef struct m3sa_plan {
  m3sa_plan_request request; /* request.implementation: the chosen name (static storage) */
  int32_t implementation;    /* registry index; -1: not planned */
  int32_t num_threads;
  uint64_t workspace_bytes; /* caller allocates at least this much on the plan's device */
  uint32_t plan_info_version;
  int64_t plan_info[M3SA_PLAN_INFO_SIZE];
} m3sa_plan;

/* Caller memory of at least plan.workspace_bytes, 64-byte aligned, on the plan's device. */
typedef struct m3sa_workspace {
  void* data;
  uint64_t bytes;
} m3sa_workspace;

/* Where a function takes an m3sa_exec_context*, NULL means {0, NULL}: the plan's threads, and on
 * CUDA the stream NULL, which m3sa/ops.h asks CUDA callers not to use (pass their own stream). */
typedef struct m3sa_exec_context {
  int32_t num_threads; /* CPU backend: 0 = the plan's; never more than the plan's */
  void* stream;        /* CUDA backend: a cudaStream_t */
} m3sa_exec_context;

typedef struct m3sa_norm_rope_insert_args {
  m3sa_tensor_view q, k, v, index_q, index_k, positions;
  m3sa_tensor_view q_norm_weight, k_norm_weight, index_q_norm_weight, index_k_norm_weight;
  m3sa_tensor_view cos_sin_cache; /* optional */
  m3sa_tensor_view slot_mapping, index_slot_mapping;
  m3sa_tensor_view q_out, k_cache, v_cache;
  float k_scale, v_scale;
  m3sa_tensor_view index_q_out, index_k_cache;
} m3sa_norm_rope_insert_args;

typedef struct m3sa_insert_index_k_args {
  m3sa_tensor_view index_k, slot_mapping, index_k_cache;
} m3sa_insert_index_k_args;

typedef struct m3sa_score_blocks_args {
  m3sa_tensor_view index_q, index_k_cache;
  m3sa_batch batch;
  m3sa_tensor_view scores; /* [H, T, N] f32 */
} m3sa_score_blocks_args;

typedef struct m3sa_select_topk_blocks_args {
  m3sa_tensor_view scores;
  m3sa_batch batch;
  m3sa_tensor_view topk; /* [H, T, K] i32 */
} m3sa_select_topk_blocks_args;

typedef struct m3sa_index_topk_args {
  m3sa_tensor_view index_q, index_k_cache;
  m3sa_batch batch;
  m3sa_tensor_view topk; /* [H, T, K] i32: ascending block ids, -1 padded */
} m3sa_index_topk_args;

typedef struct m3sa_sparse_attention_args {
  m3sa_tensor_view q, k_cache, v_cache;
  float k_scale, v_scale;
  m3sa_tensor_view topk;
  m3sa_batch batch;
  m3sa_tensor_view kv_block_table; /* optional */
  m3sa_tensor_view out;
  m3sa_tensor_view lse; /* optional */
} m3sa_sparse_attention_args;

typedef struct m3sa_implementation_info {
  const char* name; /* "cpu.index_topk", ... (static storage) */
  int32_t backend;
  int32_t op;
  const char* description;
} m3sa_implementation_info;

/* Library and its build. */
M3SA_C_EXPORT int32_t m3sa_c_api_version(void); /* M3SA_C_API_VERSION of the loaded library */
M3SA_C_EXPORT const char* m3sa_version_string(void);
M3SA_C_EXPORT const char* m3sa_build_commit(void);
/* The message of the calling thread's last failed call ("" after a success). */
M3SA_C_EXPORT const char* m3sa_last_error_message(void);
/* "ok", "invalid_argument", ...; the to_string names of every enum ("bf16", "index_topk"). */
M3SA_C_EXPORT const char* m3sa_status_name(m3sa_status status);
M3SA_C_EXPORT const char* m3sa_dtype_name(int32_t dtype);
M3SA_C_EXPORT const char* m3sa_backend_name(int32_t backend);
M3SA_C_EXPORT const char* m3sa_op_name(int32_t op);
M3SA_C_EXPORT size_t m3sa_dtype_size(int32_t dtype); /* 0 for an unknown dtype */

/* Defaults and views. */
M3SA_C_EXPORT void m3sa_config_init(m3sa_config* config);
M3SA_C_EXPORT void m3sa_plan_request_init(m3sa_plan_request* request);
/* A row-major contiguous view of `rank` dims on the CPU (device fields may be set after). */
M3SA_C_EXPORT m3sa_status m3sa_tensor_view_contiguous(void* data, int32_t dtype, int32_t rank,
                                                      const int64_t* shape, m3sa_tensor_view* view);

/* The registry (m3sa/registry.h, m3sa/capabilities.h). */
M3SA_C_EXPORT int32_t m3sa_implementation_count(void);
M3SA_C_EXPORT m3sa_status m3sa_implementation_info_at(int32_t index,
                                                      m3sa_implementation_info* info);
M3SA_C_EXPORT m3sa_status m3sa_supports(int32_t backend, int32_t op, const m3sa_config* config,
                                        int32_t cache_dtype);
M3SA_C_EXPORT int32_t m3sa_best_available_backend(const m3sa_config* config, int32_t cache_dtype);
M3SA_C_EXPORT int32_t m3sa_cuda_device_count(void);
M3SA_C_EXPORT int32_t m3sa_cuda_backend_built(void);

/* Plan once, prepare each workspace once, then run (m3sa/ops.h). */
M3SA_C_EXPORT m3sa_status m3sa_make_plan(const m3sa_plan_request* request, m3sa_plan* plan);
M3SA_C_EXPORT const char* m3sa_plan_implementation_name(const m3sa_plan* plan);
M3SA_C_EXPORT m3sa_status m3sa_prepare_workspace(const m3sa_plan* plan, m3sa_workspace workspace,
                                                 const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_norm_rope_insert(const m3sa_plan* plan,
                                                const m3sa_norm_rope_insert_args* args,
                                                m3sa_workspace workspace,
                                                const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_insert_index_k(const m3sa_plan* plan,
                                              const m3sa_insert_index_k_args* args,
                                              m3sa_workspace workspace,
                                              const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_score_blocks(const m3sa_plan* plan,
                                            const m3sa_score_blocks_args* args,
                                            m3sa_workspace workspace, const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_select_topk_blocks(const m3sa_plan* plan,
                                                  const m3sa_select_topk_blocks_args* args,
                                                  m3sa_workspace workspace,
                                                  const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_index_topk(const m3sa_plan* plan, const m3sa_index_topk_args* args,
                                          m3sa_workspace workspace, const m3sa_exec_context* ctx);
M3SA_C_EXPORT m3sa_status m3sa_sparse_attention(const m3sa_plan* plan,
                                                const m3sa_sparse_attention_args* args,
                                                m3sa_workspace workspace,
                                                const m3sa_exec_context* ctx);
/* Device-side validation flags (bits as in m3sa/ops.h), read and cleared; synchronises. */
M3SA_C_EXPORT m3sa_status m3sa_read_device_errors(const m3sa_plan* plan, m3sa_workspace workspace,
                                                  const m3sa_exec_context* ctx, int32_t* flags);

/* Storage conversions (contract §3), bit-exact with CUDA's. */
M3SA_C_EXPORT uint16_t m3sa_float_to_bf16_bits(float value);
M3SA_C_EXPORT float m3sa_bf16_bits_to_float(uint16_t bits);
M3SA_C_EXPORT uint8_t m3sa_float_to_e4m3_bits(float value);
M3SA_C_EXPORT float m3sa_e4m3_bits_to_float(uint8_t bits);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* M3SA_C_API_H */
