//! Pre-tokenization: splitting text into the pieces that byte-level BPE then encodes one by one.
//!
//! The GPT-2 pattern, written out by hand instead of with a regex engine (it needs a look-ahead
//! that the `regex` crate lacks):
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! [`PreTokenizer::DigitsThenGpt2`] (llama.cpp's `smollm`, `starcoder`, ... pre-tokenizers) first
//! isolates every `\p{N}` character, then applies the pattern to each piece separately.
//!
//! Character classes: `\s` is Rust's `char::is_whitespace` (Unicode White_Space, as the regex),
//! `\p{N}` is `char::is_numeric` (Nd, Nl, No, as the regex), `\p{L}` is `char::is_alphabetic`
//! minus the numerics. The last differs from the General Category L for the few marks that are
//! Other_Alphabetic (e.g. Devanagari vowel signs): those join a letter run here, and form a
//! punctuation run under the regex.

use crate::error::{Error, Result};

/// How text is split before BPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The GPT-2 pattern alone (`tokenizer.ggml.pre` = `gpt2`, `default`, `mpt`, `olmo`).
    Gpt2,
    /// Every number character isolated, then the GPT-2 pattern (`smollm`, `starcoder`,
    /// `refact`, `command-r`, `codeshell`, `exaone`, `minerva`).
    DigitsThenGpt2,
}

/// The `tokenizer.ggml.pre` values this module implements.
pub(crate) const SUPPORTED_PRE: &str =
    "gpt2, default, mpt, olmo, smollm, starcoder, refact, command-r, codeshell, exaone, minerva";

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre` = `name` (absent: `default`).
    pub fn from_gguf_name(name: Option<&str>) -> Result<PreTokenizer> {
        match name.unwrap_or("default") {
            "gpt2" | "default" | "mpt" | "olmo" => Ok(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => Ok(PreTokenizer::DigitsThenGpt2),
            other => Err(Error::UnsupportedTokenizer {
                found: format!("tokenizer.ggml.pre = {other:?}"),
                supported: SUPPORTED_PRE,
            }),
        }
    }

    /// The pieces of `text`, in order; their concatenation is `text`.
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        match self {
            PreTokenizer::Gpt2 => gpt2_split(text, &mut out),
            PreTokenizer::DigitsThenGpt2 => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        gpt2_split(&text[start..i], &mut out);
                        out.push(&text[i..i + c.len_utf8()]);
                        start = i + c.len_utf8();
                    }
                }
                gpt2_split(&text[start..], &mut out);
            }
        }
        out
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Number,
    Other,
}

fn class_of(c: char) -> Class {
    if c.is_numeric() {
        Class::Number
    } else if c.is_alphabetic() {
        Class::Letter
    } else {
        Class::Other
    }
}

/// The GPT-2 pattern over `text`, pushing each match to `out`.
fn gpt2_split<'a>(text: &'a str, out: &mut Vec<&'a str>) {
    let cs: Vec<(usize, char)> = text.char_indices().collect();
    let n = cs.len();
    let byte = |k: usize| if k < n { cs[k].0 } else { text.len() };
    let ch = |k: usize| cs.get(k).map(|&(_, c)| c);
    let mut i = 0;
    while i < n {
        let c = cs[i].1;
        let end = if let Some(len) = contraction(c, ch(i + 1), ch(i + 2)) {
            i + len
        } else {
            // ` ?X+`: a single leading space joins the run that follows it.
            let lead = if c == ' ' && ch(i + 1).is_some_and(|d| !d.is_whitespace()) {
                i + 1
            } else {
                i
            };
            if !cs[lead].1.is_whitespace() {
                let class = class_of(cs[lead].1);
                let mut j = lead + 1;
                while ch(j).is_some_and(|d| !d.is_whitespace() && class_of(d) == class) {
                    j += 1;
                }
                j
            } else {
                // `\s+(?!\S)`: a run of spaces leaves its last one to the word after it;
                // `\s+`: a single space before a word that did not take it stands alone.
                let mut j = i;
                while ch(j).is_some_and(char::is_whitespace) {
                    j += 1;
                }
                if j < n && j - i > 1 {
                    j - 1
                } else {
                    j
                }
            }
        };
        out.push(&text[byte(i)..byte(end)]);
        i = end;
    }
}

/// Length in characters of the contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) that
/// starts with `c`, if any.
fn contraction(c: char, c1: Option<char>, c2: Option<char>) -> Option<usize> {
    if c != '\'' {
        return None;
    }
    match (c1?, c2) {
        ('s' | 't' | 'm' | 'd', _) => Some(2),
        ('r' | 'v', Some('e')) | ('l', Some('l')) => Some(3),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2(s: &str) -> Vec<&str> {
        PreTokenizer::Gpt2.split(s)
    }

    #[test]
    fn words_take_one_leading_space() {
        assert_eq!(gpt2("Hello world"), ["Hello", " world"]);
        assert_eq!(gpt2("a  b"), ["a", " ", " b"]);
        assert_eq!(gpt2("a   b"), ["a", "  ", " b"]);
        assert_eq!(gpt2("end  "), ["end", "  "]);
    }

    #[test]
    fn newlines_do_not_join_words() {
        assert_eq!(gpt2("a\nb"), ["a", "\n", "b"]);
        assert_eq!(gpt2("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(gpt2("a.\n\n_The"), ["a", ".", "\n", "\n", "_", "The"]);
        assert_eq!(gpt2("x \n y"), ["x", " \n", " y"]);
    }

    #[test]
    fn contractions_and_punctuation() {
        assert_eq!(gpt2("Devil's"), ["Devil", "'s"]);
        assert_eq!(gpt2("we'll they're"), ["we", "'ll", " they", "'re"]);
        assert_eq!(gpt2("\"'s"), ["\"'", "s"]);
        assert_eq!(gpt2(" 's"), [" '", "s"]);
        assert_eq!(gpt2("Hi!!! ok?"), ["Hi", "!!!", " ok", "?"]);
        assert_eq!(
            gpt2("[from {ACADEME}]"),
            ["[", "from", " {", "ACADEME", "}]"]
        );
    }

    #[test]
    fn numbers_run_or_split() {
        assert_eq!(gpt2("in 1881, x"), ["in", " 1881", ",", " x"]);
        let smol = PreTokenizer::DigitsThenGpt2;
        assert_eq!(
            smol.split("in 1881, x"),
            ["in", " ", "1", "8", "8", "1", ",", " x"]
        );
        assert_eq!(smol.split("a1b"), ["a", "1", "b"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        for s in [
            "",
            " ",
            "  \t\n x",
            "héllo wörld 42 — ok",
            "日本語のテキスト",
            "a\r\n\r\nb",
        ] {
            for p in [PreTokenizer::Gpt2, PreTokenizer::DigitsThenGpt2] {
                let pieces = p.split(s);
                assert_eq!(pieces.concat(), s);
                assert!(pieces.iter().all(|x| !x.is_empty()));
            }
        }
    }

    #[test]
    fn unknown_pre_is_an_error() {
        assert!(PreTokenizer::from_gguf_name(Some("llama3")).is_err());
        assert_eq!(
            PreTokenizer::from_gguf_name(Some("smollm")).unwrap(),
            PreTokenizer::DigitsThenGpt2
        );
    }
}
