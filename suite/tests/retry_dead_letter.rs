//! `dead_letter = SINK` overrides the runtime's sink: a `static`, a parameter and a field all
//! work, and the runtime's own sink receives nothing.

use jobguard::{GiveUp, MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::LazyLock;

static PAYMENTS_LETTERS: LazyLock<MemoryDeadLetters> = LazyLock::new(MemoryDeadLetters::new);

#[jobguard::retry(attempts = 2, base = "10ms", cap = "10ms", jitter = none, dead_letter = *PAYMENTS_LETTERS)]
async fn to_static() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, dead_letter = sink)]
async fn to_parameter(sink: &MemoryDeadLetters) -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

struct Worker {
    letters: MemoryDeadLetters,
}

impl Worker {
    #[jobguard::retry(attempts = 1, dead_letter = self.letters)]
    async fn to_field(&self) -> Result<(), GatewayError> {
        Err(GatewayError::Timeout)
    }
}

fn runtime() -> (Runtime, MemoryDeadLetters) {
    let letters = MemoryDeadLetters::new();
    (
        Runtime::builder().dead_letters(letters.clone()).build(),
        letters,
    )
}

#[tokio::test(start_paused = true)]
async fn a_static_sink_gets_the_letter_instead_of_the_runtime() {
    let (runtime, runtime_letters) = runtime();
    runtime.scope(to_static()).await.unwrap_err();
    assert!(runtime_letters.is_empty());
    let letters = PAYMENTS_LETTERS.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].job, concat!(module_path!(), "::to_static"));
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn a_parameter_sink_gets_the_letter_instead_of_the_runtime() {
    let (runtime, runtime_letters) = runtime();
    let mine = MemoryDeadLetters::new();
    runtime.scope(to_parameter(&mine)).await.unwrap_err();
    assert!(runtime_letters.is_empty());
    let letters = mine.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_field_sink_gets_the_letter_instead_of_the_runtime() {
    let (runtime, runtime_letters) = runtime();
    let worker = Worker {
        letters: MemoryDeadLetters::new(),
    };
    runtime.scope(worker.to_field()).await.unwrap_err();
    assert!(runtime_letters.is_empty());
    let letters = worker.letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].job, concat!(module_path!(), "::to_field"));
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 1)
    );
}
