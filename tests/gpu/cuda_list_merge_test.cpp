// The decode indexer's last-CTA list merge (lists_floor + rank_survivors, with the register-list
// ranking as its fallback) on lists built for it, through a one-warp probe (list_merge_probe.cu):
// random lists with short and empty ones, lists ordered so that every key of the first lists lies
// above the floor (too many survivors), lists banded by the lane that reads their heads (too many
// live lists), all-empty lists; lists back to back (the Hopper kernel's packed warp lists) and
// lists with a gap of poison keys between them (the portable kernel's [64][fill] slots, context
// parallel's rank stride); global and staged in shared memory. The result must be the fill
// largest keys, descending and 0-padded, whichever path served it. And the one-warp sort of rows
// with at most 64 keys. "Small": compute-sanitizer runs it.
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

// Lists as the probe reads them: list l's keys at l * (len + gap), the `gap` keys after each list
// poisoned so that a wrong stride or a read past len takes a key above every real one.
struct HostLists {
  int count, len, gap;
  std::vector<uint64_t> keys;

  HostLists(int count_, int len_, int gap_)
      : count(count_), len(len_), gap(gap_),
        keys(static_cast<size_t>(count_) * (len_ + gap_), ~uint64_t{0}) {} // the poison
  int64_t stride() const { return len + gap; }
  uint64_t& at(int l, int k) { return keys[static_cast<size_t>(l * stride() + k)]; }
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
  // The floor lists_floor promises: the fill-th largest of the keys its 32 lanes hold, 0 when
  // fewer than fill lanes hold one - lane l the largest head of lists l, l + 32, ...; or, where
  // few lists are sampled (the one-range finish) and there are fewer than 32, key l / count of
  // list l % count.
  uint64_t lanes_floor(int fill, bool sample_few_lists) {
    if (fill <= 0) return 0;
    std::vector<uint64_t> lanes(32, 0);
    for (int lane = 0; lane < 32; ++lane) {
      if (sample_few_lists && count > 0 && count < 32) {
        if (lane / count < len) lanes[lane] = at(lane % count, lane / count);
      } else {
        for (int l = lane; l < count; l += 32) lanes[lane] = std::max(lanes[lane], at(l, 0));
      }
    }
    std::sort(lanes.rbegin(), lanes.rend());
    return lanes[fill - 1];
  }
};

struct MergeResult {
  std::vector<uint64_t> chosen;
  uint64_t floor = 0;
  bool ranked = false;
};

MergeResult run_probe(const HostLists& h, int fill, bool shared, bool sample_few_lists) {
  MergeResult r;
  HostTensor keys(DType::i64, {static_cast<int64_t>(h.keys.size())});
  std::copy(h.keys.begin(), h.keys.end(), keys.data<uint64_t>());
  const DeviceBuffer lists(keys);
  DeviceBuffer chosen(DType::i64, {32}, 0xcd), floor(DType::i64, {1}, 0xcd),
      ranked(DType::i32, {1}, 0xcd);
  EXPECT_TRUE(lists.ok() && chosen.ok() && floor.ok() && ranked.ok());
  ListMergeProbe p{};
  p.lists = static_cast<const uint64_t*>(lists.data());
  p.stride = h.stride();
  p.extent = static_cast<int64_t>(h.keys.size());
  p.count = h.count, p.len = h.len, p.fill = fill, p.shared = shared;
  p.sample_few_lists = sample_few_lists;
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

// Runs every variant (global, shared; heads' floor, few lists sampled) and checks the result, the
// floor (at or below the fill-th largest key, and exactly the lanes' one) and, where the lists
// were built for one, the path (where the floor is the heads'; a sampled one keeps fewer
// survivors).
void expect_merge(HostLists& h, int fill, Path path, const std::string& name) {
  const std::vector<uint64_t> want = h.best(fill);
  for (bool sample : {false, true})
    for (bool shared : {false, true}) {
      const std::string variant =
          std::string(shared ? " staged" : " global") + (sample ? " sampled" : "");
      SCOPED_TRACE(name + variant);
      const MergeResult got = run_probe(h, fill, shared, sample);
      EXPECT_EQ(got.chosen, want);
      if (fill > 0 && want[fill - 1] != 0) {
        EXPECT_LE(got.floor, want[fill - 1]);
      }
      EXPECT_EQ(got.floor, h.lanes_floor(fill, sample));
      if (path != Path::any && (!sample || h.count >= 32)) {
        EXPECT_EQ(got.ranked, path == Path::survivors);
      }
      std::printf("[ ListMerge %s%s ] %s\n", name.c_str(), variant.c_str(),
                  got.ranked ? "survivors" : "fallback");
    }
}

std::string shape(int count, int len, int gap, int fill) {
  return std::to_string(count) + " lists x " + std::to_string(len) + " (gap " +
         std::to_string(gap) + "), fill " + std::to_string(fill);
}

TEST(GpuListMergeSmall, RandomListsGiveTheFillLargestKeys) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  struct Shape {
    int count, len, gap, fill;
  };
  const Shape shapes[] = {{1, 1, 3, 1},     {1, 16, 3, 14},   {3, 5, 3, 15},   {4, 15, 0, 14},
                          {31, 2, 3, 15},   {32, 1, 3, 14},   {33, 8, 3, 31},  {64, 1, 0, 14},
                          {132, 8, 3, 15},  {132, 15, 3, 14}, {528, 2, 0, 14}, {528, 15, 0, 15},
                          {400, 31, 0, 31}, {16, 4, 0, 30},   {8, 32, 3, 32},  {264, 3, 0, 1},
                          {8, 16, 0, 14},   {8, 15, 0, 15},   {4, 32, 0, 31},  {16, 8, 3, 15}};
  for (const Shape& s : shapes) {
    HostLists h(s.count, s.len, s.gap);
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
    expect_merge(h, s.fill, Path::any, "random " + shape(s.count, s.len, s.gap, s.fill));
  }
}

