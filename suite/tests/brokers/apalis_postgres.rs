//! The apalis-postgres side: apalis's tables and jobguard's `jobguard_keys` in one private
//! `postgres`, the jobs pushed to a queue of the test's own with their `max_attempts`, and the
//! worker: an apalis worker on `PostgresStorage` under `GuardLayer`, one task at a time, whose
//! handler returns the job's error to apalis.

use super::{Job, Setup};
use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use jobguard::Delivery;
use jobguard::apalis::GuardLayer;
use sqlx::PgPool;
use std::time::Duration;

/// apalis-postgres's settings: a worker whose heartbeat stops for 2 s is dead, and its tasks
/// go back to the queue (their attempts counted); one task fetched at a time.
pub fn config(queue: &str) -> Config {
    Config::default()
        .queue(queue)
        .batch_size(1)
        .heartbeat_interval(Duration::from_secs(1))
        .missed_heartbeats(2)
}

/// Creates apalis's tables and jobguard's in the database at `url`.
pub async fn migrate(url: &str) -> PgPool {
    let pool = PgPool::connect(url).await.expect("connect to postgres");
    PostgresStorage::setup(&pool)
        .await
        .expect("apalis-postgres's migrations");
    jobguard::PgStore::new(pool.clone())
        .migrate()
        .await
        .expect("jobguard's migration");
    pool
}

/// Pushes each job with `max_attempts` `setup.limit`.
pub async fn push(pool: &PgPool, setup: &Setup, jobs: &[Job]) {
    let mut storage = PostgresStorage::<Job>::new(pool).with_config(config(&setup.name));
    for job in jobs {
        let task = TaskBuilder::new(*job)
            .max_attempts(setup.limit as usize)
            .build();
        storage.push_task(task).await.expect("push a task");
    }
}

/// Each task of the queue as apalis-postgres keeps it: the job, its status and its attempts.
pub async fn tasks(pool: &PgPool, queue: &str) -> Vec<(Job, String, i32)> {
    let rows: Vec<(Vec<u8>, String, i32)> =
        sqlx::query_as("SELECT job, status, attempts FROM apalis.jobs WHERE job_type = $1")
            .bind(queue)
            .fetch_all(pool)
            .await
            .expect("read apalis.jobs");
    let mut tasks: Vec<_> = rows
        .into_iter()
        .map(|(job, status, attempts)| {
            let job: Job = serde_json::from_slice(&job).expect("a job");
            (job, status, attempts)
        })
        .collect();
    tasks.sort_by_key(|(job, _, _)| job.id);
    tasks
}

/// The status of job `id`'s task.
pub async fn status(pool: &PgPool, queue: &str, id: u32) -> Option<String> {
    tasks(pool, queue)
        .await
        .into_iter()
        .find(|(job, _, _)| job.id == id)
        .map(|(_, status, _)| status)
}

/// The worker: one task at a time until it is killed.
pub async fn run_worker(setup: &Setup) {
    let pool = PgPool::connect(&setup.url)
        .await
        .expect("connect to postgres");
    let storage = PostgresStorage::<Job>::new(&pool).with_config(config(&setup.name));
    WorkerBuilder::new(format!("worker-{}", std::process::id()))
        .backend(storage)
        .concurrency(1)
        .layer(GuardLayer::new())
        .build(handle)
        .run()
        .await
        .expect("the worker runs until it is killed");
}

/// The handler: the job in the delivery `GuardLayer` put in scope, then the `acked` crash point
/// between the stored result and apalis's ack. The job's error goes back to apalis as it is:
/// `GuardLayer` marks a settled job's task `Killed`.
async fn handle(job: Job) -> Result<u64, BoxDynError> {
    let delivery = Delivery::current().expect("GuardLayer puts the delivery in scope");
    super::record(job, delivery).await;
    let n = super::run(job).await?;
    super::crash_point("acked", job.id).await;
    Ok(n)
}
