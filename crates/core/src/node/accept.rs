//! What an accept loop does after a failed `accept`: a connection-level failure (the peer
//! left before it was accepted) is skipped at once; running out of descriptors or memory
//! (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) pauses accepting, doubling the pause from
//! [`ACCEPT_BACKOFF_MIN`] up to [`ACCEPT_BACKOFF_MAX`], so the loop neither spins on an
//! error that repeats until a descriptor is freed nor gives up serving.

use std::io;
use std::time::Duration;

/// First pause after running out of descriptors or memory: 10 ms.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause: 1 s, so accepting resumes within a second of descriptors coming back.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What to do after an `accept` error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcceptStep {
    /// Accept the next connection now.
    Continue,
    /// Out of a resource: wait this long, then accept again.
    Pause(Duration),
}

/// The state of one accept loop's backoff.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    /// The pause to use next, `None` after a success.
    next: Option<Duration>,
}

impl AcceptBackoff {
    /// A connection was accepted: the next exhaustion starts from the shortest pause.
    pub fn accepted(&mut self) {
        self.next = None;
    }

    /// `accept` failed with `error`: what to do now.
    pub fn failed(&mut self, error: &io::Error) -> AcceptStep {
        let exhausted = matches!(
            error.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        );
        if !exhausted {
            return AcceptStep::Continue;
        }
        let pause = self.next.unwrap_or(ACCEPT_BACKOFF_MIN);
        self.next = Some((pause * 2).min(ACCEPT_BACKOFF_MAX));
        AcceptStep::Pause(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustion_pauses_doubling_to_a_bound_and_success_resets() {
        let mut backoff = AcceptBackoff::default();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let mut pauses = Vec::new();
        for _ in 0..10 {
            match backoff.failed(&emfile) {
                AcceptStep::Pause(pause) => pauses.push(pause),
                AcceptStep::Continue => panic!("EMFILE must pause"),
            }
        }
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(pauses[1], ACCEPT_BACKOFF_MIN * 2);
        assert!(pauses.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX);
        let enfile = io::Error::from_raw_os_error(libc::ENFILE);
        assert_eq!(
            backoff.failed(&enfile),
            AcceptStep::Pause(ACCEPT_BACKOFF_MAX)
        );
        backoff.accepted();
        assert_eq!(
            backoff.failed(&emfile),
            AcceptStep::Pause(ACCEPT_BACKOFF_MIN)
        );
    }

    #[test]
    fn a_connection_level_failure_is_skipped_at_once() {
        let mut backoff = AcceptBackoff::default();
        let aborted = io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert_eq!(backoff.failed(&aborted), AcceptStep::Continue);
    }
}
