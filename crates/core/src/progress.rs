//! Progress of long work, on stderr. A tool (`replay`, `bench`, `sim`) draws an indicatif
//! bar when stderr is a terminal and it prints text; with `--json`, or when stderr is not a
//! terminal, it shows nothing, so scripts and logs see only the result. A service (a node
//! pre-faulting its pool) has no terminal: it logs a line through `tracing` at most every
//! [`LOG_INTERVAL`] instead.

use indicatif::{ProgressBar, ProgressStyle};
use std::cell::Cell;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a service logs its progress: often enough that an operator watching the
/// journal sees it move, rarely enough not to flood it.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);
/// How often a bar is redrawn at most (indicatif's own limit is 20 a second).
const BAR_REFRESH_PER_SECOND: u8 = 10;

/// What a progress counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Requests, seeds, seconds: plain numbers.
    Items,
    Bytes,
}

/// One piece of long work's progress; dropping it clears its bar.
pub struct Progress {
    bar: Option<ProgressBar>,
    log: Option<Log>,
}

/// The periodic log line of a service.
struct Log {
    name: String,
    total: u64,
    unit: Unit,
    last: Cell<Instant>,
}

impl Progress {
    /// A bar for `total` units of a tool's work named `name`, drawn only when stderr is a
    /// terminal and `json` is false.
    pub fn bar(name: &str, total: u64, unit: Unit, json: bool) -> Progress {
        let bar = drawn(json).then(|| {
            let template = match unit {
                Unit::Items => "{prefix:>14} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
                Unit::Bytes => {
                    "{prefix:>14} [{bar:30}] {bytes}/{total_bytes} {msg} ({elapsed}, eta {eta})"
                }
            };
            let bar = ProgressBar::with_draw_target(Some(total), draw_target());
            bar.set_style(style(template));
            bar.set_prefix(name.to_owned());
            bar
        });
        Progress { bar, log: None }
    }

    /// A phase of unknown length (a benchmark's step): a spinner with its name and the time
    /// it has taken, drawn only when stderr is a terminal and `json` is false.
    pub fn phase(name: &str, json: bool) -> Progress {
        let bar = drawn(json).then(|| {
            let bar = ProgressBar::with_draw_target(None, draw_target());
            bar.set_style(style("{spinner} {prefix} {msg} ({elapsed})"));
            bar.set_prefix(name.to_owned());
            bar.enable_steady_tick(Duration::from_millis(
                1000 / u64::from(BAR_REFRESH_PER_SECOND),
            ));
            bar
        });
        Progress { bar, log: None }
    }

    /// A service's progress: a `tracing` line at most every [`LOG_INTERVAL`] (and at the
    /// end), and a bar as well when stderr is a terminal.
    pub fn logged(name: &str, total: u64, unit: Unit) -> Progress {
        let mut progress = Progress::bar(name, total, unit, false);
        progress.log = Some(Log {
            name: name.to_owned(),
            total,
            unit,
            last: Cell::new(Instant::now()),
        });
        progress
    }

    /// Sets how much is done.
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
        }
        if let Some(log) = &self.log {
            if log.last.get().elapsed() >= LOG_INTERVAL {
                log.last.set(Instant::now());
                log.line(done);
            }
        }
    }

    /// Sets the text shown after the count (a hit ratio so far, the restarts so far).
    pub fn message(&self, text: String) {
        if let Some(bar) = &self.bar {
            bar.set_message(text);
        }
    }

    /// Ends the work: clears the bar; a service logs its last line.
    pub fn finish(self) {
        if let Some(log) = &self.log {
            log.line(log.total);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Log {
    fn line(&self, done: u64) {
        let percent = done.min(self.total) as f64 * 100.0 / self.total.max(1) as f64;
        match self.unit {
            Unit::Bytes => tracing::info!(
                what = %self.name,
                done_bytes = done,
                total_bytes = self.total,
                "{percent:.0}% done"
            ),
            Unit::Items => tracing::info!(
                what = %self.name,
                done,
                total = self.total,
                "{percent:.0}% done"
            ),
        }
    }
}

/// Whether a bar is drawn: text output to a terminal.
fn drawn(json: bool) -> bool {
    !json && std::io::stderr().is_terminal()
}

fn draw_target() -> indicatif::ProgressDrawTarget {
    indicatif::ProgressDrawTarget::stderr_with_hz(BAR_REFRESH_PER_SECOND)
}

/// A style from one of this module's templates (constants, so parsing cannot fail on
/// input; a broken template falls back to indicatif's default).
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .map(|style| style.progress_chars("#>-"))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse() {
        for template in [
            "{prefix:>14} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
            "{prefix:>14} [{bar:30}] {bytes}/{total_bytes} {msg} ({elapsed}, eta {eta})",
            "{spinner} {prefix} {msg} ({elapsed})",
        ] {
            assert!(ProgressStyle::with_template(template).is_ok(), "{template}");
        }
    }

    #[test]
    fn bars_only_on_a_terminal_never_with_json_and_a_service_counts() {
        let terminal = std::io::stderr().is_terminal();
        let quiet = Progress::bar("replay", 10, Unit::Items, false);
        assert_eq!(quiet.bar.is_some(), terminal);
        quiet.set(5);
        quiet.finish();
        let json = Progress::phase("bench", true);
        assert!(json.bar.is_none());
        let service = Progress::logged("pre-fault", 1 << 20, Unit::Bytes);
        assert!(service.log.is_some());
        service.set(1 << 19);
        service.finish();
    }
}
