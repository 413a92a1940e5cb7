#!/usr/bin/env bash
# Installs what m3sa's build needs on a Debian/Ubuntu machine (run as root, or with sudo available).
# The CUDA toolkit is optional: with nvcc found the CUDA backend is compiled too.
set -euo pipefail
packages=(cmake ninja-build g++ git libgtest-dev libcli11-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "[m3sa] installing: ${missing[*]}" >&2
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
