//! [`Phased`]: a backend wrapper that tells a generation's prefill traffic from its decode
//! steps' (the statistics are snapshot when the second forward starts).

use cxlkv_model::{Attention, AttentionStats, Result};

/// Wraps a backend for one [`cxlkv_model::generate`] call: the first forward is the prefill,
/// every later one a decode step.
pub struct Phased<'a> {
    inner: &'a mut dyn Attention,
    start: AttentionStats,
    forwards: usize,
    at_decode: Option<AttentionStats>,
}

impl<'a> Phased<'a> {
    /// Wraps `inner` (its statistics so far are left out).
    pub fn new(inner: &'a mut dyn Attention) -> Phased<'a> {
        let start = inner.stats();
        Phased {
            inner,
            start,
            forwards: 0,
            at_decode: None,
        }
    }

    /// What the prefill (the first forward) moved.
    pub fn prefill(&self) -> AttentionStats {
        self.at_decode
            .unwrap_or_else(|| self.inner.stats())
            .since(&self.start)
    }

    /// What the decode steps (every later forward) moved.
    pub fn decode(&self) -> AttentionStats {
        match self.at_decode {
            Some(s) => self.inner.stats().since(&s),
            None => AttentionStats::default(),
        }
    }
}

impl Attention for Phased<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn len(&self, layer: usize) -> usize {
        self.inner.len(layer)
    }

    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        // Every forward appends to layer 0 first.
        if layer == 0 {
            self.forwards += 1;
            if self.forwards == 2 {
                self.at_decode = Some(self.inner.stats());
            }
        }
        self.inner.append(layer, k, v)
    }

    fn attend(&mut self, layer: usize, q: &[f32], out: &mut [f32]) -> Result<()> {
        self.inner.attend(layer, q, out)
    }

    fn clear(&mut self) {
        self.inner.clear()
    }

    fn stats(&self) -> AttentionStats {
        self.inner.stats()
    }
}
