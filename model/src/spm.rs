//! SentencePiece (`tokenizer.ggml.model = llama`) as llama.cpp runs it: the vocabulary's tokens,
//! scores and types from the GGUF, no merge list.
//!
//! Encoding: user-defined tokens (GGUF token type 4: Gemma's runs of newlines and spaces) are cut
//! out of the text first, as llama.cpp always does; each remaining fragment gets a leading space
//! if `tokenizer.ggml.add_space_prefix` says so and its spaces become `▁`; every UTF-8 character
//! starts as one symbol, and the adjacent pair whose concatenation is the best-scoring token
//! (ties: the leftmost) is merged until no pair is a token. A final symbol that is not a token
//! (a character outside the vocabulary) becomes its UTF-8 bytes as `<0xXX>` tokens (byte
//! fallback), or the unknown token when the vocabulary lacks those. A beginning-of-sequence token
//! leads when `tokenizer.ggml.add_bos_token` is true.
//!
//! Decoding: normal tokens with `▁` as a space, byte tokens as their byte, user-defined tokens as
//! their text, control tokens (`<bos>`, `<eos>`) as nothing.

use crate::error::{Error, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_BYTE: i64 = 6;
const SPACE: char = '\u{2581}';

/// The SentencePiece-specific part of a [`Tokenizer`](crate::Tokenizer).
pub(crate) struct Spm {
    scores: Vec<f32>,
    types: Vec<i64>,
    /// User-defined tokens, longest first.
    user_defined: Vec<(String, u32)>,
    bytes: [Option<u32>; 256],
    pub(crate) add_bos: bool,
    add_space_prefix: bool,
}

/// A candidate merge of symbols `left` and `left`'s successor, whose texts total `size` bytes.
struct Bigram {
    score: f32,
    left: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// The greatest is the best: higher score, then the leftmost.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// A symbol: bytes `start .. start + len` of the fragment, linked to its neighbours.
#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    pub(crate) fn new(
        tokens: &[String],
        scores: Vec<f32>,
        types: Vec<i64>,
        add_bos: bool,
        add_space_prefix: bool,
    ) -> Result<Spm> {
        for (key, n) in [
            ("tokenizer.ggml.scores", scores.len()),
            ("tokenizer.ggml.token_type", types.len()),
        ] {
            if n != tokens.len() {
                return Err(Error::BadMetadata {
                    key: key.into(),
                    reason: format!("{n} entries for {} tokens", tokens.len()),
                });
            }
        }
        let mut user_defined: Vec<(String, u32)> = (0..tokens.len())
            .filter(|&i| types[i] == TYPE_USER_DEFINED && !tokens[i].is_empty())
            .map(|i| (tokens[i].clone(), i as u32))
            .collect();
        user_defined.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut bytes = [None; 256];
        for (i, t) in tokens.iter().enumerate() {
            if types[i] != TYPE_BYTE {
                continue;
            }
            let hex = t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                bytes[b as usize].get_or_insert(i as u32);
            }
        }
        Ok(Spm {
            scores,
            types,
            user_defined,
            bytes,
            add_bos,
            add_space_prefix,
        })
    }

    /// Encodes plain `text` (no control tokens recognized) into `out`.
    pub(crate) fn encode(
        &self,
        text: &str,
        ids: &HashMap<String, u32>,
        unknown: Option<u32>,
        out: &mut Vec<u32>,
    ) {
        let mut rest = text;
        let mut first = true;
        while !rest.is_empty() {
            let next = self
                .user_defined
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                .min_by_key(|&(at, _, _)| at);
            let (plain, special) = match next {
                Some((at, len, id)) => {
                    let p = &rest[..at];
                    rest = &rest[at + len..];
                    (p, Some(id))
                }
                None => (std::mem::take(&mut rest), None),
            };
            if !plain.is_empty() {
                let mut s = String::with_capacity(plain.len() + 3);
                if self.add_space_prefix && first {
                    s.push(SPACE);
                }
                s.extend(plain.chars().map(|c| if c == ' ' { SPACE } else { c }));
                self.fragment(&s, ids, unknown, out);
            }
            out.extend(special);
            first = false;
        }
    }

    /// llama.cpp's SPM merge loop over one fragment (spaces already `▁`).
    fn fragment(
        &self,
        text: &str,
        ids: &HashMap<String, u32>,
        unknown: Option<u32>,
        out: &mut Vec<u32>,
    ) {
        let mut syms: Vec<Sym> = text
            .char_indices()
            .map(|(i, c)| Sym {
                start: i,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let mut heap = BinaryHeap::new();
        let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], left: usize| {
            let Some(right) = syms[left].next else { return };
            let (a, b) = (syms[left], syms[right]);
            let piece = &text[a.start..b.start + b.len];
            if let Some(&id) = ids.get(piece) {
                heap.push(Bigram {
                    score: self.scores[id as usize],
                    left,
                    size: piece.len(),
                });
            }
        };
        for i in 0..n.saturating_sub(1) {
            try_add(&mut heap, &syms, i);
        }
        while let Some(bg) = heap.pop() {
            let left = bg.left;
            let Some(right) = syms[left].next else {
                continue;
            };
            // Stale: one side has merged since this bigram was queued.
            if syms[left].len == 0
                || syms[right].len == 0
                || syms[left].len + syms[right].len != bg.size
            {
                continue;
            }
            syms[left].len += syms[right].len;
            syms[right].len = 0;
            syms[left].next = syms[right].next;
            if let Some(nn) = syms[right].next {
                syms[nn].prev = Some(left);
            }
            if let Some(p) = syms[left].prev {
                try_add(&mut heap, &syms, p);
            }
            try_add(&mut heap, &syms, left);
        }
        let mut at = if n > 0 { Some(0) } else { None };
        while let Some(i) = at {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            match ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.bytes[b as usize].or(unknown) {
                            out.push(id);
                        }
                    }
                }
            }
            at = s.next;
        }
    }

    /// Appends the bytes token `id` (text `text`) stands for.
    pub(crate) fn push_bytes(&self, id: u32, text: &str, out: &mut Vec<u8>) {
        match self.types.get(id as usize).copied() {
            Some(TYPE_CONTROL) => {}
            Some(TYPE_BYTE) => match self.bytes.iter().position(|&b| b == Some(id)) {
                Some(b) => out.push(b as u8),
                None => out.extend_from_slice(text.as_bytes()),
            },
            Some(TYPE_USER_DEFINED) => out.extend_from_slice(text.as_bytes()),
            _ => {
                for c in text.chars() {
                    let c = if c == SPACE { ' ' } else { c };
                    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
        }
    }
}