// A batch-128 range's own lists (8 warps x 16 keys, fill 14 or 15, every list full): fewer lists
// than lanes, so the heads alone leave the floor at 0 and all 128 keys survive, while the sampled
// floor is the fill-th largest of the lists' first four keys and rank_survivors ranks a few more
// than fill of them (s34 r2: ranking all 128 took 7K cycles).
TEST(GpuListMergeSmall, FewFullListsSampledGiveAFloorAboveZero) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int fill : {14, 15}) {
    HostLists h(8, 16, 0);
    std::set<uint64_t> used{0, ~uint64_t{0}};
    for (int l = 0; l < 8; ++l) {
      std::vector<uint64_t> list;
      while (list.size() < 16) {
        const uint64_t key = rng.next() | 1;
        if (used.insert(key).second) list.push_back(key);
      }
      h.set(l, list);
    }
    EXPECT_EQ(h.lanes_floor(fill, false), 0u);
    EXPECT_NE(h.lanes_floor(fill, true), 0u);
    const MergeResult got = run_probe(h, fill, true, true);
    EXPECT_TRUE(got.ranked);
    EXPECT_EQ(got.chosen, h.best(fill));
    EXPECT_EQ(got.floor, h.lanes_floor(fill, true));
  }
}

// Every key of list l above every key of list l + 1 (the contract's order on tied scores: lower
// block ids first, ranges in order): the floor is list fill - 1's head, and (fill - 1) x len + 1
// keys survive - up to rank_survivors' 224, or more (then the register lists rank them all).
TEST(GpuListMergeSmall, OrderedListsDefeatTheFloor) {
  M3SA_SKIP_WITHOUT_CUDA();
  struct Shape {
    int count, len, gap, fill;
    Path path;
  };
  const Shape shapes[] = {{64, 8, 3, 4, Path::survivors},
                          {132, 31, 3, 31, Path::fallback},
                          {528, 10, 0, 31, Path::fallback},
                          {40, 20, 0, 12, Path::survivors}, // 221 survivors
                          {40, 16, 0, 15, Path::fallback}}; // 225
  for (const Shape& s : shapes) {
    HostLists h(s.count, s.len, s.gap);
    for (int l = 0; l < s.count; ++l) {
      std::vector<uint64_t> list;
      for (int k = 0; k < s.len; ++k)
        list.push_back((uint64_t{1} << 40) - uint64_t{static_cast<uint32_t>(l)} * 64 - k);
      h.set(l, list);
    }
    expect_merge(h, s.fill, s.path, "ordered " + shape(s.count, s.len, s.gap, s.fill));
  }
}

