//! Replays every committed fuzz input through the same harnesses the cargo-fuzz
//! targets run (`botmesh::fuzzing`), on stable and without libFuzzer, so the corpus
//! and every crash ever found keep being checked by `scripts/test.sh`.
//!
//! Inputs: `fuzz/corpus/<target>/*` (the minimized corpus) and
//! `fuzz/regressions/<target>/*` (each input that once crashed a harness; the fix and
//! its unit test are named in `fuzz/regressions/README.md`).

use std::path::{Path, PathBuf};

/// The fuzz crate's folder.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files directly inside `dir` (none if it does not exist), sorted for stable output.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// Runs `target`'s harness on every file of `dir`; returns how many ran. A panic
/// names the file, so a failure points straight at the input to debug.
fn replay(target: &str, dir: &Path) -> usize {
    let inputs = files(dir);
    for path in &inputs {
        let data = std::fs::read(path).expect("reading a corpus file");
        let outcome = std::panic::catch_unwind(|| botmesh::fuzzing::run(target, &data));
        match outcome {
            Ok(known) => assert!(known, "unknown fuzz target {target}"),
            Err(_) => panic!("fuzz harness {target} failed on {}", path.display()),
        }
    }
    inputs.len()
}

#[test]
fn committed_corpus_and_regressions_pass_their_harnesses() {
    let root = fuzz_dir();
    for target in botmesh::fuzzing::TARGETS {
        let corpus = replay(target, &root.join("corpus").join(target));
        assert!(corpus > 0, "fuzz/corpus/{target} is empty or missing");
        replay(target, &root.join("regressions").join(target));
    }
}

#[test]
fn every_target_has_a_fuzz_binary() {
    let root = fuzz_dir();
    for target in botmesh::fuzzing::TARGETS {
        let src = root.join("fuzz_targets").join(format!("{target}.rs"));
        let text =
            std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        assert!(
            text.contains(&format!("botmesh::fuzzing::{target}(")),
            "{} does not call its harness",
            src.display()
        );
    }
}
