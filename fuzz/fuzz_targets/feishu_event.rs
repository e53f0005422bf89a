//! Fuzz target `feishu_event`: see `botmesh::fuzzing::feishu_event` for the input layout and the
//! invariants checked (the same harness replays the corpus in the normal tests).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| botmesh::fuzzing::feishu_event(data));
