# shellcheck shell=bash
# Sourced by bench/micro/decode_round.sh and suite_round.sh: a clone of the checkout's HEAD kept
# between rounds, and its sm_90a-only build of the m3sa CLI and the GPU tests.

# Brings the kept clone $2 to $1's HEAD (cloned the first time). git rewrites (and so re-dates)
# only the files that differ, so ninja rebuilds just their translation units - minutes a round
# instead of a whole build. Its build/ and logs stay.
checkout_kept_tree() {
  local root="$1" tree="$2"
  [[ -d "$tree/.git" ]] || git clone -q "$root" "$tree"
  git -C "$tree" fetch -q "$root" HEAD
  git -C "$tree" checkout -q -f --detach FETCH_HEAD
  git -C "$tree" clean -q -fdx -e build -e '*.log'
}

# Configures $1/build (Release, CUDA, 90a-real) where it is not yet, then builds m3sa_cli and
# m3sa_gpu_tests there; the logs' tails are printed on failure. Needs scripts/env.sh sourced.
build_cli_and_gpu_tests() {
  local tree="$1"
  [[ -f "$tree/build/build.ninja" ]] ||
    cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DM3SA_ENABLE_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real > "$tree/configure.log" 2>&1 ||
    { cat "$tree/configure.log"; return 1; }
  cmake --build "$tree/build" --target m3sa_cli m3sa_gpu_tests -j "$M3SA_JOBS" \
    > "$tree/build.log" 2>&1 || { tail -40 "$tree/build.log"; return 1; }
}
