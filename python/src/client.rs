//! `Client`, `Namespace`, `Probe` and `Loaded`: the Python face of [`kvtier::Client`].

use crate::buffer::{ensure_distinct, Buffer};
use crate::errors::{self, LeaseExpired};
use crate::jobs::{JobKind, Jobs};
use crate::keys;
use crate::leased::LeasedBytes;
use crate::runtime;
use crate::ssd::SsdPin;
use kvtier::{
    AcquireMode, Client as Inner, KvDtype, LoadedView, Medium, NamespaceDescriptor, NamespaceId,
    NodeRun, ObjectId, ProbeOutcome, StoreOutcome,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::path::PathBuf;
use std::sync::Arc;

/// The status of a store, as Python sees it: a skip is a status, never an error.
pub(crate) fn store_status(outcome: StoreOutcome) -> &'static str {
    match outcome {
        StoreOutcome::Stored => "stored",
        StoreOutcome::AlreadyPresent => "already_present",
        StoreOutcome::Pending => "pending",
        StoreOutcome::Skipped(_) => "skipped",
    }
}

fn medium_name(medium: Medium) -> &'static str {
    match medium {
        Medium::Cpu => "cpu",
        Medium::Cxl => "cxl",
        Medium::Ssd => "ssd",
    }
}

fn kv_dtype(name: &str) -> PyResult<KvDtype> {
    Ok(match name.trim_start_matches("torch.") {
        "float32" | "fp32" => KvDtype::Float32,
        "float16" | "fp16" | "half" => KvDtype::Float16,
        "bfloat16" | "bf16" => KvDtype::BFloat16,
        "float8_e4m3" | "float8_e4m3fn" | "fp8_e4m3" | "fp8" => KvDtype::Float8E4M3,
        "float8_e5m2" | "fp8_e5m2" => KvDtype::Float8E5M2,
        "int8" => KvDtype::Int8,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown kv_dtype {other:?}: one of float32, float16, bfloat16, \
                 float8_e4m3, float8_e5m2, int8"
            )))
        }
    })
}

/// A registered namespace: the compatibility boundary of cached KV state (model, revision,
/// dtype, geometry). Objects are named by a key within a namespace.
#[pyclass(frozen, module = "kvtier._kvtier")]
#[derive(Clone)]
pub(crate) struct Namespace {
    pub(crate) id: NamespaceId,
}

#[pymethods]
impl Namespace {
    /// The namespace's 16-byte id (equal descriptors give equal ids on every host).
    #[getter]
    fn id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.id.0)
    }

    fn __repr__(&self) -> String {
        format!("Namespace({:?})", self.id)
    }
}

/// What a probe found for one key.
#[pyclass(frozen, get_all, name = "Probe", module = "kvtier._kvtier")]
pub(crate) struct ProbeResult {
    /// `"hit"`, `"pending"` (being written), `"miss"` or `"on_ssd"` (only the node's SSD
    /// holds it: `prefetch` restores it).
    state: &'static str,
    /// For a hit, the cheapest medium holding it (`"cpu"`, `"cxl"`); `"ssd"` when on SSD.
    medium: Option<&'static str>,
    /// For a hit or on SSD, the object's length in bytes.
    length: Option<u64>,
}

#[pymethods]
impl ProbeResult {
    fn __repr__(&self) -> String {
        match (self.medium, self.length) {
            (Some(medium), Some(length)) => {
                format!("Probe({}, {medium}, {length} bytes)", self.state)
            }
            _ => format!("Probe({})", self.state),
        }
    }
}

/// One node's run in a `locate` answer.
#[pyclass(frozen, get_all, name = "NodeRun", module = "kvtier._kvtier")]
pub(crate) struct NodeRunResult {
    /// The node's name, as `cluster.toml` declares it.
    node: String,
    /// Leading keys of the asked prefix the node can load without a network transfer.
    chunks: u32,
    /// Of those, from its CPU pool, a CXL pool, its SSD.
    cpu: u32,
    cxl: u32,
    ssd: u32,
}

#[pymethods]
impl NodeRunResult {
    fn __repr__(&self) -> String {
        format!(
            "NodeRun({}, {} chunks: {} cpu, {} cxl, {} ssd)",
            self.node, self.chunks, self.cpu, self.cxl, self.ssd
        )
    }
}

