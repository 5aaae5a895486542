# Pool memory = the BAR2 of an ivshmem-plain PCI device (1af4:1110), backed by the host's file.
dev=""
for d in /sys/bus/pci/devices/*; do
	[ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ] && dev=$d && break
done
[ -n "$dev" ] || { echo "CXLKV-TB ERROR: no ivshmem-plain device (1af4:1110)"; ls /sys/bus/pci/devices; exit 1; }
echo 1 > "$dev/enable"
echo "CXLKV-TB MEMORY ivshmem at $dev: $(sed -n 3p "$dev/resource")"
echo "file:$dev/resource2" > /tmp/tb-pool
cxlkv topo
[ -n "$TB_PREPARE_ONLY" ] && exit 0
# Scenario 5 (two guests): tb_role=a|b, tb_coherence, tb_lease_ms, tb_step_clock_s.
cxlkv-testbed guest --pool "file:$dev/resource2" --scenarios "$TB_SCENARIOS" --iters "${CMDLINE_tb_iters:-200}" \
	${CMDLINE_tb_role:+--role "$CMDLINE_tb_role"} ${CMDLINE_tb_coherence:+--coherence "$CMDLINE_tb_coherence"} \
	${CMDLINE_tb_lease_ms:+--lease-ms "$CMDLINE_tb_lease_ms"} ${CMDLINE_tb_step_clock_s:+--step-clock-s "$CMDLINE_tb_step_clock_s"}
