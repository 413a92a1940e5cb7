// The decode kernel's stealing protocol (cuda/decode_steal.h) under real threads: a thread a warp,
// CTAs of them meeting at barriers as the kernel's do, owners claiming from the front, CTAs done
// with their own tile stealing from the back, over several steps that reuse the words without a
// reset while the tiles' lengths change (a decode step's seq_len grows; a new batch may shrink
// it). Every block must be streamed exactly once, every tile merged exactly once, by a CTA that
// sees every participant's published lists, and no tile may take more thieves than its slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <latch>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cuda/decode_steal.h"

namespace m3sa::testing {
namespace {

using namespace m3sa::cuda;

TEST(DecodeSteal, WordFieldsRoundTrip) {
  for (int chunks : {0, 1, 7, 4096, kStealMaxChunks})
    for (int front : {0, 1, chunks, chunks + 8})
      for (int stolen : {0, 1, chunks})
        for (int thieves : {0, 1, kStealMaxThieves}) {
          const StealState s = steal_state(steal_word(chunks, front, stolen, thieves));
          EXPECT_EQ(s.chunks, chunks);
          EXPECT_EQ(s.front, front);
          EXPECT_EQ(s.stolen, stolen);
          EXPECT_EQ(s.thieves, thieves);
        }
  // A front claim is one addition that never carries into `stolen`.
  const uint64_t w = steal_word(100, 41, 7, 2) + kStealFrontOne;
  EXPECT_EQ(steal_state(w).front, 42);
  EXPECT_EQ(steal_state(w).stolen, 7);
}

TEST(DecodeSteal, ChunksCoverTheTileOnce) {
  for (int c : {1, 2, 3, 4})
    for (int n = 0; n < 200; ++n) {
      const int chunks = steal_chunk_count(n, c);
      int total = 0;
      for (int i = 0; i < chunks; ++i) {
        EXPECT_GE(steal_chunk_blocks(i, c, n), 1) << "n " << n << " chunk " << i;
        total += steal_chunk_blocks(i, c, n);
      }
      EXPECT_EQ(total, n);
      EXPECT_EQ(steal_chunk_blocks(chunks, c, n), 0);
    }
}

TEST(DecodeSteal, FrontAndBackMeetWithoutOverlap) {
  // One chunk left: whichever of the owner's claim and a thief's comes first takes it.
  const uint64_t last = steal_word(10, 6, 3, 1);
  EXPECT_EQ(steal_chunks_left(last), 1);
  EXPECT_EQ(claimed_from_front(last), 6);
  EXPECT_EQ(claimed_from_back(last), 6);
  EXPECT_EQ(claimed_from_front(last + kStealBackOne), -1); // the owner came second
  EXPECT_EQ(claimed_from_back(last + kStealFrontOne), -1); // the thief came second
  EXPECT_EQ(register_thief(last + kStealFrontOne).chunk, -1);
  // Void claims only push the fields further past `chunks`.
  EXPECT_EQ(claimed_from_back(last + kStealFrontOne + kStealBackOne), -1);
  EXPECT_EQ(steal_chunks_left(last + 2 * kStealFrontOne + 5 * kStealBackOne), 0);
  // A tile with every slot taken accepts no new thief, but its thieves go on.
  const uint64_t full = steal_word(10, 2, 3, kStealMaxThieves);
  EXPECT_EQ(steal_preference(full), 0);
  EXPECT_EQ(register_thief(full).chunk, -1);
  EXPECT_EQ(claimed_from_back(full), 6);
  const Steal first = register_thief(steal_word(10, 2, 3, 1));
  EXPECT_EQ(first.chunk, 6);
  EXPECT_EQ(first.slot, 2);
  EXPECT_EQ(steal_state(first.after).stolen, 4);
  // Every chunk in the owner's warps at once: nothing to steal.
  EXPECT_EQ(steal_chunks_left(owner_start_word(3, 16)), 0);
  EXPECT_EQ(steal_chunks_left(owner_start_word(30, 16)), 14);
  // A taken word offers nothing even to a longer next step (no reset between steps).
  EXPECT_EQ(steal_preference(steal_word(10, 8, 3, 1)), 0);
}

// The plan's capacity check: a tile fits the word when its chunk count (rounded up) is at most
// kStealMaxChunks, which leaves the fields room for the void claims past `chunks`.
TEST(DecodeSteal, CapacityFitsExactlyTheChunksTheFieldsHold) {
  for (int c : {1, 2, 3, 8}) {
    const int64_t most = int64_t{kStealMaxChunks} * c;
    EXPECT_TRUE(steal_chunks_fit(0, c));
    EXPECT_TRUE(steal_chunks_fit(most - c + 1, c)) << c;
    EXPECT_TRUE(steal_chunks_fit(most, c)) << c;
    EXPECT_FALSE(steal_chunks_fit(most + 1, c)) << c; // one block more is one chunk more
    EXPECT_FALSE(steal_chunks_fit(most + c, c)) << c;
    EXPECT_EQ(steal_chunk_count(static_cast<int>(most), c), kStealMaxChunks);
  }
  // A fitting tile's word holds its chunks and a front past them by the void claims' room.
  const StealState s = steal_state(steal_word(kStealMaxChunks, kStealMaxChunks + 63, 0, 0));
  EXPECT_EQ(s.chunks, kStealMaxChunks);
  EXPECT_EQ(s.front, kStealMaxChunks + 63);
  EXPECT_EQ(s.stolen, 0);
}

// The owner's start word takes at most the tile's chunks, however many its warps ask for: its
// front field never carries into `stolen`, and nothing is left when the warps cover the tile.
TEST(DecodeSteal, OwnerStartWordTakesAtMostTheTilesChunks) {
  for (int chunks : {0, 1, 5, 100, kStealMaxChunks})
    for (int taken : {0, 1, 16, chunks, chunks + 1, 2 * chunks + 7, 1 << kStealFieldBits}) {
      const StealState s = steal_state(owner_start_word(chunks, taken));
      const int expected = std::min(taken, chunks);
      EXPECT_EQ(s.chunks, chunks) << chunks << " " << taken;
      EXPECT_EQ(s.front, expected) << chunks << " " << taken;
      EXPECT_EQ(s.stolen, 0) << chunks << " " << taken;
      EXPECT_EQ(s.thieves, 0) << chunks << " " << taken;
      EXPECT_EQ(steal_chunks_left(owner_start_word(chunks, taken)), chunks - expected);
    }
}

// The kernel's flow, a std::thread a warp. Per step each tile has a random length; CTA t < tiles
// owns tile t, the others start as thieves.
struct Protocol {
  int tiles, warps, chunk_blocks;
  std::vector<std::atomic<uint64_t>> words;
  std::vector<std::atomic<int>> done;
  // Per step:
  std::vector<int> n;
  std::vector<std::unique_ptr<std::atomic<int>[]>> streamed; // [tile][block]
  std::vector<std::atomic<int>> merges;
  std::vector<std::array<std::atomic<int>, kStealSlots>> slot_blocks; // published lists
  std::vector<std::atomic<int>> merged_blocks;
  std::unique_ptr<std::latch> owners_started; // the CTAs without a tile wait for it
  std::atomic<int> steals{0};