impl From<NodeRun> for NodeRunResult {
    fn from(run: NodeRun) -> NodeRunResult {
        NodeRunResult {
            node: run.node,
            chunks: run.chunks,
            cpu: run.cpu,
            cxl: run.cxl,
            ssd: run.ssd,
        }
    }
}

impl From<ProbeOutcome> for ProbeResult {
    fn from(outcome: ProbeOutcome) -> ProbeResult {
        match outcome {
            ProbeOutcome::Hit {
                medium,
                length_bytes,
            } => ProbeResult {
                state: "hit",
                medium: Some(medium_name(medium)),
                length: Some(length_bytes),
            },
            ProbeOutcome::Pending => ProbeResult {
                state: "pending",
                medium: None,
                length: None,
            },
            ProbeOutcome::Miss => ProbeResult {
                state: "miss",
                medium: None,
                length: None,
            },
            ProbeOutcome::OnSsd { length_bytes } => ProbeResult {
                state: "on_ssd",
                medium: Some("ssd"),
                length: Some(length_bytes),
            },
        }
    }
}

/// A connection to the local kvtier node, with the node's pools mapped into this process.
/// Every call releases the GIL while it waits for the node or copies bytes.
#[pyclass(frozen, module = "kvtier._kvtier")]
pub(crate) struct Client {
    inner: Inner,
    jobs: Arc<Jobs>,
}

