//! A call's estimated cost in tokens from its item (`--cost EXPR`), and
//! what the response says it really cost (`--usage POINTER`).
//!
//! An expression is numbers, JSON field paths of the item (`max_tokens`,
//! `params.max_tokens`, `messages[0].content`), `chars(PATH)` (the length
//! of a field in characters), `+ - * /` and parentheses, e.g.
//! `max_tokens + chars(prompt)/4`. A field that is a number counts as that
//! number (a numeric string too, as CSV fields are); the result is rounded
//! up, and never below zero.
//!
//! Pure: parsing and evaluating never panic on any input.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use crate::rate::policy::{TokenWeight, Used};

/// The default `--usage`: where OpenAI-style responses say what a call used.
pub const DEFAULT_USAGE: &str = "/usage/total_tokens";

/// A parsed `--cost` expression.
#[derive(Debug, Clone, PartialEq)]
pub struct CostExpr {
    source: String,
    root: Node,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Number(f64),
    Field(Vec<Step>),
    Chars(Vec<Step>),
    /// `or(FIELD, DEFAULT)`: the field, or the default where the item has
    /// no such field (or it is null, or an empty CSV cell).
    Or(Vec<Step>, Box<Node>),
    Neg(Box<Node>),
    Op(char, Box<Node>, Box<Node>),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// Why an expression could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --cost {input:?}: {reason} (expected numbers, field paths, chars(FIELD), or(FIELD, DEFAULT), + - * / and parentheses, such as 'max_tokens + chars(prompt)/4')")]
pub struct CostParseError {
    input: String,
    reason: String,
}

impl FromStr for CostExpr {
    type Err = CostParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut p = Parser {
            s: s.as_bytes(),
            at: 0,
            depth: 0,
            ops: 0,
        };
        let root = p.expr().and_then(|n| {
            p.space();
            match p.peek() {
                None => Ok(n),
                Some(c) => Err(format!("unexpected {:?} at {}", c as char, p.at + 1)),
            }
        });
        root.map(|root| CostExpr {
            source: s.to_string(),
            root,
        })
        .map_err(|reason| CostParseError {
            input: s.to_string(),
            reason,
        })
    }
}

impl fmt::Display for CostExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl CostExpr {
    /// The item's estimated cost, or why it cannot be evaluated on it.
    pub fn eval(&self, item: &Value) -> Result<u64, String> {
        let v = eval(&self.root, item)?;
        if !v.is_finite() {
            return Err(format!(
                "--cost {:?} is not a finite number for this item",
                self.source
            ));
        }
        Ok(v.max(0.0).ceil().min(u64::MAX as f64) as u64)
    }
}

fn eval(n: &Node, item: &Value) -> Result<f64, String> {
    Ok(match n {
        Node::Number(x) => *x,
        Node::Or(path, default) => match lookup(item, path) {
            None | Some(Value::Null) => eval(default, item)?,
            Some(Value::String(s)) if s.trim().is_empty() => eval(default, item)?,
            found => number(found, path)?,
        },
        Node::Field(path) => number(lookup(item, path), path)?,
        Node::Chars(path) => match lookup(item, path) {
            Some(Value::String(s)) => s.chars().count() as f64,
            Some(other) => other.to_string().chars().count() as f64,
            None => return Err(format!("the item has no field {}", show(path))),
        },
        Node::Neg(a) => -eval(a, item)?,
        Node::Op(op, a, b) => {
            let (a, b) = (eval(a, item)?, eval(b, item)?);
            match op {
                '+' => a + b,
                '-' => a - b,
                '*' => a * b,
                _ if b == 0.0 => return Err("--cost divides by zero for this item".into()),
                _ => a / b,
            }
        }
    })
}

/// The number a field holds (`found` at `path`), or why it holds none.
fn number(found: Option<&Value>, path: &[Step]) -> Result<f64, String> {
    Ok(match found {
        Some(Value::Number(x)) => x.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map_err(|_| format!("field {} is {s:?}, not a number", show(path)))?,
        Some(other) => return Err(format!("field {} is {other}, not a number", show(path))),
        None => return Err(format!("the item has no field {}", show(path))),
    })
}

fn lookup<'a>(v: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, s| match s {
        Step::Key(k) => v.get(k),
        Step::Index(i) => v.get(i),
    })
}

