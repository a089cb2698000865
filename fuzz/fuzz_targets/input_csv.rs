//! CSV input: arbitrary bytes read whole and in short reads of arbitrary
//! sizes.
#![no_main]

use batchrun::input::Format;
use batchrun_fuzz::check_input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [seed, rest @ ..] = data else {
        return;
    };
    check_input(rest, Format::Csv, usize::MAX, *seed);
});
