//! Durable jobs on NATS JetStream through [async-nats](https://docs.rs/async-nats) (feature
//! `nats`).
//!
//! A JetStream consumer with explicit acks delivers every message at least once: a message not
//! acknowledged within the consumer's `ack_wait` (its worker died) is delivered again, and so is
//! one handed back with a `-NAK`. The server counts every delivery of a message, and tells each
//! one its count in the message's metadata (`Info::delivered`, from 1); the consumer's
//! `max_deliver` caps it. [`delivery`] reads that count into a [`Delivery`], which a consumer
//! loop puts in scope around its job with [`Delivery::scope_settled`]. With it, a job that keeps
//! failing is retried by `#[retry]` within each delivery, handed back for the next one, and
//! dead-lettered once, on its last delivery; and a job that kills its worker is counted by the
//! idempotency store and dead-lettered once after `crashes` crashes
//! ([`#[idempotent]`](crate::idempotent)).
//!
//! # A consumer loop
//!
//! The repository's `examples/nats_worker.rs` is the whole program (it also tells the server,
//! while a job runs, that the job is in progress, so that a long job is not delivered twice); its
//! loop is this one:
//!
//! ```no_run
//! use async_nats::jetstream::{self, AckKind, consumer::PullConsumer};
//! use futures::StreamExt;
//! use std::time::Duration;
//!
//! /// The consumer's `max_deliver`.
//! const MAX_DELIVER: i64 = 5;
//!
//! async fn charge(order_id: &str) -> Result<(), std::io::Error> {
//!     // `#[jobguard::idempotent]` around `#[jobguard::retry]`, as in the README
//! #   let _ = order_id;
//!     Ok(())
//! }
//!
//! # async fn run() -> Result<(), async_nats::Error> {
//! let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! let consumer: PullConsumer = js.get_stream("CHARGES").await?.get_consumer("workers").await?;
//! loop {
//!     // One message at a time: a long poll for a batch of one.
//!     let mut batch = consumer.batch().max_messages(1).expires(Duration::from_secs(5)).messages().await?;
//!     while let Some(message) = batch.next().await {
//!         let message = message?;
//!         let delivery = jobguard::nats::delivery(&message, MAX_DELIVER);
//!         let order_id = String::from_utf8_lossy(&message.payload).into_owned();
//!         let (result, settled) = delivery.scope_settled(charge(&order_id)).await;
//!         let ack = match (result, settled) {
//!             (Ok(_), _) => AckKind::Ack,
//!             // Its one dead letter is written: the server must not deliver it again.
//!             (Err(_), true) => AckKind::Term,
//!             // Handed back for the next delivery.
//!             (Err(_), false) => AckKind::Nak(None),
//!         };
//!         message.ack_with(ack).await?;
//!     }
//! }
//! # }
//! ```
//!
//! # Which delivery is the last
//!
//! [`Delivery::number`] is the server's count of the message's deliveries, this one included:
//! 1 on the first. The delivery is the [`last`](Delivery::last) when the count reaches
//! `max_deliver`, the consumer's limit, after which the server delivers the message no more
//! (it stays in the stream, unacknowledged, and the server raises a `MAX_DELIVERIES` advisory).
//! A `max_deliver` of `-1` or `0` is the server's "no limit": no delivery is the last, and a job
//! that keeps failing is handed back forever and never dead-lettered, so give the consumer a
//! limit. Pass the `max_deliver` the consumer was created with (`consumer.cached_info().config.
//! max_deliver`).
//!
//! Every delivery counts: a `-NAK`, and a message whose `ack_wait` lapsed because its worker
//! died or stalled. A job that runs longer than `ack_wait` is delivered again while it runs,
//! unless its worker sends `+WPI` (`AckKind::Progress`) now and then, as the example does.
//!
//! A message whose metadata cannot be read (no `$JS.ACK` reply subject: not a JetStream
//! consumer's delivery), or whose count is below 1, is numbered 1 and is the last: its job runs
//! and is settled on this delivery (dead-lettered if it fails), since no count can say when the
//! server will stop delivering it. No panic, no error.
//!
//! # What the loop does with the outcome
//!
//! [`Delivery::scope_settled`] returns the job's result and whether the job is settled: its one
//! dead letter was written on this delivery (the last one, or a permanent failure), or before (a
//! poisoned job), or its key refuses it for good. Then:
//!
//! | outcome | what the loop sends | what JetStream does |
//! |---|---|---|
//! | `Ok` (a first run, or a replay of a stored result) | `+ACK` | done with the message |
//! | `Err`, settled | `+TERM`: the letter is the job's record | never delivers it again |
//! | `Err`, not settled | `-NAK` (with a delay, if you like) | delivers it again, counted |
//!
//! An `Err` that is not settled on the last delivery is jobguard's own (the store out of reach,
//! the key held by a worker that is still alive): after the `-NAK` the message stays in the
//! stream, delivered no more, with the server's `MAX_DELIVERIES` advisory to say so.
//!
//! A worker that dies mid-job sends nothing: the server delivers the message again once
//! `ack_wait` lapses, and counts it. The next delivery may find the dead worker's claim: give the
//! job `#[idempotent(in_progress = wait("..."))]` longer than its lease, so that the delivery
//! waits for the lease and takes the claim over (counting the crash) instead of being handed
//! back. A job that kills its worker every time spends one delivery per crash: keep
//! `max_deliver` above `crashes` (3 by default), so that the delivery after the last crash is
//! still made and dead-letters the job with [`GiveUp::Crashed`](crate::GiveUp::Crashed).
//!
//! # The letter's attempts
//!
//! A letter's `attempts` counts every attempt of every delivery in the key's record, when the
//! job is `#[idempotent]` outside its `#[retry]`; else it is inferred from the delivery's number,
//! as under apalis (the [apalis module](crate::apalis) says how; the feature `apalis` need not
//! be on to read it).
pub use crate::Delivery;

