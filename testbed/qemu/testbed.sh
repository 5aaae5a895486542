#!/usr/bin/env bash
# cxlkv QEMU test bed: a TCG guest that sees CXL-like memory, and the NDP device (cxlkv-ndpd)
# running on the host on the same backing file, as a real device runs beside its memory.
#
#   testbed.sh test [--memory ivshmem|dax|cxl] [--scenario N]... [--coherence hardware|software|both]
#                                                                   run scenarios, exit 0 iff all pass
#   testbed.sh up   [--memory ivshmem|dax|cxl|numa]                 interactive guest (serial console)
#   testbed.sh prepare                                              install, fetch, build only
#
# Memory exposures (the host file is /dev/shm/cxlkv-testbed-<memory>-<pid>):
#   ivshmem  ivshmem-plain PCI BAR2 (guest: /sys/bus/pci/devices/BDF/resource2), RAM speed
#   dax      emulated NVDIMM -> devdax /dev/dax0.0 (pool 6 MiB into the host file)
#   cxl      CXL type-3 volatile device -> CXL region -> CPU-less NUMA node (kmem) -> /dev/dax0.0;
#            emulated MMIO, tens of MiB/s: small data only
#   numa     file-backed CPU-less NUMA node (up only: its pages have no host-known offset)
# Scenarios: 1 typed KV blocks guest->host and host->guest byte-exact; 2 SCORE_TOPK/GATHER/NOP
# from the guest to the host-side cxlkv-ndpd, equal to the host reference, with latencies;
# 3 = 1 on a CXL type-3 region (implies --memory cxl); 4 the host device is killed, the guest
# client times out and falls back to the host with the same answer; 5 two guests (two QEMU
# processes, wall clocks a day behind and 3 h ahead of the host's) on one ivshmem file: A parks a
# prefix of typed KV blocks, B finds it with lookup_prefix and reads it byte-exact, both send
# SCORE_TOPK to the host device at once, A's QEMU is SIGKILLed, B watches A's heartbeat stand still
# for a lease (2 s) on its own clock, takes A's partition over and reads back every block A
# committed (--coherence: the pool's mode, hardware, software, or both: one run of each, the default).
# `test` with no options runs 1,2,4 on ivshmem, then 3 on cxl, then 5 hardware- and software-coherent.
#
# Env: CACHE [testbed/qemu/.cache] downloads, kernel, initramfs, logs (git-ignored)
#      TESTBED_BIN_DIR  prebuilt static cxlkv, cxlkv-ndpd, cxlkv-testbed (skips the cargo build)
#      TESTBED_TIMEOUT [300] seconds per guest run; QEMU [qemu-system-x86_64]; SHM_DIR [/dev/shm]
# Needs root (or sudo) on Debian bookworm for the packages; KVM is not used (TCG).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
export CACHE="${CACHE:-$HERE/.cache}"
QEMU="${QEMU:-qemu-system-x86_64}"
SHM_DIR="${SHM_DIR:-/dev/shm}"
TIMEOUT="${TESTBED_TIMEOUT:-300}"
die() { echo "testbed: ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

CMD="${1:-}"; [ -n "$CMD" ] || usage; shift
MEMORY="" SCENARIOS="" COHERENCE=both
while [ $# -gt 0 ]; do
	case "$1" in
	--memory) MEMORY="${2:?--memory needs ivshmem|dax|cxl|numa}"; shift 2 ;;
	--memory=*) MEMORY="${1#*=}"; shift ;;
	--scenario) SCENARIOS="$SCENARIOS ${2:?--scenario needs 1..5}"; shift 2 ;;
	--scenario=*) SCENARIOS="$SCENARIOS ${1#*=}"; shift ;;
	--coherence) COHERENCE="${2:?--coherence needs hardware|software|both}"; shift 2 ;;
	--coherence=*) COHERENCE="${1#*=}"; shift ;;
	-h|--help) usage ;;
	*) die "unknown argument '$1' (see $0 --help)" ;;
	esac
done
case "$MEMORY" in ""|ivshmem|dax|cxl|numa) ;; *) die "unknown memory '$MEMORY' (ivshmem|dax|cxl|numa)" ;; esac
for s in $SCENARIOS; do case "$s" in 1|2|3|4|5) ;; *) die "unknown scenario '$s' (1..5)" ;; esac; done
case "$COHERENCE" in hardware|software) PAIR_MODES=$COHERENCE ;; both) PAIR_MODES="hardware software" ;;
*) die "unknown coherence '$COHERENCE' (hardware|software|both)" ;; esac
mkdir -p "$CACHE/logs"
T_START=$EPOCHREALTIME
el() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }

