//! Id ↔ policy-slot bookkeeping shared by the tiers and both replay drivers.

use std::collections::HashMap;

/// Ids under a policy: the id ↔ policy-slot bookkeeping both drivers (and the tiers) share, so
/// that the same sequence of operations numbers slots the same way everywhere.
pub(crate) struct SlotMap<K> {
    slot_of: HashMap<K, u32>,
    id_of: Vec<K>,
    free: Vec<u32>,
}

impl<K: std::hash::Hash + Eq + Copy + Default> SlotMap<K> {
    pub(crate) fn new(slots: usize) -> Self {
        SlotMap {
            slot_of: HashMap::with_capacity(slots),
            id_of: vec![K::default(); slots],
            free: (0..slots as u32).rev().collect(),
        }
    }
    pub(crate) fn get(&self, id: K) -> Option<u32> {
        self.slot_of.get(&id).copied()
    }
    pub(crate) fn len(&self) -> usize {
        self.slot_of.len()
    }
    /// Assigns a slot to a new id; `None` when every slot is taken.
    pub(crate) fn assign(&mut self, id: K) -> Option<u32> {
        let s = self.free.pop()?;
        self.slot_of.insert(id, s);
        self.id_of[s as usize] = id;
        Some(s)
    }
    /// Frees a slot; returns the id it held.
    pub(crate) fn release(&mut self, slot: u32) -> K {
        let id = self.id_of[slot as usize];
        self.slot_of.remove(&id);
        self.free.push(slot);
        id
    }
}
