//! [`PulledRows`]: how the host fallback reads a command's blocks for
//! [`crate::ndp::sketch::sparse_rows`]: every byte pulled across the link into private memory
//! (under the coherence protocol's read acquire), one read per run of adjacent rows.

use crate::coherence::{self, Site};
use crate::ndp::abi::*;
use crate::ndp::block::{read_scales, read_sketch_scales, ResolvedBlock};
use crate::ndp::layout::DeviceStatus;
use crate::ndp::sketch::{BlockRows, Section};
use cxlkv_kernels::{DType, KeyRows};
use cxlkv_shm::mem::SharedMemory;

/// A command's resolved blocks, read by pulling.
pub(super) struct PulledRows<'a> {
    pub(super) mem: &'a dyn SharedMemory,
    pub(super) blocks: &'a [ResolvedBlock],
    pub(super) dtype: DType,
    pub(super) dim: usize,
    buf: Vec<u8>,
}

impl<'a> PulledRows<'a> {
    pub(super) fn new(
        mem: &'a dyn SharedMemory,
        blocks: &'a [ResolvedBlock],
        dtype: DType,
        dim: usize,
    ) -> PulledRows<'a> {
        PulledRows {
            mem,
            blocks,
            dtype,
            dim,
            buf: Vec::new(),
        }
    }

    fn read(&mut self, off: u64, len: u64) -> Result<(), DeviceStatus> {
        self.buf.resize(len as usize, 0);
        coherence::acquire(self.mem, Site::PayloadRead, off, len);
        self.mem
            .read(off, &mut self.buf)
            .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_RANGE))
    }

    fn rows_of(
        &mut self,
        off: u64,
        len: u64,
        dtype: DType,
        f: &mut dyn FnMut(&KeyRows<'_>),
    ) -> Result<(), DeviceStatus> {
        self.read(off, len)?;
        let rows = KeyRows::new(&self.buf, dtype, self.dim)
            .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_LAYOUT))?;
        f(&rows);
        Ok(())
    }
}

impl BlockRows for PulledRows<'_> {
    fn keys(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus> {
        let r = self.blocks[b];
        self.rows_of(r.k_off, r.head_bytes, self.dtype, f)
    }

    fn sketch(&mut self, b: usize, f: &mut dyn FnMut(&KeyRows<'_>)) -> Result<(), DeviceStatus> {
        let r = self.blocks[b];
        let t = r
            .sketch
            .dtype()
            .ok_or(DeviceStatus::at(CXLKV_NDP_ERR_LAYOUT, b))?;
        self.rows_of(r.sketch_off, r.sketch_code_bytes(self.dim), t, f)
    }

    fn sketch_copy(&mut self, b: usize) -> Result<Vec<u8>, DeviceStatus> {
        let r = self.blocks[b];
        self.read(r.sketch_off, r.sketch_code_bytes(self.dim))?;
        Ok(std::mem::take(&mut self.buf))
    }

    fn copy_rows(
        &mut self,
        b: usize,
        section: Section,
        rows: &[usize],
        out: &mut [u8],
    ) -> Result<(), DeviceStatus> {
        let r = self.blocks[b];
        let base = section.offset(&r);
        let row = self.dtype.bytes(self.dim);
        // One read per run of adjacent rows.
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                j += 1;
            }
            let off = base + (rows[i] * row) as u64;
            let dst = &mut out[i * row..j * row];
            coherence::acquire(self.mem, Site::PayloadRead, off, dst.len() as u64);
            self.mem
                .read(off, dst)
                .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_RANGE))?;
            i = j;
        }
        Ok(())
    }

    fn scales(&mut self, b: usize) -> Result<(Vec<f32>, Vec<f32>), DeviceStatus> {
        read_scales(self.mem, &self.blocks[b], self.dim)
            .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_RANGE))
    }

    fn sketch_scales(&mut self, b: usize) -> Result<Vec<f32>, DeviceStatus> {
        read_sketch_scales(self.mem, &self.blocks[b], self.dim)
            .map_err(|_| DeviceStatus::new(CXLKV_NDP_ERR_RANGE))
    }
}