  Protocol(int tiles_, int warps_, int chunk_)
      : tiles(tiles_), warps(warps_), chunk_blocks(chunk_), words(tiles_), done(tiles_), n(tiles_),
        streamed(tiles_), merges(tiles_), slot_blocks(tiles_), merged_blocks(tiles_) {
    for (auto& w : words) w.store(0);
    for (auto& d : done) d.store(0);
  }

  void begin_step(std::mt19937& rng, int max_blocks) {
    owners_started = std::make_unique<std::latch>(tiles);
    for (int t = 0; t < tiles; ++t) {
      n[t] = std::uniform_int_distribution<int>(0, max_blocks)(rng);
      streamed[t] = std::make_unique<std::atomic<int>[]>(std::max(1, n[t]));
      for (int b = 0; b < n[t]; ++b) streamed[t][b].store(0);
      merges[t].store(0);
      merged_blocks[t].store(-1);
      for (auto& s : slot_blocks[t]) s.store(-1);
    }
  }

  int stream(int tile, int chunk) {
    const int blocks = steal_chunk_blocks(chunk, chunk_blocks, n[tile]);
    for (int b = chunk * chunk_blocks; b < chunk * chunk_blocks + blocks; ++b)
      streamed[tile][b].fetch_add(1, std::memory_order_relaxed);
    // Long enough that the threads overlap on few cores.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return blocks;
  }

