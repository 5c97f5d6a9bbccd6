//! Counts one admitted request's outcome exactly once: `ok` or `error` when
//! the answer says so, `cancelled` when it is dropped first. axum drops a
//! handler's future, and a stream's body, when the client goes away; the
//! engine then ends the sequence at its next step (its event channel is
//! closed), and this guard is where the request is counted.

use std::sync::Arc;

use crate::server::ServerState;

pub(super) struct Outcome {
    state: Arc<ServerState>,
    counted: bool,
}

impl Outcome {
    pub(super) fn new(state: Arc<ServerState>) -> Outcome {
        Outcome {
            state,
            counted: false,
        }
    }

    /// The request got its answer (`ok`) or failed (`error`).
    pub(super) fn finished(&mut self, ok: bool) {
        if !self.counted {
            self.state.counters.finished(ok);
            self.counted = true;
        }
    }

    /// The request was refused before it started: counted by whoever
    /// refused it (`rejected`), or not at all (a 4xx for bad input).
    pub(super) fn dismiss(mut self) {
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
