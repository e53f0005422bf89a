//! Fuzz target `feishu_decrypt`: see `botmesh::fuzzing::feishu_decrypt` for the input layout and the
//! invariants checked (the same harness replays the corpus in the normal tests).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| botmesh::fuzzing::feishu_decrypt(data));
