//! # cxlkv-ndp
//!
//! The near-data-processing device: its ABI (registers, queue pairs, command and completion
//! descriptors), the device model that serves them from next to the pool's memory, and the daemon
//! `cxlkv-ndpd`. The device scores attention keys where they live with `cxlkv-kernels` so that only
//! top-k indices and selected value rows cross the link.
//!
//! This crate is filled by the NDP device issue; until then it exports nothing, and the pool
//! reserves its device area (docs/FORMAT.md) so the format need not change when it lands.
