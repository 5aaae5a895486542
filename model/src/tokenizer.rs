//! Byte-level BPE (GPT-2 style) built from a GGUF's `tokenizer.ggml.*` keys: encode, decode and
//! a streaming decoder for generated text.
//!
//! Encoding: the text is split into pieces ([`PreTokenizer`]); each piece's UTF-8 bytes are
//! mapped to printable characters by GPT-2's byte-to-unicode table (`' '` becomes `Ġ`, `'\n'`
//! becomes `Ċ`, printable ASCII and most Latin-1 stay themselves), each character starts as one
//! symbol, and the adjacent pair of lowest merge rank is merged until no pair has a rank. Merges
//! are kept as `(left id, right id) -> (rank, merged id)`, so the loop works on token ids.
//! Decoding maps characters back to bytes; control tokens (`<|im_start|>`) are their text.

use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::pretokenize::PreTokenizer;
use crate::spm::Spm;
use std::collections::HashMap;

/// GGUF `token_type` of control tokens (`<|endoftext|>`, `<|im_start|>`).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// GGUF `token_type` of user-defined tokens (treated like control tokens when parsing specials).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// A byte-level BPE tokenizer.
pub struct Tokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Control and user-defined tokens, longest first: matched literally when parsing specials.
    specials: Vec<(String, u32)>,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    unknown: Option<u32>,
    /// SentencePiece (`tokenizer.ggml.model = llama`), else byte-level BPE.
    spm: Option<Spm>,
}