prepare() {
	local t
	t=$EPOCHREALTIME
	"$HERE/setup-host.sh" || die "setup-host.sh failed (see above): the test bed cannot run without its packages"
	echo "testbed: setup-host $(el "$t")s"
	t=$EPOCHREALTIME
	KDIR=$("$HERE/get-kernel.sh" | sed -n 's/^KDIR=//p')
	[ -n "$KDIR" ] && [ -f "$KDIR/vmlinux" ] || die "get-kernel.sh gave no vmlinux"
	echo "testbed: kernel $(el "$t")s ($KDIR)"
	t=$EPOCHREALTIME
	if [ -n "${TESTBED_BIN_DIR:-}" ]; then
		BIN="$TESTBED_BIN_DIR"
	else
		command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
		command -v cargo >/dev/null || die "cargo not found"
		# Static binaries: they run in the busybox guest and on the host alike.
		(cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$REPO/target-qemu-static" \
			cargo build -q --release --target x86_64-unknown-linux-gnu -p cxlkv-ndp --bin cxlkv-ndpd -p cxlkv-testbed --bin cxlkv-testbed -p cxlkv --bin cxlkv) ||
			die "static build of cxlkv, cxlkv-ndpd, cxlkv-testbed failed"
		BIN="$REPO/target-qemu-static/x86_64-unknown-linux-gnu/release"
	fi
	for b in cxlkv cxlkv-ndpd cxlkv-testbed; do [ -x "$BIN/$b" ] || die "missing $BIN/$b"; done
	echo "testbed: static binaries $(el "$t")s ($BIN)"
	INITRD="$CACHE/initramfs.cpio.gz"
	KDIR="$KDIR" BINS="$BIN/cxlkv $BIN/cxlkv-ndpd $BIN/cxlkv-testbed" OUT="$INITRD" "$HERE/build-initramfs.sh" ||
		die "build-initramfs.sh failed"
	KERNEL="$KDIR/vmlinux"
}

# qemu_args MEMORY SHMFILE -> QARGS, SHM_MIB
qemu_args() {
	local mem=$1 shm=$2
	QARGS=(-accel tcg -nographic -no-reboot -nic none -smp 1 -kernel "$KERNEL" -initrd "$INITRD")
	case "$mem" in
	ivshmem)
		SHM_MIB=64
		QARGS+=(-M pc -m 1024M -object "memory-backend-file,id=shm0,share=on,mem-path=$shm,size=${SHM_MIB}M"
			-device ivshmem-plain,memdev=shm0) ;;
	dax)
		SHM_MIB=256
		QARGS+=(-M pc,nvdimm=on -m 1024M,slots=2,maxmem=2304M
			-object "memory-backend-file,id=nv0,share=on,mem-path=$shm,size=${SHM_MIB}M"
			-device nvdimm,id=nvdimm0,memdev=nv0) ;;
	cxl)
		SHM_MIB=256
		"$QEMU" -device cxl-type3,help 2>/dev/null | grep -q volatile-memdev ||
			die "$QEMU has no cxl-type3 volatile-memdev (QEMU >= 8 needed; setup-host.sh installs 10)"
		# Linux >= 6.2 refuses to commit a CXL region while CPUID reports a hypervisor.
		QARGS+=(-cpu qemu64,-hypervisor -M q35,cxl=on -m 1024M,maxmem=5120M,slots=4
			-object "memory-backend-file,id=cxlm0,share=on,mem-path=$shm,size=${SHM_MIB}M"
			-device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
			-device cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2
			-device cxl-type3,bus=root_port13,volatile-memdev=cxlm0,id=cxl-mem0
			-device cxl-rp,port=1,bus=cxl.1,id=root_port14,chassis=0,slot=3
			-M cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G) ;;
	numa)
		SHM_MIB=64
		QARGS+=(-M pc -m 1088M -object memory-backend-ram,id=m0,size=1024M -numa node,nodeid=0,cpus=0,memdev=m0
			-object "memory-backend-file,id=m1,share=on,mem-path=$shm,size=${SHM_MIB}M" -numa node,nodeid=1,memdev=m1) ;;
	esac
}

