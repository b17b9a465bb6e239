//! `#[idempotent(transaction = tx)]` in a crate whose jobguard lacks the `postgres` feature: one
//! compile error in words, not rustc's "not found in `__private`".
//!
//! The UI suite (`tests/ui.rs`) builds its cases with this package's features, which include
//! `postgres`, so this case is a crate of its own, written to a temporary directory and checked
//! with `cargo check` against jobguard with its default features only (the first run builds
//! jobguard's dependencies there, about a minute; later runs reuse them).

use std::path::Path;
use std::process::Command;

const MANIFEST: &str = r#"
[package]
name = "no-postgres"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
jobguard = { path = "RUNTIME" }
"#;

const LIB: &str = r#"
/// Stands in for sqlx's type, which this crate does not have: the attribute checks the name.
pub struct PgConnection;

#[jobguard::idempotent(key = order, transaction = tx)]
pub async fn job(tx: &mut PgConnection, order: &str) -> Result<i64, jobguard::Error> {
    let _ = (tx, order);
    Ok(1)
}
"#;

#[test]
fn transaction_without_the_postgres_feature_is_an_error_in_words() {
    // This package is `suite/`; the workspace (its `runtime/` and `Cargo.lock`) is one level up.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no_postgres");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let runtime = root.join("runtime");
    let manifest = MANIFEST.replace("RUNTIME", runtime.to_str().unwrap());
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/lib.rs"), LIB).unwrap();
    // The workspace's versions, so that nothing is resolved anew.
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["check", "--quiet", "--offline", "--message-format=short"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .output()
        .expect("run cargo check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "compiled without postgres:\n{stderr}"
    );
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("error:") && !l.contains("could not compile"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("`transaction = ...` needs jobguard's `postgres` feature"),
        "{stderr}"
    );
    assert!(errors[0].contains("src/lib.rs:5"), "{stderr}");
}
