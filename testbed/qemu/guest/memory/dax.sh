# Pool memory = an emulated NVDIMM turned into a device-DAX namespace (/dev/dax0.0).  The host
# finds the pool 6 MiB into its file (after the namespace info block) by the superblock.
for m in nfit nd_pmem dax_pmem device_dax; do modprobe $m || echo "CXLKV-TB WARNING: modprobe $m failed"; done
sleep 1
ndctl create-namespace -f -e namespace0.0 -m devdax -a 4K >/dev/null || { echo "CXLKV-TB ERROR: ndctl create-namespace failed"; exit 1; }
[ -c /dev/dax0.0 ] || { echo "CXLKV-TB ERROR: no /dev/dax0.0"; ls /dev; exit 1; }
echo "CXLKV-TB MEMORY nvdimm devdax /dev/dax0.0 size=$(cat /sys/bus/dax/devices/dax0.0/size)"
echo "dax:/dev/dax0.0" > /tmp/tb-pool
cxlkv topo
[ -n "$TB_PREPARE_ONLY" ] && exit 0
cxlkv-testbed guest --pool dax:/dev/dax0.0 --window-mib 32 --scenarios "$TB_SCENARIOS" --iters "${CMDLINE_tb_iters:-200}"
