//! The file-descriptor budget: connections may use what `RLIMIT_NOFILE`
//! leaves after a reserve, so accept never fails with "Too many open files"
//! and the memory guard can always open `/proc/meminfo` and the cgroup files.

use thiserror::Error;

/// Descriptors kept for everything but connections: the listener, the
/// runtime's epoll and wake-up fds, model files, meminfo, cgroup files,
/// logs, the API key file.
pub const FD_RESERVE: u64 = 64;

/// Connections answered `503` and closed while at the cap, at once; beyond
/// them an accepted connection is closed without an answer.
pub const OVERFLOW_RESPONDERS: usize = 32;

/// The most concurrent connections by default, whatever the fd limit allows.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// A soft limit raised to the hard one is still kept below this (an
/// `unlimited` hard limit must not become a huge table).
const NOFILE_CEILING: u64 = 1 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FdBudgetError {
    #[error(
        "RLIMIT_NOFILE is {limit}: after the reserve of {FD_RESERVE} descriptors and \
         {OVERFLOW_RESPONDERS} for refusals no connection fits (raise it with `ulimit -n` \
         or LimitNOFILE=)"
    )]
    TooFew { limit: u64 },
    #[error(
        "--max-connections {requested} exceeds the file-descriptor budget of {budget} \
         (RLIMIT_NOFILE {limit} − reserve {FD_RESERVE} − {OVERFLOW_RESPONDERS} for refusals)"
    )]
    OverBudget {
        requested: usize,
        budget: usize,
        limit: u64,
    },
    #[error("--max-connections must be at least 1")]
    Zero,
    #[error("cannot read RLIMIT_NOFILE: {0}")]
    Read(String),
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (as far as
/// [`NOFILE_CEILING`]) and returns the soft limit in force afterwards.
pub fn raise_open_file_limit() -> Result<u64, FdBudgetError> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into `limit`, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(FdBudgetError::Read(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    let wanted = limit.rlim_max.min(NOFILE_CEILING);
    if limit.rlim_cur < wanted {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` from `raised`, which outlives the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(wanted);
        }
    }
    Ok(limit.rlim_cur)
}

/// The connection cap for a soft fd limit of `limit`: `requested` if it
/// fits the budget, else the budget up to [`DEFAULT_MAX_CONNECTIONS`].
pub fn connection_cap(limit: u64, requested: Option<usize>) -> Result<usize, FdBudgetError> {
    let spare = limit.saturating_sub(FD_RESERVE + OVERFLOW_RESPONDERS as u64);
    let budget = usize::try_from(spare).unwrap_or(usize::MAX);
    if budget == 0 {
        return Err(FdBudgetError::TooFew { limit });
    }
    match requested {
        Some(0) => Err(FdBudgetError::Zero),
        Some(n) if n > budget => Err(FdBudgetError::OverBudget {
            requested: n,
            budget,
            limit,
        }),
        Some(n) => Ok(n),
        None => Ok(budget.min(DEFAULT_MAX_CONNECTIONS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_reserve() {
        assert_eq!(connection_cap(1024, None), Ok(1024 - 64 - 32));
        assert_eq!(connection_cap(1 << 20, None), Ok(DEFAULT_MAX_CONNECTIONS));
        assert_eq!(connection_cap(1024, Some(8)), Ok(8));
        assert_eq!(
            connection_cap(96, None),
            Err(FdBudgetError::TooFew { limit: 96 })
        );
        assert_eq!(connection_cap(1024, Some(0)), Err(FdBudgetError::Zero));
        let over = connection_cap(1024, Some(5000)).unwrap_err();
        assert!(over.to_string().contains("5000"), "{over}");
        assert!(over.to_string().contains("RLIMIT_NOFILE 1024"), "{over}");
    }

    #[test]
    fn the_limit_is_read() {
        assert!(raise_open_file_limit().unwrap() > 0);
    }
}
