#!/usr/bin/env python3
"""The stealing decode kernel's ring bookkeeping, replayed on the CPU (session 35).

`stream_chunks` in bench/patches/s35-decode-steal*.patch (decode_topk_sm90_steal.cuh) has lane 0
issue a warp's boxes ahead of the warp through `top_up`, across chunk ends: it knows only the
current chunk and the next, and the chunk after that arrives when the current one ends. This
replays that logic line for line for random chunk sequences (partial chunks, every boxes-a-page
and chunk size the kernel's shapes use, rings that start mid-phase as a thief's do after its own
tile) and checks what the GPU would hang or misread on:
- the warp never waits on a box that was not issued;
- a box goes out only into a slot the warp has read (at most kSlots unread boxes);
- boxes go out in the order the warp reads them, each of the right block and part;
- nothing is issued past the warp's last chunk (the ring ends with no box in flight);
- the ring stays full wherever the boxes ahead are known (kSlots unread, or every known box);
- every chunk the warp took is streamed, each block once.
CPU only, no m3sa dependency:  python3 bench/micro/steal_ring_model.py [--trials N]
"""
import argparse
import random

SLOTS = 3  # kDecodeSm90BoxesPerWarp


def stream_chunks(boxes_per_page, chunk_blocks, n, chunks, u0):
    """The kernel's loop for one warp over `chunks` (its first two, then one a chunk; -1 ends)."""
    def blocks_of(c):
        begin = c * chunk_blocks
        return max(0, min(n, begin + chunk_blocks) - begin)

    def boxes_of(c):
        return 0 if c < 0 else blocks_of(c) * boxes_per_page

    queue = list(chunks)
    chunk, nxt = queue.pop(0), queue.pop(0)
    u = u0  # the warp's boxes read so far
    chunk_start = issued = u
    read = u0
    issued_boxes, read_boxes = [], []

    def known_end():
        return chunk_start + boxes_of(chunk) + boxes_of(nxt)

    def full():  # the ring holds kSlots unread boxes, or every box known
        assert issued >= min(read + SLOTS, known_end()), f"ring not full: {issued} after {read}"

    def top_up(v):  # lane 0: issue up to box v of what is known
        nonlocal issued
        next_start = chunk_start + boxes_of(chunk)
        known_end = next_start + boxes_of(nxt)
        while issued <= v and issued < known_end:
            in_next = issued >= next_start
            box = issued - (next_start if in_next else chunk_start)
            c = nxt if in_next else chunk
            assert issued - SLOTS < read, f"box {issued} into a slot not read yet ({read} read)"
            issued_boxes.append((issued, c * chunk_blocks + box // boxes_per_page,
                                 issued % boxes_per_page))
            issued += 1

    top_up(u + SLOTS - 1)
    full()
    while chunk >= 0:
        after = queue.pop(0) if nxt >= 0 and queue else -1  # claimed as `chunk` begins
        for k in range(blocks_of(chunk)):
            j = chunk * chunk_blocks + k
            for box in range(boxes_per_page):  # score_page: wait, read, refill
                b = u + box
                assert b < issued, f"waits on box {b}, only {issued} issued"
                read_boxes.append((b, j, b % boxes_per_page))
                read = b + 1
                top_up(b + SLOTS)
                full()
            u += boxes_per_page
        chunk_start += boxes_of(chunk)
        chunk, nxt = nxt, after
        top_up(u + SLOTS - 1)
        full()
    assert issued == u, f"{issued - u} boxes issued past the last chunk"
    assert issued_boxes == read_boxes, "boxes issued in another order, or of other blocks"
    taken = [c for c in chunks if c >= 0]
    want = sorted(b for c in taken for b in range(c * chunk_blocks, c * chunk_blocks + blocks_of(c)))
    assert sorted({j for _, j, _ in read_boxes}) == want and \
        len(read_boxes) == len(want) * boxes_per_page, "a chunk taken but not streamed"
    return u - u0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    boxes = 0
    for _ in range(args.trials):
        # Boxes a page 1, 2, 4 (4-warp e4m3 / 8-warp e4m3 or 4-warp bf16 / 8-warp bf16) and chunks
        # of 1, 2, 4 blocks (decode_steal_chunk_blocks), a tile of up to 60 blocks.
        boxes_per_page = rng.choice([1, 2, 4])
        chunk_blocks = rng.choice([1, 2, 4])
        n = rng.randint(1, 60)
        count = (n + chunk_blocks - 1) // chunk_blocks
        chunks = rng.sample(range(count), rng.randint(1, count)) + [-1, -1]
        boxes += stream_chunks(boxes_per_page, chunk_blocks, n, chunks, rng.randint(0, 50))
    print(f"steal_ring_model: {args.trials} warps' streams, {boxes} boxes: every check held")


if __name__ == "__main__":
    main()
