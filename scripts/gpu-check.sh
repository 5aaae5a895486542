#!/usr/bin/env bash
# The GPU side of cxlkv, checked on a machine with an NVIDIA GPU (docs/GPU.md).
#
#   scripts/gpu-check.sh bundle   # here, with Rust: build the binaries into target/gpu-bundle/
#   scripts/gpu-check.sh run      # there, with CUDA (driver, NVRTC) but no Rust and no network
#
# `bundle` builds the release `cxlkv` and the cxlkv-gpu test binaries (`cargo test --no-run
# --release -p cxlkv-gpu`, their paths read from cargo's JSON messages), strips their debug info
# and copies them with a manifest into target/gpu-bundle/ (about 20 MB: carry that folder with the
# source tree; data/kv is in the tree).
#
# `run` finds NVRTC ($CXLKV_NVRTC, else PyTorch's bundled wheel, else the CUDA toolkit's), runs the
# GPU tests (the kernels against the CPU ATTEND, pool registration; they must not skip there) and
# `cxlkv bench gpu` (table and JSON), and writes everything under $OUT (default target/gpu-check/):
# machine.txt, tests.log, bench.json and bench.txt (its table). It exits non-zero if a test fails or skips, or
# the bench fails. Set CXLKV_GPU_TOKENS to change the bench's lengths (default 32768,131072).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=target/gpu-bundle

build_bundle() {
    export PATH="$HOME/.cargo/bin:$PATH"
    SECONDS=0
    rm -rf "$bundle"
    mkdir -p "$bundle"
    cargo build --release --bin cxlkv
    cargo test --no-run --release -p cxlkv-gpu --message-format=json >"$bundle/cargo.json"
    python3 - "$bundle" <<'EOF'
import json, os, shutil, subprocess, sys
bundle = sys.argv[1]
tests = []
for line in open(os.path.join(bundle, "cargo.json")):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if m["target"]["name"] not in ("cxlkv_gpu", "cxlkv-gpu", "device", "ptx") or not m["profile"]["test"]:
        continue
    name = "gpu-test-" + m["target"]["name"].replace("-", "_")
    shutil.copy(m["executable"], os.path.join(bundle, name))
    tests.append(name)
shutil.copy("target/release/cxlkv", os.path.join(bundle, "cxlkv"))
for f in tests + ["cxlkv"]:
    subprocess.run(["strip", "--strip-debug", os.path.join(bundle, f)], check=True)
want = {"gpu-test-cxlkv_gpu", "gpu-test-device", "gpu-test-ptx"}
if set(tests) != want:
    sys.exit(f"expected test binaries {sorted(want)}, cargo built {sorted(tests)}")
open(os.path.join(bundle, "MANIFEST"), "w").write("\n".join(sorted(tests) + ["cxlkv"]) + "\n")
os.remove(os.path.join(bundle, "cargo.json"))
EOF
    git rev-parse HEAD >"$bundle/COMMIT"
    # The newest C and C++ runtime symbol versions the binaries need: the GPU machine's glibc and
    # libstdc++ must have them.
    for f in $(cat "$bundle/MANIFEST"); do objdump -T "$bundle/$f"; done |
        grep -oE 'GLIBC(XX)?_[0-9.]+' | sort -uV |
        awk -F_ '{last[$1] = $0} END {for (k in last) print last[k]}' | sort >"$bundle/REQUIRES"
    echo "the GPU machine needs $(tr '\n' ' ' <"$bundle/REQUIRES")"
    du -sh "$bundle"
    echo "bundle ready in ${SECONDS} s: $bundle ($(tr '\n' ' ' <"$bundle/MANIFEST"))"
}

find_nvrtc() {
    if [ -n "${CXLKV_NVRTC:-}" ]; then
        echo "$CXLKV_NVRTC"
        return
    fi
    local p
    # PyTorch's CUDA wheels carry NVRTC (nvidia/cuda_nvrtc/lib or nvidia/cu13/lib); its version
    # matches the driver torch runs on.
    p="$(python3 - 2>/dev/null <<'EOF' || true
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for p in sorted(glob.glob(d + "/nvidia/**/libnvrtc.so*", recursive=True)):
        if "builtins" not in p and ".alt." not in p:
            print(p)
            raise SystemExit
EOF
)"
    if [ -z "$p" ]; then
        p="$(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda-*/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* 2>/dev/null | grep -v builtins | head -n 1 || true)"
    fi
    echo "$p"
}

