//! One job, one dead letter, on real apalis workers: a job whose `#[retry]` runs out on every
//! delivery is dead-lettered once, on its last delivery, with the attempts of every delivery,
//! and the broker does not deliver it again; a job that recovers on its second delivery is
//! dead-lettered never. On apalis-redis (a private `redis-server`, the letters in a Redis
//! stream) the task's `max_attempts`, or `GuardLayer::deliveries`, sets the deliveries; on
//! apalis's in-memory storage a task is delivered once, so its first delivery is the last.

use apalis::prelude::*;
use apalis_redis::RedisStorage;
use jobguard::apalis::{Delivery, GuardLayer};
use jobguard::{DeadLetter, GiveUp, MemoryDeadLetters, RedisDeadLetters, Runtime, Transient};
use jobguard_testkit::redis::RedisServer;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `#[retry]`'s attempts in each delivery.
const ATTEMPTS: u32 = 2;
/// The broker's deliveries of a task that keeps failing.
const DELIVERIES: u32 = 3;

/// A job that fails on its first `failing` deliveries and succeeds after, or fails for good.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Job {
    id: u32,
    failing: u32,
    declined: bool,
}

#[derive(Debug, Transient)]
enum JobError {
    #[transient]
    Timeout,
    Declined,
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for JobError {}

#[jobguard::retry(attempts = 2, base = "0ms", cap = "0ms", jitter = none, on = transient)]
async fn run(job: Job) -> Result<u32, JobError> {
    let delivery = jobguard::attempt()
        .and_then(|a| a.delivery)
        .expect("GuardLayer puts the delivery in scope");
    match job {
        Job { declined: true, .. } => Err(JobError::Declined),
        Job { failing, .. } if delivery.number <= failing => Err(JobError::Timeout),
        _ => Ok(delivery.number),
    }
}

/// What the handler saw: each job's deliveries, in order.
type Seen = Arc<Mutex<Vec<(u32, Option<Delivery>)>>>;

async fn handle(job: Job, runtime: Data<Runtime>, seen: Data<Seen>) -> Result<u32, JobError> {
    seen.lock().unwrap().push((job.id, Delivery::current()));
    runtime.scope(run(job)).await
}

/// The deliveries `seen` holds for job `id`.
fn deliveries(seen: &Seen, id: u32) -> Vec<Delivery> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(job, _)| *job == id)
        .map(|(_, d)| d.expect("a delivery in scope"))
        .collect()
}

fn numbered(numbers: std::ops::RangeInclusive<u32>, last: u32) -> Vec<Delivery> {
    numbers
        .map(|number| Delivery {
            number,
            last: number == last,
        })
        .collect()
}

/// Runs `jobs` on one apalis-redis worker, each pushed with `max_attempts` [`DELIVERIES`],
/// until every task is done or given up by the broker. Returns the letters in the stream, what
/// the handler saw, and each job's final apalis status by id.
async fn on_redis(jobs: &[Job]) -> Option<(Vec<DeadLetter>, Seen, Vec<(u32, String)>)> {
    on_redis_with(jobs, Some(DELIVERIES as usize), GuardLayer::new()).await
}