fn show(path: &[Step]) -> String {
    let mut s = String::new();
    for (i, p) in path.iter().enumerate() {
        match p {
            Step::Key(k) if i == 0 => s.push_str(k),
            Step::Key(k) => s.push_str(&format!(".{k}")),
            Step::Index(n) => s.push_str(&format!("[{n}]")),
        }
    }
    s
}

/// What a response body says the call used, at the JSON `pointer`; `None`
/// when the body is not JSON or has no whole number there.
pub fn used(body: &str, pointer: &str) -> Option<u64> {
    if pointer.is_empty() {
        return None;
    }
    let v: Value = serde_json::from_str(body).ok()?;
    v.pointer(pointer)?.as_u64()
}

/// The fields whose text is a request's prompt, in the APIs that count
/// tokens (OpenAI's completions, chat and responses; Anthropic's messages).
const PROMPT_FIELDS: [&str; 4] = ["prompt", "input", "system", "messages"];

/// The most tokens any call is estimated at (about a trillion): a count
/// the fleet's script keeps exactly (Lua writes 1e14 and more as
/// `1e+14`), and a weight that pushes no bucket centuries ahead.
const MAX_ESTIMATE: u64 = 1 << 40;

/// Fields whose strings are no text of the prompt: an image's or a file's
/// data (base64, a `data:` URL) or its address, which a model does not
/// read as text and which would weigh a million tokens at four characters
/// each.
const NOT_TEXT: [&str; 5] = ["data", "image_url", "file_data", "input_audio", "url"];

/// The fields that cap an answer's tokens, by API.
const ANSWER_CAPS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// What a request may use, as OpenAI's limiter reckons it before the call
/// runs: the tokens its answers may take (`max_tokens`,
/// `max_completion_tokens` or `max_output_tokens`, times `n` where the
/// body sent asks for several answers) and its prompt at a token per four
/// characters, rounded up (every string under `prompt`, `input`, `system`
/// and `messages`, the roles included, which OpenAI counts a few tokens a
/// message for). The estimate when `--cost` is not given, read from the
/// `--body` rendered (`rendered`) or else the item; one with none of these
/// fields weighs nothing until its answer says what it used. The prompt is
/// its input and the answers' cap its output, for a server that limits
/// them apart (Anthropic).
fn requested(v: &Value, rendered: bool) -> TokenWeight {
    let mut chars = 0u64;
    let mut stack: Vec<&Value> = PROMPT_FIELDS.iter().filter_map(|f| v.get(f)).collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.starts_with("data:") => {}
            Value::String(s) => chars = chars.saturating_add(s.chars().count() as u64),
            Value::Array(a) => stack.extend(a),
            Value::Object(o) => stack.extend(
                (o.iter())
                    .filter(|(k, _)| !NOT_TEXT.contains(&k.as_str()))
                    .map(|(_, v)| v),
            ),
            _ => {}
        }
    }
    TokenWeight::split(chars.div_ceil(4), answers_cap(v, rendered))
}

/// The most answers a request may ask for (OpenAI's `n`).
const MAX_ANSWERS: u64 = 128;

