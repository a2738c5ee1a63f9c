//! End-to-end tests of `pathfinder model`.

use std::process::Command;

fn pathfinder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pathfinder"))
}

#[test]
fn list_names_known_models_and_fetch_rejects_unknown_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = pathfinder()
        .args(["model", "list", "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("smollm2-135m") && stdout.contains("not fetched"),
        "{stdout}"
    );

    let out = pathfinder()
        .args(["model", "fetch", "gpt-17", "--cache-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("unknown model") && stderr.contains("smollm2-135m"),
        "{stderr}"
    );
}

#[test]
fn generate_explains_missing_models() {
    let dir = tempfile::tempdir().unwrap();
    let out = pathfinder()
        .args([
            "model",
            "generate",
            "--prompt",
            "hi",
            "--model",
            "smollm2-135m",
            "--cache-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("pathfinder model fetch smollm2-135m"),
        "{stderr}"
    );

    let out = pathfinder()
        .args([
            "model",
            "generate",
            "--prompt",
            "hi",
            "--model",
            "/no/such/model.gguf",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("/no/such/model.gguf"), "{stderr}");
}

#[test]
fn fetch_reuses_a_verified_cached_file_and_generate_answers() {
    let Some(gguf) = model::testing::smollm2_weights() else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let known = model::fetch::known_model("smollm2-135m").unwrap();
    let target = model::fetch::cached_path(cache.path(), known);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::copy(&gguf, &target).unwrap();
    // The file is already there with the right sha256: no download (python is not even run).
    let out = pathfinder()
        .args([
            "model",
            "fetch",
            "smollm2-135m",
            "--python",
            "/nonexistent/python",
            "--cache-dir",
        ])
        .arg(cache.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        target.display().to_string()
    );

    let out = pathfinder()
        .args([
            "model",
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--max-new-tokens",
            "16",
            "--cache-dir",
        ])
        .arg(cache.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("Paris"), "{stdout}");
}