PIDS=() FILES=()
cleanup() {
	local p
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	for p in "${FILES[@]:-}"; do [ -n "$p" ] && rm -f "$p"; done
}
trap cleanup EXIT

RESULTS=()
# run_guest MEMORY "1,2,4" -> 0 iff every scenario passed
run_guest() {
	local mem=$1 scen=$2 shm log hlog t0 qpid hpid t_boot="" now qrc hrc=0 ok=1 s line
	shm="$SHM_DIR/cxlkv-testbed-$mem-$$"
	log="$CACHE/logs/guest-$mem.log"; hlog="$CACHE/logs/host-$mem.log"
	qemu_args "$mem" "$shm"
	rm -f "$shm"; truncate -s "${SHM_MIB}M" "$shm"; FILES+=("$shm")
	echo "=== testbed: memory=$mem scenarios=$scen (host file $shm)"
	: >"$log"
	t0=$EPOCHREALTIME
	"$QEMU" "${QARGS[@]}" -append "console=ttyS0 panic=-1 quiet tb_memory=$mem tb_scenarios=$scen" >"$log" 2>&1 </dev/null &
	qpid=$!; PIDS+=("$qpid")
	"$BIN/cxlkv-testbed" host --file "$shm" --scenarios "$scen" --ndpd "$BIN/cxlkv-ndpd" --timeout-s "$TIMEOUT" >"$hlog" 2>&1 &
	hpid=$!; PIDS+=("$hpid")
	while kill -0 "$qpid" 2>/dev/null; do
		now=$(el "$t0")
		if [ -z "$t_boot" ] && grep -q BOOT-READY "$log"; then t_boot=$now; echo "  [$now s] guest userspace up"; fi
		if awk -v a="$now" -v t="$TIMEOUT" 'BEGIN{exit !(a>t)}'; then
			echo "  TIMEOUT: guest still running after ${TIMEOUT}s, killing QEMU"; kill "$qpid"; ok=0; break
		fi
		sleep 0.2
	done
	qrc=0; wait "$qpid" || qrc=$?
	local t_qemu; t_qemu=$(el "$t0")
	# The host side ends when the guest says it is done; give it a moment, then stop it.
	for _ in $(seq 50); do kill -0 "$hpid" 2>/dev/null || break; sleep 0.1; done
	kill "$hpid" 2>/dev/null || true
	wait "$hpid" || hrc=$?
	echo "  --- guest console (cxlkv lines):"
	tr -d '\r' <"$log" | grep -a -E 'CXLKV|BOOT-READY|cxlkv|^ *node|^ *dax|^ *cxl|NUMA|DAX|CXL|error|Error|panic' | grep -v -E '^\[' | sed 's/^/  guest: /' | head -80
	echo "  --- host side:"; sed 's/^/  host: /' "$hlog"
	for s in ${scen//,/ }; do
		line=$(tr -d '\r' <"$log" | grep -a -o "CXLKV-SCENARIO-$s [A-Z]*.*" | head -1)
		case "$line" in
		"CXLKV-SCENARIO-$s PASS"*) RESULTS+=("scenario $s ($mem): PASS ${line#CXLKV-SCENARIO-$s PASS }") ;;
		"") RESULTS+=("scenario $s ($mem): FAIL (no result marker; see $log)"); ok=0 ;;
		*) RESULTS+=("scenario $s ($mem): FAIL ${line#CXLKV-SCENARIO-$s FAIL }"); ok=0 ;;
		esac
	done
	grep -a -q 'CXLKV-TB-EXIT rc=0' "$log" || { echo "  guest did not exit cleanly (see $log)"; ok=0; }
	[ "$hrc" = 0 ] || { echo "  host side failed (rc $hrc, see $hlog)"; ok=0; }
	[ "$qrc" = 0 ] || { echo "  QEMU exited with $qrc"; ok=0; }
	RESULTS+=("run $mem: boot-to-userspace=${t_boot:-n/a}s whole-guest-run=${t_qemu}s")
	rm -f "$shm"
	[ "$ok" = 1 ]
}

# The guests' wall clocks: a day behind and three hours ahead of the host's (QEMU -rtc base=).
rtc_at() { date -u -d "$1" +%Y-%m-%dT%H:%M:%S; }