/// The part of [`requested`] that is certain: the tokens the answers may
/// take, which a limiter counting them counts in full. `n` is read only
/// from a `--body` rendered (`rendered`), where its author put it for the
/// API: an item's own `n` is as often its id (batchrun's examples number
/// items so) and, counted, would weigh item 90 ninety answers.
fn answers_cap(v: &Value, rendered: bool) -> u64 {
    let number = |v: &Value| match v {
        Value::Number(x) => x.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let cap = ANSWER_CAPS
        .iter()
        .find_map(|f| v.get(f).and_then(number))
        .filter(|x| x.is_finite() && *x > 0.0)
        .unwrap_or(0.0);
    let answers = (v.get("n").and_then(Value::as_u64))
        .filter(|n| rendered && (1..=MAX_ANSWERS).contains(n))
        .unwrap_or(1);
    (cap.ceil().min(u64::MAX as f64) as u64).saturating_mul(answers)
}

/// How a run weighs its calls in tokens: the estimate from each item, and
/// the correction from each response.
#[derive(Debug, Clone)]
pub struct Costing {
    /// `--cost`; without it a call is estimated at what it requests
    /// (its `max_tokens` and prompt) and counted at what its response says it used.
    pub expr: Option<CostExpr>,
    /// `--usage`: a JSON pointer into the response body.
    pub usage: String,
    /// The input's name, for messages naming FILE:LINE.
    pub file: String,
    /// The most tokens one call may be estimated at, and the `--limit`
    /// that says so: the least that any told policy of tokens admits at
    /// once (a window's quota, a bucket's burst and one). A server keeping
    /// that policy refuses a heavier call every time, so it is failed
    /// unsent rather than sent again after each 429.
    pub most: Option<(u64, String)>,
    /// [`most`](Self::most) among the told policies that count an answer's
    /// tokens (all of a call's, or its output's): what a guess's certain
    /// part, the answers' cap, is held against.
    pub most_answered: Option<(u64, String)>,
    /// The least quota of the told policies counting each part of a call's
    /// tokens (all, input, output; about a trillion where none does): an
    /// estimate without `--cost`, a guess, is held to it rather than failed
    /// (a bucket given no burst would otherwise be pushed a guess's weight
    /// ahead).
    pub guess_cap: TokenWeight,
}

impl Costing {
    /// The estimated tokens of `item`, or the item's error naming its line.
    /// Without `--cost` the estimate is a guess: held to the least told
    /// quota, and failed only where its certain part, the answers' cap,
    /// is more than a told policy admits at once (sent, it would be
    /// refused every time, and each 429 would teach a lower call limit).
    ///
    /// `rendered` is the item's `--body` rendered, where it has one and it
    /// is JSON: the guess reads it (the template's `max_tokens`, `n` and
    /// prompt are there, not in the item); `--cost` reads the item.
    pub fn estimate(
        &self,
        item: &crate::input::Item,
        rendered: Option<&Value>,
    ) -> Result<TokenWeight, String> {
        let Some(e) = &self.expr else {
            let read = rendered.unwrap_or(&item.value);
            let guess = requested(read, rendered.is_some());
            // Its output is the answers' cap, the certain part.
            let cap = guess.output;
            let most = self.most_answered.as_ref();
            if let Some((most, limit)) = most.filter(|(m, _)| cap > *m) {
                return Err(self.too_heavy(item, cap, *most, &format!("--limit {limit}")));
            }
            return Ok(self.held(guess));
        };
        let at = |why: String| {
            format!(
                "--cost {:?} at {}:{}: {why}",
                e.source, self.file, item.line
            )
        };
        let tokens = e.eval(&item.value).map_err(at)?.min(MAX_ESTIMATE);
        match &self.most {
            Some((most, limit)) if tokens > *most => {
                Err(self.too_heavy(item, tokens, *most, &format!("--limit {limit}")))
            }
            _ => Ok(TokenWeight::whole(tokens)),
        }
    }

    /// Whether estimates are guesses: no `--cost`.
    pub fn guessed(&self) -> bool {
        self.expr.is_none()
    }

    /// A guess of `tokens` (one call's, or a batch's sum) held to what one
    /// call may weigh: each part to the least told quota counting it, and
    /// at most about a trillion (`MAX_ESTIMATE`).
    pub fn held(&self, tokens: TokenWeight) -> TokenWeight {
        (tokens.min(self.guess_cap)).min(TokenWeight::whole(MAX_ESTIMATE))
    }

    /// Why an item estimated at `tokens` is failed unsent: more than the
    /// policy `what` admits at once (`most`), which never accepts it.
    pub fn too_heavy(
        &self,
        item: &crate::input::Item,
        tokens: u64,
        most: u64,
        what: &str,
    ) -> String {
        let (estimated, lower) = match &self.expr {
            Some(e) => (format!("--cost {:?} at", e.source), "the item's cost"),
            None => ("at".to_string(), "its max_tokens or prompt"),
        };
        format!(
            "{estimated} {}:{}: the call is estimated at {tokens} tokens, more than {what} admits at once ({most}): a server keeping that limit never accepts it; lower {lower} or raise the limit",
            self.file, item.line
        )
    }

    /// What the response body says the call used, if it says: at the
    /// default `--usage`, OpenAI's total with its prompt's and answer's
    /// parts, else Anthropic's input tokens (those it writes to its cache
    /// count as input too) and output tokens. Another `--usage` is a total:
    /// it says nothing of the parts, whose estimates stand, and neither
    /// does an answer without them.
    pub fn used(&self, body: &str) -> Option<Used> {
        if self.usage != DEFAULT_USAGE {
            return used(body, &self.usage).map(Used::total);
        }
        let v: Value = serde_json::from_str(body).ok()?;
        let at = |p: &str| v.pointer(p).and_then(Value::as_u64);
        // Chat completions name the parts so, the Responses API and
        // Anthropic as below.
        let part = |a: &str, b: &str| at(a).or_else(|| at(b));
        let input = part("/usage/prompt_tokens", "/usage/input_tokens");
        let output = part("/usage/completion_tokens", "/usage/output_tokens");
        let total = at(DEFAULT_USAGE);
        if total.is_none() && input.is_none() && output.is_none() {
            return None;
        }
        let cached = at("/usage/cache_creation_input_tokens").unwrap_or(0);
        let input = match total {
            Some(_) => input,
            None => input.map(|i| i.saturating_add(cached)),
        };
        Some(Used {
            total,
            input,
            output,
        })
    }
}

/// Parentheses nest at most this deep: a bound, so no input overflows the stack.
const MAX_DEPTH: usize = 32;
/// At most this many operators: `a+b+c+...` nests each one in the next,
/// and the tree is walked (and dropped) recursively.
const MAX_OPS: usize = 256;

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    depth: usize,
    ops: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn space(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.space();
        let yes = self.peek() == Some(c);
        if yes {
            self.at += 1;
        }
        yes
    }

    fn expr(&mut self) -> Result<Node, String> {
        let mut n = self.term()?;
        loop {
            let op = if self.eat(b'+') {
                '+'
            } else if self.eat(b'-') {
                '-'
            } else {
                return Ok(n);
            };
            self.count_op()?;
            n = Node::Op(op, Box::new(n), Box::new(self.term()?));
        }
    }

    fn term(&mut self) -> Result<Node, String> {
        let mut n = self.factor()?;
        loop {
            let op = if self.eat(b'*') {
                '*'
            } else if self.eat(b'/') {
                '/'
            } else {
                return Ok(n);
            };
            self.count_op()?;
            n = Node::Op(op, Box::new(n), Box::new(self.factor()?));
        }
    }

    fn count_op(&mut self) -> Result<(), String> {
        self.ops += 1;
        match self.ops > MAX_OPS {
            true => Err(format!("more than {MAX_OPS} operators")),
            false => Ok(()),
        }
    }

    fn factor(&mut self) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("nested too deep".into());
        }
        let n = self.atom();
        self.depth -= 1;
        n
    }

    fn atom(&mut self) -> Result<Node, String> {
        self.space();
        match self.peek() {
            Some(b'-') => {
                self.at += 1;
                Ok(Node::Neg(Box::new(self.factor()?)))
            }
            Some(b'(') => {
                self.at += 1;
                let n = self.expr()?;
                if !self.eat(b')') {
                    return Err("a '(' is not closed".into());
                }
                Ok(n)
            }
            Some(c) if c.is_ascii_digit() || c == b'.' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let path = self.path()?;
                if path == [Step::Key("chars".into())] && self.eat(b'(') {
                    let inner = self.path()?;
                    if !self.eat(b')') {
                        return Err("chars( is not closed".into());
                    }
                    return Ok(Node::Chars(inner));
                }
                if path == [Step::Key("or".into())] && self.eat(b'(') {
                    return self.or();
                }
                Ok(Node::Field(path))
            }
            Some(c) => Err(format!("unexpected {:?} at {}", c as char, self.at + 1)),
            None => Err("it ends where a value is expected".into()),
        }
    }

    /// `or(FIELD, DEFAULT)`, after its `(`.
    fn or(&mut self) -> Result<Node, String> {
        self.space();
        let field = (self.path()).map_err(|e| format!("or( takes a field first: {e}"))?;
        if !self.eat(b',') {
            return Err("or( takes a field, a comma and a default".into());
        }
        let default = self.expr()?;
        if !self.eat(b')') {
            return Err("or( is not closed".into());
        }
        Ok(Node::Or(field, Box::new(default)))
    }

    fn number(&mut self) -> Result<Node, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit() || c == b'.') {
            self.at += 1;
        }
        let t = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
        t.parse()
            .map(Node::Number)
            .map_err(|_| format!("{t:?} is not a number"))
    }

    fn ident(&mut self) -> Result<String, String> {
        self.space();
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' && self.at > start)
        {
            self.at += 1;
        }
        if start == self.at {
            return Err(format!("a field name is expected at {}", self.at + 1));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn path(&mut self) -> Result<Vec<Step>, String> {
        let mut path = vec![Step::Key(self.ident()?)];
        loop {
            match self.peek() {
                Some(b'.') => {
                    self.at += 1;
                    path.push(Step::Key(self.ident()?));
                }
                Some(b'[') => {
                    self.at += 1;
                    let n = match self.number()? {
                        Node::Number(n) => n,
                        _ => return Err("an index is a whole number in [ ]".into()),
                    };
                    if n.fract() != 0.0 || !self.eat(b']') {
                        return Err("an index is a whole number in [ ]".into());
                    }
                    path.push(Step::Index(n as usize));
                }
                _ => return Ok(path),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::policy::Unit;
    use serde_json::json;

    fn cost(e: &str, item: Value) -> Result<u64, String> {
        e.parse::<CostExpr>().unwrap().eval(&item)
    }

    #[test]
    fn the_documented_estimate_and_its_parts() {
        let item =
            json!({"max_tokens": 100, "prompt": "abcdefghij", "p": {"n": "7"}, "m": [{"c": "xy"}]});
        assert_eq!(cost("max_tokens + chars(prompt)/4", item.clone()), Ok(103));
        assert_eq!(cost("(1 + 2) * p.n - -1", item.clone()), Ok(22));
        assert_eq!(cost("chars(m[0].c) * 10", item.clone()), Ok(20));
        assert_eq!(cost("1 - 5", item.clone()), Ok(0), "never below zero");
        assert_eq!(cost("2.5", item), Ok(3), "rounded up");
    }

    /// `or(FIELD, DEFAULT)`: a request asking several answers where some
    /// items carry no `n` (every item without one failed: 65 of 100).
    #[test]
    fn or_gives_a_default_to_an_item_without_the_field() {
        let e = "max_tokens * or(n, 1) + chars(prompt)/4";
        let item = |v: Value| cost(e, v);
        assert_eq!(
            item(json!({"max_tokens": 10, "n": 3, "prompt": "abcd"})),
            Ok(31)
        );
        assert_eq!(item(json!({"max_tokens": 10, "prompt": "abcd"})), Ok(11));
        assert_eq!(
            item(json!({"max_tokens": 10, "n": null, "prompt": "abcd"})),
            Ok(11)
        );
        // A CSV's empty cell is no value either.
        let blank = item(json!({"max_tokens": "10", "n": " ", "prompt": "abcd"}));
        assert_eq!(blank, Ok(11));
        let words = item(json!({"max_tokens": 10, "n": "lots", "prompt": "abcd"}));
        assert!(words.unwrap_err().contains("not a number"));
        assert_eq!(cost("or(p.q, 2 * 3)", json!({})), Ok(6));
        for bad in ["or(n)", "or(n, 1", "or(, 1)"] {
            let e = bad.parse::<CostExpr>().unwrap_err().to_string();
            assert!(e.contains("or("), "{bad}: {e}");
        }
    }

    #[test]
    fn a_row_it_cannot_be_evaluated_on_says_why() {
        let item = json!({"prompt": "x", "n": "lots", "z": 0});
        for (e, says) in [
            ("max_tokens", "no field max_tokens"),
            ("n + 1", "not a number"),
            ("prompt * 2", "not a number"),
            ("1 / z", "divides by zero"),
        ] {
            let err = cost(e, item.clone()).unwrap_err();
            assert!(err.contains(says), "{e}: {err}");
        }
    }

    #[test]
    fn a_bad_expression_is_refused_naming_it() {
        let deep = "(".repeat(100) + "1" + &")".repeat(100);
        for bad in [
            "",
            "1 +",
            "max_tokens +* 2",
            "chars(prompt",
            "(1",
            "a[x]",
            "1 2",
            "$",
            &deep,
        ] {
            let e = bad.parse::<CostExpr>().unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_long_chain_of_operators_is_refused_not_walked_until_the_stack_overflows() {
        let chain = |n: usize| vec!["1"; n].join("+");
        assert_eq!(cost(&chain(MAX_OPS + 1), json!({})), Ok(MAX_OPS as u64 + 1));
        for long in [chain(20_000), vec!["2"; 20_000].join("*")] {
            let e = long.parse::<CostExpr>().unwrap_err().to_string();
            assert!(
                e.contains("more than 256 operators"),
                "{}",
                &e[e.len() - 200..]
            );
        }
    }

    #[test]
    fn a_request_is_estimated_at_its_answers_cap_and_its_prompt() {
        let chat = json!({"model": "m", "max_tokens": 100, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "abcdefghij"}]},
        ]});
        // 100, and "system" + "be brief" + "user" + "text" + "abcdefghij"
        // (32 characters) a token per four.
        assert_eq!(requested(&chat, true).total, 108);
        assert_eq!(answers_cap(&chat, true), 100);
        let csv = json!({"max_completion_tokens": " 40 ", "n": 3, "prompt": "abcde"});
        assert_eq!(
            requested(&csv, false).total,
            42,
            "an item's own n may be its id"
        );
        assert_eq!(
            requested(&csv, true).total,
            122,
            "a --body's n asks for 3 answers of 40"
        );
        let responses = json!({"max_output_tokens": 7, "input": "abcd", "other": "x".repeat(99)});
        assert_eq!(
            requested(&responses, true).total,
            8,
            "only the prompt's fields count"
        );
        for none in [
            json!({"id": 7, "text": "not a prompt"}),
            json!(null),
            json!([1, 2]),
        ] {
            assert_eq!(requested(&none, true).total, 0, "{none}");
        }
        for odd in [
            json!({"max_tokens": -5, "n": 0}),
            json!({"max_tokens": "lots", "n": 1e308}),
        ] {
            assert_eq!(requested(&odd, true).total, 0, "{odd}");
        }
        let many = json!({"max_tokens": 10, "n": 5000});
        assert_eq!(
            requested(&many, true).total,
            10,
            "an n past 128 is no count of answers"
        );
        let huge = json!({"max_tokens": 1e308, "n": 100});
        assert_eq!(
            requested(&huge, true).total,
            u64::MAX,
            "saturates, never panics"
        );
    }

    /// Items whose `--body` template holds the request: the guess reads the
    /// body rendered, where the item has only the prompt's text under its
    /// own name (it guessed 0, and every token window ran into a 429).
    #[test]
    fn a_body_templates_request_is_estimated_from_the_body_sent() {
        let c = Costing {
            expr: None,
            usage: DEFAULT_USAGE.into(),
            file: "in.csv".into(),
            most: None,
            most_answered: None,
            guess_cap: TokenWeight::whole(u64::MAX),
        };
        let item = crate::input::Item {
            line: 3,
            value: json!({"id": "7", "text": "abcdefgh", "n": "9"}),
            field_order: Default::default(),
        };
        assert_eq!(c.estimate(&item, None).map(|t| t.total), Ok(0));
        let body = json!({"model": "m", "max_tokens": 50, "n": 2, "messages": [
            {"role": "user", "content": "abcdefgh"},
        ]});
        // 2 answers of 50, and "user" + "abcdefgh" (12 characters).
        // Its prompt is its input, its answers' cap its output.
        assert_eq!(
            c.estimate(&item, Some(&body)),
            Ok(TokenWeight::split(3, 100))
        );
    }

    /// An image's data and address are no text: 100,000 characters of
    /// base64 weighed 25,000 tokens. A guess is held to the least told
    /// quota of tokens, and no estimate goes past MAX_ESTIMATE.
    #[test]
    fn an_image_weighs_nothing_and_a_guess_is_held_to_the_told_quota() {
        let data = "A".repeat(100_000);
        let image = json!({"max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "abcd"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        ]}]});
        // "user", "text", "abcd", "image_url", "image", "base64",
        // "image/png": 41 characters, 11 tokens.
        assert_eq!(requested(&image, true).total, 21);
        let item = |value: Value| crate::input::Item {
            line: 7,
            value,
            field_order: Default::default(),
        };
        let mut c = Costing {
            expr: None,
            usage: DEFAULT_USAGE.into(),
            file: "in.jsonl".into(),
            most: None,
            most_answered: None,
            guess_cap: TokenWeight::whole(500),
        };
        let huge = item(json!({"max_tokens": 1e15}));
        assert_eq!(c.estimate(&huge, None).map(|t| t.total), Ok(500));
        // Its max_tokens alone past what a told policy admits: refused
        // every time, so failed unsent; a long prompt is a guess, held.
        c.most_answered = Some((500, "500/1s,tokens".into()));
        let err = c.estimate(&huge, None).unwrap_err();
        assert!(
            err.contains("in.jsonl:7") && err.contains("--limit 500/1s,tokens"),
            "{err}"
        );
        let long = item(json!({"max_tokens": 10, "prompt": "x".repeat(4000)}));
        assert_eq!(c.estimate(&long, None).map(|t| t.total), Ok(500));
        c.most_answered = None;
        c.guess_cap = TokenWeight::whole(u64::MAX);
        assert_eq!(c.estimate(&huge, None).map(|t| t.total), Ok(MAX_ESTIMATE));
        c.expr = Some("max_tokens".parse().unwrap());
        assert_eq!(c.estimate(&huge, None).map(|t| t.total), Ok(MAX_ESTIMATE));
    }

    /// At the default `--usage`, Anthropic's usage (input and output
    /// tokens, no total) counts as their sum, apart as well; OpenAI's
    /// total with its parts; another `--usage` is read as given, a total
    /// that says nothing of the parts.
    #[test]
    fn anthropics_usage_is_read_at_the_default_pointer() {
        let mut c = Costing {
            expr: None,
            usage: DEFAULT_USAGE.into(),
            file: "in.jsonl".into(),
            most: None,
            most_answered: None,
            guess_cap: TokenWeight::whole(u64::MAX),
        };
        let anthropic = r#"{"usage": {"input_tokens": 12, "output_tokens": 30}}"#;
        let both = |i, o| Used {
            total: None,
            input: Some(i),
            output: Some(o),
        };
        assert_eq!(c.used(anthropic), Some(both(12, 30)));
        assert_eq!(c.used(anthropic).unwrap().of(Unit::Tokens), Some(42));
        let written = r#"{"usage": {"input_tokens": 12, "cache_creation_input_tokens": 8,
            "cache_read_input_tokens": 500, "output_tokens": 30}}"#;
        assert_eq!(c.used(written), Some(both(20, 30)));
        // A part not said leaves its estimate standing, and the total too.
        let output_only = c.used(r#"{"usage": {"output_tokens": 30}}"#).unwrap();
        assert_eq!(output_only.of(Unit::InputTokens), None);
        assert_eq!(output_only.of(Unit::Tokens), None);
        let estimate = TokenWeight::split(50, 100);
        assert_eq!(
            output_only.or(estimate),
            TokenWeight {
                total: 150,
                input: 50,
                output: 30
            }
        );
        let openai =
            r#"{"usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}"#;
        assert_eq!(
            c.used(openai),
            Some(Used {
                total: Some(13),
                input: Some(9),
                output: Some(4)
            })
        );
        assert_eq!(c.used(r#"{"usage": {}}"#), None);
        c.usage = "/usage/total_tokens/x".into();
        assert_eq!(c.used(anthropic), None);
        // Another --usage is a total: the parts keep their estimates.
        c.usage = "/usage/output_tokens".into();
        assert_eq!(c.used(anthropic), Some(Used::total(30)));
        assert_eq!(
            Used::total(30).or(estimate),
            TokenWeight {
                total: 30,
                input: 50,
                output: 100
            }
        );
    }

    #[test]
    fn usage_is_read_from_the_body_when_there() {
        let body = r#"{"usage": {"total_tokens": 42}}"#;
        assert_eq!(used(body, DEFAULT_USAGE), Some(42));
        assert_eq!(used("not json", DEFAULT_USAGE), None);
        assert_eq!(used(r#"{"usage": {}}"#, DEFAULT_USAGE), None);
        assert_eq!(used(body, ""), None);
    }
}
