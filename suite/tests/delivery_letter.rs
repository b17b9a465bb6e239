//! One job, one dead letter, in the engine: under a job runner's [`Delivery`], an exhausted
//! `#[retry]` on a delivery that is not the last hands its error back (`Event::HandedBack`) and
//! writes no letter; the last delivery writes one whose `attempts` counts every delivery's
//! attempts. A permanent failure, and a call with no delivery in scope, write one at once. A letter
//! the sink refuses settles nothing.

use jobguard::{Delivery, Event, GiveUp, MemoryDeadLetters, Runtime};
use jobguard_testkit::gateway::GatewayError;
use std::sync::{Arc, Mutex};

#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, on = transient)]
async fn times_out() -> Result<(), GatewayError> {
    Err(GatewayError::Timeout)
}

#[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, on = transient)]
async fn declined() -> Result<(), GatewayError> {
    Err(GatewayError::Declined)
}

/// A runtime whose letters and events the test reads: the events as their `Debug` lines, only
/// the give-up kinds.
fn runtime() -> (Runtime, MemoryDeadLetters, Arc<Mutex<Vec<String>>>) {
    let letters = MemoryDeadLetters::new();
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = events.clone();
    let runtime = Runtime::builder()
        .dead_letters(letters.clone())
        .observer(move |event: &Event<'_>| {
            if matches!(event, Event::HandedBack { .. } | Event::DeadLetter(_)) {
                seen.lock().unwrap().push(format!("{event:?}"));
            }
        })
        .build();
    (runtime, letters, events)
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_is_not_the_last_hands_the_error_back_without_a_letter() {
    let (runtime, letters, events) = runtime();
    let delivery = Delivery {
        number: 1,
        last: false,
    };
    let (result, dead_lettered) = runtime.scope(delivery.scope_settled(times_out())).await;
    assert!(matches!(result, Err(GatewayError::Timeout)));
    assert!(!dead_lettered);
    assert!(letters.is_empty(), "{:?}", letters.letters());
    let events = events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with("HandedBack {"), "{events:?}");
    assert!(events[0].contains("attempts: 3"), "{events:?}");
    assert!(
        events[0].contains("delivery: Delivery { number: 1, last: false }"),
        "{events:?}"
    );
    assert!(events[0].contains("reason: Exhausted"), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn every_delivery_failing_writes_one_letter_on_the_last_counting_every_attempt() {
    let (runtime, letters, events) = runtime();
    for number in 1..=4 {
        let delivery = Delivery {
            number,
            last: number == 4,
        };
        let (result, dead_lettered) = runtime.scope(delivery.scope_settled(times_out())).await;
        assert!(result.is_err());
        assert_eq!(dead_lettered, number == 4, "delivery {number}");
        assert_eq!(letters.len(), usize::from(number == 4), "delivery {number}");
    }
    let letters = letters.letters();
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 4 * 3)
    );
    assert_eq!(letters[0].error, "Timeout");
    let events = events.lock().unwrap().clone();
    let handed_back = events
        .iter()
        .filter(|e| e.starts_with("HandedBack"))
        .count();
    let dead = events
        .iter()
        .filter(|e| e.starts_with("DeadLetter"))
        .count();
    assert_eq!((handed_back, dead), (3, 1), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_writes_its_letter_on_any_delivery() {
    let (runtime, letters, events) = runtime();
    let delivery = Delivery {
        number: 1,
        last: false,
    };
    let (result, dead_lettered) = runtime.scope(delivery.scope_settled(declined())).await;
    assert!(matches!(result, Err(GatewayError::Declined)));
    assert!(dead_lettered, "the runner must not deliver it again");
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 1)
    );
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.starts_with("HandedBack"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_letter_the_sink_refuses_does_not_settle_the_job() {
    let refusing = jobguard::from_fn(|_letter| async {
        Err(jobguard::Error::Store("the sink is down".into()))
    });
    let runtime = Runtime::builder().dead_letters(refusing).build();
    let delivery = Delivery {
        number: 1,
        last: false,
    };
    let (result, dead_lettered) = runtime.scope(delivery.scope_settled(declined())).await;
    assert!(matches!(result, Err(GatewayError::Declined)));
    assert!(
        !dead_lettered,
        "no letter was kept: the runner may deliver the job again"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_delivery_in_scope_the_give_up_writes_its_letter_as_before() {
    let (runtime, letters, _) = runtime();
    assert!(runtime.scope(times_out()).await.is_err());
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, 3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_success_on_a_later_delivery_writes_no_letter() {
    let (runtime, letters, _) = runtime();
    let first = Delivery {
        number: 1,
        last: false,
    };
    let (result, _) = runtime.scope(first.scope_settled(times_out())).await;
    assert!(result.is_err());
    #[jobguard::retry(attempts = 3, base = "10ms", cap = "10ms", jitter = none, on = transient)]
    async fn recovers() -> Result<u32, GatewayError> {
        Ok(7)
    }
    let second = Delivery {
        number: 2,
        last: true,
    };
    let (result, dead_lettered) = runtime.scope(second.scope_settled(recovers())).await;
    assert_eq!(result.unwrap(), 7);
    assert!(!dead_lettered);
    assert!(letters.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hand_back_is_counted_and_is_no_dead_letter_in_the_metrics() {
    use jobguard::observe::metrics as names;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (runtime, _, _) = runtime();
    for number in 1..=2 {
        let delivery = Delivery {
            number,
            last: number == 2,
        };
        let _ = runtime.scope(delivery.scope_settled(times_out())).await;
    }
    let rendered = recorder.handle().render();
    let samples = jobguard_testkit::prometheus::samples(&rendered);
    let job = concat!(module_path!(), "::times_out");
    let handed_back = format!(r#"{}{{job="{job}"}}"#, names::HANDED_BACK);
    let dead = format!(
        r#"{}{{job="{job}",reason="exhausted"}}"#,
        names::DEAD_LETTERED
    );
    assert_eq!(
        samples.get(handed_back.as_str()).copied(),
        Some("1"),
        "{rendered}"
    );
    assert_eq!(samples.get(dead.as_str()).copied(), Some("1"), "{rendered}");
}
