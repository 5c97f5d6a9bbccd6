//! Where request bodies are parsed, chat templates rendered and prompts
//! tokenized: on tokio's blocking threads, never on the async workers that
//! answer `/health` and stream tokens. At most `jobs` (the cores) run at
//! once, and at most `budget` body bytes are in preparation at once, so N
//! large prompts cost N × the tokenizer's memory only up to the budget; the
//! rest wait their turn.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::errors::ApiError;

/// Bytes one permit of the budget stands for.
const PERMIT_BYTES: usize = 1024;

/// The bounded pool of preparation jobs.
#[derive(Debug)]
pub struct PrepPool {
    jobs: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    budget_permits: u32,
}

impl PrepPool {
    /// `jobs` at once (at least one), and `budget_bytes` of request bodies
    /// at once (at least one request of any size is let through).
    pub fn new(jobs: usize, budget_bytes: usize) -> PrepPool {
        let budget_permits = (budget_bytes / PERMIT_BYTES + 1)
            .min(u32::MAX as usize)
            .min(Semaphore::MAX_PERMITS) as u32;
        let jobs = jobs.clamp(1, Semaphore::MAX_PERMITS);
        PrepPool {
            jobs: Arc::new(Semaphore::new(jobs)),
            budget: Arc::new(Semaphore::new(budget_permits as usize)),
            budget_permits,
        }
    }

    /// Runs `job` on a blocking thread once a job slot and `bytes` of the
    /// budget are free. A client that leaves while waiting costs nothing; one
    /// that leaves while its job runs holds the permits until the job ends,
    /// so the bound holds either way.
    pub async fn run<T: Send + 'static>(
        &self,
        bytes: usize,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        let weight = (bytes / PERMIT_BYTES + 1).min(self.budget_permits as usize) as u32;
        let closed = |_| ApiError::internal("the request pool is closed");
        let budget = Arc::clone(&self.budget)
            .acquire_many_owned(weight)
            .await
            .map_err(closed)?;
        let slot = Arc::clone(&self.jobs)
            .acquire_owned()
            .await
            .map_err(closed)?;
        tokio::task::spawn_blocking(move || {
            let _permits = (budget, slot);
            job()
        })
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Runs `count` jobs of `bytes` each at once; returns the most that ran
    /// together.
    async fn most_at_once(pool: Arc<PrepPool>, count: usize, bytes: usize) -> usize {
        let active = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..count {
            let (pool, active, most) = (Arc::clone(&pool), Arc::clone(&active), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                pool.run(bytes, move || {
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    active.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        most.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_and_bytes_are_both_bounded() {
        // Small jobs: the job slots bound them.
        let pool = Arc::new(PrepPool::new(2, 1 << 20));
        assert_eq!(most_at_once(Arc::clone(&pool), 6, 10).await, 2);
        // Jobs of the whole budget (or more): one at a time, none stuck.
        let pool = Arc::new(PrepPool::new(4, 64 << 10));
        assert_eq!(most_at_once(Arc::clone(&pool), 3, 64 << 10).await, 1);
        assert_eq!(most_at_once(pool, 2, 10 << 20).await, 1);
    }

    #[tokio::test]
    async fn jobs_run_off_the_async_thread() {
        let pool = PrepPool::new(1, 1024);
        let here = std::thread::current().id();
        let there = pool.run(1, || std::thread::current().id()).await.unwrap();
        assert_ne!(here, there);
    }
}
