//! `cxlkv eval --passkey N`: synthetic retrieval prompts (a five-digit pass key hidden in filler
//! at a depth of the prompt), each prefilled once exactly, then for each mode the question run
//! as decode steps and the answer generated greedily under the mode.

use super::super::{Error, Result};
use super::score::{model_err, prefill, Prefix};
use cxlkv::kernels::rng::SplitMix64;
use cxlkv::model::{argmax, Attention, Model, Tokenizer};

/// Depths (fraction of the filler before the key) the prompts cycle through.
pub const DEPTHS: [f64; 3] = [0.1, 0.5, 0.9];
/// Tokens generated for the answer.
pub const ANSWER_TOKENS: usize = 8;

const INTRO: &str = "There is an important piece of information hidden inside a lot of \
                     irrelevant text. Find it and memorize it. I will quiz you about it.";
/// The neutral filler of the pass-key test of Mohtashami & Jaggi (2023, "Landmark Attention").
const FILLER: &str = " The grass is green. The sky is blue. The sun is yellow. Here we go. There \
                      and back again.";
const QUESTION: &str = " What is the pass key? The pass key is";

/// One retrieval prompt.
pub struct Prompt {
    /// Intro, filler and key: prefilled exactly.
    pub context: Vec<u32>,
    /// The question: decode steps under the mode.
    pub question: Vec<u32>,
    /// The key, five digits.
    pub key: String,
    /// Fraction of the filler before the key.
    pub depth: f64,
    /// Prompt tokens (context + question).
    pub length: usize,
}

/// `n` prompts of lengths spread up to `max_len` tokens (answer included), depths cycling
/// through [`DEPTHS`], keys from a fixed seed.
pub fn prompts(tk: &Tokenizer, n: usize, max_len: usize) -> Result<Vec<Prompt>> {
    let intro = tk.encode(INTRO);
    let filler = tk.encode(FILLER);
    let question = tk.encode(QUESTION);
    let fixed = intro.len() + question.len() + 24 + ANSWER_TOKENS;
    let lengths = n.div_ceil(DEPTHS.len());
    let shortest = max_len / lengths;
    if shortest < fixed + 8 {
        return Err(Error::Usage(format!(
            "--passkey {n}: prompts of up to {max_len} tokens in {lengths} lengths are too \
             short (each needs at least {} tokens); use fewer prompts or a longer --context",
            fixed + 8
        )));
    }
    let mut rng = SplitMix64::new(0x09a5_56e7);
    (0..n)
        .map(|i| {
            let depth = DEPTHS[i % DEPTHS.len()];
            let length = max_len * (i / DEPTHS.len() + 1) / lengths;
            let key = format!("{}", 10_000 + rng.below(90_000));
            let needle = tk.encode(&format!(
                " The pass key is {key}. Remember it. {key} is the pass key."
            ));
            let room =
                length.saturating_sub(ANSWER_TOKENS + intro.len() + needle.len() + question.len());
            let before = (room as f64 * depth) as usize;
            let mut context = intro.clone();
            context.extend(filler.iter().cycle().take(before));
            context.extend(&needle);
            context.extend(filler.iter().cycle().take(room - before));
            Ok(Prompt {
                length: context.len() + question.len(),
                context,
                question: question.clone(),
                key,
                depth,
            })
        })
        .collect()
}

/// The prompt's exact prefill, shared by every mode.
pub fn prefill_prompt(
    model: &Model,
    dense: &mut dyn Attention,
    p: &Prompt,
    label: &str,
) -> Result<Prefix> {
    prefill(model, dense, &p.context, label)
}

/// Runs the question one decode step per token on `attn` (holding the prompt's context), then
/// generates [`ANSWER_TOKENS`] greedily; true if the first number in the answer is the key.
/// Returns the answer text too.
pub fn answer(model: &Model, attn: &mut dyn Attention, p: &Prompt) -> Result<(bool, String)> {
    let mut logits = Vec::new();
    for &t in &p.question {
        logits = model.forward(&[t], attn).map_err(model_err)?;
    }
    let mut out = Vec::with_capacity(ANSWER_TOKENS);
    for i in 0..ANSWER_TOKENS {
        let next = argmax(&logits) as u32;
        out.push(next);
        if Some(next) == model.tokenizer().eos() {
            break;
        }
        if i + 1 < ANSWER_TOKENS {
            logits = model.forward(&[next], attn).map_err(model_err)?;
        }
    }
    let text = model.tokenizer().decode(&out).map_err(model_err)?;
    Ok((first_number(&text) == Some(p.key.as_str()), text))
}

/// The first run of ASCII digits in `s`.
fn first_number(s: &str) -> Option<&str> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let rest = &s[start..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_number_is_the_answer() {
        assert_eq!(first_number(" 48213. Remember"), Some("48213"));
        assert_eq!(first_number(" 4821 3"), Some("4821"));
        assert_eq!(first_number(" none"), None);
    }
}
