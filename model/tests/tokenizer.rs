//! The tokenizer built from the GGUF against the reference tokens (llama.cpp's ids for the text,
//! data/kv/smollm2_devil_2048).

mod common;

use cxlkv_model::{Gguf, Tokenizer};

fn tokenizer(test: &str) -> Option<Tokenizer> {
    let path = common::model_path(test)?;
    let gguf = Gguf::open(path).expect("open the GGUF");
    Some(Tokenizer::from_gguf(&gguf).expect("tokenizer from the GGUF"))
}

#[test]
fn reference_tokens_decode_to_the_text() {
    let Some(tk) = tokenizer("reference_tokens_decode_to_the_text") else {
        return;
    };
    let tokens = common::tokens();
    let meta = common::meta();
    let head = meta["text_head"].as_str().unwrap();
    let tail = meta["text_tail"].as_str().unwrap();
    let text = tk.decode(&tokens).unwrap();
    assert!(
        text.starts_with(head),
        "decoded text starts {:?}",
        &text[..200]
    );
    assert!(
        text.ends_with(tail),
        "decoded text ends {:?}",
        &text[text.len() - 200..]
    );

    // Streaming gives the same text.
    let mut stream = tk.stream();
    let mut streamed = String::new();
    for &t in &tokens {
        streamed.push_str(&stream.push(t).unwrap());
    }
    streamed.push_str(&stream.finish());
    assert_eq!(streamed, text);
}

#[test]
fn text_encodes_to_the_reference_tokens() {
    let Some(tk) = tokenizer("text_encodes_to_the_reference_tokens") else {
        return;
    };
    let tokens = common::tokens();
    let text = tk.decode(&tokens).unwrap();
    let ids = tk.encode(&text);
    let first_diff = ids.iter().zip(&tokens).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "first difference at token {first_diff:?}");
    assert_eq!(ids.len(), tokens.len());
}

#[test]
fn chat_markers_are_control_tokens() {
    let Some(tk) = tokenizer("chat_markers_are_control_tokens") else {
        return;
    };
    let start = tk.token_id("<|im_start|>").unwrap();
    let ids = tk.encode_with_specials("<|im_start|>user\nHi<|im_end|>\n");
    assert_eq!(ids[0], start);
    assert_eq!(ids.iter().filter(|&&i| Some(i) == tk.eos()).count(), 1);
    assert!(!tk.encode("<|im_start|>").contains(&start));
    assert_eq!(tk.decode(&ids).unwrap(), "<|im_start|>user\nHi<|im_end|>\n");
}
