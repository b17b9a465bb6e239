//! `jobguard::nats::delivery` against the machine's NATS JetStream: what a pull consumer really
//! sends. Each delivery is counted, from 1: a `-NAK` and a consumer that went silent past
//! `ack_wait` alike; the delivery at the consumer's `max_deliver` is the last, after which the
//! server says `MAX_DELIVERIES` and delivers the message no more (it stays in the stream).
//!
//! Each test creates a stream and consumer named for itself and deletes them when it ends,
//! passed or failed. Without
//! a server it skips, unless `JOBGUARD_REQUIRE_NATS=1`.

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy};
use async_nats::jetstream::{self, AckKind, Context, Message};
use futures::StreamExt;
use jobguard::Delivery;
use jobguard_testkit::broker::{Broker, unique_name};
use std::time::Duration;

/// Deletes the stream `name` when dropped, also by a failing test.
struct Cleanup {
    url: String,
    name: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Maybe inside the test's runtime: delete on a thread of its own.
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let client = async_nats::connect(&url).await.expect("connect to NATS");
                jetstream::new(client)
                    .delete_stream(&name)
                    .await
                    .unwrap_or_else(|e| panic!("delete the stream {name}: {e}"));
            });
        })
        .join();
    }
}

/// A work-queue stream `name` on subject `jobguard.test.{name}`, with one message, and its
/// durable pull consumer `name`.
async fn stream(url: &str, name: &str, max_deliver: i64, ack_wait: Duration) -> (Context, Cleanup) {
    let js = jetstream::new(async_nats::connect(url).await.expect("connect to NATS"));
    let subject = format!("jobguard.test.{name}");
    let stream = js
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.clone()],
            retention: RetentionPolicy::WorkQueue,
            ..stream::Config::default()
        })
        .await
        .expect("create the stream");
    stream
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            max_deliver,
            ..pull::Config::default()
        })
        .await
        .expect("create the consumer");
    js.publish(subject, "job".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let cleanup = Cleanup {
        url: url.to_owned(),
        name: name.to_owned(),
    };
    (js, cleanup)
}

async fn consumer(js: &Context, name: &str) -> PullConsumer {
    js.get_stream(name)
        .await
        .expect("the stream")
        .get_consumer(name)
        .await
        .expect("the consumer")
}

/// The next message, asking the server for one for up to 10 s.
async fn next(consumer: &PullConsumer) -> Message {
    consumer
        .batch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .expect("a pull request")
        .next()
        .await
        .expect("a message within 10 s")
        .expect("a message")
}

#[tokio::test]
async fn each_nak_counts_and_the_delivery_at_max_deliver_is_the_last() {
    let Some(url) = Broker::Nats.url() else {
        return;
    };
    let name = unique_name("delivery");
    let (js, _cleanup) = stream(&url, &name, 3, Duration::from_secs(30)).await;
    let consumer = consumer(&js, &name).await;
    let advisories = js
        .client()
        .subscribe(format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{name}.{name}"
        ))
        .await
        .expect("subscribe to the advisory");

    let mut seen = Vec::new();
    for _ in 0..3 {
        let message = next(&consumer).await;
        seen.push(jobguard::nats::delivery(&message, 3));
        message.ack_with(AckKind::Nak(None)).await.expect("nak");
    }
    assert_eq!(
        seen,
        [
            Delivery {
                number: 1,
                last: false
            },
            Delivery {
                number: 2,
                last: false
            },
            Delivery {
                number: 3,
                last: true
            },
        ]
    );
    // Asked for a message, the server finds the one it has delivered `max_deliver` times, says so
    // (`MAX_DELIVERIES`) and answers the request with none; the message stays in the stream.
    let mut pull = consumer
        .batch()
        .max_messages(1)
        .expires(Duration::from_secs(3))
        .messages()
        .await
        .expect("a pull request");
    let advisory = tokio::time::timeout(Duration::from_secs(10), advisories.take(1).next())
        .await
        .expect("the MAX_DELIVERIES advisory within 10 s");
    assert!(advisory.is_some());
    let none = pull.next().await;
    assert!(none.is_none(), "delivered past max_deliver: {none:?}");
    let mut info = js.get_stream(&name).await.unwrap();
    assert_eq!(info.info().await.unwrap().state.messages, 1);
}

#[tokio::test]
async fn a_consumer_that_goes_silent_past_ack_wait_spends_a_delivery() {
    let Some(url) = Broker::Nats.url() else {
        return;
    };
    let name = unique_name("silent");
    let (js, _cleanup) = stream(&url, &name, 5, Duration::from_secs(1)).await;
    let consumer = consumer(&js, &name).await;

    // A worker takes the message and never answers, as a killed process would.
    let first = next(&consumer).await;
    assert_eq!(
        jobguard::nats::delivery(&first, 5),
        Delivery {
            number: 1,
            last: false
        }
    );
    drop(first);
    let again = next(&consumer).await;
    assert_eq!(
        jobguard::nats::delivery(&again, 5),
        Delivery {
            number: 2,
            last: false
        }
    );
    again.ack().await.expect("ack");
}
