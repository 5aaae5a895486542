//! Greedy generation: one forward over the prompt (prefill), then one decode step per new token,
//! each token handed to the caller as soon as it is chosen, with the time of both phases.

use crate::attention::Attention;
use crate::error::{Error, Result};
use crate::model::Model;
use std::time::{Duration, Instant};

/// What a generation did and how long it took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens run in the prefill.
    pub prompt_tokens: usize,
    /// Tokens generated (the end-of-sequence token, if it came, not counted).
    pub generated: usize,
    /// Time of the prefill, including the choice of the first token.
    pub prefill: Duration,
    /// Time of the decode steps after the first token.
    pub decode: Duration,
    /// True if generation ended at the end-of-sequence token.
    pub stopped_at_eos: bool,
}

impl GenerationStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill)
    }

    /// Decode steps per second (each step runs one token and chooses the next).
    pub fn decode_tokens_per_s(&self) -> f64 {
        rate(self.generated.saturating_sub(1), self.decode)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// Index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// Greedy decoding of up to `max_new` tokens after `prompt`, continuing the sequence `attn`
/// holds. `on_token` receives each new token as it is chosen; generation stops after `max_new`
/// tokens or at the end-of-sequence token (not passed on). The whole run must fit the model's
/// context, checked before any work.
pub fn generate(
    model: &Model,
    attn: &mut dyn Attention,
    prompt: &[u32],
    max_new: usize,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<GenerationStats> {
    let context = model.config().context;
    // The last generated token is never run, hence the `- 1`.
    let needed = attn.len(0) + prompt.len() + max_new.saturating_sub(1);
    if needed > context {
        return Err(Error::ContextTooLong {
            requested: needed,
            max: context,
        });
    }
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len(),
        ..GenerationStats::default()
    };
    if max_new == 0 {
        return Ok(stats);
    }
    let eos = model.tokenizer().eos();
    let t0 = Instant::now();
    let mut next = argmax(&model.forward(prompt, attn)?) as u32;
    stats.prefill = t0.elapsed();
    let t1 = Instant::now();
    loop {
        if Some(next) == eos {
            stats.stopped_at_eos = true;
            break;
        }
        on_token(next)?;
        stats.generated += 1;
        if stats.generated == max_new {
            break;
        }
        next = argmax(&model.forward(&[next], attn)?) as u32;
    }
    stats.decode = t1.elapsed();
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn rates_are_zero_without_time() {
        let s = GenerationStats::default();
        assert_eq!(s.prefill_tokens_per_s(), 0.0);
        let s = GenerationStats {
            generated: 11,
            decode: Duration::from_secs(2),
            ..s
        };
        assert_eq!(s.decode_tokens_per_s(), 5.0);
    }
}
