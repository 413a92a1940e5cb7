#!/usr/bin/env python3
"""Mutation check of the CPU suite (issue 16).

Applies each small source mutation below to the CPU backend, the reference backend, the host
API or a host-testable half of a CUDA plan, one at a time; rebuilds m3sa_cpu_tests in the
cpu-only preset; runs it with a fixed seed and records which tests fail; restores the file with
`git checkout --`. A mutation no test catches is a survivor. Usage, from the repository root
after configuring the cpu-only preset:

    scripts/mutation_check.py [name-substring ...]

Prints one Markdown table row per mutation (the table in docs/testing.md comes from it) and exits
1 if a mutation survived or could not be applied.
"""
import os
import re
import subprocess
import sys

# (name, file, exact text, replacement): the text must occur exactly once in the file. Mutants
# keep every parameter used ((void)x, x * 0.f) so that -Werror builds still compile them.
MUTATIONS = [
    ("ref: block score ignores NaN", "src/reference/indexer.cpp",
     "if (dot > best || std::isnan(dot)) best = std::isnan(best) ? best : dot;",
     "if (dot > best) best = dot;"),
    ("cpu: block score ignores NaN", "src/cpu/simd.cpp",
     "return nan ? std::numeric_limits<float>::quiet_NaN() : result;", "return (void)nan, result;"),
    ("ref: reduce_heads NaN beats a number", "src/reference/indexer.cpp",
     "  if (std::isnan(a)) return b;\n  if (std::isnan(b)) return a;",
     "  if (std::isnan(a) || std::isnan(b)) return a + b;"),
    ("cpu: reduce_heads NaN beats a number", "src/cpu/indexer.cpp",
     "  if (std::isnan(a)) return b;\n  if (std::isnan(b)) return a;",
     "  if (std::isnan(a) || std::isnan(b)) return a + b;"),
    ("cpu: -0 ranked below +0", "src/cpu/indexer.cpp",
     "std::bit_cast<uint32_t>(score == 0.f ? 0.f : score)", "std::bit_cast<uint32_t>(score)"),
    ("ref: -0 ranked below +0", "src/reference/indexer.cpp",
     "if (!nan_a && sa != sb) return sa > sb;",
     "if (!nan_a && (sa != sb || std::signbit(sa) != std::signbit(sb)))\n"
     "    return sa > sb || std::signbit(sb);"),
    ("cpu/cuda: RMSNorm eps = 0", "src/common/norm_rope_math.h",
     "add(mul(sum_of_squares, 1.f / 128.f), eps)",
     "add(mul(sum_of_squares, 1.f / 128.f), eps * 0.f)"),
    ("cpu/cuda: RMSNorm eps = 1e-2", "src/common/norm_rope_math.h",
     "add(mul(sum_of_squares, 1.f / 128.f), eps)",
     "add(mul(sum_of_squares, 1.f / 128.f), eps * 0.f + 1e-2f)"),
    ("ref: RMSNorm eps = 0", "src/reference/norm_rope.cpp",
     "sum / kHeadDim + config.rms_norm_eps", "sum / kHeadDim + 0.0"),
    ("ref: RMSNorm eps = 1e-2", "src/reference/norm_rope.cpp",
     "sum / kHeadDim + config.rms_norm_eps", "sum / kHeadDim + 1e-2"),
    ("api: contiguous shard is round-robin", "src/api/context_parallel.cpp",
     "return shard.mode == ShardMode::contiguous ? shard.rank * shard_span(capacities, shard) + j\n"
     "                                             : j * shard.num_ranks + shard.rank;",
     "return (void)capacities, j * shard.num_ranks + shard.rank;"),
    ("api: m3sa::<op>: prefix dropped", "src/api/ops.cpp",
     'return {status.code(), std::string("m3sa::") + to_string(op) + ": " + status.message()};',
     "return (void)op, status;"),
    ("api: context-parallel prefix dropped", "src/api/context_parallel.cpp",
     'return {status.code(), "m3sa::context_parallel_index_topk: " + status.message()};',
     "return status;"),
    ("cpu: init blocks not written", "src/cpu/indexer.cpp",
     "for (int32_t b = 0; b < config.init_blocks; ++b) out[(slot++) * out_stride] = b;", ""),
    ("ref: init blocks not written", "src/reference/indexer.cpp",
     "for (int32_t b = 0; b < config.init_blocks; ++b) out[(count++) * out_stride] = b;", ""),
    ("cpu: insert skips the last token", "src/cpu/indexer.cpp",
     "for (int64_t t = 0; t < k.shape[0]; ++t) {", "for (int64_t t = 0; t < k.shape[0] - 1; ++t) {"),
    ("ref: insert skips the last token", "src/reference/indexer.cpp",
     "for (int64_t t = 0; t < k.shape[0]; ++t) {", "for (int64_t t = 0; t < k.shape[0] - 1; ++t) {"),
    ("cpu: ids left unsorted", "src/cpu/indexer.cpp", "std::sort(s.ids, s.ids + fill);", ""),
    ("ref: ids left unsorted", "src/reference/indexer.cpp", "std::sort(order, order + fill);", ""),
    ("cpu: ties to the higher id", "src/cpu/indexer.cpp",
     "if (kept == fill && key <= s.keys[fill - 1]) continue;",
     "if (kept == fill && key < s.keys[fill - 1]) continue;"),
    ("cpu: NaN ranks above every number", "src/cpu/indexer.cpp",
     "if (std::isnan(score)) return 0;", "if (std::isnan(score)) return 0xffffffffu;"),
    ("ref: NaN ranks above every number", "src/reference/indexer.cpp",
     "if (nan_a != nan_b) return nan_b;", "if (nan_a != nan_b) return nan_a;"),
    ("cpu: causal limit one block too far", "src/cpu/indexer.cpp",
     "int64_t causal_blocks(int64_t position) { return position < 0 ? 0 : position / kBlockTokens + 1; }",
     "int64_t causal_blocks(int64_t position) { return position < 0 ? 0 : position / kBlockTokens + 2; }"),
    ("cpu: attention softmax scale 1/sqrt(64)", "src/cpu/attention.cpp",
     "1.f / std::sqrt(static_cast<float>(kHeadDim))", "1.f / std::sqrt(64.f)"),
    ("cpu: attention lse without the max", "src/cpu/attention.cpp",
     ": max_logit[h] + std::log(denominator[h]);", ": std::log(denominator[h]);"),
    # Sparse attention's semantics (contract §6) in both host backends: the token-level causal
    # mask, V's own scale, the GQA head mapping, the lse, block 0 (session 60).
    ("ref: attention causal mask admits the next token", "src/reference/attention.cpp",
     "j <= p && j < seq_len", "j <= p + 1 && j < seq_len"),
    ("cpu: attention causal mask admits the next token", "src/cpu/attention.cpp",
     "p + 1, seq_len})", "p + 2, seq_len})"),
    ("ref: attention V scaled by k_scale", "src/reference/attention.cpp",
     "row[d] * args.v_scale", "row[d] * args.k_scale"),
    ("cpu: attention V scaled by k_scale", "src/cpu/attention.cpp",
     "load_chunk(args.v_cache, args.v_scale, n0, chunk);",
     "load_chunk(args.v_cache, args.k_scale, n0, chunk);"),
    ("ref: attention query heads interleaved over KV heads", "src/reference/attention.cpp",
     "args.q.offset({t, g * group + h, d})", "args.q.offset({t, h * num_kv_heads + g, d})"),
    ("ref: attention lse without the max", "src/reference/attention.cpp",
     "static_cast<float>(max_logit[h] + std::log(denominator[h]))",
     "static_cast<float>(std::log(denominator[h]))"),
    ("ref: attention skips block 0", "src/reference/attention.cpp", "if (b < 0) continue;",
     "if (b <= 0) continue;"),
    # RoPE (contract: NeoX halves, theta^(-i/32)): the reference's and the shared fp32 math.
    ("ref: rope first half adds the sine", "src/reference/norm_rope.cpp",
     "    y[i] = x1 * rot.cos[i] - x2 * rot.sin[i];", "    y[i] = x1 * rot.cos[i] + x2 * rot.sin[i];"),
    ("ref: rope frequencies over 64", "src/reference/norm_rope.cpp", "-i / 32.0", "-i / 64.0"),
    ("cpu/cuda: rope cosine sign in the fourth quadrant", "src/common/norm_rope_math.h",
     "quadrant == 2 ? -cos_r : sin_r;", "quadrant == 2 ? -cos_r : -sin_r;"),
    ("cpu/cuda: rope frequencies over 64", "src/common/norm_rope_math.h",
     "return static_cast<float>(std::pow(theta, -i / 32.0));",
     "return static_cast<float>(std::pow(theta, -i / 64.0));"),
    ("plan: SM90 range key ties to the shorter R", "src/cuda/kernels/indexer_traits.h",
     "static_cast<unsigned>(kRangeChoices - 1 - c);", "static_cast<unsigned>(c);"),
    ("plan: SM90 range key ignores the unit capacity", "src/cuda/kernels/indexer_traits.h",
     "if (units > unit_capacity || n_ranges > range_capacity) return kUnfitRangeChoice;",
     "if ((void)unit_capacity, n_ranges > range_capacity) return kUnfitRangeChoice;"),
    ("plan: SM90 range key cost overlaps the choice bits", "src/cuda/kernels/indexer_traits.h",
     "static_cast<unsigned long long>(cost) << 6", "static_cast<unsigned long long>(cost) << 4"),
    # The decode grid a call takes (launch_decode_topk): an SM's worth of ranges over its own
    # decode requests, within the workspace's list slots.
    ("plan: decode list slots sized by the plan's capacity only", "src/cuda/kernels/indexer_traits.h",
     "request_tiles * one_request_ranges);", "request_tiles * one_request_ranges * 0);"),
    ("plan: decode call splits past the list slots", "src/cuda/kernels/indexer_traits.h",
     "std::clamp<int64_t>(ranges, 1, most)", "std::max<int64_t>({ranges, 1, most * 0})"),
    # The Hopper decode kernel's ranges, warp lists and grid (session 61): each rule the kernel,
    # its publish and the plan derive from one helper, so a helper off by one breaks them together
    # and only the host tests of tests/unit/decode_ranges_test.cpp can see it without a GPU.
    ("plan: decode 8 warps stop one split early", "src/cuda/kernels/indexer_traits.h",
     "return splits <= kDecodeSm90WideMaxSplits ?", "return splits < kDecodeSm90WideMaxSplits ?"),
    ("plan: decode ranges below the minimum blocks", "src/cuda/kernels/indexer_traits.h",
     "return n <= 0 ? 0 : even > min_per_split ? even : min_per_split;",
     "return n <= 0 ? 0 : even;"),
    ("plan: decode ranges with blocks counted by floor", "src/cuda/kernels/indexer_traits.h",
     "return per_split == 0 ? 0 : (n + per_split - 1) / per_split;",
     "return per_split == 0 ? 0 : n / per_split;"),
    ("plan: decode warp lists' blocks by floor", "src/cuda/kernels/indexer_traits.h",
     "return (per_split + lists - 1) / lists;", "return per_split / lists > 1 ? per_split / lists : 1;"),
    ("plan: decode published lists without the even padding", "src/cuda/kernels/indexer_traits.h",
     "  out.lists += out.lists * rows * out.len % 2;\n", ""),
    ("plan: decode published lists longer than fill", "src/cuda/kernels/indexer_traits.h",
     "                                                              ? fill\n",
     "                                                              ? fill + 1\n"),
    ("plan: decode grid past the ranges the longest request fills",
     "src/cuda/kernels/indexer_traits.h",
     "std::clamp<int64_t>(sm_splits, 1, std::max<int64_t>(useful, 1))",
     "std::max<int64_t>(sm_splits + useful * 0, 1)"),
    ("plan: decode cluster of one range", "src/cuda/kernels/indexer_traits.h",
     "  if (splits >= 2 && splits <= kMost)", "  if (splits >= 1 && splits <= kMost)"),
    ("plan: decode no 16-range cluster for longer grids", "src/cuda/kernels/indexer_traits.h",
     "  else if (splits > kMost && kMost >= 2 &&", "  else if (splits > kMost && kMost >= 2 && false &&"),
    ("plan: decode cluster past rank 0's receiving area", "src/cuda/kernels/indexer_traits.h",
     "return keys <= kDecodeSm90ReceiveKeys ? cluster : 0;",
     "return keys <= 2 * kDecodeSm90ReceiveKeys ? cluster : 0;"),
    # The host arithmetic under every plan and check (session 61): saturating sizes, the workspace
    # carver's alignment; and the registry's plan checks and seal.
    ("common: workspace regions not aligned", "src/common/workspace.h",
     "    offset_ = aligned(offset_);\n", "    offset_ = offset_;\n"),
    ("common: workspace alignment rounds down", "src/common/workspace.h",
     "return saturating_add(offset, kAlignment - 1) / kAlignment * kAlignment;",
     "return offset / kAlignment * kAlignment;"),
    ("common: workspace size not rounded up", "src/common/workspace.h",
     "size_t bytes_used() const { return aligned(offset_); }",
     "size_t bytes_used() const { return offset_; }"),
    ("common: workspace size wraps", "src/common/workspace.h",
     "offset_ = saturating_add(offset_, saturating_mul(count, sizeof(T)));",
     "offset_ = offset_ + count * sizeof(T);"),
    ("common: signed product saturates away from its sign", "src/common/checked_math.h",
     "return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()",
     "return (a < 0) == (b < 0) ? std::numeric_limits<int64_t>::min()"),
    ("common: signed sum saturates away from its sign", "src/common/checked_math.h",
     "return b < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();",
     "return b > 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();"),
    ("common: unsigned product wraps", "src/common/checked_math.h",
     "return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<size_t>::max() : product;",
     "return __builtin_mul_overflow(a, b, &product) ? product : product;"),
    ("common: unsigned sum wraps", "src/common/checked_math.h",
     "return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<size_t>::max() : sum;",
     "return __builtin_add_overflow(a, b, &sum) ? sum : sum;"),
    ("registry: a plan for another op accepted", "src/registry/registry.cpp",
     "  if (impl.op != op)\n", "  if (impl.op != op && false)\n"),
    ("registry: plan_info version unchecked", "src/registry/registry.cpp",
     "  if (plan.plan_info_version != impl.plan_info_version)\n",
     "  if (plan.plan_info_version != impl.plan_info_version && false)\n"),
    ("registry: seal ignores the workspace size", "src/registry/registry.cpp",
     " << plan.workspace_bytes << plan.plan_info_version;", " << plan.plan_info_version;"),
    ("registry: seal ignores plan_info", "src/registry/registry.cpp",
     "for (int i = 0; i < kPlanSealWord; ++i) hash << plan.plan_info[i];",
     "for (int i = 0; i < 0; ++i) hash << plan.plan_info[i];"),
    ("registry: seal ignores top_k", "src/registry/registry.cpp",
     "hash << r.op << r.backend << c.top_k << c.local_blocks",
     "hash << r.op << r.backend << c.local_blocks"),
    ("registry: seal unchecked", "src/registry/registry.cpp",
     "  if (plan.plan_info[kPlanSealWord] != plan_seal(plan))\n",
     "  if (plan.plan_info[kPlanSealWord] != plan_seal(plan) && false)\n"),
    ("registry: top_k one past its limit", "src/registry/registry.cpp",
     "config.top_k > kMaxTopK)", "config.top_k > kMaxTopK + 1)"),
    ("registry: index heads one past their limit", "src/registry/registry.cpp",
     "config.num_index_heads > kMaxIndexHeads)", "config.num_index_heads > kMaxIndexHeads + 1)"),
    ("registry: implementation one past the table", "src/registry/registry.cpp",
     "plan.implementation >= static_cast<int32_t>(all.size()))\n",
     "plan.implementation > static_cast<int32_t>(all.size()))\n"),
    # The CPU norm_rope_insert's own steps and the tensor views' basics (session 61). Three
    # mutations of supports() (capabilities.cpp: another op's implementations counted, one op
    # skipped, one reason kept) were tried and dropped: equivalent in a CPU-only build, where each
    # host op has one implementation a backend and the same limits, and CUDA returns first.
    ("cpu: norm_rope gains without the weight offset", "src/cpu/norm_rope.cpp",
     "g[d] = nr::add(offset, w[d]);", "g[d] = nr::add(0.f * offset, w[d]);"),
    ("cpu: norm_rope V normalized as K", "src/cpu/norm_rope.cpp",
     "transform(a.v, a.v.offset({t, h}), nullptr);", "transform(a.v, a.v.offset({t, h}), &k_gain);"),
    ("cpu: norm_rope V stored with K's scale", "src/cpu/norm_rope.cpp",
     "store_row(a.v_cache, a.v_cache.offset({page, in_page, h}), y, a.v_scale);",
     "store_row(a.v_cache, a.v_cache.offset({page, in_page, h}), y, a.k_scale);"),
    ("cpu: norm_rope cos / sin table halves swapped", "src/cpu/norm_rope.cpp",
     "rot.cos[i] = both[i], rot.sin[i] = both[i + nr::kRotaryPairs];",
     "rot.sin[i] = both[i], rot.cos[i] = both[i + nr::kRotaryPairs];"),
    ("cpu: norm_rope index_q with q's gain", "src/cpu/norm_rope.cpp",
     "transform(a.index_q, a.index_q.offset({t, h}), &iq_gain);",
     "transform(a.index_q, a.index_q.offset({t, h}), &q_gain);"),
    ("cpu: norm_rope index_k with k's gain", "src/cpu/norm_rope.cpp",
     "transform(a.index_k, a.index_k.offset({t}), &ik_gain);",
     "transform(a.index_k, a.index_k.offset({t}), &k_gain);"),
    ("api: a rank-0 view holds one element", "src/api/basics.cpp",
     "return rank == 0 ? 0 : n;", "return n;"),
    ("api: contiguity checks the strides of size-1 dims", "src/api/basics.cpp",
     "if (shape[d] != 1 && strides[d] != stride) return false;",
     "if (strides[d] != stride) return false;"),
    ("api: contiguous views' strides wrap", "src/api/basics.cpp",
     "    t.strides[i] = stride;\n    stride = detail::saturating_mul(stride, t.shape[i]);",
     "    t.strides[i] = stride;\n    stride = stride * t.shape[i];"),
    ("api: e4m3 two bytes", "src/api/basics.cpp",
     "  case DType::fp8_e4m3:\n    return 1;", "  case DType::fp8_e4m3:\n    return 2;"),
    # The tests' own judge (src/testing/compare.cpp: a selection row's format and rules, the
    # exchanges a backend may make against the reference) - a lenient judge passes every backend
    # (session 61).
    ("testing: padding after the ids unchecked", "src/testing/compare.cpp",
     '    if (row[i] != -1) return detail::concat("slot ", i, " holds ", row[i], " after padding");\n',
     ""),
    ("testing: repeated ids accepted", "src/testing/compare.cpp",
     "if (row[i] <= row[i - 1]) return", "if (row[i] < row[i - 1]) return"),
    ("testing: too few ids accepted", "src/testing/compare.cpp",
     "  if (valid != std::min(n, k))\n", "  if (valid > std::min(n, k))\n"),
    ("testing: forced local blocks unchecked", "src/testing/compare.cpp",
     "  for (int64_t b = n - rules.local_blocks; b < n; ++b)\n",
     "  for (int64_t b = n; b < n; ++b)\n"),
    ("testing: exchanges judged at ten times the tolerance", "src/testing/compare.cpp",
     "      if (relative > tolerance)\n", "      if (relative > 10 * tolerance)\n"),
    ("testing: exact ties never bind", "src/testing/compare.cpp",
     "exact_tie && (ties == ExactTies::bind || !std::isfinite(sa) || !std::isfinite(sx));",
     "exact_tie && (!std::isfinite(sa) || !std::isfinite(sx));"),
    ("testing: a NaN exchanged for a number within tolerance", "src/testing/compare.cpp",
     "      if (std::isnan(sa) || std::isnan(sx))\n        return", "      if (false)\n        return"),
    # The batch and cache checks every op shares (src/api/validate.cpp), each bound moved by
    # one, and the indexer's own (session 60).
    ("api: page == num_pages accepted", "src/api/validate.cpp",
     "if (page < 0 || page >= num_pages)", "if (page < 0 || page > num_pages)"),
    ("api: negative page accepted", "src/api/validate.cpp",
     "if (page < 0 || page >= num_pages)", "if (page < -1 || page >= num_pages)"),
    ("api: seq_len one block past the block table accepted", "src/api/validate.cpp",
     "if (int64_t{seq_len} > batch.block_table.shape[1] * kBlockTokens)",
     "if (int64_t{seq_len} > (batch.block_table.shape[1] + 1) * kBlockTokens)"),
    ("api: q_len one past seq_len accepted", "src/api/validate.cpp",
     "if (seq_len > 0 && q_len > seq_len)", "if (seq_len > 0 && q_len > seq_len + 1)"),
    ("api: the last decode request's q_len unchecked", "src/api/validate.cpp",
     "if (r < batch.num_decode_requests && q_len != batch.decode_q_len)",
     "if (r + 1 < batch.num_decode_requests && q_len != batch.decode_q_len)"),
    ("api: cu_q_lens ending short of num_tokens accepted", "src/api/validate.cpp",
     "if (host.q_begin(static_cast<int>(r_count)) != batch.num_tokens)",
     "if (host.q_begin(static_cast<int>(r_count)) > batch.num_tokens)"),
    ("api: one request past the plan accepted", "src/api/validate.cpp",
     "if (r_count < 0 || r_count > cap.max_requests)",
     "if (r_count < 0 || r_count > cap.max_requests + 1)"),
    ("api: one block-table column past the plan accepted", "src/api/validate.cpp",
     "if (batch.block_table.shape[1] > cap.max_blocks_per_request)",
     "if (batch.block_table.shape[1] > cap.max_blocks_per_request + 1)"),
    ("api: slot == num_pages x 128 accepted", "src/api/validate.cpp",
     "if (slot >= pages * kBlockTokens)", "if (slot > pages * kBlockTokens)"),
    ("api: scores one column short of the block table accepted", "src/api/validate_indexer.cpp",
     "if (scores.shape[2] < batch.block_table.shape[1])",
     "if (scores.shape[2] < batch.block_table.shape[1] - 1)"),
    ("api: index_topk topk over index_q accepted", "src/api/validate_indexer.cpp",
     '''  return check_aliasing({{args.topk, "topk"}},
                        {{args.index_q, "index_q"}, ''',
     '''  return check_aliasing({{args.topk, "topk"}},
                        {'''),
    # The configuration, plan and norm_rope / insert checks, each bound moved by one (session 60).
    ("api: top_k 33 accepted", "src/api/validate.cpp",
     "if (c.top_k < 1 || c.top_k > kMaxTopK)", "if (c.top_k < 1 || c.top_k > kMaxTopK + 1)"),
    ("api: local + init one past top_k accepted", "src/api/validate.cpp",
     "if (int64_t{c.local_blocks} + c.init_blocks > c.top_k)",
     "if (int64_t{c.local_blocks} + c.init_blocks > c.top_k + 1)"),
    ("api: 17 index heads accepted", "src/api/validate.cpp",
     "if (c.num_index_heads < 1 || c.num_index_heads > kMaxIndexHeads)",
     "if (c.num_index_heads < 1 || c.num_index_heads > kMaxIndexHeads + 1)"),
    ("api: 2^20 + 1 blocks a request accepted", "src/api/validate.cpp",
     "cap.max_blocks_per_request > (int64_t{1} << 20))",
     "cap.max_blocks_per_request > (int64_t{1} << 20) + 1)"),
    ("api: one plan thread past the limit accepted", "src/api/validate.cpp",
     "request.num_threads > kMaxPlanThreads)", "request.num_threads > kMaxPlanThreads + 1)"),
    ("api: norm_rope position == max_position accepted", "src/api/validate_norm_rope.cpp",
     "if (position < 0 || position >= max_position)", "if (position < 0 || position > max_position)"),
    ("api: norm_rope negative position accepted", "src/api/validate_norm_rope.cpp",
     "if (position < 0 || position >= max_position)", "if (position < -1 || position >= max_position)"),
    ("api: norm_rope one token past the plan accepted", "src/api/validate_norm_rope.cpp",
     "if (tokens > plan.request.capacities.max_tokens)",
     "if (tokens > plan.request.capacities.max_tokens + 1)"),
    ("api: norm_rope negative eps accepted", "src/api/validate_norm_rope.cpp",
     "config.rms_norm_eps < 0.f)", "config.rms_norm_eps < -1.f)"),
    ("api: norm_rope rope_theta 1 accepted", "src/api/validate_norm_rope.cpp",
     "!(config.rope_theta > 1.0 && std::isfinite(config.rope_theta))",
     "!(config.rope_theta >= 1.0 && std::isfinite(config.rope_theta))"),
    ("api: insert one row past the plan accepted", "src/api/validate_insert.cpp",
     "if (tokens > plan.request.capacities.max_tokens)",
     "if (tokens > plan.request.capacities.max_tokens + 1)"),
    # sparse_attention's argument checks (src/api/validate_attention.cpp): each hole must let a
    # hostile case of invalid_inputs_test through (session 60).
    ("api: attention topk past the causal limit accepted", "src/api/validate_attention.cpp",
     "(!padding && b > previous && b < n)", "(!padding && b > previous && b <= n)"),
    ("api: attention topk repeated id accepted", "src/api/validate_attention.cpp",
     "(!padding && b > previous && b < n)", "(!padding && b >= previous && b < n)"),
    ("api: attention topk id after -1 accepted", "src/api/validate_attention.cpp",
     "(!padding && b > previous && b < n)", "((void)padding, b > previous && b < n)"),
    ("api: attention v_scale unchecked", "src/api/validate_attention.cpp",
     "  if (!(args.v_scale > 0.f) || !std::isfinite(args.v_scale))",
     "  if ((void)args.v_scale, false)"),
    ("api: attention GQA group of 32 accepted", "src/api/validate_attention.cpp",
     "q_heads / kv_heads > kMaxGqaGroup)", "q_heads / kv_heads > 2 * kMaxGqaGroup)"),
    ("api: attention out over q accepted", "src/api/validate_attention.cpp",
     '''                                      {{args.q, "q"},''', "                                      {"),
    ("api: attention KV heads other than index heads accepted", "src/api/validate_attention.cpp",
     "  if (kv_heads != plan.request.config.num_index_heads)",
     "  if ((void)kv_heads, false)"),
    # How decode attention splits a pair's selection (src/cuda/decode_splits.h, the host half of
    # the CUDA plan): the cluster merge's owners and slots, the regimes' thresholds (session 60).
    ("plan: attention cluster merge owner off by one", "src/cuda/decode_splits.h",
     "return row % splits; }", "return (row + 1) % splits; }"),
    ("plan: attention cluster merge slots overlap", "src/cuda/decode_splits.h",
     "return row / splits * splits + split;", "return row / splits + split;"),
    ("plan: attention one range from 80 % of the SMs", "src/cuda/decode_splits.h",
     "decode_pairs * 10 >= int64_t{sm_count} * 9", "decode_pairs * 10 >= int64_t{sm_count} * 8"),
    ("plan: attention merge kernel from 2 ranges", "src/cuda/decode_splits.h",
     "splits < kMinSplitsMergedByKernel", "splits < 2"),
    ("plan: attention cp.async ranges of one block", "src/cuda/decode_splits.h",
     "std::max(1, top_k / 2)", "std::max(1, top_k)"),
    ("plan: attention clusters past top_k", "src/cuda/decode_splits.h",
     "(2 << i) <= top_k && decode_pairs <= active_clusters[i]",
     "(void)top_k, decode_pairs <= active_clusters[i]"),
    # The C API's conversions (src/api/c_api.cpp): each dropped or swapped field must show.
    ("c api: strides taken from the shape", "src/api/c_api.cpp",
     "result.strides[d] = view.strides[d];", "result.strides[d] = view.shape[d];"),
    ("c api: device ordinal dropped", "src/api/c_api.cpp",
     "  result.device.ordinal = view.device_ordinal;\n", ""),
    ("c api: rank unchecked", "src/api/c_api.cpp",
     "  if (view.rank < 0 || view.rank > M3SA_MAX_RANK)", "  if (view.rank < 0)"),
    ("c api: enum list one longer", "src/api/c_api.cpp",
     "  if (!in_list(value, count - 1))", "  if (!in_list(value, count))"),
    ("c api: reduce_heads dropped", "src/api/c_api.cpp",
     "  out->reduce_heads = config.reduce_heads == 1;\n", ""),
    ("c api: rope_theta dropped", "src/api/c_api.cpp", "  out->rope_theta = config.rope_theta;\n",
     ""),
    ("c api: decode_q_len dropped", "src/api/c_api.cpp",
     "  out->decode_q_len = batch.decode_q_len;\n", ""),
    ("c api: v_scale from k_scale", "src/api/c_api.cpp",
     "  out->v_scale = a.v_scale;\n  M3SA_RETURN_IF_ERROR(to_view(a.topk",
     "  out->v_scale = a.k_scale;\n  M3SA_RETURN_IF_ERROR(to_view(a.topk"),
    ("c api: kv_block_table dropped", "src/api/c_api.cpp",
     '  M3SA_RETURN_IF_ERROR(to_view(a.kv_block_table, "kv_block_table", &out->kv_block_table));\n',
     ""),
    ("c api: index gains swapped", "src/api/c_api.cpp",
     'to_view(a.index_q_norm_weight, "index_q_norm_weight", &out->index_q_norm_weight)',
     'to_view(a.index_k_norm_weight, "index_q_norm_weight", &out->index_q_norm_weight)'),
    ("c api: context threads ignored", "src/api/c_api.cpp", "  return {ctx->num_threads, ctx->stream};",
     "  return {0, ctx->stream};"),
    ("c api: a success keeps the last message", "src/api/c_api.cpp",
     '  if (status.ok()) {\n    last_error = "";', "  if (status.ok()) {"),
]

