//! `kvtier._kvtier`: the Python binding of [`kvtier::Client`] (PyO3, abi3, Python >= 3.10).
//!
//! One tokio runtime serves every client of the process. Every call that copies bytes or
//! waits for the node releases the GIL first; copies go straight between the caller's buffer
//! (through the buffer protocol) and the node's mapped pools, never through a Rust copy.

mod buffer;
mod client;
mod cluster;
mod errors;
mod jobs;
mod keys;
mod leased;
mod ssd;

use buffer::Buffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::OnceLock;

/// Worker threads of the shared runtime: the copies run on the callers' threads (or, for
/// submitted jobs, on these), and the round trips need little.
const RUNTIME_WORKERS: usize = 2;

/// The process's one tokio runtime, started on first use.
pub(crate) fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(RUNTIME_WORKERS)
                .thread_name("kvtier")
                .enable_all()
                .build()
                .map_err(|error| error.to_string())
        })
        .as_ref()
        .map_err(|error| errors::KvtierError::new_err(format!("starting the runtime: {error}")))
}

/// Copies `source` into the start of `target` (a writable buffer at least as long; the two
/// must not overlap) with kvtier's streaming routine (non-temporal stores), without the
/// GIL: the streaming-copy limit `python -m kvtier.bench` measures beside numpy's copy.
#[pyfunction]
fn copy_streaming(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    target: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let source = Buffer::get(source, false)?;
    let target = Buffer::get(target, true)?;
    let (from, to) = (source.span(), target.span());
    if target.len() < source.len() || from.overlaps(to) {
        return Err(PyValueError::new_err(
            "the target must be at least as long as the source and must not overlap it",
        ));
    }
    py.allow_threads(|| {
        // SAFETY: both exports live until after this closure, the target's is writable,
        // and the two ranges do not overlap (checked above).
        let (from, to) = unsafe { (from.bytes(), to.bytes_mut()) };
        kvtier::tools::copy_streaming(from, to);
    });
    Ok(())
}

/// The copy routines this process uses, `{"store": name, "load": name}` (`memcpy` or
/// `streaming`), chosen by a short measurement on the first call (or by
/// `KVTIER_COPY_ROUTINE`): what `python -m kvtier.bench` reports beside its figures.
#[pyfunction]
fn copy_routines(py: Python<'_>) -> std::collections::HashMap<&'static str, &'static str> {
    let routines = py.allow_threads(kvtier::tools::routines);
    [
        ("store", routines.store.name()),
        ("load", routines.load.name()),
    ]
    .into()
}

/// Runs the `kvtier` command line `argv` (the program's name first) in this process, as
/// the `kvtier` binary does, with the GIL released; its exit status (an error is printed
/// as the binary prints it). The package's `kvtier` script calls it.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(
        || match kvtier::tools::run_command_line(argv.into_iter().map(Into::into)) {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("Error: {error:?}");
                1
            }
        },
    )
}

/// The extension module.
#[pymodule]
fn _kvtier(module: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(module)?;
    module.add_class::<client::Client>()?;
    module.add_class::<client::Namespace>()?;
    module.add_class::<client::ProbeResult>()?;
    module.add_class::<client::NodeRunResult>()?;
    module.add_class::<client::Loaded>()?;
    module.add_class::<leased::LeasedBytes>()?;
    module.add_class::<cluster::LocalCluster>()?;
    module.add_class::<ssd::SsdPin>()?;
    module.add_function(wrap_pyfunction!(keys::prefix_digest, module)?)?;
    module.add_function(wrap_pyfunction!(copy_streaming, module)?)?;
    module.add_function(wrap_pyfunction!(copy_routines, module)?)?;
    module.add_function(wrap_pyfunction!(run_cli, module)?)?;
    module.add("JOBS_INFLIGHT_MAX", jobs::JOBS_INFLIGHT_MAX)?;
    Ok(())
}
