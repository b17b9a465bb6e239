//! Durable jobs on RabbitMQ through [lapin](https://docs.rs/lapin) (feature `lapin`).
//!
//! RabbitMQ delivers every message at least once: a consumer that dies before its ack (its
//! connection closes) has its unacknowledged messages requeued, and a message handed back with
//! `basic.reject` (requeue) comes again. A quorum queue counts those returns: it puts the count
//! in the `x-delivery-count` header of each redelivery, and once the count passes the queue's
//! `x-delivery-limit` it drops the message (or dead-letters it to the queue's dead-letter
//! exchange). [`delivery`] reads that header into a [`Delivery`], which a consumer loop puts in
//! scope around its job with [`Delivery::scope_settled`]. With it, a job that keeps failing is
//! retried by `#[retry]` within each delivery, handed back to RabbitMQ for the next one, and
//! dead-lettered once, on its last delivery; and a job that kills its worker is counted by the
//! idempotency store and dead-lettered once after `crashes` crashes
//! ([`#[idempotent]`](crate::idempotent)).
//!
//! # A consumer loop
//!
//! The repository's `examples/rabbitmq_worker.rs` is the whole program; its loop is this one:
//!
//! ```no_run
//! use futures::StreamExt;
//! use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
//! use lapin::types::FieldTable;
//! use lapin::{Connection, ConnectionProperties};
//!
//! /// The queue's `x-delivery-limit`: a message is delivered at most `LIMIT + 1` times.
//! const LIMIT: u32 = 4;
//!
//! async fn charge(order_id: &str) -> Result<(), std::io::Error> {
//!     // `#[jobguard::idempotent]` around `#[jobguard::retry]`, as in the README
//! #   let _ = order_id;
//!     Ok(())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
//! let channel = connection.create_channel().await?;
//! channel.basic_qos(1, BasicQosOptions::default()).await?; // one job at a time
//! let mut consumer = channel
//!     .basic_consume("charges".into(), "worker".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! while let Some(message) = consumer.next().await {
//!     let message = message?;
//!     let delivery = jobguard::lapin::delivery(&message, LIMIT);
//!     let order_id = String::from_utf8_lossy(&message.data).into_owned();
//!     let (result, settled) = delivery.scope_settled(charge(&order_id)).await;
//!     if result.is_ok() || settled {
//!         // Done, or its one dead letter is written: RabbitMQ must not deliver it again.
//!         message.ack(BasicAckOptions::default()).await?;
//!     } else {
//!         // Handed back: `reject` with requeue, which every RabbitMQ counts as a failed delivery.
//!         message.reject(BasicRejectOptions { requeue: true }).await?;
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Which delivery is the last
//!
//! A quorum queue keeps a count of a message's failed deliveries. The first delivery carries no
//! `x-delivery-count` header (or `0`); after `n` returns it carries `n`. [`delivery`] numbers the
//! delivery `n + 1`, and marks it [`last`](Delivery::last) when `n` has reached the queue's
//! `x-delivery-limit`: RabbitMQ drops (or dead-letters) a message whose count goes past the
//! limit, so a queue declared with `x-delivery-limit: 4` delivers a message five times at most,
//! and the fifth is the last. A limit of `0` makes the first delivery the last. Pass the limit
//! the queue was declared with (RabbitMQ 4.x gives a quorum queue without one a limit of 20).
//!
//! What counts as a failed delivery depends on the server's version:
//!
//! * RabbitMQ 3.x and 4.0–4.2 count every return: `basic.reject` and `basic.nack` with
//!   requeue, and the messages of a consumer whose channel or connection closed (a worker that
//!   died).
//! * RabbitMQ 4.3 counts only what it takes for a failure: `basic.reject` (requeue or not) and
//!   a consumer whose channel closed, but not a `basic.nack` with requeue, nor a delivery
//!   returned by the consumer timeout (it adds `x-acquired-count` for every delivery). That is
//!   how RabbitMQ describes the change; jobguard's own tests run against 3.10.
//!
//! So hand a job back with `basic.reject` and `requeue: true`: it is counted on every version.
//! A job handed back with `basic.nack` on RabbitMQ 4.3 is delivered again with the same number,
//! and never reaches its last delivery.
//!
//! A count the header cannot give is not guessed upwards:
//!
//! * no header on a redelivery (the `redelivered` flag set): a classic queue, which keeps no
//!   count and has no limit. The delivery is numbered 2 (it is one at least) and is the last: a
//!   job that fails on it is dead-lettered now rather than handed back to a queue that would
//!   deliver it forever without a letter;
//! * a header that is not a count (not an integer, or negative: written by a publisher, not by
//!   the queue): the delivery is numbered 1, or 2 when `redelivered` is set, and is the last, for
//!   the same reason. No panic, no error: the job runs, and is settled on this delivery.
//!
//! # What the loop does with the outcome
//!
//! [`Delivery::scope_settled`] returns the job's result and whether the job is settled: its one
//! dead letter was written on this delivery (the last one, or a permanent failure), or before (a
//! poisoned job), or its key refuses it for good. Then:
//!
//! | outcome | what the loop does | what RabbitMQ does |
//! |---|---|---|
//! | `Ok` (a first run, or a replay of a stored result) | `basic.ack` | forgets the message |
//! | `Err`, settled | `basic.ack`: the letter is the job's record | forgets the message |
//! | `Err`, not settled | `basic.reject`, `requeue: true` | delivers it again, counted |
//!
//! An `Err` that is not settled on the last delivery is jobguard's own (the store out of reach,
//! the key held by a worker that is still alive): the reject makes RabbitMQ drop the message,
//! or route it to the queue's `x-dead-letter-exchange`, which the example declares so that such
//! a message is parked rather than lost.
//!
//! A worker that dies mid-job never reaches its ack: its connection closes, RabbitMQ requeues
//! the message at once and counts the return. The next delivery finds the dead worker's claim
//! until its lease lapses: give the job `#[idempotent(in_progress = wait("..."))]` longer than its
//! lease, so that the delivery waits for the lease and takes the claim over (counting the crash)
//! instead of being handed back and spending a delivery. A job that kills its worker every time
//! therefore spends one delivery per crash: keep `x-delivery-limit` at or above `crashes` (3 by
//! default), so that the delivery after the last crash is still made and dead-letters the job
//! with [`GiveUp::Crashed`](crate::GiveUp::Crashed).
//!
//! # The letter's attempts
//!
//! A letter's `attempts` counts every attempt of every delivery in the key's record, when the
//! job is `#[idempotent]` outside its `#[retry]`; else it is inferred from the delivery's number,
//! as under apalis (the [apalis module](crate::apalis) says how; the feature `apalis` need not
//! be on to read it).
pub use crate::Delivery;

