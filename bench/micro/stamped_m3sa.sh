#!/usr/bin/env bash
# Builds .gpu/m3sa_stamps: the m3sa CLI with both bf16 decode attention kernels (the cp.async one,
# which takes batch 1 in clusters, and the TMA one), the e4m3 TMA one, and the decode indexer's
# TMA kernels (bf16 and e4m3, top_k 16: `--filter "decode bf16 B=1 S=8K H=1"`) compiled with
# M3SA_ATTENTION_DECODE_STAMPS=1
# (kernels/decode_stamps.cuh: clock64 at each phase of every CTA of a kernel's 20th launch,
# printed by its last CTA). Needs the default preset built (build/). Run on the device:
# .gpu/m3sa_stamps bench --filter "attention decode bf16 B=32 S=32K Hq=16 Hkv=1" (bench/NOTES.md
# s10 r2 reads the printout).
exec "$(dirname "${BASH_SOURCE[0]}")/variant_m3sa.sh" stamps \
  "-DM3SA_ATTENTION_DECODE_STAMPS=1" src/cuda/sparse_attention_decode_sm90_bf16.cu \
  src/cuda/sparse_attention_decode_sm90_fp8.cu src/cuda/sparse_attention_decode_bf16.cu \
  src/cuda/decode_topk_sm90_bf16_k16.cu src/cuda/decode_topk_sm90_fp8_k16.cu
