//! Counts one request's outcome exactly once: by its error's status when it
//! is refused, `ok` or a server error when its answer ends, `cancelled` when
//! it is dropped first. axum drops a
//! handler's future, and a stream's body, when the client goes away; the
//! engine then ends the sequence at its next step (its event channel is
//! closed), and this guard is where the request is counted.

use std::sync::Arc;
use std::time::Instant;

use crate::server::state::ServerState;

pub(super) struct Outcome {
    state: Arc<ServerState>,
    counted: bool,
    /// When the request came in (its latencies count from here).
    pub(super) arrived: Instant,
}

impl Outcome {
    pub(super) fn new(state: Arc<ServerState>) -> Outcome {
        Outcome {
            state,
            counted: false,
            arrived: Instant::now(),
        }
    }

    /// The request got its answer (`ok`) or failed (a server error).
    pub(super) fn finished(&mut self, ok: bool) {
        if !self.counted {
            self.state.counters.finished(ok);
            self.counted = true;
        }
    }

    /// The request was answered with `error` before any output.
    pub(super) fn refused(mut self, error: &crate::server::errors::ApiError) {
        self.state.counters.refused(error.status);
        self.counted = true;
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.counted {
            self.state.counters.cancelled();
        }
    }
}
