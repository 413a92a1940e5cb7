"""The C API from another language's FFI: Python's ctypes (standard library only) loads libm3sa_c,
declares m3sa/c_api.h's structs itself and runs index_topk on the CPU and reference backends.

What it checks is the ABI the header promises: the struct layouts a foreign declaration computes
from the header's field list (int32_t enums, int64_t shapes, pointers) are the ones the library
reads - a field out of place would be read as another value, and the calls below would fail or
select differently - and the error contract (status codes, the thread's last message).

Usage: python3 c_api_ctypes.py <path to libm3sa_c.so>. Exit status 0 when every check holds.
"""
import ctypes as C
import random
import sys

MAX_RANK = 4
BF16, F32, I32, I64 = 0, 2, 3, 4
REFERENCE, CPU = 0, 1
OP_INDEX_TOPK = 3
OK, INVALID_ARGUMENT = 0, 1


class TensorView(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int32), ("rank", C.c_int32),
                ("shape", C.c_int64 * MAX_RANK), ("strides", C.c_int64 * MAX_RANK),
                ("device_kind", C.c_int32), ("device_ordinal", C.c_int32)]


class Batch(C.Structure):
    _fields_ = [("cu_q_lens", TensorView), ("seq_lens", TensorView), ("block_table", TensorView),
                ("num_requests", C.c_int32), ("num_decode_requests", C.c_int32),
                ("decode_q_len", C.c_int32), ("num_tokens", C.c_int32)]


class Capacities(C.Structure):
    _fields_ = [("max_requests", C.c_int64), ("max_tokens", C.c_int64),
                ("max_blocks_per_request", C.c_int64)]


class Config(C.Structure):
    _fields_ = [("top_k", C.c_int32), ("local_blocks", C.c_int32), ("init_blocks", C.c_int32),
                ("num_index_heads", C.c_int32), ("score_scale", C.c_float),
                ("reduce_heads", C.c_int32), ("rms_norm_eps", C.c_float),
                ("norm_weight_offset", C.c_float), ("rope_theta", C.c_double)]


class PlanRequest(C.Structure):
    _fields_ = [("op", C.c_int32), ("backend", C.c_int32), ("config", Config),
                ("capacities", Capacities), ("cache_dtype", C.c_int32),
                ("num_threads", C.c_int32), ("device_ordinal", C.c_int32),
                ("implementation", C.c_char_p)]


class Plan(C.Structure):
    _fields_ = [("request", PlanRequest), ("implementation", C.c_int32),
                ("num_threads", C.c_int32), ("workspace_bytes", C.c_uint64),
                ("plan_info_version", C.c_uint32), ("plan_info", C.c_int64 * 16)]


class Workspace(C.Structure):
    _fields_ = [("data", C.c_void_p), ("bytes", C.c_uint64)]


class IndexTopkArgs(C.Structure):
    _fields_ = [("index_q", TensorView), ("index_k_cache", TensorView), ("batch", Batch),
                ("topk", TensorView)]


failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what)


def view(buffer, dtype, shape):
    v = TensorView()
    dims = (C.c_int64 * MAX_RANK)(*shape)
    status = lib.m3sa_tensor_view_contiguous(C.cast(buffer, C.c_void_p), dtype, len(shape), dims,
                                             C.byref(v))
    check(status == OK, "view: " + lib.m3sa_last_error_message().decode())
    return v


def plan_for(backend, config, requests, tokens, width):
    request = PlanRequest()
    lib.m3sa_plan_request_init(C.byref(request))
    request.op = OP_INDEX_TOPK
    request.backend = backend
    request.config = config
    request.capacities = Capacities(requests, tokens, width)
    plan = Plan()
    status = lib.m3sa_make_plan(C.byref(request), C.byref(plan))
    check(status == OK, "make_plan: " + lib.m3sa_last_error_message().decode())
    memory = C.create_string_buffer(plan.workspace_bytes + 64)
    address = (C.addressof(memory) + 63) // 64 * 64
    workspace = Workspace(address, plan.workspace_bytes)
    check(lib.m3sa_prepare_workspace(C.byref(plan), workspace, None) == OK, "prepare_workspace")
    return plan, workspace, memory


