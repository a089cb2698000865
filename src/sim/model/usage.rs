//! A request's tokens, as an LLM API would count them, for the sim's token
//! policies (`--limit N/W,tokens`) and the `usage` of its answer.
//!
//! The estimate a request is checked against is its `max_tokens` (0 when
//! absent) plus its prompt: the characters of the body's `prompt`, `input`
//! and `messages` text, a token per four, rounded up. What it is charged is
//! its prompt plus a fraction of `max_tokens`, as a model rarely writes all
//! it may: the fraction is drawn from the seed and the body, so the same
//! body always costs the same, in any order of arrival.

use serde_json::{json, Value};

use super::policy::Tokens;
use crate::rate::policy::TokenWeight;

/// The tokens of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt: u64,
    /// Tokens the answer may take: `max_tokens`.
    pub max_tokens: u64,
    /// Tokens the answer took: at most `max_tokens`.
    pub completion: u64,
}

impl Usage {
    /// The usage of a request with body `data`, its answer's length drawn
    /// from `seed`.
    pub fn of(data: &Value, seed: u64) -> Usage {
        let max_tokens = match data.get("max_tokens") {
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
            _ => 0,
        };
        let mut chars = 0u64;
        for field in ["prompt", "input"] {
            if let Some(v) = data.get(field) {
                chars += text_chars(v);
            }
        }
        if let Some(Value::Array(messages)) = data.get("messages") {
            chars += messages
                .iter()
                .filter_map(|m| m.get("content"))
                .map(content_chars)
                .sum::<u64>();
        }
        let prompt = chars.div_ceil(4);
        let fraction = unit_interval(seed ^ fnv1a(data.to_string().as_bytes()));
        let completion = ((max_tokens as f64) * fraction).floor() as u64;
        Usage {
            prompt,
            max_tokens,
            completion: completion.min(max_tokens),
        }
    }

    /// What the token policies check (the estimate) and count (the
    /// charge): the prompt is its input, the answer its output.
    pub fn tokens(&self) -> Tokens {
        Tokens {
            estimate: TokenWeight::split(self.prompt, self.max_tokens),
            charged: TokenWeight::split(self.prompt, self.completion),
        }
    }

    /// The `usage` object of the answer, as OpenAI writes it, or as
    /// Anthropic does (`anthropic`: input and output, no total).
    pub fn to_json(self, anthropic: bool) -> Value {
        match anthropic {
            true => json!({"input_tokens": self.prompt, "output_tokens": self.completion}),
            false => json!({
                "prompt_tokens": self.prompt,
                "completion_tokens": self.completion,
                "total_tokens": self.prompt + self.completion,
            }),
        }
    }
}

/// Characters of every string in `v`.
fn text_chars(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(a) => a.iter().map(text_chars).sum(),
        _ => 0,
    }
}

/// A message's `content`: a string, or parts whose `text` counts.
fn content_chars(v: &Value) -> u64 {
    match v {
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p {
                Value::String(_) => text_chars(p),
                _ => p.get("text").map_or(0, text_chars),
            })
            .sum(),
        _ => text_chars(v),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A fraction in [0, 1) from `x` (splitmix64's finalizer).
fn unit_interval(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_max_tokens_plus_a_token_per_four_characters() {
        let body = json!({"max_tokens": 100, "prompt": "abcdefghi"});
        let u = Usage::of(&body, 7);
        assert_eq!((u.prompt, u.max_tokens), (3, 100));
        assert_eq!(u.tokens().estimate, TokenWeight::split(3, 100));
        assert!(u.completion <= 100);
        assert_eq!(u.tokens().charged.total, 3 + u.completion);
        assert_eq!(Usage::of(&body, 7), u, "the same body costs the same");
    }

    #[test]
    fn messages_and_input_count_their_text() {
        let body = json!({
            "messages": [
                {"role": "system", "content": "1234"},
                {"role": "user", "content": [{"type": "text", "text": "12345678"}]}
            ],
            "input": ["1234", "5"]
        });
        let u = Usage::of(&body, 0);
        // 4 + 8 + 5 characters: 17, so 5 tokens; no max_tokens: no answer.
        assert_eq!((u.prompt, u.max_tokens, u.completion), (5, 0, 0));
        assert_eq!(
            u.to_json(false),
            json!({"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5})
        );
        assert_eq!(
            u.to_json(true),
            json!({"input_tokens": 5, "output_tokens": 0})
        );
        assert_eq!(Usage::of(&json!({}), 0), Usage::default());
    }

    #[test]
    fn the_charged_fraction_varies_with_the_body() {
        let fractions: Vec<u64> = (0..50)
            .map(|i| Usage::of(&json!({"max_tokens": 1000, "prompt": i.to_string()}), 1).completion)
            .collect();
        assert!(fractions.iter().any(|&c| c < 500) && fractions.iter().any(|&c| c >= 500));
    }
}