impl Tokenizer {
    /// The tokenizer of `gguf`: `tokenizer.ggml.model` must be `gpt2` (byte-level BPE) or
    /// `llama` (SentencePiece, see `spm.rs`).
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        let model = gguf.str("tokenizer.ggml.model")?;
        if model == "llama" {
            return Tokenizer::spm_from_gguf(gguf);
        }
        if model != "gpt2" {
            return Err(Error::UnsupportedTokenizer {
                found: format!("tokenizer.ggml.model = {model:?}"),
                supported: "gpt2 (byte-level BPE), llama (SentencePiece)",
            });
        }
        let pre = PreTokenizer::from_gguf_name(gguf.str("tokenizer.ggml.pre").ok())?;
        let tokens: Vec<String> = gguf
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let merges = gguf.strings("tokenizer.ggml.merges")?;
        let types = gguf.ints_opt("tokenizer.ggml.token_type")?;
        let id_key = |k: &str| -> Result<Option<u32>> {
            match gguf.usize_opt(k)? {
                Some(id) if id < tokens.len() => Ok(Some(id as u32)),
                Some(id) => Err(Error::BadMetadata {
                    key: k.into(),
                    reason: format!("id {id} outside the vocabulary of {}", tokens.len()),
                }),
                None => Ok(None),
            }
        };
        let (bos, eos, unknown) = (
            id_key("tokenizer.ggml.bos_token_id")?,
            id_key("tokenizer.ggml.eos_token_id")?,
            id_key("tokenizer.ggml.unknown_token_id")?,
        );
        Tokenizer::new(tokens, &merges, types.as_deref(), pre, bos, eos, unknown)
    }

    fn spm_from_gguf(gguf: &Gguf) -> Result<Tokenizer> {
        let tokens: Vec<String> = gguf
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_string)
            .collect();
        let types = gguf
            .ints_opt("tokenizer.ggml.token_type")?
            .unwrap_or_else(|| vec![1; tokens.len()]);
        let scores = match gguf.get("tokenizer.ggml.scores") {
            Some(candle_core::quantized::gguf_file::Value::Array(a)) => a
                .iter()
                .map(|v| v.to_f32().map_err(Error::from))
                .collect::<Result<Vec<f32>>>()?,
            _ => {
                return Err(Error::BadMetadata {
                    key: "tokenizer.ggml.scores".into(),
                    reason: "missing or not an array (SentencePiece needs the scores)".into(),
                })
            }
        };
        let flag = |k: &str, default: bool| match gguf.get(k) {
            Some(v) => v.to_bool().map_err(Error::from),
            None => Ok(default),
        };
        let add_bos = flag("tokenizer.ggml.add_bos_token", true)?;
        let add_space_prefix = flag("tokenizer.ggml.add_space_prefix", true)?;
        let spm = Spm::new(&tokens, scores, types.clone(), add_bos, add_space_prefix)?;
        let mut t = Tokenizer::from_parts_gguf(gguf, tokens, &types)?;
        t.spm = Some(spm);
        Ok(t)
    }

    fn from_parts_gguf(gguf: &Gguf, tokens: Vec<String>, types: &[i64]) -> Result<Tokenizer> {
        let n = tokens.len();
        let id_key = |k: &str| -> Result<Option<u32>> {
            match gguf.usize_opt(k)? {
                Some(id) if id < n => Ok(Some(id as u32)),
                Some(id) => Err(Error::BadMetadata {
                    key: k.into(),
                    reason: format!("id {id} outside the vocabulary of {n}"),
                }),
                None => Ok(None),
            }
        };
        let (bos, eos, unknown) = (
            id_key("tokenizer.ggml.bos_token_id")?,
            id_key("tokenizer.ggml.eos_token_id")?,
            id_key("tokenizer.ggml.unknown_token_id")?,
        );
        Tokenizer::new(
            tokens,
            &[],
            Some(types),
            PreTokenizer::Gpt2,
            bos,
            eos,
            unknown,
        )
    }

    /// A tokenizer from its parts: `merges` are `"left right"` strings, best first; `types` the
    /// GGUF token types (control tokens are 3).
    pub fn new(
        tokens: Vec<String>,
        merges: &[&str],
        types: Option<&[i64]>,
        pre: PreTokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
        unknown: Option<u32>,
    ) -> Result<Tokenizer> {
        let bad = |reason: String| Error::BadMetadata {
            key: "tokenizer.ggml.merges".into(),
            reason,
        };
        if tokens.len() > u32::MAX as usize {
            return Err(Error::BadMetadata {
                key: "tokenizer.ggml.tokens".into(),
                reason: format!("{} tokens do not fit u32 ids", tokens.len()),
            });
        }
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let (l, r) = m
                .split_once(' ')
                .ok_or_else(|| bad(format!("merge {rank} {m:?} has no space")))?;
            let (Some(&li), Some(&ri), Some(&mi)) =
                (ids.get(l), ids.get(r), ids.get(&format!("{l}{r}")))
            else {
                return Err(bad(format!(
                    "merge {rank} {m:?} names a token not in the vocabulary"
                )));
            };
            // Keep the best rank if a pair repeats.
            merge_map.entry((li, ri)).or_insert((rank as u32, mi));
        }
        let mut specials: Vec<(String, u32)> = types
            .unwrap_or(&[])
            .iter()
            .enumerate()
            .filter(|&(i, &t)| {
                (t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
                    && i < tokens.len()
                    && !tokens[i].is_empty()
            })
            .map(|(i, _)| (tokens[i].clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let byte_char = byte_to_unicode();
        let char_byte = (0..=255u8).map(|b| (byte_char[b as usize], b)).collect();
        Ok(Tokenizer {
            tokens,
            ids,
            merges: merge_map,
            specials,
            byte_char,
            char_byte,
            pre,
            bos,
            eos,
            unknown,
            spm: None,
        })
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token, if the file names one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the file names one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The (byte-level) text of token `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Encodes `text` as plain text: a control token's spelling in it is encoded as characters.
    /// A SentencePiece vocabulary whose file sets `tokenizer.ggml.add_bos_token` starts with the
    /// beginning-of-sequence token, as llama.cpp does; a BPE one adds nothing.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.push_bos(&mut out);
        self.encode_plain(text, &mut out);
        out
    }

    /// Encodes `text`, turning the exact spelling of a control token (`<|im_start|>`) into that
    /// token: the form for chat templates.
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.push_bos(&mut out);
        let mut rest = text;
        while !rest.is_empty() {
            let next = self
                .specials
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|at| (at, s.len(), *id)))
                // Earliest match; the longest among those starting there (the list is longest first).
                .min_by_key(|&(at, _, _)| at);
            match next {
                Some((at, len, id)) => {
                    self.encode_plain(&rest[..at], &mut out);
                    out.push(id);
                    rest = &rest[at + len..];
                }
                None => {
                    self.encode_plain(rest, &mut out);
                    break;
                }
            }
        }
        out
    }

    fn push_bos(&self, out: &mut Vec<u32>) {
        if let (Some(spm), Some(bos)) = (&self.spm, self.bos) {
            if spm.add_bos {
                out.push(bos);
            }
        }
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        if let Some(spm) = &self.spm {
            spm.encode(text, &self.ids, self.unknown, out);
            return;
        }
        let mut symbols = Vec::new();
        let mut chars = String::new();
        for piece in self.pre.split(text) {
            symbols.clear();
            for &b in piece.as_bytes() {
                chars.clear();
                chars.push(self.byte_char[b as usize]);
                // Byte-level vocabularies hold all 256 byte symbols; one that lacks a byte and
                // has no unknown token cannot represent it, and the byte is dropped.
                if let Some(id) = self.ids.get(&chars).copied().or(self.unknown) {
                    symbols.push(id);
                }
            }
            self.merge(&mut symbols);
            out.extend_from_slice(&symbols);
        }
    }

    /// Applies merges to `symbols` until none applies: always the pair of lowest rank, its
    /// leftmost occurrence first (so equal pairs merge left to right).
    fn merge(&self, symbols: &mut Vec<u32>) {
        loop {
            let best = symbols
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.merges.get(&(w[0], w[1])).map(|&(r, m)| (r, i, m)))
                .min_by_key(|&(r, i, _)| (r, i));
            let Some((_, i, merged)) = best else {
                return;
            };
            symbols[i] = merged;
            symbols.remove(i + 1);
        }
    }

    /// The text of `ids`. Bytes that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            self.push_bytes(id, &mut bytes)?;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Appends the bytes of token `id` to `out`.
    fn push_bytes(&self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let text = self.token_text(id).ok_or(Error::BadToken {
            id,
            vocab: self.tokens.len(),
        })?;
        if let Some(spm) = &self.spm {
            spm.push_bytes(id, text, out);
            return Ok(());
        }
        for c in text.chars() {
            match self.char_byte.get(&c) {
                Some(&b) => out.push(b),
                // A character outside the byte alphabet (only in added tokens): itself.
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        Ok(())
    }

    /// A decoder that turns tokens into text as they are generated.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream {
            tokenizer: self,
            pending: Vec::new(),
        }
    }
}

/// Incremental decoding: a token can end in the middle of a UTF-8 character, so the bytes of an
/// unfinished character wait for the next token.
pub struct TokenStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
}

impl TokenStream<'_> {
    /// The text that token `id` completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tokenizer.push_bytes(id, &mut self.pending)?;
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    text.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or(""));
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        Ok(text)
    }

    /// Whatever is left at the end (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// GPT-2's byte-to-unicode table: the printable bytes `!..=~`, `¡..=¬`, `®..=ÿ` are themselves;
/// the other 68 bytes, in increasing order, become U+0100, U+0101, ...
fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
            next += 1;
            c
        };
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary: the byte alphabet, then merges building "Ġthe" and "he".
    fn toy() -> Tokenizer {
        let table = byte_to_unicode();
        let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
        for t in ["he", "Ġt", "Ġthe", "<|end|>"] {
            tokens.push(t.into());
        }
        let mut types = vec![1i64; tokens.len()];
        *types.last_mut().unwrap() = TOKEN_TYPE_CONTROL;
        let merges = ["h e", "Ġ t", "Ġt he"];
        Tokenizer::new(
            tokens,
            &merges,
            Some(&types),
            PreTokenizer::Gpt2,
            None,
            None,
            None,
        )
        .unwrap()
    }

    #[test]
    fn byte_table_is_gpt2s() {
        let t = byte_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'A' as usize], 'A');
        assert_eq!(t[0], '\u{100}');
        assert_eq!(t[0xad], '\u{143}');
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn merges_apply_by_rank() {
        let tk = toy();
        let ids = tk.encode("the the");
        let texts: Vec<&str> = ids.iter().map(|&i| tk.token_text(i).unwrap()).collect();
        assert_eq!(texts, ["t", "he", "Ġthe"]);
        assert_eq!(tk.decode(&ids).unwrap(), "the the");
    }

    #[test]
    fn specials_only_when_asked() {
        let tk = toy();
        let end = tk.token_id("<|end|>").unwrap();
        assert!(!tk.encode("a<|end|>").contains(&end));
        assert_eq!(tk.encode_with_specials("a<|end|>b").len(), 3);
        assert_eq!(tk.encode_with_specials("a<|end|>b")[1], end);
    }

    #[test]
    fn stream_holds_split_characters() {
        let tk = toy();
        // "é" is two bytes, each its own token in the toy vocabulary.
        let ids = tk.encode("é!");
        assert_eq!(ids.len(), 3);
        let mut s = tk.stream();
        assert_eq!(s.push(ids[0]).unwrap(), "");
        assert_eq!(s.push(ids[1]).unwrap(), "é");
        assert_eq!(s.push(ids[2]).unwrap(), "!");
        assert_eq!(s.finish(), "");
        assert!(s.push(u32::MAX).is_err());
    }
}