#[pymethods]
impl Client {
    /// Connects to the node serving the Unix socket `socket_path` and maps its pools.
    #[staticmethod]
    fn connect(py: Python<'_>, socket_path: PathBuf) -> PyResult<Client> {
        let runtime = runtime()?;
        let inner = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), Inner::connect(&socket_path)))
            .map_err(errors::to_py)?;
        Ok(Client {
            inner,
            jobs: Arc::new(Jobs::default()),
        })
    }

    /// The node's name-independent id and epoch, as `(node, epoch)` integers.
    #[getter]
    fn node(&self) -> (u64, u64) {
        let (node, epoch) = self.inner.node();
        (u64::from(node.0), epoch.0)
    }

    /// Registers (or finds) the namespace of a model's KV state and returns it. Every field
    /// takes part in the id: engines share objects only when all are equal.
    #[pyo3(signature = (
        model, revision, kv_dtype, layers, kv_heads, head_dim, block_tokens,
        chunk_tokens=None, tensor_parallel=1, pipeline_parallel=1, adapter=None,
        quantization=None, format_version=1
    ))]
    #[allow(clippy::too_many_arguments)]
    fn register_namespace(
        &self,
        py: Python<'_>,
        model: String,
        revision: String,
        kv_dtype: &str,
        layers: u32,
        kv_heads: u32,
        head_dim: u32,
        block_tokens: u32,
        chunk_tokens: Option<u32>,
        tensor_parallel: u32,
        pipeline_parallel: u32,
        adapter: Option<String>,
        quantization: Option<String>,
        format_version: u32,
    ) -> PyResult<Namespace> {
        let descriptor = NamespaceDescriptor {
            model,
            revision,
            adapter,
            kv_dtype: self::kv_dtype(kv_dtype)?,
            quantization,
            layers,
            kv_heads,
            head_dim,
            block_tokens,
            format_version,
            chunk_tokens: chunk_tokens.unwrap_or(block_tokens),
            tensor_parallel,
            pipeline_parallel,
            salt: None,
        };
        descriptor
            .id()
            .map_err(|error| PyValueError::new_err(error.to_string()))?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let id = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), inner.register_namespace(descriptor)))
            .map_err(errors::to_py)?;
        Ok(Namespace { id })
    }

    /// Stores `buffer` (any C-contiguous buffer: bytes, bytearray, memoryview, numpy array,
    /// CPU torch tensor as numpy) under `key`, copying it straight into the node's pool.
    /// Returns `"stored"`, `"already_present"`, `"pending"` or `"skipped"` (no room: a
    /// skip is not an error).
    fn store(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        key: &Bound<'_, PyBytes>,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<&'static str> {
        let object = keys::object(namespace.id, key)?;
        let buffer = Buffer::get(buffer, false)?;
        let span = buffer.span();
        let runtime = runtime()?;
        let inner = &self.inner;
        let outcome = py.allow_threads(|| {
            // SAFETY: `buffer` holds the export until after this closure; nothing writes it.
            kvtier::block_on(runtime.handle(), inner.store(object, unsafe { span.bytes() }))
        });
        drop(buffer);
        outcome.map(store_status).map_err(errors::to_py)
    }

    /// Stores several buffers; one status per key, in order. The keys are reserved in
    /// groups of up to 64 keys and 32 MiB (a larger buffer alone), one round trip each, and
    /// committed per 8 MiB as their copies finish, pipelined: this thread copies while
    /// kvtier's threads reserve the next group and commit what was copied. A full pool skips only the keys past its
    /// room. The first error (if any) is raised after every store finished.
    fn store_many(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<&'static str>> {
        let objects =
            same_length(&keys, &buffers).and_then(|_| keys::objects(namespace.id, &keys))?;
        let buffers = buffers
            .iter()
            .map(|buffer| Buffer::get(buffer, false))
            .collect::<PyResult<Vec<_>>>()?;
        let spans: Vec<_> = buffers.iter().map(Buffer::span).collect();
        let runtime = runtime()?;
        let inner = &self.inner;
        let outcomes = py.allow_threads(|| {
            let items: Vec<_> = objects
                .iter()
                .zip(&spans)
                // SAFETY: `buffers` holds every export until after this closure.
                .map(|(object, span)| (*object, unsafe { span.bytes() }))
                .collect();
            inner.store_many_blocking(runtime.handle(), &items)
        });
        drop(buffers);
        outcomes
            .into_iter()
            .map(|outcome| outcome.map(store_status).map_err(errors::to_py))
            .collect()
    }

    /// Which keys are cached where this node can read them (reserves nothing).
    fn probe(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Vec<ProbeResult>> {
        let objects = keys::objects(namespace.id, &keys)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let outcomes = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), inner.probe(&objects)))
            .map_err(errors::to_py)?;
        Ok(outcomes.into_iter().map(ProbeResult::from).collect())
    }

    /// For each node of the cluster, how many leading `keys` (a prompt's chunks, in order)
    /// it can load without a network transfer, longest first (for a router); empty while
    /// the directory is out of reach.
    fn locate(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Vec<NodeRunResult>> {
        let objects = keys::objects(namespace.id, &keys)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let runs = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), inner.locate(&objects)))
            .map_err(errors::to_py)?;
        Ok(runs.into_iter().map(NodeRunResult::from).collect())
    }

    /// Starts restoring the keys only the node's SSD holds (a probe's `"on_ssd"`) into its
    /// memory pool and returns at once with how many restores it started; a later load of
    /// them waits for the restores still under way.
    fn prefetch(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<u32> {
        let objects = keys::objects(namespace.id, &keys)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        py.allow_threads(|| kvtier::block_on(runtime.handle(), inner.prefetch(&objects)))
            .map_err(errors::to_py)
    }

    /// Pins the objects of `keys` in place on the node's SSD and says where their bytes
    /// lie (an `SsdPin` per key, None for one its SSD store does not hold), for a reader that
    /// reads the files itself (GPUDirect Storage). At most 64 keys a call. End the pins with
    /// `unpin_on_ssd`.
    fn pin_on_ssd(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Vec<Option<SsdPin>>> {
        let objects = keys::objects(namespace.id, &keys)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let extents = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), inner.pin_on_ssd(&objects)))
            .map_err(errors::to_py)?;
        Ok(extents
            .into_iter()
            .map(|extent| extent.map(SsdPin::from))
            .collect())
    }

    /// Ends pins `pin_on_ssd` gave (their `pin` ids); returns how many it ended.
    fn unpin_on_ssd(&self, py: Python<'_>, pins: Vec<u64>) -> PyResult<u32> {
        let runtime = runtime()?;
        let inner = &self.inner;
        py.allow_threads(|| kvtier::block_on(runtime.handle(), inner.unpin_on_ssd(&pins)))
            .map_err(errors::to_py)
    }

    /// Copies the objects of `keys` into `buffers` (writable C-contiguous buffers: bytearray,
    /// memoryview, numpy arrays, CPU torch tensors as numpy; each at least the object's
    /// length), straight from the pools, and gives the leases back. Returns one bool per
    /// key: whether it was a hit. Any number of keys: they go in batches of up to 64 keys
    /// and 32 MiB of buffers, this thread copying one while kvtier's threads lease the next.
    fn load_into(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<bool>> {
        let objects =
            same_length(&keys, &buffers).and_then(|_| keys::objects(namespace.id, &keys))?;
        let buffers = buffers
            .iter()
            .map(|buffer| Buffer::get(buffer, true))
            .collect::<PyResult<Vec<_>>>()?;
        let spans: Vec<_> = buffers.iter().map(Buffer::span).collect();
        ensure_distinct(&spans)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let hits = py.allow_threads(|| {
            // SAFETY: `buffers` holds every (writable) export until after this closure,
            // and no two spans share a byte (checked above).
            let mut targets: Vec<&mut [u8]> = spans
                .iter()
                .map(|span| unsafe { span.bytes_mut() })
                .collect();
            inner.load_into_blocking(runtime.handle(), &objects, &mut targets)
        });
        drop(buffers);
        hits.map_err(errors::to_py)
    }

    /// Leases the objects of `keys` and returns a `Loaded`: a context manager whose items
    /// are read-only memoryviews straight over the pool memory (None for a miss). The
    /// leases and views are released on `__exit__`, `release()` or garbage collection.
    fn load(
        &self,
        py: Python<'_>,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Loaded> {
        let objects = keys::objects(namespace.id, &keys)?;
        let runtime = runtime()?;
        let inner = &self.inner;
        let views = py
            .allow_threads(|| kvtier::block_on(runtime.handle(), inner.load(&objects, AcquireMode::Each)))
            .map_err(errors::to_py)?;
        Loaded::new(py, views)
    }

    /// Starts storing `buffer` under `key` on kvtier's threads and returns the job's id at
    /// once; `poll()` gives its status. The buffer is held (and must not change) until its
    /// completion was polled. Raises `Busy` past `JOBS_INFLIGHT_MAX` unpolled jobs.
    fn submit_store(
        &self,
        namespace: &Namespace,
        key: &Bound<'_, PyBytes>,
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let object = keys::object(namespace.id, key)?;
        let buffer = Buffer::get(buffer, false)?;
        self.jobs.submit(
            runtime()?,
            &self.inner,
            JobKind::Store(object),
            vec![buffer],
        )
    }

    /// Starts storing several buffers (pipelined) on kvtier's threads and returns the job's
    /// id at once; `poll()` gives a list with one status (or exception) per key.
    fn submit_store_many(
        &self,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.submit_buffers(namespace, &keys, &buffers, false, JobKind::StoreMany)
    }

    /// Starts loading the objects of `keys` into `buffers` on kvtier's threads and returns
    /// the job's id at once; `poll()` gives the hits. The buffers must not be touched until
    /// the completion was polled. Raises `Busy` past `JOBS_INFLIGHT_MAX` unpolled jobs.
    fn submit_load_into(
        &self,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        self.submit_buffers(namespace, &keys, &buffers, true, JobKind::LoadInto)
    }

    /// Starts probing `keys` on kvtier's threads and returns the job's id at once; `poll()`
    /// gives the list of `Probe`s. For callers that must not block even on a round trip.
    fn submit_probe(&self, namespace: &Namespace, keys: Vec<Bound<'_, PyBytes>>) -> PyResult<u64> {
        let objects = keys::objects(namespace.id, &keys)?;
        self.jobs
            .submit(runtime()?, &self.inner, JobKind::Probe(objects), Vec::new())
    }

    /// Starts a prefetch (see `prefetch`) without blocking; returns the job id, whose result
    /// is the number of restores started.
    fn submit_prefetch(
        &self,
        namespace: &Namespace,
        keys: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<u64> {
        let objects = keys::objects(namespace.id, &keys)?;
        self.jobs.submit(
            runtime()?,
            &self.inner,
            JobKind::Prefetch(objects),
            Vec::new(),
        )
    }

    /// Finished jobs, as `(job_id, result)` pairs: a store's status string, a load's list
    /// of hits (a store_many's list of statuses, a probe's list of `Probe`s, a prefetch's
    /// count of restores started), or the exception it failed with. Waits up to `timeout` seconds (0: never)
    /// for the first one, without the GIL; returns at most `max` (None: all finished).
    #[pyo3(signature = (timeout=0.0, max=None))]
    fn poll<'py>(
        &self,
        py: Python<'py>,
        timeout: f64,
        max: Option<usize>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.jobs.poll(py, timeout, max)
    }

    /// Jobs submitted and not yet polled.
    #[getter]
    fn inflight(&self) -> usize {
        self.jobs.inflight()
    }
}