use lapin::types::AMQPValue;

/// The header in which a quorum queue counts a message's failed deliveries.
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// The delivery that `message` is, on a quorum queue declared with `x-delivery-limit: limit`:
/// numbered from 1 by the `x-delivery-count` header, and the [`last`](Delivery::last) once the
/// count has reached `limit`. See the [module docs](self) for a consumer loop, and for what a
/// missing or unreadable count reads as.
///
/// ```
/// use jobguard::Delivery;
/// use lapin::message::Delivery as Message;
/// use lapin::types::{AMQPValue, FieldTable};
/// use lapin::BasicProperties;
///
/// // What RabbitMQ sends: the first delivery carries no count.
/// let first = Message::mock(1, "".into(), "charges".into(), false, Vec::new());
/// assert_eq!(jobguard::lapin::delivery(&first, 2), Delivery { number: 1, last: false });
///
/// // After two returns, with the queue's `x-delivery-limit` at 2: the third and last delivery.
/// let mut third = Message::mock(3, "".into(), "charges".into(), true, Vec::new());
/// let mut headers = FieldTable::default();
/// headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(2));
/// third.properties = BasicProperties::default().with_headers(headers);
/// assert_eq!(jobguard::lapin::delivery(&third, 2), Delivery { number: 3, last: true });
/// ```
pub fn delivery(message: &lapin::message::Delivery, limit: u32) -> Delivery {
    let header = message
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(DELIVERY_COUNT));
    let count = match header {
        None => Count::Absent,
        Some(value) => count_of(value).map_or(Count::Unreadable, Count::Returns),
    };
    decide(count, message.redelivered, limit)
}

/// What a message says of its earlier deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// No `x-delivery-count` header.
    Absent,
    /// The header's count of returns.
    Returns(u64),
    /// A header that is not a count.
    Unreadable,
}