/// The delivery that `message` is, for a consumer created with `max_deliver`: numbered by the
/// server's count of the message's deliveries, and the [`last`](Delivery::last) once the count
/// reaches `max_deliver` (never, for `-1` or `0`). See the [module docs](self) for a consumer
/// loop, and for what an unreadable count reads as.
///
/// ```no_run
/// use async_nats::jetstream::{self, consumer::PullConsumer};
/// use futures::StreamExt;
///
/// # async fn run() -> Result<(), async_nats::Error> {
/// let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
/// let mut consumer: PullConsumer = js.get_stream("CHARGES").await?.get_consumer("workers").await?;
/// let max_deliver = consumer.info().await?.config.max_deliver;
/// let mut messages = consumer.fetch().max_messages(1).messages().await?;
/// if let Some(message) = messages.next().await {
///     let message = message?;
///     let delivery = jobguard::nats::delivery(&message, max_deliver);
///     println!("delivery {} (last: {})", delivery.number, delivery.last);
/// }
/// # Ok(())
/// # }
/// ```
pub fn delivery(message: &async_nats::jetstream::Message, max_deliver: i64) -> Delivery {
    decide(message.info().ok().map(|info| info.delivered), max_deliver)
}

/// The delivery for the server's count (`None`: unreadable) and the consumer's limit.
fn decide(delivered: Option<i64>, max_deliver: i64) -> Delivery {
    match delivered {
        Some(delivered) if delivered >= 1 => Delivery {
            number: u32::try_from(delivered).unwrap_or(u32::MAX),
            last: max_deliver > 0 && delivered >= max_deliver,
        },
        _ => Delivery {
            number: 1,
            last: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(number: u32, last: bool) -> Delivery {
        Delivery { number, last }
    }

    #[test]
    fn the_count_numbers_the_delivery_and_max_deliver_makes_the_last() {
        assert_eq!(decide(Some(1), 3), d(1, false));
        assert_eq!(decide(Some(2), 3), d(2, false));
        assert_eq!(decide(Some(3), 3), d(3, true));
        assert_eq!(decide(Some(7), 3), d(7, true));
        assert_eq!(decide(Some(1), 1), d(1, true));
    }

    #[test]
    fn without_a_limit_no_delivery_is_the_last() {
        assert_eq!(decide(Some(1), -1), d(1, false));
        assert_eq!(decide(Some(500), 0), d(500, false));
    }

    #[test]
    fn an_unreadable_count_is_the_last() {
        assert_eq!(decide(None, 5), d(1, true));
        assert_eq!(decide(Some(0), 5), d(1, true));
        assert_eq!(decide(Some(-3), -1), d(1, true));
    }

    #[test]
    fn a_huge_count_saturates() {
        assert_eq!(decide(Some(i64::MAX), i64::MAX), d(u32::MAX, true));
    }

    /// A JetStream message with `reply` as its reply subject, on a client that is never
    /// connected (it would connect in the background; nothing here needs it to).
    async fn message(reply: Option<&str>) -> async_nats::jetstream::Message {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("nats://127.0.0.1:1")
            .await
            .expect("a client that connects in the background");
        async_nats::jetstream::Message {
            message: async_nats::Message {
                subject: "charges".into(),
                reply: reply.map(Into::into),
                payload: Default::default(),
                headers: None,
                status: None,
                description: None,
                length: 0,
            },
            context: async_nats::jetstream::new(client),
        }
    }

    #[tokio::test]
    async fn the_delivered_count_comes_from_the_ack_subject() {
        // `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`
        let third = message(Some(
            "$JS.ACK.CHARGES.workers.3.100.7.1790230470084404000.0",
        ))
        .await;
        assert_eq!(delivery(&third, 5), d(3, false));
        assert_eq!(delivery(&third, 3), d(3, true));
    }

    #[tokio::test]
    async fn a_message_without_jetstream_metadata_is_the_last() {
        assert_eq!(delivery(&message(None).await, 5), d(1, true));
        assert_eq!(delivery(&message(Some("_INBOX.abc")).await, 5), d(1, true));
        let garbled = message(Some("$JS.ACK.CHARGES.workers.many.100.7.1.0")).await;
        assert_eq!(delivery(&garbled, 5), d(1, true));
    }
}
