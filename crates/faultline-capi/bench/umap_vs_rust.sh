#!/usr/bin/env bash
# The C layer's cost: a Umap-style random reader through libumap.so against
# the same reads through the Rust API, alternating in one run, same file,
# same settings (UMAP_BUFSIZE pages of 4 KiB, 2 fillers). The file stays in
# the page cache (warm), so the fault path, not the disk, is measured.
# Usage: bench/umap_vs_rust.sh [FILE_MIB] [BUF_PAGES] [READS] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
mib=${1:-512} buf=${2:-16384} reads=${3:-300000} runs=${4:-5}
cargo build -q --release -p faultline-umap --lib --example rust_random_reader
out=$(mktemp -d /tmp/umap-vs-rust.XXXXXX)
trap 'rm -rf "$out"' EXIT
lib=${CARGO_TARGET_DIR:-target}/release
cc -std=gnu11 -O2 -I crates/faultline-capi/include -o "$out/umap_random" \
  crates/faultline-capi/bench/umap_random.c -L "$lib" -lumap
python3 - "$out/data" "$mib" <<'PY'
import struct, sys
path, mib = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as f:
    for b in range(mib * 256):
        w = (b * 0x9E3779B97F4A7C15 & (2**64 - 1)) ^ 0x0123456789ABCDEF
        f.write(struct.pack("<Q", w) + b"\xa5" * 4088)
PY
export UMAP_BUFSIZE=$buf UMAP_PAGE_FILLERS=2 UMAP_PAGESIZE=4096
c() { LD_LIBRARY_PATH="$lib" "$out/umap_random" "$out/data" "$reads"; }
rust() { "$lib/examples/rust_random_reader" "$out/data" "$reads"; }
# Alternating, and which goes first alternates too (no order bias).
for i in $(seq "$runs"); do
  if (( i % 2 )); then c; rust; else rust; c; fi
done | tee "$out/rows.json"
python3 - "$out/rows.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["system"], []).append(r["reads_per_s"])
for s, v in by.items():
    print(f"{s}: median {statistics.median(v):,.0f} reads/s (min {min(v):,.0f}, max {max(v):,.0f}, n={len(v)})")
c = statistics.median(by["faultline via libumap.so (C)"])
r = statistics.median(by["faultline via the Rust API"])
print(json.dumps({"system": "libumap.so / Rust API", "pattern": "random 4k reads", "ratio": round(c / r, 3)}))
PY
