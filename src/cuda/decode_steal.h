#pragma once
// How the Hopper decode kernel's CTAs share a tile's blocks when a tile has one CTA of its own
// (batches that fill the SMs alone, splits == 1): the owner streams chunks from the front, a CTA
// done with its own tile steals chunks from the back, and whoever completes the tile merges.
// Plain host / device code, so that the CPU tests run the same transitions under real threads
// (tests/unit/decode_steal_test.cpp); the kernel wraps them in its atomics.
//
// Why: at batch 128 every SM streams one request's whole cache, and the same bytes take 160-190K
// cycles on some SM groups and 215-238K on others (bench/NOTES.md s34 r2), so the step is the
// slowest group's, ~7 % above the mean. Sizing ranges by SM speed is impossible at launch, and
// more ranges than SMs make every CTA restart and every tile merge (s27 r3, s34 r2); stealing
// only makes the fast SMs restart, at the end of the step.
//
// The protocol, one 64-bit word a tile (steal_word) and one done count:
// - The owner stores owner_start_word (its warps' first chunks, taken at once) before any of its
//   claims; then each warp takes one more chunk from the front by fetch_add(kStealFrontOne) as it
//   begins one (claimed_from_front), so that its next two are known before their boxes go out.
// - A thief picks a tile with chunks left (steal_preference). Its first chunk there registers it
//   by CAS (register_thief: thieves + 1, at most kStealMaxThieves, publish slot `thieves`; the
//   owner's is 0); then its warps take chunks from the back by fetch_add(kStealBackOne)
//   (claimed_from_back).
// - Every fetch_add moves front + stolen on by one, so the first `chunks` of them (in the order
//   the word sees them) take the chunks, front ones in order from 0 and back ones from the end,
//   and every later one takes none (a warp stops claiming at its first void one; a thief's warp
//   asks for its first two at once). Fields only pass `chunks` by those void claims: at most
//   two a warp.
// - Nobody stole (the owner's warps took all `chunks`): the owner merges in the CTA, as without
//   stealing; the done count is not touched.
// - Otherwise every participant publishes its lists into its slot and then adds to the done
//   count (acq_rel): the owner its blocks + 1, a thief its blocks (>= 1: it holds a chunk once
//   registered). The addition that reaches steal_done_target(n) is the last one: every slot is
//   published (registration needs a chunk left, so `thieves` is final too), and that CTA merges
//   the 1 + thieves slots and sets the count back to 0.
// - No reset of the word: once every chunk is taken it offers nothing (steal_chunks_left 0)
//   whatever the next step's seq_len, so a thief that reads it before the next step's owner has
//   stored its fresh word steals nothing; a tile whose owner exits early (bad metadata) keeps
//   such a word. The workspace starts at 0: no chunks.
#include <cstdint>

#include "common/host_device.h"

