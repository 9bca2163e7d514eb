#![no_main]
//! The body (and its invariants) lives in `health_agent::fuzzing::peer_view`, shared with the
//! stable fuzz smoke in `cargo test`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| health_agent::fuzzing::peer_view(data));