def main(path):
    global lib
    lib = C.CDLL(path)
    lib.m3sa_last_error_message.restype = C.c_char_p
    lib.m3sa_version_string.restype = C.c_char_p
    lib.m3sa_plan_implementation_name.restype = C.c_char_p
    lib.m3sa_float_to_bf16_bits.restype = C.c_uint16
    lib.m3sa_float_to_bf16_bits.argtypes = [C.c_float]
    for name in ("m3sa_index_topk", "m3sa_prepare_workspace"):
        getattr(lib, name).argtypes = (
            [C.c_void_p, C.c_void_p, Workspace, C.c_void_p] if name == "m3sa_index_topk"
            else [C.c_void_p, Workspace, C.c_void_p])
    print("m3sa %s through ctypes (C API %d)" % (lib.m3sa_version_string().decode(),
                                                lib.m3sa_c_api_version()))

    config = Config()
    lib.m3sa_config_init(C.byref(config))
    check(config.top_k == 16 and config.local_blocks == 1 and config.num_index_heads == 4,
          "m3sa_config_init gives the model's defaults")
    config.top_k, config.num_index_heads = 4, 2

    # Two decode requests (900 and 300 tokens) over a shuffled 8-page-wide table; integer keys and
    # queries, so the CPU backend and the reference score exactly and select alike.
    heads, requests, width, tokens = 2, 2, 8, 2
    pages = requests * width
    rng = random.Random(7)
    cu_q_lens = (C.c_int32 * 3)(0, 1, 2)
    seq_lens = (C.c_int32 * 2)(900, 300)
    table = (C.c_int32 * pages)(*rng.sample(range(pages), pages))
    bits = lib.m3sa_float_to_bf16_bits
    cache = (C.c_uint16 * (pages * 128 * 128))(
        *[bits(float(rng.randint(-3, 3))) for _ in range(pages * 128 * 128)])
    index_q = (C.c_uint16 * (tokens * heads * 128))(
        *[bits(float(rng.randint(-1, 1))) for _ in range(tokens * heads * 128)])

    batch = Batch(view(cu_q_lens, I32, [requests + 1]), view(seq_lens, I32, [requests]),
                  view(table, I32, [requests, width]), requests, requests, 1, tokens)
    selections = []
    for backend in (CPU, REFERENCE):
        plan, workspace, _memory = plan_for(backend, config, requests, tokens, width)
        topk = (C.c_int32 * (heads * tokens * 4))(*([0x5a5a5a5a] * (heads * tokens * 4)))
        args = IndexTopkArgs(view(index_q, BF16, [tokens, heads, 128]),
                             view(cache, BF16, [pages, 128, 128]), batch,
                             view(topk, I32, [heads, tokens, 4]))
        status = lib.m3sa_index_topk(C.byref(plan), C.byref(args), workspace, None)
        check(status == OK, "index_topk: " + lib.m3sa_last_error_message().decode())
        selections.append(list(topk))
        print("%s: request 0 head 0 selects %s" % (
            lib.m3sa_plan_implementation_name(C.byref(plan)).decode(), list(topk)[0:4]))
    check(selections[0] == selections[1], "CPU and reference selections are identical")
    row = selections[0][0:4]
    check(row == sorted(row) and row[3] == 7 and len(set(row)) == 4,
          "request 0 (900 tokens, blocks 0..7): 4 ascending blocks, its own block 7 last")
    check(selections[0][4:8] == [0, 1, 2, -1],
          "request 1 (300 tokens, 3 blocks <= top_k 4) selects them all, -1 padded")

    # Errors: an enum outside its list, named; the message is the calling thread's last.
    args.topk.dtype = 42
    status = lib.m3sa_index_topk(C.byref(plan), C.byref(args), workspace, None)
    message = lib.m3sa_last_error_message().decode()
    check(status == INVALID_ARGUMENT, "dtype 42 rejected")
    check(message == "invalid_argument: m3sa::index_topk: topk.dtype: expected one of 0..4, "
                     "got 42", "message: " + message)
    print("an enum outside its list:", message)
    print("passed" if not failures else "FAILED: %d check(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
