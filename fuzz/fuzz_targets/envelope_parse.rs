//! Fuzz target `envelope_parse`: see `botmesh::fuzzing::envelope_parse` for the input layout and the
//! invariants checked (the same harness replays the corpus in the normal tests).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| botmesh::fuzzing::envelope_parse(data));