// Lists banded by the lane that reads their head (list l: band 31 - l % 32 in the high bits): the
// lane maxima are one a band, the floor the fill-th band's, and every list of the higher bands is
// live - more live lists than survivor slots, so rank_survivors declines before reading them.
TEST(GpuListMergeSmall, LaneBandedListsOverflowTheLiveLists) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (int gap : {0, 3}) {
    const int count = 528, len = 2, fill = 31;
    HostLists h(count, len, gap);
    for (int l = 0; l < count; ++l) {
      const uint64_t band = uint64_t{static_cast<uint32_t>(32 - l % 32)} << 40;
      h.set(l, {band | (uint64_t{static_cast<uint32_t>(count - l)} << 4) | 2,
                band | (uint64_t{static_cast<uint32_t>(count - l)} << 4) | 1});
    }
    expect_merge(h, fill, Path::fallback, "banded " + shape(count, len, gap, fill));
  }
}

TEST(GpuListMergeSmall, EmptyListsGiveNoKey) {
  M3SA_SKIP_WITHOUT_CUDA();
  for (int count : {0, 1, 40, 300}) {
    HostLists h(count, 8, 0);
    for (int l = 0; l < count; ++l) h.set(l, {});
    expect_merge(h, 14, Path::survivors, "empty " + shape(count, 8, 0, 14));
  }
}

// Rows whose lists hold at most 64 keys skip the floor: one warp ranks them (rank_of_64, the
// decode merge's; best_of_64, the context-parallel merge's network). Any count of keys 0..64 at
// any of the 64 places (0s between them), keys that differ only in the low word (tied scores, the
// block id decides) or only in the top bit (the unsigned order), keys of every place ascending or
// descending: lane l gets the key of rank l, 0 past the last - from both.
TEST(GpuListMergeSmall, AtMost64KeysSortedByOneWarp) {
  M3SA_SKIP_WITHOUT_CUDA();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  DeviceBuffer keys(DType::i64, {64}, 0), ranked(DType::i64, {32}, 0xcd);
  ASSERT_TRUE(keys.ok() && ranked.ok());
  const auto check = [&](const std::vector<uint64_t>& in, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(keys.upload(in.data(), 64 * sizeof(uint64_t)).ok());
    std::vector<uint64_t> want(in);
    std::sort(want.rbegin(), want.rend());
    want.resize(32);
    for (bool by_ranks : {false, true}) {
      SCOPED_TRACE(by_ranks ? "rank_of_64" : "best_of_64");
      ASSERT_TRUE(ranked.fill(0xcd).ok());
      ASSERT_EQ(run_warp_ranking_probe(static_cast<const uint64_t*>(keys.data()),
                                       static_cast<uint64_t*>(ranked.data()), by_ranks),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const HostTensor got = ranked.download();
      EXPECT_EQ(std::vector<uint64_t>(got.data<uint64_t>(), got.data<uint64_t>() + 32), want);
    }
  };
  for (int n = 0; n <= 64; ++n) {
    // n distinct random keys at random places.
    std::vector<uint64_t> in(64, 0);
    std::vector<int> places(64);
    for (int i = 0; i < 64; ++i) places[i] = i;
    for (int i = 63; i > 0; --i) std::swap(places[i], places[rng.uniform_int(0, i)]);
    std::set<uint64_t> used{0};
    for (int i = 0; i < n; ++i) {
      uint64_t key = rng.next();
      while (!used.insert(key).second) key = rng.next();
      in[places[i]] = key;
    }
    check(in, "random, " + std::to_string(n) + " keys");
    // Tied scores: one high word, the low words (block ids) in a random order.
    for (int i = 0; i < n; ++i)
      in[places[i]] = (uint64_t{0x3f800000} << 32) | static_cast<uint32_t>(places[(i * 7) % 64]);
    check(in, "tied, " + std::to_string(n) + " keys");
  }
  std::vector<uint64_t> ascending(64), descending(64), top_bit(64);
  for (int i = 0; i < 64; ++i) {
    ascending[i] = uint64_t{static_cast<uint32_t>(i + 1)} << 20;
    descending[i] = uint64_t{static_cast<uint32_t>(64 - i)} << 20;
    top_bit[i] = (i % 2 ? uint64_t{1} << 63 : 0) | static_cast<uint32_t>(i + 1);
  }
  check(ascending, "ascending");
  check(descending, "descending");
  check(top_bit, "top bit on every other key");
}

} // namespace
} // namespace m3sa::testing
