//! Eviction policies of a partition owner: which unpinned block to reuse when the partition is full.

/// An eviction policy over the blocks of one partition (numbered `0..blocks`).
pub trait EvictionPolicy: Send {
    /// A block became indexed.
    fn insert(&mut self, block: u32);
    /// A block was read by its owner.
    fn touch(&mut self, block: u32);
    /// A block left the index (deleted, replaced or evicted).
    fn remove(&mut self, block: u32);
    /// Removes and returns the next victim, or `None` when no block is tracked.
    fn victim(&mut self) -> Option<u32>;
}

const NIL: u32 = u32::MAX;

/// Least recently used: an intrusive doubly linked list over block numbers, O(1) per operation.
#[derive(Debug)]
pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32, // most recent
    tail: u32, // least recent
}

impl Lru {
    /// An empty LRU over `blocks` blocks.
    pub fn new(blocks: usize) -> Lru {
        Lru { prev: vec![NIL; blocks], next: vec![NIL; blocks], linked: vec![false; blocks], head: NIL, tail: NIL }
    }

    fn unlink(&mut self, b: u32) {
        let i = b as usize;
        if !self.linked[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL { self.head = n } else { self.next[p as usize] = n }
        if n == NIL { self.tail = p } else { self.prev[n as usize] = p }
        self.linked[i] = false;
    }

    fn push_front(&mut self, b: u32) {
        let i = b as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = b;
        } else {
            self.tail = b;
        }
        self.head = b;
        self.linked[i] = true;
    }
}

impl EvictionPolicy for Lru {
    fn insert(&mut self, block: u32) {
        self.unlink(block);
        self.push_front(block);
    }
    fn touch(&mut self, block: u32) {
        if self.linked[block as usize] {
            self.unlink(block);
            self.push_front(block);
        }
    }
    fn remove(&mut self, block: u32) {
        self.unlink(block);
    }
    fn victim(&mut self) -> Option<u32> {
        let t = self.tail;
        (t != NIL).then(|| {
            self.unlink(t);
            t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recent() {
        let mut l = Lru::new(4);
        for b in 0..4 {
            l.insert(b);
        }
        l.touch(0);
        l.remove(2);
        assert_eq!(l.victim(), Some(1));
        assert_eq!(l.victim(), Some(3));
        assert_eq!(l.victim(), Some(0));
        assert_eq!(l.victim(), None);
    }
}
