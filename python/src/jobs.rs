//! Submitted jobs and their completion queue, for callers that must not block (an engine's
//! scheduler): a job runs on kvtier's runtime threads, its completion waits in a queue
//! until polled. Bounded: at most [`JOBS_INFLIGHT_MAX`] jobs submitted and not yet polled.

use crate::buffer::Buffer;
use crate::client::{store_status, ProbeResult};
use crate::errors::{self, Busy};
use kvtier::{Client, ClientError, ObjectId, ProbeOutcome, StoreOutcome};
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Jobs one client may have submitted and not yet polled; a submit beyond raises `Busy`.
pub const JOBS_INFLIGHT_MAX: usize = 1024;

/// What a job does.
pub(crate) enum JobKind {
    /// Store the one buffer under the object.
    Store(ObjectId),
    /// Store the buffers under the objects, pipelined.
    StoreMany(Vec<ObjectId>),
    /// Load the objects into the buffers, in order.
    LoadInto(Vec<ObjectId>),
    /// Probe the objects (no buffers).
    Probe(Vec<ObjectId>),
    /// Start restoring the objects only the node's SSD holds (no buffers).
    Prefetch(Vec<ObjectId>),
}

enum Outcome {
    /// The job's task panicked (a bug): its completion says so, and its buffers and its
    /// place among the jobs in flight are given back as for any other.
    Panicked(String),
    Stored(Result<StoreOutcome, ClientError>),
    StoredMany(Vec<Result<StoreOutcome, ClientError>>),
    Loaded(Result<Vec<bool>, ClientError>),
    Probed(Result<Vec<ProbeOutcome>, ClientError>),
    Prefetched(Result<u32, ClientError>),
}

struct Done {
    job: u64,
    outcome: Outcome,
    /// Given back when the completion is polled (with the GIL).
    buffers: Vec<Buffer>,
}

#[derive(Default)]
struct State {
    next_job: u64,
    /// Submitted and not yet polled (running or done).
    inflight: usize,
    done: VecDeque<Done>,
}

/// One client's jobs.
#[derive(Default)]
pub(crate) struct Jobs {
    state: Mutex<State>,
    finished: Condvar,
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent counters: keep going.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts a job on `runtime` and returns its id.
    pub(crate) fn submit(
        self: &std::sync::Arc<Self>,
        runtime: &tokio::runtime::Runtime,
        client: &Client,
        kind: JobKind,
        buffers: Vec<Buffer>,
    ) -> PyResult<u64> {
        let job = {
            let mut state = self.lock();
            if state.inflight >= JOBS_INFLIGHT_MAX {
                return Err(errors::with_reason(
                    Busy::new_err(format!(
                        "{JOBS_INFLIGHT_MAX} jobs in flight: poll completions first"
                    )),
                    "busy",
                ));
            }
            state.inflight += 1;
            state.next_job += 1;
            state.next_job
        };
        let spans: Vec<_> = buffers.iter().map(Buffer::span).collect();
        let (jobs, client) = (self.clone(), client.clone());
        // The work runs as a task of its own, so a panic in it ends that task only and the
        // completion is still queued.
        let work = runtime.spawn(async move {
            match kind {
                // SAFETY: the exports are held in `buffers` until the completion is polled.
                JobKind::Store(object) => {
                    Outcome::Stored(client.store(object, unsafe { spans[0].bytes() }).await)
                }
                JobKind::StoreMany(objects) => {
                    // SAFETY: as above.
                    let items: Vec<_> = objects
                        .iter()
                        .zip(&spans)
                        .map(|(object, span)| (*object, unsafe { span.bytes() }))
                        .collect();
                    Outcome::StoredMany(client.store_many(&items).await)
                }
                JobKind::LoadInto(objects) => {
                    // SAFETY: as above; the buffers were exported writable and are distinct.
                    let mut targets: Vec<&mut [u8]> = spans
                        .iter()
                        .map(|span| unsafe { span.bytes_mut() })
                        .collect();
                    Outcome::Loaded(client.load_into(&objects, &mut targets).await)
                }
                JobKind::Probe(objects) => Outcome::Probed(client.probe(&objects).await),
                JobKind::Prefetch(objects) => Outcome::Prefetched(client.prefetch(&objects).await),
            }
        });
        runtime.spawn(async move {
            let outcome = work.await.unwrap_or_else(|error| {
                Outcome::Panicked(format!("a kvtier job failed inside: {error}"))
            });
            jobs.lock().done.push_back(Done {
                job,
                outcome,
                buffers,
            });
            jobs.finished.notify_all();
        });
        Ok(job)
    }

    /// Takes finished jobs (see `Client.poll`).
    pub(crate) fn poll<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
        max: Option<usize>,
    ) -> PyResult<Bound<'py, PyList>> {
        let wait = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let taken: Vec<Done> = py.allow_threads(|| {
            let deadline = Instant::now().checked_add(wait);
            let mut state = self.lock();
            while state.done.is_empty() {
                let left = match deadline {
                    Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                    None => Duration::from_secs(3600),
                };
                if left.is_zero() {
                    break;
                }
                state = self
                    .finished
                    .wait_timeout(state, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
            let count = max.unwrap_or(usize::MAX).min(state.done.len());
            state.inflight -= count;
            state.done.drain(..count).collect()
        });
        let list = PyList::empty(py);
        for done in taken {
            let result = match done.outcome {
                Outcome::Panicked(reason) => errors::KvtierError::new_err(reason)
                    .into_value(py)
                    .into_bound(py)
                    .into_any(),
                Outcome::Stored(Ok(outcome)) => store_status(outcome).into_pyobject(py)?.into_any(),
                Outcome::StoredMany(outcomes) => {
                    let statuses = PyList::empty(py);
                    for outcome in outcomes {
                        match outcome {
                            Ok(outcome) => statuses.append(store_status(outcome))?,
                            Err(error) => statuses.append(errors::to_py(error).into_value(py))?,
                        }
                    }
                    statuses.into_any()
                }
                Outcome::Loaded(Ok(hits)) => hits.into_pyobject(py)?.into_any(),
                Outcome::Probed(Ok(outcomes)) => {
                    let probes = PyList::empty(py);
                    for outcome in outcomes {
                        probes.append(ProbeResult::from(outcome))?;
                    }
                    probes.into_any()
                }
                Outcome::Prefetched(Ok(started)) => started.into_pyobject(py)?.into_any(),
                Outcome::Stored(Err(error))
                | Outcome::Loaded(Err(error))
                | Outcome::Probed(Err(error))
                | Outcome::Prefetched(Err(error)) => errors::to_py(error)
                    .into_value(py)
                    .into_bound(py)
                    .into_any(),
            };
            list.append((done.job, result))?;
            drop(done.buffers);
        }
        Ok(list)
    }

    /// Jobs submitted and not yet polled.
    pub(crate) fn inflight(&self) -> usize {
        self.lock().inflight
    }
}
