# Vitis HLS flow for the cxlkv NDP kernel (not run on the development machine: no vendor tools).
#
#   make golden                                  # golden vectors first (fpga/golden/*.gold)
#   vitis_hls -f run_hls.tcl                     # csim + csynth
#   vitis_hls -f run_hls.tcl -tclargs cosim      # csim + csynth + cosim (RTL co-simulation)
#
# Target: AMD Alveo U280 (xcu280-fsvh2892-2L-e), 300 MHz (3.33 ns). See README.md for the choice,
# the expected initiation intervals and the resource estimates.
set do_cosim [expr {[llength $argv] > 0 && [lindex $argv 0] eq "cosim"}]
set here [file dirname [file normalize [info script]]]
set golden [lsort [glob -nocomplain $here/golden/*.gold $here/golden/*.gatt $here/golden/*.gsel]]
if {[llength $golden] == 0} {
    puts "no golden vectors in $here/golden: run 'make golden' first"
    exit 1
}
# The synthesized top reads the golden sets that fit its limits (k <= 256, G <= 4, d <= 128): all
# (SCORE_TOPK .gold, ATTEND .gatt, selection .gsel).
set cflags "-std=c++14 -ffp-contract=off -I$here/src"

open_project -reset hls_prj
set_top cxlkv_ndp_top
add_files $here/src/cxlkv_ndp_kernel.cpp -cflags $cflags
foreach tb {tb.cpp tb_attend.cpp tb_select.cpp} {
    add_files -tb $here/tb/$tb -cflags "$cflags -Wno-unknown-pragmas"
}
open_solution -reset sol_u280 -flow_target vitis
set_part xcu280-fsvh2892-2L-e
create_clock -period 3.33 -name default
config_interface -m_axi_addr64=true
config_dataflow -default_channel fifo -fifo_depth 64

csim_design -argv [join $golden " "]
csynth_design
if {$do_cosim} {
    # RTL co-simulation of the first two sets keeps the run short; add more as time permits.
    cosim_design -argv [join [lrange $golden 0 1] " "] -trace_level none
}
exit
