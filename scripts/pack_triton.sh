#!/usr/bin/env bash
# Pack a Triton release for the GPU machine (no package registry there) in as few parts as
# one device call each can carry (59 MB: a call carries 64 MiB with the working tree).
# Run here, from the repository root:   scripts/pack_triton.sh 3.9.0
# -> .gpu-triton/3.9.0/part_aa, part_ab (git-ignored). Leaves out what evtfuse does not use
# on an H100/H200: the CUPTI libraries (both), the profiler plugin, instrumentation and the
# AMD backend's device libraries; keeps both ptxas (3.9 looks for ptxas-blackwell on Hopper).
# On the GPU machine, one call per part, back to back (a machine stays warm ~30 s):
#   call 1: carry part_aa, command  cp .gpu-triton/V/part_aa /tmp/
#   call 2: carry part_ab, command  mkdir -p /opt/tV && cat /tmp/part_aa .gpu-triton/V/part_ab |
#           xz -dc | tar -x -C /opt/tV && TRITON_DIR=/opt/tV scripts/gpu_tier.sh ...
set -euo pipefail
v=${1:?usage: scripts/pack_triton.sh VERSION   e.g. 3.9.0}
py=${PYVER:-3.12}   # the GPU machine's Python
cd "$(git rev-parse --show-toplevel)"
grep -qxF '/.gpu-triton/' .git/info/exclude 2>/dev/null || echo '/.gpu-triton/' >> .git/info/exclude
out=.gpu-triton/$v
rm -rf "$out"; mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --python-version "$py" --only-binary=:all: \
    --platform manylinux_2_28_x86_64 "triton==$v" -d "$tmp"
(cd "$tmp" && python3 -m zipfile -e ./*.whl unpacked >/dev/null && cd unpacked &&
 chmod +x triton/backends/nvidia/bin/* &&
 tar -cf - --exclude='triton/backends/nvidia/lib/cupti' \
     --exclude='triton/backends/nvidia/lib/cupti-blackwell' --exclude='triton/backends/amd/lib' \
     --exclude='triton/instrumentation' --exclude='triton/_C/libproton.so' \
     triton ./*.dist-info | xz -T0 -6) | split -b 59000000 - "$out/part_"
ls -l "$out"
