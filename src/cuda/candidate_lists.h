#pragma once
// A decode row's candidate list: its best keys so far, descending, 0 in the empty slots (keys are
// selection_key values, unique per block and never 0). Plain host / device code, no CUDA headers,
// so that the CPU tests check the insertions against a sort (tests/unit/candidate_lists_test.cpp);
// the decode kernels call them on lists in shared memory, one thread a row.
#include <cstdint>

#include "common/host_device.h"

namespace m3sa::cuda {

// Inserts `key` into a descending list of `len` keys, dropping the last: a walk from the end,
// one memory round trip per shifted key (the portable decode kernel: its 168 registers do not
// hold a whole list, which insert_descending needs).
M3SA_HOST_DEVICE void insert_sorted(uint64_t* list, int len, uint64_t key) {
  if (key <= list[len - 1]) return;
  int i = len - 1;
  while (i > 0 && list[i - 1] < key) {
    list[i] = list[i - 1];
    --i;
  }
  list[i] = key;
}

// The same insertion with the list read at once (len <= kMaxLen): slot i takes
// max(list[i], min(list[i - 1], key)) and slot 0 max(list[0], key), each independent of the
// others, so the list costs one memory round trip instead of one per shifted key. Returns the new
// last key (the row's entry bar). For kernels with the registers to hold the list (the Hopper
// decode kernel, where the page's fragments are dead by then: 236 registers, no spill; the
// portable kernel spills at its 168): -0.2-0.6 us at batch 1 and -0.6-0.9 at B=32 S=8K, where
// nearly every block enters its row's list (bench/NOTES.md s26 r4-r5).
template <int kMaxLen>
M3SA_HOST_DEVICE uint64_t insert_descending(uint64_t* list, int len, uint64_t key) {
  const auto larger = [](uint64_t a, uint64_t b) { return a > b ? a : b; };
  const auto smaller = [](uint64_t a, uint64_t b) { return a < b ? a : b; };
  uint64_t d[kMaxLen];
  M3SA_UNROLL
  for (int i = 0; i < kMaxLen; ++i) d[i] = i < len ? list[i] : 0;
  uint64_t last = larger(d[0], key);
  list[0] = last;
  M3SA_UNROLL
  for (int i = 1; i < kMaxLen; ++i)
    if (i < len) {
      last = larger(d[i], smaller(d[i - 1], key));
      list[i] = last;
    }
  return last;
}

} // namespace m3sa::cuda
