# Pool memory = a file-backed, CPU-less NUMA node (node1).  Pages bound to it land at guest
# physical addresses the host cannot know in advance, so this exposure is for placement
# experiments inside the guest (a pool with numa:1:NAME); it has no host-shared scenario.
echo "CXLKV-TB MEMORY numa: node1 cpulist='$(cat /sys/devices/system/node/node1/cpulist 2>/dev/null)' $(grep MemTotal /sys/devices/system/node/node1/meminfo 2>/dev/null)"
echo "numa:1:tb-pool" > /tmp/tb-pool
cxlkv topo
[ -n "$TB_PREPARE_ONLY" ] && exit 0
echo "CXLKV-TB ERROR: the numa exposure has no host-shared scenarios (use --memory ivshmem|dax|cxl)"
exit 1
