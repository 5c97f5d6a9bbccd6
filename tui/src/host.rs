//! Where the monitor's host readings come from: a [`HostSource`], read once
//! per interval. The binary's is [`crate::probe::ProbeCommand`] (the
//! `sparkrt` binary owns the host probe and the plan's formulas); tests and
//! the demo supply their own.

use sparkrt_wire::HostSnapshot;

/// Where the monitor gets host readings. Called from the collector thread
/// once per interval; an `Err` is shown on screen and the monitor goes on.
pub trait HostSource: Send {
    fn read(&mut self) -> Result<HostSnapshot, String>;
}
