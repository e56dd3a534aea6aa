//! Shared pieces of the proptest fuzz targets (`crates/*/tests/fuzz.rs`): the case count from
//! `HERMES_FUZZ_CASES` and the text strategies every target uses.

use proptest::prelude::*;

/// The cases per property: `HERMES_FUZZ_CASES`, 256 by default (`make fuzz` runs 20000).
pub fn config() -> ProptestConfig {
    let cases = std::env::var("HERMES_FUZZ_CASES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(256);
    ProptestConfig {
        cases,
        // No persistence file: a crash found here is added as a regression test by hand.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Any text: every `char` can appear (NUL, controls, combining marks, astral planes).
pub fn any_text(max_chars: usize) -> BoxedStrategy<String> {
    prop::collection::vec(any::<char>(), 0..max_chars).prop_map(|chars| chars.into_iter().collect()).boxed()
}

/// Text made of `tokens`, with the odd arbitrary char between them.
pub fn token_text(tokens: &'static [&'static str], max_pieces: usize) -> BoxedStrategy<String> {
    let piece = prop_oneof![
        6 => prop::sample::select(tokens).prop_map(|t| t.to_owned()),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..max_pieces).prop_map(|pieces| pieces.concat()).boxed()
}

/// One of `values`, owned.
pub fn select_owned(values: &'static [&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(values).prop_map(|v| v.to_owned()).boxed()
}
