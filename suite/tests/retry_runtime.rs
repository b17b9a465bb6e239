//! Which runtime a `#[retry]` job uses: the one of the enclosing `Runtime::scope`, else the one
//! installed as the process default, else the embedded default (dead letters written to the log).
//!
//! `install` is process-wide, so this file is its own test binary, and the embedded default is
//! checked in a child process that installs nothing.

use jobguard::{GiveUp, MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::process::Command;

#[jobguard::retry(attempts = 2, base = "10ms", cap = "10ms", jitter = none)]
async fn gives_up() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

fn with_letters() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

#[tokio::test(start_paused = true)]
async fn scope_wins_over_installed_and_installed_is_used_outside_any_scope() {
    let (installed, installed_letters) = with_letters();
    installed.install().expect("the first install wins");
    let (again, _) = with_letters();
    assert!(again.install().is_err(), "a second install is refused");

    // Outside any scope: the installed runtime.
    gives_up().await.unwrap_err();
    assert_eq!(installed_letters.len(), 1);

    // Inside a scope: the scoped runtime, and the installed one sees nothing.
    let (scoped, scoped_letters) = with_letters();
    scoped.scope(gives_up()).await.unwrap_err();
    assert_eq!(scoped_letters.len(), 1);
    assert_eq!(scoped_letters.letters()[0].reason, GiveUp::Exhausted);
    assert_eq!(installed_letters.len(), 1);

    // The scope holds for its own task only: a task spawned inside it uses the installed one.
    scoped
        .scope(async { tokio::spawn(gives_up()).await.unwrap().unwrap_err() })
        .await;
    assert_eq!(scoped_letters.len(), 1);
    assert_eq!(installed_letters.len(), 2);

    // Scopes nest: the innermost wins.
    let (inner, inner_letters) = with_letters();
    scoped.scope(inner.scope(gives_up())).await.unwrap_err();
    assert_eq!(inner_letters.len(), 1);
    assert_eq!(scoped_letters.len(), 1);
}

const CHILD: &str = "JOBGUARD_RETRY_RUNTIME_CHILD";

/// In a child process (see below): gives up with no scope and nothing installed. Does nothing
/// when run as a test of its own.
#[test]
fn embedded_default_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // With the `tracing` feature the log sink writes through `tracing`: show it on stderr.
    use tracing_subscriber::layer::SubscriberExt;
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Stderr));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(gives_up()).unwrap_err();
}

#[test]
fn without_scope_or_install_the_embedded_default_logs_the_dead_letter() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "embedded_default_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    let job = concat!(module_path!(), "::gives_up");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("dead letter") && l.contains(job) && l.contains("exhausted")),
        "no dead letter for {job} in the log:\n{stderr}"
    );
}

/// Writes every `tracing` event to stderr as `target field=value ...`.
struct Stderr;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Stderr {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        use std::fmt::Write;
        let mut line = event.metadata().target().to_owned();
        event.record(
            &mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
                let _ = write!(line, " {}={value:?}", field.name());
            },
        );
        eprintln!("{line}");
    }
}
