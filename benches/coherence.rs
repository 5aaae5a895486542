//! Coherence cost: put and get of 256 KiB in software-coherent mode against hardware-coherent mode
//! in the same run, and the raw cost of write-back and invalidation per line and per 256 KiB.
//! (Filled in below.)
fn main() {}
