#!/usr/bin/env bash
# Pack a Triton release for the GPU machine (no package registry there) so that one device
# call carries it: one part of at most 59 MB (a call carries 64 MiB with the working tree).
# Run here, from the repository root:   scripts/pack_triton.sh 3.9.0
# -> .gpu-triton/3.9.0/part_aa (git-ignored; a part_ab only if the release outgrows one part).
# Leaves out what evtfuse does not use on an H100/H200: the CUPTI libraries, the profiler
# plugin, instrumentation and the AMD backend's libraries. libtriton.so loses its debug
# information (strip --strip-unneeded keeps every symbol it exports: 500 MB -> 190 MB), and
# of the two ptxas the release bundles only the one it runs for sm_90 is kept, the other
# name linked to it (3.6-3.8 run `ptxas` on Hopper, 3.9 `ptxas-blackwell`).
# On the GPU machine, carry .gpu-triton/V and begin the command with
#   mkdir -p /opt/tV && cat .gpu-triton/V/part_* | xz -dc | tar -x -C /opt/tV
# then TRITON_DIR=/opt/tV scripts/gpu_tier.sh ... (or PYTHONPATH=/opt/tV:src ...).
set -euo pipefail
v=${1:?usage: scripts/pack_triton.sh VERSION   e.g. 3.9.0}
py=${PYVER:-3.12}   # the GPU machine's Python
cd "$(git rev-parse --show-toplevel)"
grep -qxF '/.gpu-triton/' .git/info/exclude 2>/dev/null || echo '/.gpu-triton/' >> .git/info/exclude
out=$PWD/.gpu-triton/$v
rm -rf "$out"; mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --python-version "$py" --only-binary=:all: \
    --platform manylinux_2_28_x86_64 "triton==$v" -d "$tmp"
cd "$tmp"
python3 -m zipfile -e ./*.whl unpacked >/dev/null
cd unpacked
bin=triton/backends/nvidia/bin
chmod +x "$bin"/*
strip --strip-unneeded triton/_C/libtriton.so
# Which ptxas this release runs for sm_90: its own get_ptxas, read with ast (not imported:
# the wheel is built for the GPU machine's Python) and called with stand-in tool names.
used=$(python3 - triton/backends/nvidia/compiler.py <<'PY'
import ast, sys, types
tree = ast.parse(open(sys.argv[1]).read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_ptxas")
fn.decorator_list, fn.returns = [], None
for a in fn.args.args:
    a.annotation = None
ns = {"knobs": types.SimpleNamespace(nvidia=types.SimpleNamespace(
    ptxas="ptxas", ptxas_blackwell="ptxas-blackwell"))}
exec(compile(ast.Module([fn], []), "get_ptxas", "exec"), ns)
print(ns["get_ptxas"](90))
PY
)
for name in ptxas ptxas-blackwell; do
  [[ $name != "$used" && -e $bin/$name && -e $bin/$used ]] && ln -sf "$used" "$bin/$name"
done
echo "sm_90 runs $used"
tar -cf - --exclude='triton/backends/nvidia/lib/cupti' \
    --exclude='triton/backends/nvidia/lib/cupti-blackwell' --exclude='triton/backends/amd/lib' \
    --exclude='triton/instrumentation' --exclude='triton/_C/libproton.so' \
    triton ./*.dist-info | xz -T0 -6 | split -b 59000000 - "$out/part_"
ls -l "$out"