run_checks() {
    [ -f "$bundle/MANIFEST" ] || { echo "no $bundle/MANIFEST: run 'scripts/gpu-check.sh bundle' on the build machine and carry $bundle" >&2; exit 1; }
    local out="${OUT:-target/gpu-check}"
    mkdir -p "$out"
    if ! "$bundle/cxlkv" --version >/dev/null; then
        echo "the bundled binaries do not start here; they need $(tr '\n' ' ' <"$bundle/REQUIRES" 2>/dev/null) (glibc, libstdc++)" >&2
        exit 1
    fi
    CXLKV_NVRTC="$(find_nvrtc)"
    if [ -n "$CXLKV_NVRTC" ]; then
        # cudarc opens NVRTC by name (libnvrtc.so first): a link of that name on the loader's
        # path finds any version; the library's own folder holds its builtins.
        local links="$out/nvrtc-link"
        mkdir -p "$links"
        ln -sf "$(readlink -f "$CXLKV_NVRTC")" "$links/libnvrtc.so"
        LD_LIBRARY_PATH="$links:$(dirname "$(readlink -f "$CXLKV_NVRTC")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export CXLKV_NVRTC LD_LIBRARY_PATH
    else
        unset CXLKV_NVRTC
    fi
    {
        echo "commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
        echo "nvrtc ${CXLKV_NVRTC:-not found}"
        uname -a
        nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1 || true
        lscpu 2>/dev/null | grep -E '^(Model name|Socket|NUMA node\(s\))' || true
    } | tee "$out/machine.txt"
    local rc=0
    : >"$out/tests.log"
    for t in $(grep '^gpu-test-' "$bundle/MANIFEST"); do
        echo "=== $t" | tee -a "$out/tests.log"
        # One thread: the tests share the GPU; --nocapture: the skip messages must be seen.
        if ! "$bundle/$t" --test-threads 1 --nocapture 2>&1 | tee -a "$out/tests.log"; then
            rc=1
        fi
    done
    if grep -q "skipped" "$out/tests.log"; then
        echo "a GPU test skipped on this machine (see $out/tests.log)" >&2
        rc=1
    fi
    local tokens="${CXLKV_GPU_TOKENS:-32768,131072}"
    echo "=== cxlkv bench gpu --tokens $tokens --json"
    if "$bundle/cxlkv" bench gpu --tokens "$tokens" --kv data/kv/smollm2_devil_2048 --json >"$out/bench.json" 2> >(tee "$out/bench.stderr" >&2); then
        # The table, from the JSON (one run of the bench, not two).
        python3 - "$out/bench.json" <<'EOF' | tee "$out/bench.txt"
import json, sys
r = json.load(open(sys.argv[1]))
l = r["link"]
print(f"GPU: {r['device']} (compute {'.'.join(map(str, r['compute_capability']))})")
print(f"link over {l['bytes'] >> 20} MiB: cuMemcpyHtoD pinned {l['memcpy_htod_pinned_bytes_per_s'] / 1e9:.1f} GB/s, "
      f"kernel reading registered memory {l['kernel_read_registered_bytes_per_s'] / 1e9:.1f} GB/s, "
      f"datasheet {l['datasheet_bytes_per_s'] / 1e9:.1f} GB/s")
for w in r["reports"]:
    print(f"\n{w['workload']}: {w['layers']} layers per step, gather top-{w['topk']}")
    print(f"{'path':<10} {'ms/step':>10} {'link MB/step':>14} {'rel err':>9}")
    for p in w["paths"]:
        print(f"{p['path']:<10} {p['ms_per_step']:>10.3f} {p['link_bytes_per_step'] / 1e6:>14.1f} {p['relative_error']:>9.1e}")
for c in r["crossover_tokens"]:
    t = c["tokens"]
    print(f"{c['a']} / {c['b']}: " + (f"cross at about {t:.0f} tokens" if t else "no crossing"))
EOF
    else
        rc=1
    fi
    echo "results in $out (exit $rc)"
    return "$rc"
}

case "${1:-}" in
    bundle) build_bundle ;;
    run) run_checks ;;
    *)
        echo "usage: scripts/gpu-check.sh bundle|run (docs/GPU.md)" >&2
        exit 2
        ;;
esac