# run_pair COHERENCE -> 0 iff scenario 5 passed: two guests on one ivshmem file, A killed.
run_pair() {
	local coh=$1 shm loga logb hlog t0 pa pb hpid t_kill="" t_boot_a="" t_boot_b="" now rc_b=0 hrc=0 ok=1 line qargs_a qargs_b
	shm="$SHM_DIR/cxlkv-testbed-pair-$$"
	loga="$CACHE/logs/guest-pair-a-$coh.log"; logb="$CACHE/logs/guest-pair-b-$coh.log"; hlog="$CACHE/logs/host-pair-$coh.log"
	qemu_args ivshmem "$shm"
	qargs_a=("${QARGS[@]}" -rtc "base=$(rtc_at '-1 day')")
	qargs_b=("${QARGS[@]}" -rtc "base=$(rtc_at '+3 hours')")
	rm -f "$shm"; truncate -s "${SHM_MIB}M" "$shm"; FILES+=("$shm")
	echo "=== testbed: scenario 5, two guests on one ivshmem file ($shm), $coh-coherent pool"
	: >"$loga"; : >"$logb"
	local app="console=ttyS0 panic=-1 quiet tb_memory=ivshmem tb_scenarios=5 tb_lease_ms=2000"
	t0=$EPOCHREALTIME
	"$QEMU" "${qargs_a[@]}" -append "$app tb_role=a tb_coherence=$coh" >"$loga" 2>&1 </dev/null &
	pa=$!; PIDS+=("$pa")
	"$QEMU" "${qargs_b[@]}" -append "$app tb_role=b tb_step_clock_s=-3600" >"$logb" 2>&1 </dev/null &
	pb=$!; PIDS+=("$pb")
	"$BIN/cxlkv-testbed" host --file "$shm" --scenarios 5 --ndpd "$BIN/cxlkv-ndpd" --timeout-s "$TIMEOUT" >"$hlog" 2>&1 &
	hpid=$!; PIDS+=("$hpid")
	while kill -0 "$pb" 2>/dev/null; do
		now=$(el "$t0")
		if [ -z "$t_boot_a" ] && grep -q BOOT-READY "$loga"; then t_boot_a=$now; echo "  [$now s] guest A userspace up"; fi
		if [ -z "$t_boot_b" ] && grep -q BOOT-READY "$logb"; then t_boot_b=$now; echo "  [$now s] guest B userspace up"; fi
		if [ -z "$t_kill" ] && grep -a -q 'CXLKV-TB KILL-ME' "$loga"; then
			# Not at once: let A commit a few more blocks, so that it dies among its puts.
			sleep 0.3
			kill -KILL "$pa" 2>/dev/null || true
			{ wait "$pa"; } 2>/dev/null || true
			t_kill=$(el "$t0"); echo "  [$t_kill s] guest A's QEMU killed (SIGKILL)"
		fi
		if awk -v a="$now" -v t="$TIMEOUT" 'BEGIN{exit !(a>t)}'; then
			echo "  TIMEOUT: guest B still running after ${TIMEOUT}s, killing QEMU"; kill "$pb" "$pa" 2>/dev/null; ok=0; break
		fi
		sleep 0.2
	done
	wait "$pb" || rc_b=$?
	kill "$pa" 2>/dev/null || true; wait "$pa" 2>/dev/null || true
	local t_all; t_all=$(el "$t0")
	for _ in $(seq 50); do kill -0 "$hpid" 2>/dev/null || break; sleep 0.1; done
	kill "$hpid" 2>/dev/null || true
	wait "$hpid" || hrc=$?
	for g in A:"$loga" B:"$logb"; do
		echo "  --- guest ${g%%:*} console (cxlkv lines):"
		tr -d '\r' <"${g#*:}" | grep -a -E 'CXLKV|BOOT-READY|error|Error|panic' | grep -v -E '^\[' | sed "s/^/  guest ${g%%:*}: /" | head -40
	done
	echo "  --- host side:"; sed 's/^/  host: /' "$hlog"
	line=$(tr -d '\r' <"$loga" | grep -a -o 'CXLKV-SCENARIO-5 [A-Z]*.*' | head -1)
	case "$line" in "CXLKV-SCENARIO-5 PASS"*) ;; *) echo "  guest A: ${line:-no result marker (see $loga)}"; ok=0 ;; esac
	[ -n "$t_kill" ] || { echo "  guest A never asked to be killed"; ok=0; }
	line=$(tr -d '\r' <"$logb" | grep -a -o 'CXLKV-SCENARIO-5 [A-Z]*.*' | head -1)
	case "$line" in
	"CXLKV-SCENARIO-5 PASS"*) RESULTS+=("scenario 5 (two guests, ivshmem, $coh-coherent): PASS ${line#CXLKV-SCENARIO-5 PASS }") ;;
	"") RESULTS+=("scenario 5 (two guests, $coh-coherent): FAIL (no result marker from guest B; see $logb)"); ok=0 ;;
	*) RESULTS+=("scenario 5 (two guests, $coh-coherent): FAIL ${line#CXLKV-SCENARIO-5 FAIL }"); ok=0 ;;
	esac
	grep -a -q 'CXLKV-TB-EXIT rc=0' "$logb" || { echo "  guest B did not exit cleanly (see $logb)"; ok=0; }
	[ "$hrc" = 0 ] || { echo "  host side failed (rc $hrc, see $hlog)"; ok=0; }
	[ "$rc_b" = 0 ] || { echo "  QEMU of guest B exited with $rc_b"; ok=0; }
	RESULTS+=("run pair-$coh: boot-to-userspace A=${t_boot_a:-n/a}s B=${t_boot_b:-n/a}s, A killed at ${t_kill:-n/a}s, whole run=${t_all}s")
	rm -f "$shm"
	[ "$ok" = 1 ]
}

