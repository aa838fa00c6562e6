//! `LocalCluster`: a kvtier cluster of real processes on loopback (a directory and N nodes,
//! from the `kvtier` executable), for tests and benchmarks run from Python.

use crate::errors::KvtierError;
use kvtier::tools::{ClusterSpec, LocalCluster as Inner};
use kvtier::Medium;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// A local cluster: started on construction (waits until every node serves clients),
/// stopped and removed by `shutdown()`, `__exit__` or garbage collection.
#[pyclass(module = "kvtier._kvtier")]
pub(crate) struct LocalCluster {
    inner: Option<Inner>,
}

fn medium(name: &str) -> PyResult<Medium> {
    match name {
        "cpu" => Ok(Medium::Cpu),
        "cxl" => Ok(Medium::Cxl),
        other => Err(PyValueError::new_err(format!(
            "unknown medium {other:?} in write_order: cpu or cxl"
        ))),
    }
}

fn failed(error: impl std::fmt::Display) -> PyErr {
    KvtierError::new_err(error.to_string())
}

impl LocalCluster {
    fn inner(&mut self) -> PyResult<&mut Inner> {
        self.inner
            .as_mut()
            .ok_or_else(|| KvtierError::new_err("the cluster was shut down"))
    }
}

#[pymethods]
impl LocalCluster {
    /// Starts a directory and `nodes` nodes from the `kvtier` executable `exe`. Each node
    /// has a private CPU pool of `cpu_pool_bytes`; with `cxl_pool_bytes` > 0 every node also
    /// maps one shared (emulated) CXL pool, which is how nodes share objects. `write_order`
    /// is where stores go first. With `ssd_bytes` > 0 every node has an SSD store of that
    /// size (in the cluster's folder) that admits an object after `ssd_admit_after_accesses`.
    #[new]
    #[pyo3(signature = (
        exe, nodes=1, cpu_pool_bytes=64 << 20, cxl_pool_bytes=0, cxl_extent_bytes=4 << 20,
        page_bytes=64 << 10, write_order=None, ssd_bytes=0, ssd_admit_after_accesses=2
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        exe: PathBuf,
        nodes: usize,
        cpu_pool_bytes: u64,
        cxl_pool_bytes: u64,
        cxl_extent_bytes: u64,
        page_bytes: u64,
        write_order: Option<Vec<String>>,
        ssd_bytes: u64,
        ssd_admit_after_accesses: u32,
    ) -> PyResult<LocalCluster> {
        let mut spec = ClusterSpec {
            nodes,
            cpu_pool_bytes,
            cxl_pool_bytes,
            cxl_extent_bytes,
            page_bytes,
            ssd_bytes,
            ssd_admit_after_accesses,
            ..ClusterSpec::default()
        };
        if let Some(order) = write_order {
            spec.write_order = order
                .iter()
                .map(|name| medium(name))
                .collect::<PyResult<_>>()?;
        }
        let inner = py
            .allow_threads(|| Inner::start(&exe, &spec))
            .map_err(failed)?;
        Ok(LocalCluster { inner: Some(inner) })
    }

    /// The Unix socket of node `index`, for `Client.connect`.
    fn socket(&mut self, index: usize) -> PyResult<PathBuf> {
        self.inner()?.socket(index).map_err(failed)
    }

    /// `(name, "host:port")` of the metrics endpoint of the directory and of each node.
    fn metrics_addresses(&mut self) -> PyResult<Vec<(String, String)>> {
        Ok(self
            .inner()?
            .metrics_addresses()
            .into_iter()
            .map(|(name, address)| (name, address.to_string()))
            .collect())
    }

    /// The cluster's folder (configuration and logs).
    #[getter]
    fn root(&mut self) -> PyResult<PathBuf> {
        Ok(self.inner()?.root.clone())
    }

    /// Kills node `index` with SIGKILL and waits for it to die.
    fn kill_node(&mut self, py: Python<'_>, index: usize) -> PyResult<()> {
        let inner = self.inner()?;
        py.allow_threads(|| inner.kill_node(index)).map_err(failed)
    }

    /// Starts node `index` again (a new epoch) and waits until it serves clients.
    fn restart_node(&mut self, py: Python<'_>, index: usize) -> PyResult<()> {
        let inner = self.inner()?;
        py.allow_threads(|| inner.restart_node(index))
            .map_err(failed)
    }

    /// Stops every process and removes what the cluster created; returns what could not be
    /// removed (empty: everything is gone).
    fn shutdown(&mut self, py: Python<'_>) -> Vec<String> {
        match self.inner.take() {
            Some(inner) => py.allow_threads(|| inner.shutdown()),
            None => Vec::new(),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.shutdown(py);
        false
    }
}
