// The decode indexer's last-CTA list merge (lists_floor + rank_survivors, with the register-list
// ranking as its fallback) on lists built for it, through a one-warp probe (list_merge_probe.cu):
// random lists with short and empty ones, lists ordered so that every key of the first lists lies
// above the floor (too many survivors), lists banded by the lane that reads their heads (too many
// live lists), all-empty lists; one list a range (the portable kernel, context parallel) and four
// (the Hopper kernel's warps); global and staged in shared memory. The result must be the fill
// largest keys, descending and 0-padded, whichever path served it. "Small": compute-sanitizer runs
// it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cuda/kernels/indexer_traits.h"
#include "gpu/cuda_test_util.h"
#include "gpu/list_merge_probe.h"

namespace m3sa::testing {
namespace {

// Lists as the probe reads them: list l's keys at (l / per_split) * split_stride + (l % per_split)
// * list_stride, both padded past what the lists need so that a wrong stride reads a poison key.
struct HostLists {
  int count, len, per_split;
  int64_t list_stride, split_stride;
  std::vector<uint64_t> keys;

  HostLists(int count_, int len_, int per_split_)
      : count(count_), len(len_), per_split(per_split_), list_stride(len_ + 1),
        split_stride(per_split_ * (len_ + 1) + 3),
        keys(static_cast<size_t>((count_ + per_split_ - 1) / per_split_ * split_stride),
             ~uint64_t{0}) {} // the poison: above every real key
  uint64_t& at(int l, int k) {
    return keys[static_cast<size_t>(l / per_split * split_stride + l % per_split * list_stride +
                                    k)];
  }
  // List l gets `list` (descending, at most len keys), 0-padded.
  void set(int l, std::vector<uint64_t> list) {
    std::sort(list.rbegin(), list.rend());
    for (int k = 0; k < len; ++k) at(l, k) = k < static_cast<int>(list.size()) ? list[k] : 0;
  }
  // The fill largest keys over every list, descending, 0-padded to 32.
  std::vector<uint64_t> best(int fill) {
    std::vector<uint64_t> all;
    for (int l = 0; l < count; ++l)
      for (int k = 0; k < len; ++k)
        if (at(l, k) != 0) all.push_back(at(l, k));
    std::sort(all.rbegin(), all.rend());
    all.resize(32, 0);
    std::fill(all.begin() + fill, all.end(), 0);
    return all;
  }
};

struct MergeResult {
  std::vector<uint64_t> chosen;
  uint64_t floor = 0;
  bool ranked = false;
};

MergeResult run_probe(const HostLists& h, int fill, bool shared) {
  MergeResult r;
  HostTensor keys(DType::i64, {static_cast<int64_t>(h.keys.size())});
  std::copy(h.keys.begin(), h.keys.end(), keys.data<uint64_t>());
  const DeviceBuffer lists(keys);
  DeviceBuffer chosen(DType::i64, {32}, 0xcd), floor(DType::i64, {1}, 0xcd),
      ranked(DType::i32, {1}, 0xcd);
  EXPECT_TRUE(lists.ok() && chosen.ok() && floor.ok() && ranked.ok());
  ListMergeProbe p{};
  p.lists = static_cast<const uint64_t*>(lists.data());
  p.split_stride = h.split_stride, p.list_stride = h.list_stride;
  p.extent = static_cast<int64_t>(h.keys.size());
  p.per_split = h.per_split, p.count = h.count, p.len = h.len, p.fill = fill, p.shared = shared;
  p.chosen = static_cast<uint64_t*>(chosen.data());
  p.floor = static_cast<uint64_t*>(floor.data());
  p.ranked = static_cast<int32_t*>(ranked.data());
  EXPECT_EQ(run_list_merge_probe(p), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor c = chosen.download(), f = floor.download(), k = ranked.download();
  r.chosen.assign(c.data<uint64_t>(), c.data<uint64_t>() + 32);
  r.floor = f.data<uint64_t>()[0];
  r.ranked = k.data<int32_t>()[0] == 1;
  return r;
}

enum class Path { any, survivors, fallback };

// Runs both variants (global, shared) and checks the result, the floor (at or below the fill-th
// largest key) and, where the lists were built for one, the path.
void expect_merge(HostLists& h, int fill, Path path, const std::string& name) {
  const std::vector<uint64_t> want = h.best(fill);
  for (bool shared : {false, true}) {
    SCOPED_TRACE(name + (shared ? " staged" : " global"));
    const MergeResult got = run_probe(h, fill, shared);
    EXPECT_EQ(got.chosen, want);
    if (fill > 0 && want[fill - 1] != 0) {
      EXPECT_LE(got.floor, want[fill - 1]);
    }
    if (path != Path::any) {
      EXPECT_EQ(got.ranked, path == Path::survivors);
    }
    std::printf("[ ListMerge %s %s ] %s\n", name.c_str(), shared ? "staged" : "global",
                got.ranked ? "survivors" : "fallback");
  }
}

std::string shape(int count, int len, int per_split, int fill) {
  return std::to_string(count) + " lists x " + std::to_string(len) + " (" +
         std::to_string(per_split) + " a range), fill " + std::to_string(fill);
}

TEST(GpuListMergeSmall, RandomListsGiveTheFillLargestKeys) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Shape {
    int count, len, per_split, fill;
  };
  const Shape shapes[] = {{1, 1, 1, 1},     {1, 16, 1, 14},   {3, 5, 1, 15},   {4, 15, 4, 14},
                          {31, 2, 1, 15},   {32, 1, 1, 14},   {33, 8, 1, 31},  {64, 1, 4, 14},
                          {132, 8, 1, 15},  {132, 15, 1, 14}, {528, 2, 4, 14}, {528, 15, 4, 15},
                          {400, 31, 4, 31}, {16, 4, 4, 30},   {8, 32, 1, 32},  {264, 3, 4, 1}};
  for (const Shape& s : shapes) {
    HostLists h(s.count, s.len, s.per_split);
    std::set<uint64_t> used{0, ~uint64_t{0}};
    for (int l = 0; l < s.count; ++l) {
      // Every fifth list shorter than len, every seventh empty: ranges with fewer candidates.
      const int n = l % 7 == 3 ? 0 : l % 5 == 1 ? rng.uniform_int(0, s.len) : s.len;
      std::vector<uint64_t> list;
      while (static_cast<int>(list.size()) < n) {
        const uint64_t key = rng.next();
        if (used.insert(key).second) list.push_back(key);
      }
      h.set(l, list);
    }
    expect_merge(h, s.fill, Path::any, "random " + shape(s.count, s.len, s.per_split, s.fill));
  }
}

// Every key of list l above every key of list l + 1 (the contract's order on tied scores: lower
// block ids first, ranges in order): the floor is list fill - 1's head, and (fill - 1) x len + 1
// keys survive - up to rank_survivors' 224, or more (then the register lists rank them all).
TEST(GpuListMergeSmall, OrderedListsDefeatTheFloor) {
  M3SA_SKIP_WITHOUT_CUDA();
  struct Shape {
    int count, len, per_split, fill;
    Path path;
  };
  const Shape shapes[] = {{64, 8, 1, 4, Path::survivors},
                          {132, 31, 1, 31, Path::fallback},
                          {528, 10, 4, 31, Path::fallback},
                          {40, 20, 4, 12, Path::survivors}, // 221 survivors
                          {40, 16, 4, 15, Path::fallback}}; // 225
  for (const Shape& s : shapes) {
    HostLists h(s.count, s.len, s.per_split);
    for (int l = 0; l < s.count; ++l) {
      std::vector<uint64_t> list;
      for (int k = 0; k < s.len; ++k)
        list.push_back((uint64_t{1} << 40) - uint64_t{static_cast<uint32_t>(l)} * 64 - k);
      h.set(l, list);
    }
    expect_merge(h, s.fill, s.path, "ordered " + shape(s.count, s.len, s.per_split, s.fill));
  }
}

// Lists banded by the lane that reads their head (list l: band 31 - l % 32 in the high bits): the
// lane maxima are one a band, the floor the fill-th band's, and every list of the higher bands is
// live - more live lists than survivor slots, so rank_survivors declines before reading them.
TEST(GpuListMergeSmall, LaneBandedListsOverflowTheLiveLists) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (int per_split : {1, 4}) {
    const int count = 528, len = 2, fill = 31;
    HostLists h(count, len, per_split);
    for (int l = 0; l < count; ++l) {
      const uint64_t band = uint64_t{static_cast<uint32_t>(32 - l % 32)} << 40;
      h.set(l, {band | (uint64_t{static_cast<uint32_t>(count - l)} << 4) | 2,
                band | (uint64_t{static_cast<uint32_t>(count - l)} << 4) | 1});
    }
    expect_merge(h, fill, Path::fallback, "banded " + shape(count, len, per_split, fill));
  }
}

TEST(GpuListMergeSmall, EmptyListsGiveNoKey) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (int count : {0, 1, 40, 300}) {
    HostLists h(count, 8, 4);
    for (int l = 0; l < count; ++l) h.set(l, {});
    expect_merge(h, 14, Path::survivors, "empty " + shape(count, 8, 4, 14));
  }
}

} // namespace
} // namespace m3sa::testing
