# Pool memory = a volatile CXL type-3 device (QEMU cxl-type3,volatile-memdev) -> CXL RAM region
# -> dax0.0, first onlined as a CPU-less NUMA node (kmem), then switched to device DAX for a pool
# shared with the host (whose file holds it at the device physical address, found by superblock).
# Emulated CXL accesses are slow (tens of MiB/s): the pool uses a 32 MiB window.
C=/sys/bus/cxl/devices
fail() { echo "CXLKV-TB ERROR: $*"; dmesg | grep -i -E 'cxl|dax' | tail -15; exit 1; }
for m in cxl_acpi cxl_pci cxl_mem cxl_pmem dax_cxl device_dax kmem; do modprobe $m || echo "CXLKV-TB WARNING: modprobe $m failed"; done
i=0; while [ -z "$(ls $C 2>/dev/null | grep '^mem')" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
mem=$(ls $C | grep '^mem' | head -1)
[ -n "$mem" ] || fail "no CXL memdev in $C"
dec=""
for d in $C/decoder0.*; do [ "$(cat $d/cap_ram 2>/dev/null)" = 1 ] && dec=$(basename $d) && break; done
[ -n "$dec" ] || fail "no root decoder with cap_ram"
echo "CXL memdev $mem ram_size=$(cat $C/$mem/ram/size), root decoder $dec"
# cxl-cli 76.1 cannot size RAM regions (it prints 'created 0 regions' and exits 0): use sysfs.
cxl create-region -m -d "$dec" -w 1 -t ram "$mem" >/dev/null 2>&1
reg=$(ls $C | grep '^region' | head -1)
if [ -z "$reg" ]; then
	[ -e $C/$dec/create_ram_region ] || fail "kernel has no $dec/create_ram_region (Linux < 6.3)"
	ep=$(for e in $C/decoder*; do [ -f $e/dpa_size ] && basename $e; done | head -1)
	size=$(printf '%d' "$(cat $C/$mem/ram/size)")
	reg=$(cat $C/$dec/create_ram_region)
	w() { echo "$1" > "$2" || fail "writing $1 to $2"; }
	w "$reg" $C/$dec/create_ram_region
	w "$(cat $C/$dec/interleave_granularity)" $C/$reg/interleave_granularity
	w 1 $C/$reg/interleave_ways
	w ram $C/$ep/mode
	w "$size" $C/$ep/dpa_size
	w "$size" $C/$reg/size
	w "$ep" $C/$reg/target0
	w 1 $C/$reg/commit
	[ -e $C/$reg/driver ] || w "$reg" /sys/bus/cxl/drivers/cxl_region/bind
fi
[ "$(cat $C/$reg/commit 2>/dev/null)" = 1 ] || fail "region $reg not committed"
i=0; while [ -z "$(ls /sys/bus/dax/devices 2>/dev/null)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
dax=$(ls /sys/bus/dax/devices | head -1)
[ -n "$dax" ] || fail "no dax device for $reg"
drv=$(basename "$(readlink /sys/bus/dax/devices/$dax/driver)")
echo "CXLKV-TB MEMORY cxl region $reg resource=$(cat $C/$reg/resource) size=$(cat $C/$reg/size) -> $dax ($drv, target_node $(cat /sys/bus/dax/devices/$dax/target_node))"
echo "--- cxlkv topo (the CXL memory as a CPU-less NUMA node):"
cxlkv topo
if [ "$drv" = kmem ]; then
	daxctl reconfigure-device --mode=devdax -f "$dax" >/dev/null || fail "daxctl reconfigure-device --mode=devdax $dax"
fi
[ -c "/dev/$dax" ] || fail "no /dev/$dax"
echo "dax:/dev/$dax" > /tmp/tb-pool
echo "--- cxlkv topo (the CXL memory as device DAX):"
cxlkv topo
[ -n "$TB_PREPARE_ONLY" ] && exit 0
cxlkv-testbed guest --pool "dax:/dev/$dax" --window-mib 32 --scenarios "$TB_SCENARIOS" --iters "${CMDLINE_tb_iters:-50}"