/// The count in a header's value: a non-negative integer of any width.
fn count_of(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::ShortShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortShortUInt(n) => Some(n.into()),
        AMQPValue::ShortInt(n) => u64::try_from(n).ok(),
        AMQPValue::ShortUInt(n) => Some(n.into()),
        AMQPValue::LongInt(n) => u64::try_from(n).ok(),
        AMQPValue::LongUInt(n) => Some(n.into()),
        AMQPValue::LongLongInt(n) => u64::try_from(n).ok(),
        _ => None,
    }
}

/// The delivery for a count, the message's `redelivered` flag and the queue's limit.
fn decide(count: Count, redelivered: bool, limit: u32) -> Delivery {
    match count {
        Count::Returns(n) => Delivery {
            number: u32::try_from(n.saturating_add(1)).unwrap_or(u32::MAX),
            last: n >= u64::from(limit),
        },
        // A first delivery, or a returned one that the queue counted as not failed.
        Count::Absent if !redelivered => Delivery {
            number: 1,
            last: limit == 0,
        },
        // A classic queue's redelivery: one at least, and no count to reach a limit with.
        Count::Absent => Delivery {
            number: 2,
            last: true,
        },
        Count::Unreadable => Delivery {
            number: if redelivered { 2 } else { 1 },
            last: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::message::Delivery as Message;
    use lapin::types::{FieldTable, LongString};

    fn message(redelivered: bool, count: Option<AMQPValue>) -> Message {
        let mut message = Message::mock(1, "".into(), "q".into(), redelivered, Vec::new());
        if let Some(count) = count {
            let mut headers = FieldTable::default();
            headers.insert(DELIVERY_COUNT.into(), count);
            message.properties = BasicProperties::default().with_headers(headers);
        }
        message
    }

    fn d(number: u32, last: bool) -> Delivery {
        Delivery { number, last }
    }

    #[test]
    fn the_first_delivery_has_no_count() {
        assert_eq!(delivery(&message(false, None), 3), d(1, false));
        // A header with other entries only.
        let mut other = message(false, None);
        let mut headers = FieldTable::default();
        headers.insert("x-trace".into(), AMQPValue::LongString("t".into()));
        other.properties = BasicProperties::default().with_headers(headers);
        assert_eq!(delivery(&other, 3), d(1, false));
    }

    #[test]
    fn the_count_numbers_the_delivery_and_the_limit_makes_the_last() {
        let at = |n: i64| delivery(&message(true, Some(AMQPValue::LongLongInt(n))), 3);
        assert_eq!(at(0), d(1, false));
        assert_eq!(at(1), d(2, false));
        assert_eq!(at(2), d(3, false));
        assert_eq!(at(3), d(4, true));
        // Past the limit (the queue's limit was raised, or the caller's is lower): last too.
        assert_eq!(at(9), d(10, true));
    }

    #[test]
    fn every_integer_width_is_read() {
        for value in [
            AMQPValue::ShortShortInt(2),
            AMQPValue::ShortShortUInt(2),
            AMQPValue::ShortInt(2),
            AMQPValue::ShortUInt(2),
            AMQPValue::LongInt(2),
            AMQPValue::LongUInt(2),
            AMQPValue::LongLongInt(2),
        ] {
            assert_eq!(delivery(&message(true, Some(value)), 5), d(3, false));
        }
    }

    #[test]
    fn a_limit_of_zero_makes_the_first_delivery_the_last() {
        assert_eq!(delivery(&message(false, None), 0), d(1, true));
    }

    #[test]
    fn a_redelivery_without_a_count_is_the_last() {
        assert_eq!(delivery(&message(true, None), 20), d(2, true));
    }

    #[test]
    fn an_unreadable_count_is_the_last_and_never_panics() {
        for value in [
            AMQPValue::LongLongInt(-1),
            AMQPValue::ShortShortInt(-5),
            AMQPValue::LongString(LongString::from("3")),
            AMQPValue::Double(2.0),
            AMQPValue::Boolean(true),
            AMQPValue::Void,
        ] {
            assert_eq!(
                delivery(&message(false, Some(value.clone())), 20),
                d(1, true),
                "{value:?}"
            );
            assert_eq!(
                delivery(&message(true, Some(value.clone())), 20),
                d(2, true),
                "{value:?}"
            );
        }
    }

    #[test]
    fn a_huge_count_saturates() {
        let huge = message(true, Some(AMQPValue::LongLongInt(i64::MAX)));
        assert_eq!(delivery(&huge, u32::MAX), d(u32::MAX, true));
    }
}
