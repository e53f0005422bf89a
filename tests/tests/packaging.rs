//! What an operator installs from the repository holds together: the systemd unit passes
//! `systemd-analyze verify` and its sandbox rating, the compose demo's peers.toml is a valid
//! mesh, the Dockerfile runs the node as a non-root user with a health check, and README's
//! docs list and examples match the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

use botmesh_tests::{botmesh_bin, explain_cli};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn the_systemd_unit_verifies_and_is_sandboxed() {
    // scripts/test.sh installs systemd's tools when they are missing.
    let unit = read("deploy/botmesh@.service");
    let dir = tempfile::tempdir().unwrap();
    // verify checks that ExecStart's program exists: point it at the binary under test.
    let path = dir.path().join("botmesh@XiaoBa.service");
    let bin = botmesh_bin();
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/botmesh", &bin.display().to_string()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian's systemd) is needed: scripts/test.sh installs it");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "verify failed: {stderr}");
    assert!(stderr.trim().is_empty(), "verify warned: {stderr}");

    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let level: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|l| l.split(": ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {text}"));
    assert!(level < 2.0, "exposure {level} (want < 2.0, 'OK'): {text}");

    // The command line is one the binary takes: same flags, with --help appended.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).collect();
    assert_eq!(args[..3], ["run", "--bot", "%i"], "{exec}");
    let out = Command::new(&bin)
        .args(args.iter().map(|a| if *a == "%i" { "XiaoBa" } else { a }))
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{exec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_compose_demo_is_a_valid_mesh_of_the_three_demo_bots() {
    let compose = read("deploy/compose.yaml");
    let config = repo().join("deploy/compose/peers.toml");
    for (bot, service, mention) in [
        ("XiaoBa", "xiaoba", "@小八 在吗"),
        ("ErGoz", "ergoz", "@二狗 在吗"),
        ("Mira", "mira", "@米拉 在吗"),
    ] {
        let v = explain_cli(&config, bot, "alice", mention);
        assert_eq!(v["mentioned"], true, "{bot}: {v}");
        assert!(
            compose.contains(&format!("\"--bot\", \"{bot}\""))
                && compose.contains(&format!("  {service}:")),
            "compose.yaml runs {bot} as service {service}"
        );
    }
}

#[test]
fn the_image_runs_botmesh_as_a_non_root_user_with_a_health_check() {
    let dockerfile = read("Dockerfile");
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = last_stage
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the final stage sets USER");
    assert!(
        !user.starts_with("root") && !user.starts_with('0'),
        "{user}"
    );
    assert!(
        last_stage.contains("HEALTHCHECK") && last_stage.contains("/healthz"),
        "a HEALTHCHECK on /healthz in the final stage"
    );
    assert!(last_stage.contains("ENTRYPOINT [\"botmesh\"]"));
    assert!(
        !last_stage.contains("cargo "),
        "the toolchain stays in the build stage"
    );
}

#[test]
fn readme_names_every_doc_and_nothing_outside_the_repository() {
    let readme = read("README.md");
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    docs.sort();
    let missing: Vec<&String> = docs
        .iter()
        .filter(|d| !readme.contains(d.as_str()))
        .collect();
    assert!(missing.is_empty(), "README names no {missing:?}");
    for doc in
        std::iter::once("README.md".to_string()).chain(docs.iter().map(|d| format!("docs/{d}")))
    {
        let text = read(&doc);
        for outside in ["../shared", "DESIGN.md", "shared/reference"] {
            assert!(
                !text.contains(outside),
                "{doc} points outside the repository ({outside})"
            );
        }
    }
}

#[test]
fn readmes_explain_example_is_a_real_mention() {
    let readme = read("README.md");
    let line = readme
        .lines()
        .find(|l| l.contains("botmesh explain --bot XiaoBa"))
        .expect("README shows `botmesh explain`");
    let text = line
        .split("--from alice \"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap_or_else(|| panic!("an example with --from alice \"…\": {line}"));
    let v = explain_cli(&repo().join("peers.toml"), "XiaoBa", "alice", text);
    assert_eq!(v["mentioned"], true, "README's example {text:?}: {v}");
}
