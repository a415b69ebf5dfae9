#!/bin/bash
# One GPU host's checks, in one run of about 4 minutes on an H200 (2026-11-28): the realistic bf16 step and the OpInfo
# corpora with --msprobe-device cuda (contract auto: cuda), the 7B-class dump's lm_head with the bench on the GPU and
# on the CPU, and the whole 7B-class dump with both on the GPU. Prints each run's summary; logs and records go to OUT.
#
#   benchmarks/on_gpu.sh DUMPS [OUT]
#
# DUMPS holds llama_realistic_bf16_statistics, opinfo_bf16, opinfo_fp32 (make_dumps.py, make_opinfo_dump.py) and
# llama_7b_bf16_statistics (make_dumps.py --only 'llama_7b*'), about 5 MB in all.
export PYTHONUNBUFFERED=1
D=$(realpath "${1:?usage: benchmarks/on_gpu.sh DUMPS [OUT]}")
OUT=${2:-${OUT:-/tmp/on_gpu}}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1 || { tail -5 /tmp/pip.log; export PYTHONPATH=$PWD; }
python3 -c "import torch, numba, numpy; print(torch.__version__, torch.cuda.get_device_name(), numba.__version__, numpy.__version__)"
nproc
P=(-p no:cacheprovider -p no:benchmark -q -rfE)
step() {
  local name=$1 t=$2; shift 2; local s=$SECONDS
  timeout "$t" python3 -m pytest "$@" "${P[@]}" --msprobe-out "/tmp/o/$name" > "/tmp/$name.log" 2>&1
  echo "== $name rc=$? $((SECONDS - s)) s"
  grep -E "^(FAILED|ERROR)|passed|failed|NOT COMPLETE|^items:|not implemented" "/tmp/$name.log" | cut -c1-220 | tail -30
  cp "/tmp/$name.log" "$OUT/" 2>/dev/null
}
step warm 80 $D/llama_realistic_bf16_statistics --msprobe-device cuda -n 0 -k "Functional.linear.0.forward"
step real 60 $D/llama_realistic_bf16_statistics --msprobe-device cuda -n 8
step opinfo_bf16 60 $D/opinfo_bf16 --msprobe-device cuda -n 8
step opinfo_fp32 60 $D/opinfo_fp32 --msprobe-device cuda -n 8
L="$D/llama_7b_bf16_statistics/step0/rank0/dump.json::Functional.linear.14.forward"
step lm_head_bench_cuda 30 "$L" --msprobe-device cuda -o msprobe_bench_device=cuda -n 0
step lm_head_bench_cpu 60 "$L" --msprobe-device cuda -n 0
step llama7b_bench_cuda 150 $D/llama_7b_bf16_statistics --msprobe-device cuda -o msprobe_bench_device=cuda -n 8
tar czf "$OUT/records.tgz" -C /tmp/o . 2>/dev/null