namespace m3sa::cuda {

// Publish slots a tile: the owner's and up to three thieves'.
inline constexpr int kStealSlots = 4;
inline constexpr int kStealMaxThieves = kStealSlots - 1;

// Word fields: front (chunks claimed from the front) bits 0-19, stolen 20-39, chunks 40-59,
// thieves 60-63. front and stolen pass `chunks` by at most two void claims a warp, far below 2^20
// for the chunk counts the plan allows (steal_chunks_fit).
inline constexpr int kStealFieldBits = 20;
inline constexpr uint64_t kStealFieldMask = (uint64_t{1} << kStealFieldBits) - 1;
inline constexpr uint64_t kStealFrontOne = 1;
inline constexpr uint64_t kStealBackOne = uint64_t{1} << kStealFieldBits;
inline constexpr int kStealMaxChunks = (1 << kStealFieldBits) - 64;

struct StealState {
  int chunks, front, stolen, thieves;
};

M3SA_HOST_DEVICE constexpr uint64_t steal_word(int chunks, int front, int stolen, int thieves) {
  return uint64_t(unsigned(front)) | uint64_t(unsigned(stolen)) << kStealFieldBits |
         uint64_t(unsigned(chunks)) << (2 * kStealFieldBits) |
         uint64_t(unsigned(thieves)) << (3 * kStealFieldBits);
}
M3SA_HOST_DEVICE constexpr StealState steal_state(uint64_t word) {
  return {int(word >> (2 * kStealFieldBits) & kStealFieldMask), int(word & kStealFieldMask),
          int(word >> kStealFieldBits & kStealFieldMask), int(word >> (3 * kStealFieldBits))};
}
M3SA_HOST_DEVICE constexpr int steal_chunks_left(uint64_t word) {
  const StealState s = steal_state(word);
  const int left = s.chunks - s.front - s.stolen;
  return left > 0 ? left : 0;
}

// A tile of n blocks in chunks of chunk_blocks: chunk i holds blocks [i c, min(n, (i + 1) c)).
M3SA_HOST_DEVICE constexpr int steal_chunk_count(int n, int chunk_blocks) {
  return n <= 0 ? 0 : (n + chunk_blocks - 1) / chunk_blocks;
}
M3SA_HOST_DEVICE constexpr int steal_chunk_blocks(int chunk, int chunk_blocks, int n) {
  const int begin = chunk * chunk_blocks, end = begin + chunk_blocks < n ? begin + chunk_blocks : n;
  return end > begin ? end - begin : 0;
}
// Tiles of at most this many blocks fit the word's fields (the plan checks its capacity).
M3SA_HOST_DEVICE constexpr bool steal_chunks_fit(int64_t max_blocks, int chunk_blocks) {
  return (max_blocks + chunk_blocks - 1) / chunk_blocks <= kStealMaxChunks;
}

// The owner's first word: its first `taken` chunks (at most `chunks`) are its warps' at once.
M3SA_HOST_DEVICE constexpr uint64_t owner_start_word(int chunks, int taken) {
  return steal_word(chunks, taken < chunks ? taken : chunks, 0, 0);
}
// What a fetch_add(kStealFrontOne) / fetch_add(kStealBackOne) took, given the word it returned:
// the chunk, or -1 when none was left (the front had met the back).
M3SA_HOST_DEVICE constexpr int claimed_from_front(uint64_t before) {
  const StealState s = steal_state(before);
  return s.front + s.stolen < s.chunks ? s.front : -1;
}
M3SA_HOST_DEVICE constexpr int claimed_from_back(uint64_t before) {
  const StealState s = steal_state(before);
  return s.front + s.stolen < s.chunks ? s.chunks - 1 - s.stolen : -1;
}

// A thief's first steal from a tile, from the word `before`: the word to CAS in, the chunk it
// takes from the back and its publish slot (1 .. kStealMaxThieves); chunk -1 when the tile has no
// chunk left or no free slot.
struct Steal {
  uint64_t after;
  int chunk;
  int slot;
};
M3SA_HOST_DEVICE constexpr Steal register_thief(uint64_t before) {
  const StealState s = steal_state(before);
  if (s.front + s.stolen >= s.chunks || s.thieves >= kStealMaxThieves) return {before, -1, 0};
  return {steal_word(s.chunks, s.front, s.stolen + 1, s.thieves + 1), s.chunks - 1 - s.stolen,
          s.thieves + 1};
}
// The CAS loop: `cas(expected, desired)` returns the word it found (== expected: swapped).
// `seen`: the word last read.
template <typename Cas> M3SA_HOST_DEVICE Steal register_thief(Cas&& cas, uint64_t seen) {
  for (;;) {
    const Steal s = register_thief(seen);
    if (s.chunk < 0) return s;
    const uint64_t found = cas(seen, s.after);
    if (found == seen) return s;
    seen = found;
  }
}

// How much a thief scanning the tiles wants this one: its chunks left, 0 when it has none or no
// free slot for a new thief.
M3SA_HOST_DEVICE constexpr int steal_preference(uint64_t word) {
  return steal_state(word).thieves < kStealMaxThieves ? steal_chunks_left(word) : 0;
}

// The done count that completes a tile of n blocks: every block once, plus the owner's unit (so
// that an owner whose chunks were all stolen still counts, after its slot is published).
M3SA_HOST_DEVICE constexpr int steal_done_target(int n) { return n + 1; }

} // namespace m3sa::cuda