/// [`on_redis`], with the tasks' `max_attempts` (apalis-redis's default, 25, for `None`) and the
/// worker's layer given.
async fn on_redis_with(
    jobs: &[Job],
    max_attempts: Option<usize>,
    layer: GuardLayer,
) -> Option<(Vec<DeadLetter>, Seen, Vec<(u32, String)>)> {
    let server = RedisServer::start()?;
    let url = server.url();
    let config = apalis_redis::Config::default().queue("letters");
    let conn = apalis_redis::connect(url.clone()).await.unwrap();
    let mut storage = RedisStorage::<Job>::new(conn.clone()).with_config(config.clone());
    for job in jobs {
        match max_attempts {
            Some(max) => {
                let task = TaskBuilder::new(*job).max_attempts(max).build();
                storage.push_task(task).await.unwrap();
            }
            None => storage.push(*job).await.unwrap(),
        }
    }
    let letters = RedisDeadLetters::connect(&url, "jobguard:dead")
        .await
        .unwrap();
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    let seen: Seen = Arc::default();

    let mut redis = conn.clone();
    let (done_set, dead_set) = (config.done_jobs_set(), config.dead_jobs_set());
    let total = jobs.len();
    let settled = async move {
        // Polls the broker's sets; it redelivers on its own clock (a failed task comes back
        // `attempt` seconds later).
        loop {
            let done: usize = redis.scard(&done_set).await.unwrap();
            let dead: usize = redis.scard(&dead_set).await.unwrap();
            if done + dead >= total {
                return Ok::<(), WorkerError>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let worker = WorkerBuilder::new("letters-worker")
        .backend(storage)
        .data(runtime)
        .data(seen.clone())
        .layer(layer)
        .build(handle)
        .run_until(settled);
    tokio::time::timeout(Duration::from_secs(60), worker)
        .await
        .expect("every task settled within 60 s")
        .unwrap();

    // Nothing is left for the broker to deliver again: no task queued or scheduled.
    let mut redis = conn;
    let queued: usize = redis.llen(config.active_jobs_list()).await.unwrap();
    let scheduled: usize = redis.zcard(config.scheduled_jobs_set()).await.unwrap();
    assert_eq!(
        (queued, scheduled),
        (0, 0),
        "a task would be delivered again"
    );
    // Each task's status as the broker stored it, by the job's id.
    let mut statuses = Vec::new();
    for set in [config.done_jobs_set(), config.dead_jobs_set()] {
        let ids: Vec<String> = redis.smembers(&set).await.unwrap();
        for task_id in ids {
            let data: Vec<u8> = redis.hget(config.job_data_hash(), &task_id).await.unwrap();
            let job: Job = serde_json::from_slice(&data).unwrap();
            let meta = format!("{}:{task_id}", config.job_meta_hash());
            let status: String = redis.hget(&meta, "status").await.unwrap();
            statuses.push((job.id, status));
        }
    }
    statuses.sort();
    let letters = letters
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|(_, letter)| letter.unwrap())
        .collect();
    Some((letters, seen, statuses))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_failing_on_every_delivery_is_dead_lettered_once_on_the_last() {
    let job = Job {
        id: 1,
        failing: u32::MAX,
        declined: false,
    };
    let Some((letters, seen, statuses)) = on_redis(&[job]).await else {
        return;
    };
    assert_eq!(
        deliveries(&seen, 1),
        numbered(1..=DELIVERIES, DELIVERIES),
        "delivered {DELIVERIES} times, no more"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, GiveUp::Exhausted);
    assert_eq!(letters[0].attempts, DELIVERIES * ATTEMPTS);
    assert_eq!(letters[0].error, "Timeout");
    // The last delivery's failure is final for the broker: in its dead set, not rescheduled.
    assert_eq!(statuses, [(1, "Killed".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_recovers_on_its_second_delivery_is_never_dead_lettered() {
    let job = Job {
        id: 2,
        failing: 1,
        declined: false,
    };
    let Some((letters, seen, statuses)) = on_redis(&[job]).await else {
        return;
    };
    assert_eq!(deliveries(&seen, 2), numbered(1..=2, DELIVERIES));
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(statuses, [(2, "Done".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_dead_lettered_on_its_first_delivery_and_not_delivered_again() {
    let job = Job {
        id: 3,
        failing: 0,
        declined: true,
    };
    let Some((letters, seen, statuses)) = on_redis(&[job]).await else {
        return;
    };
    assert_eq!(deliveries(&seen, 3), numbered(1..=1, DELIVERIES));
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Permanent, 1)
    );
    assert_eq!(statuses, [(3, "Killed".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_deliveries_stop_apalis_redis_before_its_own_limit_of_25() {
    let job = Job {
        id: 5,
        failing: u32::MAX,
        declined: false,
    };
    let layer = GuardLayer::new().deliveries(2);
    let Some((letters, seen, statuses)) = on_redis_with(&[job], None, layer).await else {
        return;
    };
    assert_eq!(deliveries(&seen, 5), numbered(1..=2, 2));
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attempts, 2 * ATTEMPTS);
    assert_eq!(statuses, [(5, "Killed".to_owned())]);
}

#[tokio::test]
async fn in_memory_the_first_delivery_is_the_last_and_writes_the_letter() {
    let mut storage = MemoryStorage::new();
    storage
        .push(Job {
            id: 4,
            failing: u32::MAX,
            declined: false,
        })
        .await
        .unwrap();
    let letters = MemoryDeadLetters::new();
    let runtime = Runtime::builder().dead_letters(letters.clone()).build();
    let seen: Seen = Arc::default();
    let watched = letters.clone();
    let written = async move {
        while watched.is_empty() {
            tokio::task::yield_now().await;
        }
        Ok::<(), WorkerError>(())
    };
    WorkerBuilder::new("memory-letters")
        .backend(storage)
        .data(runtime)
        .data(seen.clone())
        .layer(GuardLayer::new())
        .build(handle)
        .run_until(written)
        .await
        .unwrap();
    assert_eq!(deliveries(&seen, 4), numbered(1..=1, 1));
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].reason, letters[0].attempts),
        (GiveUp::Exhausted, ATTEMPTS)
    );
}