BUILD = ["cmake", "--build", "--preset", "cpu-only", "--target", "m3sa_cpu_tests", "-j2"]
TESTS = ["build-cpu/tests/m3sa_cpu_tests", "--gtest_brief=1"]


def failing_tests():
    env = dict(os.environ, M3SA_TEST_SEED=os.environ.get("M3SA_TEST_SEED", "1"))
    # errors=replace: a mutant may print bytes from past a table (a garbage name) before it fails.
    run = subprocess.run(TESTS, capture_output=True, text=True, errors="replace", env=env)
    names = sorted(set(re.findall(r"^\[  FAILED  \] ([^ ,\n]+)", run.stdout, re.M)))
    return names if names or run.returncode == 0 else [f"(exit {run.returncode})"]


def main():
    wanted = sys.argv[1:]
    survivors = 0
    print("| mutation | file | failing tests |\n|---|---|---|")
    for name, path, text, replacement in MUTATIONS:
        if wanted and not any(w in name for w in wanted):
            continue
        source = open(path).read()
        if source.count(text) != 1:
            print(f"| {name} | {path} | NOT APPLIED: text found {source.count(text)} times |")
            survivors += 1
            continue
        try:
            open(path, "w").write(source.replace(text, replacement))
            build = subprocess.run(BUILD, capture_output=True, text=True)
            failed = failing_tests() if build.returncode == 0 else ["(does not compile)"]
        finally:
            subprocess.run(["git", "checkout", "--", path], check=True)
        survivors += not failed
        shown = ", ".join(failed[:6]) + (f" (+{len(failed) - 6} more)" if len(failed) > 6 else "")
        print(f"| {name} | {path} | {shown or 'SURVIVED'} |", flush=True)
    subprocess.run(BUILD, capture_output=True)  # leave the build matching the sources
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