  // The merge: every slot of the tile's registered participants published.
  void merge(int tile, int slots) {
    int total = 0;
    for (int s = 0; s < slots; ++s) total += slot_blocks[tile][s].load(std::memory_order_relaxed);
    merged_blocks[tile].store(total);
    merges[tile].fetch_add(1);
  }

  // Publish `blocks` into `slot` and add to the done count; the addition that completes merges.
  void publish(int tile, int slot, int blocks, int units) {
    slot_blocks[tile][slot].store(blocks, std::memory_order_relaxed);
    const int before = done[tile].fetch_add(units, std::memory_order_acq_rel);
    if (before + units == steal_done_target(n[tile])) {
      done[tile].store(0, std::memory_order_relaxed);
      merge(tile, 1 + steal_state(words[tile].load()).thieves);
    }
  }

  uint64_t cas(int tile, uint64_t expected, uint64_t desired) {
    words[tile].compare_exchange_strong(expected, desired, std::memory_order_relaxed);
    return expected; // the word found (== the expected one when swapped)
  }

  // One CTA: `warps` threads and a barrier. Shared values go through `cta_*` as shared memory.
  void run_cta(int cta) {
    std::barrier sync(warps);
    std::vector<int> warp_blocks(warps), warp_chunks(warps);
    int victim = -1, first_chunk = -1, slot = 0;
    const auto warp_main = [&](int w) {
      if (cta < tiles) { // the owner of tile `cta`
        const int tile = cta, chunks = steal_chunk_count(n[tile], chunk_blocks);
        const int taken = std::min(chunks, 2 * warps); // warp w's first two: w, w + warps
        if (w == 0) {
          words[tile].store(owner_start_word(chunks, taken));
          owners_started->count_down();
        }
        sync.arrive_and_wait();
        const auto claim = [&] {
          return claimed_from_front(words[tile].fetch_add(kStealFrontOne));
        };
        int blocks = 0, claimed = 0;
        int chunk = w < taken ? w : -1, next = w + warps < taken ? w + warps : -1;
        while (chunk >= 0) {
          const int after_next = next >= 0 ? claim() : -1; // two ahead, as the kernel
          blocks += stream(tile, chunk);
          ++claimed;
          chunk = next, next = after_next;
        }
        warp_blocks[w] = blocks, warp_chunks[w] = claimed;
        sync.arrive_and_wait();
        if (w == 0) {
          int total = 0, claimed_all = 0;
          for (int i = 0; i < warps; ++i) total += warp_blocks[i], claimed_all += warp_chunks[i];
          if (claimed_all == chunks) { // nothing stolen: the owner's own merge
            EXPECT_EQ(total, n[tile]);
            slot_blocks[tile][0].store(total);
            merge(tile, 1);
          } else {
            EXPECT_LT(total, n[tile] + (n[tile] == 0));
            publish(tile, 0, total, total + 1);
          }
        }
        sync.arrive_and_wait();
      }
      // A CTA without a tile of its own comes after the owners have begun. On the GPU it scans
      // again for a while instead; one that gave up earlier would only have found the last
      // step's taken words and ended: correct, only no help.
      if (cta >= tiles && w == 0) owners_started->wait();
      for (;;) { // a thief
        if (w == 0) {
          victim = -1, first_chunk = -1;
          for (int scan = 0; scan < 4 && first_chunk < 0; ++scan) {
            int best = 0;
            victim = -1;
            for (int i = 0; i < tiles; ++i) {
              const int t = (i + cta) % tiles, pref = steal_preference(words[t].load());
              if (pref > best) best = pref, victim = t;
            }
            if (victim < 0) break;
            const Steal s = register_thief(
                [&](uint64_t e, uint64_t d) { return cas(victim, e, d); }, words[victim].load());
            first_chunk = s.chunk, slot = s.slot;
          }
          if (first_chunk < 0) victim = -1;
        }
        sync.arrive_and_wait();
        const int tile = victim;
        if (tile < 0) return;
        const auto steal = [&] { return claimed_from_back(words[tile].fetch_add(kStealBackOne)); };
        // The first two at once, as the kernel's warps ask for them before staging the queries.
        int chunk = w == 0 ? first_chunk : steal(), blocks = 0;
        int next = steal();
        if (chunk < 0) {
          EXPECT_LT(next, 0) << "a void first claim, then a chunk";
        }
        while (chunk >= 0) {
          const int after_next = next >= 0 ? steal() : -1;
          blocks += stream(tile, chunk);
          chunk = next, next = after_next;
        }
        warp_blocks[w] = blocks;
        sync.arrive_and_wait();
        if (w == 0) {
          int total = 0;
          for (int b : warp_blocks) total += b;
          EXPECT_GE(total, 1);
          EXPECT_GE(slot, 1);
          EXPECT_LE(slot, kStealMaxThieves);
          steals.fetch_add(1);
          publish(tile, slot, total, total);
        }
        sync.arrive_and_wait();
      }
    };
    std::vector<std::thread> threads;
    for (int w = 0; w < warps; ++w) threads.emplace_back(warp_main, w);
    for (auto& t : threads) t.join();
  }
};

TEST(DecodeSteal, EveryBlockOnceEveryTileMergedOnceUnderThreads) {
  std::mt19937 rng(20261204);
  int steals = 0;
  struct Shape {
    int tiles, warps, chunk_blocks, ctas, max_blocks;
  };
  for (const Shape shape : {Shape{3, 4, 2, 6, 200}, Shape{5, 2, 1, 5, 64}, Shape{2, 3, 3, 8, 120},
                            Shape{4, 4, 2, 4, 9}}) {
    Protocol p(shape.tiles, shape.warps, shape.chunk_blocks);
    for (int step = 0; step < 12; ++step) {
      SCOPED_TRACE(::testing::Message() << "tiles " << shape.tiles << " warps " << shape.warps
                                        << " chunk " << shape.chunk_blocks << " step " << step);
      p.begin_step(rng, shape.max_blocks);
      std::vector<std::thread> ctas;
      for (int c = 0; c < shape.ctas; ++c) ctas.emplace_back([&p, c] { p.run_cta(c); });
      for (auto& t : ctas) t.join();
      for (int t = 0; t < shape.tiles; ++t) {
        EXPECT_EQ(p.merges[t].load(), 1) << "tile " << t;
        EXPECT_EQ(p.merged_blocks[t].load(), p.n[t]) << "tile " << t;
        EXPECT_EQ(p.done[t].load(), 0) << "tile " << t;
        EXPECT_EQ(steal_chunks_left(p.words[t].load()), 0) << "tile " << t;
        EXPECT_LE(steal_state(p.words[t].load()).thieves, kStealMaxThieves);
        for (int b = 0; b < p.n[t]; ++b)
          ASSERT_EQ(p.streamed[t][b].load(), 1) << "tile " << t << " block " << b;
      }
    }
    steals += p.steals.load();
  }
  // The thieves found work: the run tested stealing, not only the owners' claims.
  EXPECT_GT(steals, 20);
  std::printf("thieves' publishes: %d\n", steals);
}

} // namespace
} // namespace m3sa::testing