case "$CMD" in
prepare)
	prepare
	;;
test)
	prepare
	runs=()
	if [ -n "$SCENARIOS" ]; then
		ivs="" cxs="" pair=""
		for s in $SCENARIOS; do case "$s" in 3) cxs=3 ;; 5) pair=5 ;; *) ivs="$ivs,$s" ;; esac; done
		ivs="${ivs#,}"
		if [ -n "$MEMORY" ]; then runs+=("$MEMORY:$(echo "${ivs:+$ivs,}$cxs" | sed 's/,$//')")
		else
			[ -n "$ivs" ] && runs+=("ivshmem:$ivs")
			[ -n "$cxs" ] && runs+=("cxl:3")
		fi
		if [ -n "$pair" ]; then
			case "$MEMORY" in ""|ivshmem) ;; *) die "scenario 5 runs on ivshmem only" ;; esac
			for m in $PAIR_MODES; do runs+=("pair:$m"); done
		fi
	else
		case "$MEMORY" in
		"") runs=("ivshmem:1,2,4" "cxl:3"); for m in $PAIR_MODES; do runs+=("pair:$m"); done ;;
		cxl) runs=("cxl:3") ;;
		numa) die "the numa exposure has no host-shared scenarios: use 'up --memory numa'" ;;
		*) runs=("$MEMORY:1,2,4") ;;
		esac
	fi
	fail=0
	for r in "${runs[@]}"; do
		case "$r" in
		pair:*) run_pair "${r#*:}" || fail=1 ;;
		*) run_guest "${r%%:*}" "${r#*:}" || fail=1 ;;
		esac
	done
	echo
	echo "=== testbed results"
	printf '  %s\n' "${RESULTS[@]}"
	echo "  total $(el "$T_START")s"
	if [ "$fail" = 0 ]; then echo "testbed: all scenarios passed"; else echo "testbed: FAILED"; exit 1; fi
	;;
up)
	MEMORY="${MEMORY:-ivshmem}"
	prepare
	shm="$SHM_DIR/cxlkv-testbed-$MEMORY-$$"
	qemu_args "$MEMORY" "$shm"
	rm -f "$shm"; truncate -s "${SHM_MIB}M" "$shm"; FILES+=("$shm")
	nlog="$CACHE/logs/ndpd-up.log"
	if [ "$MEMORY" != numa ]; then
		# The host-side device: starts once a pool appears in the file (made in the guest).
		( until "$BIN/cxlkv-testbed" locate "file:$shm" >/dev/null 2>&1; do sleep 1; done
		  exec "$BIN/cxlkv-ndpd" --pool "file:$shm" --locate --idle-spin-us 1000000 ) >"$nlog" 2>&1 &
		PIDS+=("$!")
	fi
	echo "testbed: host file $shm; cxlkv-ndpd starts when a pool appears in it (log: $nlog)."
	echo "testbed: booting the guest (TCG, 4-8 s); 'poweroff -f' in the guest ends the session."
	"$QEMU" "${QARGS[@]}" -append "console=ttyS0 panic=-1 quiet tb_memory=$MEMORY tb_mode=shell"
	;;
*) usage ;;
esac
