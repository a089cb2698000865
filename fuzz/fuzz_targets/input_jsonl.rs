//! JSON Lines input: arbitrary bytes, arbitrary read sizes, and a line cap
//! small enough that the over-long-line path is reached.
#![no_main]

use batchrun::input::Format;
use batchrun_fuzz::check_input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [seed, cap, rest @ ..] = data else {
        return;
    };
    let max_line = match cap {
        255 => usize::MAX,
        254 => 64 * 1024 * 1024,
        n => usize::from(*n),
    };
    check_input(rest, Format::Jsonl, max_line, *seed);
});
