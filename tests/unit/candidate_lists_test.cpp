// The decode kernels' candidate-list insertions (cuda/candidate_lists.h), checked on the host
// against a sort: after any sequence of unique keys, a list of `len` slots holds the `len` largest
// keys seen, descending, 0-padded, and insert_descending's return value is its last slot. The GPU
// decode indexer tests check the kernels that call them (GpuDecodeIndexer*, s26 r4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "cuda/candidate_lists.h"

namespace m3sa::testing {
namespace {

// The `len` largest of `seen`, descending, 0-padded.
std::vector<uint64_t> best_of(std::vector<uint64_t> seen, int len) {
  std::sort(seen.begin(), seen.end(), std::greater<>());
  seen.resize(len, 0);
  return seen;
}

// Unique nonzero keys in random order; `ascending` / `descending` orders are the two extremes of
// the walk (every key shifts the whole list / no key enters once the list is full).
std::vector<uint64_t> keys(int count, uint32_t seed, int order) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> k(count);
  for (int i = 0; i < count; ++i) k[i] = (rng() | 1) ^ (uint64_t{static_cast<uint32_t>(i)} << 1);
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  if (order == 0) std::shuffle(k.begin(), k.end(), rng);
  if (order == 2) std::reverse(k.begin(), k.end());
  return k;
}

TEST(CandidateLists, BothInsertionsKeepTheLargestKeysDescending) {
  for (int len = 1; len <= 32; ++len)
    for (int count : {0, 1, len - 1, len, len + 1, 3 * len + 5, 200})
      for (int order = 0; order < 3; ++order) {
        const std::vector<uint64_t> k = keys(count, 1000 * len + count + order, order);
        std::vector<uint64_t> walked(len, 0), read_at_once(len, 0), seen;
        uint64_t bar = 0;
        for (uint64_t key : k) {
          seen.push_back(key);
          cuda::insert_sorted(walked.data(), len, key);
          // As the Hopper kernel calls it: only keys above the row's entry bar.
          if (key > bar) bar = cuda::insert_descending<32>(read_at_once.data(), len, key);
          ASSERT_EQ(bar, read_at_once[len - 1]) << "len " << len << " after " << seen.size();
        }
        const std::vector<uint64_t> expected = best_of(seen, len);
        EXPECT_EQ(walked, expected) << "insert_sorted, len " << len << " count " << count;
        EXPECT_EQ(read_at_once, expected)
            << "insert_descending, len " << len << " count " << count << " order " << order;
      }
}

// The bound is the list's room, not its length: a list shorter than kMaxLen leaves the memory
// past its last slot alone (the kernels' lists sit side by side in shared memory).
TEST(CandidateLists, InsertDescendingWritesOnlyTheListsSlots) {
  for (int len = 1; len <= 16; ++len) {
    std::vector<uint64_t> memory(len + 8, 0);
    const uint64_t guard = 0xdeadbeefcafef00dull;
    for (int i = len; i < len + 8; ++i) memory[i] = guard;
    for (uint64_t key : keys(40, 7 * len, 0)) cuda::insert_descending<16>(memory.data(), len, key);
    for (int i = len; i < len + 8; ++i) EXPECT_EQ(memory[i], guard) << "len " << len;
    EXPECT_TRUE(std::is_sorted(memory.begin(), memory.begin() + len, std::greater<>()));
  }
}

} // namespace
} // namespace m3sa::testing