impl Client {
    /// Starts a job over `buffers` (one per key, `writable` for loads into them) on kvtier's
    /// threads and returns its id: the shared body of `submit_store_many` and
    /// `submit_load_into`.
    fn submit_buffers(
        &self,
        namespace: &Namespace,
        keys: &[Bound<'_, PyBytes>],
        buffers: &[Bound<'_, PyAny>],
        writable: bool,
        kind: fn(Vec<ObjectId>) -> JobKind,
    ) -> PyResult<u64> {
        let objects = same_length(keys, buffers).and_then(|_| keys::objects(namespace.id, keys))?;
        let buffers = buffers
            .iter()
            .map(|buffer| Buffer::get(buffer, writable))
            .collect::<PyResult<Vec<_>>>()?;
        if writable {
            ensure_distinct(&buffers.iter().map(Buffer::span).collect::<Vec<_>>())?;
        }
        self.jobs
            .submit(runtime()?, &self.inner, kind(objects), buffers)
    }
}

fn same_length(keys: &[Bound<'_, PyBytes>], buffers: &[Bound<'_, PyAny>]) -> PyResult<()> {
    if keys.len() != buffers.len() {
        return Err(PyValueError::new_err(format!(
            "{} keys but {} buffers",
            keys.len(),
            buffers.len()
        )));
    }
    Ok(())
}

/// Leased objects: read-only memoryviews straight over pool memory, valid until released.
/// Use it as a context manager (`with client.load(ns, keys) as views:`); on exit (or on
/// `release()`, or garbage collection) each view is released and its lease given back. A
/// view derived from one (a slice, a cast, a numpy array) keeps its object's lease and pool
/// mapping until the derived view is gone: it reads the object's bytes, never unmapped
/// memory; do not keep one past the block (the lease still ends at its deadline).
#[pyclass(module = "kvtier._kvtier")]
pub(crate) struct Loaded {
    leased: Vec<Option<Py<LeasedBytes>>>,
    views: Vec<Option<Py<PyAny>>>,
}

impl Loaded {
    fn new(py: Python<'_>, leases: Vec<Option<LoadedView>>) -> PyResult<Loaded> {
        let (mut leased, mut views) = (Vec::new(), Vec::new());
        for lease in leases {
            let Some(lease) = lease else {
                leased.push(None);
                views.push(None);
                continue;
            };
            let bytes = Py::new(py, LeasedBytes::new(lease)?)?;
            // SAFETY: a new reference or null with an exception set.
            let view = unsafe {
                Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyMemoryView_FromObject(bytes.as_ptr()))
            }?;
            leased.push(Some(bytes));
            views.push(Some(view.unbind()));
        }
        Ok(Loaded { leased, views })
    }

    fn release_all(&mut self, py: Python<'_>) {
        for (view, leased) in self.views.drain(..).zip(self.leased.drain(..)) {
            if let Some(view) = view {
                // A view with exports of its own (`np.frombuffer(view)`) refuses: its
                // export, like any derived view's, ends the lease when it goes.
                let _ = view.call_method0(py, "release");
            }
            if let Some(leased) = leased {
                leased.get().end();
            }
        }
    }
}

#[pymethods]
impl Loaded {
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release_all(py);
        false
    }

    /// Releases every view and lease now.
    fn release(&mut self, py: Python<'_>) {
        self.release_all(py);
    }

    fn __len__(&self) -> usize {
        self.views.len()
    }

    fn __getitem__(&self, py: Python<'_>, index: isize) -> PyResult<Option<Py<PyAny>>> {
        let length = self.views.len() as isize;
        let position = if index < 0 { index + length } else { index };
        if position < 0 || position >= length {
            return Err(pyo3::exceptions::PyIndexError::new_err("no such view"));
        }
        let index = position as usize;
        if let Some(Some(leased)) = self.leased.get(index) {
            if !leased.get().is_valid() {
                return Err(LeaseExpired::new_err("the lease of this view has expired"));
            }
        }
        Ok(self.views[index].as_ref().map(|view| view.clone_ref(py)))
    }

    /// Whether each view's lease still protects its bytes (False for a miss or once released).
    fn valid(&self) -> Vec<bool> {
        (0..self.views.len())
            .map(|index| matches!(self.leased.get(index), Some(Some(leased)) if leased.get().is_valid()))
            .collect()
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        Python::with_gil(|py| self.release_all(py));
    }
}
