//! The directory processes of a local cluster: the first directory and, with an election,
//! its standbys: which one leads, and killing, starting and watching each.

use super::{metric_value, scrape_metrics, LocalCluster};
use anyhow::Context as _;
use std::net::SocketAddr;
use std::process::Child;

/// A standby directory process of a local cluster.
pub(super) struct StandbyDirectory {
    /// Where it listens (one of `[directory] standbys`).
    pub(super) listen: SocketAddr,
    /// Where it serves metrics, if the cluster has metrics.
    pub(super) metrics: Option<SocketAddr>,
    pub(super) child: Option<Child>,
}

impl LocalCluster {
    /// Directory processes: the first directory (0) and its standbys (1 and on).
    pub fn directory_processes(&self) -> usize {
        1 + self.standbys.len()
    }

    /// The process id of directory process `index` (0: the first one), while it runs.
    pub fn directory_process_pid(&self, index: usize) -> Option<u32> {
        match index {
            0 => self.directory_pid(),
            _ => self.standbys.get(index - 1)?.child.as_ref().map(Child::id),
        }
    }

    /// The metrics address of directory process `index`.
    pub fn directory_process_metrics(&self, index: usize) -> Option<SocketAddr> {
        match index {
            0 => self.config.directory.metrics,
            _ => self.standbys.get(index - 1)?.metrics,
        }
    }

    /// Kills directory process `index` with SIGKILL and waits for it to die.
    pub fn kill_directory_process(&mut self, index: usize) -> anyhow::Result<()> {
        let child = match index {
            0 => self.directory.take(),
            _ => self
                .standbys
                .get_mut(index - 1)
                .context("no such directory process")?
                .child
                .take(),
        };
        if let Some(mut child) = child {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts directory process `index` (killed first if it runs): the first directory on
    /// `[directory] listen`, a standby on its own address. With an election, it stands by
    /// until it wins.
    pub fn start_directory_process(&mut self, index: usize) -> anyhow::Result<()> {
        self.kill_directory_process(index)?;
        if index == 0 {
            self.directory = Some(self.spawn(None, &["directory"])?);
            return Ok(());
        }
        let standby = self
            .standbys
            .get(index - 1)
            .context("no such directory process")?;
        let listen = standby.listen.to_string();
        let metrics = standby.metrics.map(|address| address.to_string());
        let mut arguments = vec!["directory", "--listen", &listen];
        if let Some(metrics) = &metrics {
            arguments.extend(["--metrics", metrics]);
        }
        let child = self.spawn_logged(None, &arguments, &format!("directory-{index}"))?;
        self.standbys[index - 1].child = Some(child);
        Ok(())
    }

    /// How directory process `index` exited, if it did (`None` while it runs or when it
    /// was not started here).
    pub fn directory_process_exit(&mut self, index: usize) -> Option<std::process::ExitStatus> {
        let child = match index {
            0 => self.directory.as_mut(),
            _ => self.standbys.get_mut(index - 1)?.child.as_mut(),
        }?;
        child.try_wait().ok().flatten()
    }

    /// The directory process that leads now, once exactly one says so in its metrics
    /// (`kvtier_directory_role{role="leader"}`), other than `other_than`.
    pub fn directory_leader(&self, other_than: Option<usize>) -> Option<usize> {
        let leading: Vec<usize> = (0..self.directory_processes())
            .filter(|index| Some(*index) != other_than)
            .filter(|index| {
                self.directory_process_metrics(*index)
                    .and_then(|address| scrape_metrics(address).ok())
                    .and_then(|body| metric_value(&body, "kvtier_directory_role{role=\"leader\"}"))
                    == Some(1.0)
            })
            .collect();
        match leading.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }
}
