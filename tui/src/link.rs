//! Whether the server answers: connected, or disconnected and why; and how
//! often it came back, so the status line can say "reconnected".

/// The server's state as the status line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerLink {
    /// Answering. `reconnects` counts returns after a disconnection.
    Connected { reconnects: u32 },
    /// Not answering (never did, or went away), with the last error.
    Disconnected { reason: String },
}

/// Follows the link across polls.
#[derive(Debug, Clone, Default)]
pub struct LinkTracker {
    /// `None` while connected; the last error while not.
    failure: Option<String>,
    ever_connected: bool,
    reconnects: u32,
}

impl LinkTracker {
    pub fn link(&self) -> ServerLink {
        match (&self.failure, self.ever_connected) {
            (None, true) => ServerLink::Connected {
                reconnects: self.reconnects,
            },
            (Some(reason), _) => ServerLink::Disconnected {
                reason: reason.clone(),
            },
            (None, false) => ServerLink::Disconnected {
                reason: "not polled yet".to_string(),
            },
        }
    }

    pub fn record_success(&mut self) {
        if self.failure.take().is_some() && self.ever_connected {
            self.reconnects += 1;
        }
        self.ever_connected = true;
    }

    pub fn record_failure(&mut self, reason: String) {
        self.failure = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_contact_is_not_a_reconnect_but_a_return_is() {
        let mut tracker = LinkTracker::default();
        assert!(matches!(tracker.link(), ServerLink::Disconnected { .. }));

        tracker.record_failure("refused".to_string());
        assert_eq!(
            tracker.link(),
            ServerLink::Disconnected {
                reason: "refused".to_string()
            }
        );
        tracker.record_success();
        assert_eq!(tracker.link(), ServerLink::Connected { reconnects: 0 });
        tracker.record_success();
        assert_eq!(tracker.link(), ServerLink::Connected { reconnects: 0 });

        tracker.record_failure("timed out".to_string());
        tracker.record_failure("refused".to_string());
        assert_eq!(
            tracker.link(),
            ServerLink::Disconnected {
                reason: "refused".to_string()
            }
        );
        tracker.record_success();
        assert_eq!(tracker.link(), ServerLink::Connected { reconnects: 1 });
    }
}
