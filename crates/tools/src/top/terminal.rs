//! The terminal while `kvtier top` runs: raw mode and the alternate screen, given back on
//! every way out — `q`, Ctrl-C (a key in raw mode), SIGINT, SIGTERM and SIGHUP (a lost
//! SSH connection), an error, and a panic (ratatui's hook restores first).

use super::view::Key;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::DefaultTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The terminal in raw mode on the alternate screen; dropping it restores the terminal.
pub struct TerminalGuard {
    pub terminal: DefaultTerminal,
}

impl TerminalGuard {
    /// Enters raw mode and the alternate screen, and installs the panic hook that leaves
    /// them before the panic is reported.
    pub fn enter() -> std::io::Result<TerminalGuard> {
        Ok(TerminalGuard {
            terminal: ratatui::try_init()?,
        })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// What came in while waiting.
pub enum Input {
    Key(Key),
    /// The terminal changed size: draw again.
    Resized,
    Nothing,
}

/// Waits at most `timeout` for a key press or a resize.
pub fn next_input(timeout: Duration) -> std::io::Result<Input> {
    if !event::poll(timeout)? {
        return Ok(Input::Nothing);
    }
    Ok(match event::read()? {
        Event::Key(key) if key.kind == KeyEventKind::Press => Input::Key(match key.code {
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Key::Interrupt,
            KeyCode::Char(character) => Key::Char(character),
            KeyCode::Tab => Key::Tab,
            KeyCode::Esc => Key::Escape,
            _ => Key::Other,
        }),
        Event::Resize(..) => Input::Resized,
        _ => Input::Nothing,
    })
}

/// A flag raised when the process receives SIGINT, SIGTERM or SIGHUP, set by a thread that
/// waits for them.
pub fn stop_signal() -> anyhow::Result<Arc<AtomicBool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut interrupt, mut terminate, mut hangup) = runtime.block_on(async {
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        ))
    })?;
    let raised = Arc::new(AtomicBool::new(false));
    let flag = raised.clone();
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
                _ = hangup.recv() => {}
            }
        });
        flag.store(true, Ordering::Relaxed);
    });
    Ok(raised)
}
