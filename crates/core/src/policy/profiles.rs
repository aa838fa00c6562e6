//! Tier profiles: the physical character of each storage tier (latency, bandwidth,
//! capacity, addressability, coherence, persistence, sharing), and the representative
//! defaults used until a node measures its own pools.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::Medium;

/// The kinds of tier kvtier knows, hottest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TierKind {
    /// GPU HBM: the engine's own cache; kvtier never places there, it is modelled for reads.
    GpuHbm,
    /// CPU DRAM on the engine's NUMA node.
    Dram,
    /// CPU DRAM on a remote NUMA node of the same host.
    NumaFarDram,
    /// CXL-attached memory, mapped by every host of its sharing domain.
    Cxl,
    /// Local NVMe SSD: staged, persistent, wear-limited.
    Ssd,
    /// Another host's memory, reached over the network.
    Remote,
}

/// How a tier's bytes can be shared without a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareKind {
    /// Private to one process (GPU memory without IPC handles).
    Private,
    /// Shared by the processes of one host through a shared mapping.
    Host,
    /// Shared by every host of a CXL sharing domain through the same mapping.
    Domain,
    /// Not mappable: bytes are copied through an I/O path (block device, network).
    Copy,
}

/// The measured or representative character of one tier.
///
/// Contract: bandwidths are positive; a profile built by [`TierProfile::representative`]
/// satisfies this, and [`TierProfile::validate`] checks profiles read from elsewhere.
#[derive(Clone, Debug, PartialEq)]
pub struct TierProfile {
    /// Which tier this profile describes.
    pub kind: TierKind,
    /// Latency of the first byte of a read, in microseconds.
    pub read_latency_us: f64,
    /// Sustained read bandwidth into the engine, in bytes per second.
    pub read_bandwidth_bytes_per_s: f64,
    /// Sustained write (stage-in) bandwidth, in bytes per second.
    pub write_bandwidth_bytes_per_s: f64,
    /// Capacity of the tier, in bytes.
    pub capacity_bytes: u64,
    /// Loads and stores reach it at byte granularity (no block I/O).
    pub byte_addressable: bool,
    /// Caches of every reader stay coherent with it.
    pub coherent: bool,
    /// Its content survives a restart of the process or host.
    pub persistent: bool,
    /// Whether writes wear it out, so admission must be selective.
    pub wear_limited: bool,
    /// How its bytes are shared without a copy.
    pub share_kind: ShareKind,
}

/// Why a profile was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProfileError {
    /// A bandwidth or latency is zero, negative or not finite; the caller fixes the
    /// override or keeps the representative default.
    #[error("tier {kind}: {field} must be a positive finite number")]
    NotPositive {
        /// The tier whose profile is wrong.
        kind: TierKind,
        /// The offending field's name.
        field: &'static str,
    },
    /// The tier name is not one of `gpu`, `dram`, `numa`, `cxl`, `ssd`, `remote`.
    #[error("unknown tier {0:?} (expected gpu, dram, numa, cxl, ssd or remote)")]
    UnknownTier(String),
}

const GIB: u64 = 1024 * 1024 * 1024;

/// The representative figures of `kind` ([`TierProfile::representative`]): read latency
/// in microseconds, read and write bandwidths in bytes per second (all positive), and
/// capacity in bytes.
fn representative_figures(kind: TierKind) -> (f64, f64, f64, u64) {
    match kind {
        TierKind::GpuHbm => (1.0, 2.0e12, 2.0e12, 80 * GIB),
        TierKind::Dram => (0.1, 11.0e9, 11.0e9, 256 * GIB),
        TierKind::NumaFarDram => (0.2, 7.0e9, 7.0e9, 256 * GIB),
        TierKind::Cxl => (0.4, 5.0e9, 5.0e9, 512 * GIB),
        TierKind::Ssd => (80.0, 6.0e9, 3.0e9, 4096 * GIB),
        TierKind::Remote => (70.0, 2.0e9, 2.0e9, 1024 * GIB),
    }
}

/// The physical nature of `kind`: byte-addressable, coherent, persistent, wear-limited,
/// and how its bytes are shared.
fn representative_nature(kind: TierKind) -> (bool, bool, bool, bool, ShareKind) {
    match kind {
        TierKind::GpuHbm => (true, true, false, false, ShareKind::Private),
        TierKind::Dram => (true, true, false, false, ShareKind::Host),
        TierKind::NumaFarDram => (true, true, false, false, ShareKind::Host),
        TierKind::Cxl => (true, true, false, false, ShareKind::Domain),
        TierKind::Ssd => (false, false, true, true, ShareKind::Copy),
        TierKind::Remote => (false, false, false, false, ShareKind::Copy),
    }
}

impl TierProfile {
    /// Representative defaults for `kind`. They are order-of-magnitude values from public
    /// datasheets and the measured facts of docs/design.md, not measurements of this host:
    /// a node replaces them with its start-up probe. GPU HBM ~2 TB/s, DRAM ~11 GB/s single
    /// stream (0.1 µs), NUMA-far DRAM ~7 GB/s (0.2 µs), CXL ~5 GB/s (0.4 µs), SSD
    /// 6 GB/s reads and 3 GB/s writes (80 µs, a PCIe 4 datacenter NVMe), remote ~2 GB/s (70 µs, one QUIC round trip).
    pub fn representative(kind: TierKind) -> Self {
        let (latency, read, write, capacity) = representative_figures(kind);
        let (addressable, coherent, persistent, wear, share) = representative_nature(kind);
        Self {
            kind,
            read_latency_us: latency,
            read_bandwidth_bytes_per_s: read,
            write_bandwidth_bytes_per_s: write,
            capacity_bytes: capacity,
            byte_addressable: addressable,
            coherent,
            persistent,
            wear_limited: wear,
            share_kind: share,
        }
    }

    /// Checks that every latency and bandwidth is a positive finite number.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let fields = [
            ("read_latency_us", self.read_latency_us),
            (
                "read_bandwidth_bytes_per_s",
                self.read_bandwidth_bytes_per_s,
            ),
            (
                "write_bandwidth_bytes_per_s",
                self.write_bandwidth_bytes_per_s,
            ),
        ];
        for (field, value) in fields {
            if !(value.is_finite() && value > 0.0) {
                return Err(ProfileError::NotPositive {
                    kind: self.kind,
                    field,
                });
            }
        }
        Ok(())
    }

    /// True when an engine can attend to the KV bytes in place or with one memcpy
    /// (byte-addressable and coherent): DRAM, NUMA-far DRAM, CXL. Otherwise the bytes
    /// must be staged through an I/O path first (SSD, remote).
    pub fn is_attendable(&self) -> bool {
        self.byte_addressable && self.coherent
    }

    /// Time to read `bytes` back from this tier, in microseconds (latency + transfer).
    pub fn read_time_us(&self, bytes: u64) -> f64 {
        self.read_latency_us + bytes as f64 / self.read_bandwidth_bytes_per_s * 1e6
    }

    /// Time to stage `bytes` into this tier, in microseconds (latency + transfer).
    pub fn write_time_us(&self, bytes: u64) -> f64 {
        self.read_latency_us + bytes as f64 / self.write_bandwidth_bytes_per_s * 1e6
    }
}

/// The figures of a tier that a probe measures or an operator overrides; a field left
/// `None` keeps the value underneath. Measured figures travel from a node to the directory
/// in this shape, and `[profiles.<medium>]` of `cluster.toml` is parsed into it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFigures {
    /// Latency of the first byte of a read, in microseconds.
    pub read_latency_us: Option<f64>,
    /// Sustained read bandwidth, in bytes per second.
    pub read_bandwidth_bytes_per_s: Option<f64>,
    /// Sustained write bandwidth, in bytes per second.
    pub write_bandwidth_bytes_per_s: Option<f64>,
}

impl TierProfile {
    /// This profile with each performance figure the worse of its own and `other`'s: the
    /// higher latency, the lower bandwidths. Other fields are this profile's.
    pub fn most_conservative(&self, other: &TierProfile) -> TierProfile {
        TierProfile {
            read_latency_us: self.read_latency_us.max(other.read_latency_us),
            read_bandwidth_bytes_per_s: self
                .read_bandwidth_bytes_per_s
                .min(other.read_bandwidth_bytes_per_s),
            write_bandwidth_bytes_per_s: self
                .write_bandwidth_bytes_per_s
                .min(other.write_bandwidth_bytes_per_s),
            ..self.clone()
        }
    }
}

impl ProfileFigures {
    /// `profile` with every figure given here replacing its own. Fails, leaving nothing
    /// half-applied, when a given figure is not a positive finite number.
    pub fn apply(&self, profile: &TierProfile) -> Result<TierProfile, ProfileError> {
        let mut applied = profile.clone();
        if let Some(value) = self.read_latency_us {
            applied.read_latency_us = value;
        }
        if let Some(value) = self.read_bandwidth_bytes_per_s {
            applied.read_bandwidth_bytes_per_s = value;
        }
        if let Some(value) = self.write_bandwidth_bytes_per_s {
            applied.write_bandwidth_bytes_per_s = value;
        }
        applied.validate()?;
        Ok(applied)
    }
}

/// A probe's figures in whole units, as they travel from a node to the directory and back
/// in usage reports (integers keep the wire types comparable and their encoding exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measurement {
    /// Latency of the first byte of a small read, in nanoseconds.
    pub read_latency_ns: u64,
    /// Sustained read (copy-out) bandwidth, in bytes per second.
    pub read_bandwidth_bytes_per_s: u64,
    /// Sustained write (copy-in) bandwidth, in bytes per second; `None` when the probe had
    /// nowhere it could write (a shared pool with no free extent).
    pub write_bandwidth_bytes_per_s: Option<u64>,
}

impl Measurement {
    /// The figures measured; a zero figure stays and is refused by [`ProfileFigures::apply`].
    pub fn figures(&self) -> ProfileFigures {
        ProfileFigures {
            read_latency_us: Some(self.read_latency_ns as f64 / 1e3),
            read_bandwidth_bytes_per_s: Some(self.read_bandwidth_bytes_per_s as f64),
            write_bandwidth_bytes_per_s: self.write_bandwidth_bytes_per_s.map(|value| value as f64),
        }
    }

    /// `profile`'s figures, rounded to whole units.
    pub fn of(profile: &TierProfile) -> Self {
        Self {
            read_latency_ns: (profile.read_latency_us * 1e3).round() as u64,
            read_bandwidth_bytes_per_s: profile.read_bandwidth_bytes_per_s.round() as u64,
            write_bandwidth_bytes_per_s: Some(profile.write_bandwidth_bytes_per_s.round() as u64),
        }
    }
}

impl TierKind {
    /// The tier a pool of `medium` serves: a CPU pool is DRAM, a CXL pool CXL, an SSD store
    /// SSD.
    pub fn of_medium(medium: Medium) -> Self {
        match medium {
            Medium::Cpu => TierKind::Dram,
            Medium::Cxl => TierKind::Cxl,
            Medium::Ssd => TierKind::Ssd,
        }
    }
}

impl fmt::Display for TierKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            TierKind::GpuHbm => "gpu",
            TierKind::Dram => "dram",
            TierKind::NumaFarDram => "numa",
            TierKind::Cxl => "cxl",
            TierKind::Ssd => "ssd",
            TierKind::Remote => "remote",
        };
        formatter.write_str(name)
    }
}

impl FromStr for TierKind {
    type Err = ProfileError;

    /// Parses the short names printed by `Display` (`gpu`, `dram`, `numa`, `cxl`, `ssd`,
    /// `remote`), case-insensitively.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "gpu" | "hbm" => Ok(TierKind::GpuHbm),
            "dram" | "cpu" => Ok(TierKind::Dram),
            "numa" | "numa-far" => Ok(TierKind::NumaFarDram),
            "cxl" => Ok(TierKind::Cxl),
            "ssd" => Ok(TierKind::Ssd),
            "remote" => Ok(TierKind::Remote),
            _ => Err(ProfileError::UnknownTier(text.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [TierKind; 6] = [
        TierKind::GpuHbm,
        TierKind::Dram,
        TierKind::NumaFarDram,
        TierKind::Cxl,
        TierKind::Ssd,
        TierKind::Remote,
    ];

    #[test]
    fn representative_profiles_are_valid_and_round_trip_names() {
        for kind in KINDS {
            let profile = TierProfile::representative(kind);
            assert_eq!(profile.validate(), Ok(()));
            assert_eq!(kind.to_string().parse::<TierKind>(), Ok(kind));
        }
    }

    #[test]
    fn attendable_tiers_are_memory_and_staged_tiers_are_not() {
        let attendable: Vec<bool> = KINDS
            .iter()
            .map(|kind| TierProfile::representative(*kind).is_attendable())
            .collect();
        assert_eq!(attendable, [true, true, true, true, false, false]);
    }

    #[test]
    fn read_time_grows_with_size_and_invalid_profiles_are_refused() {
        let ssd = TierProfile::representative(TierKind::Ssd);
        assert!(ssd.read_time_us(64 << 20) > ssd.read_time_us(1 << 20));
        let mut broken = ssd;
        broken.read_bandwidth_bytes_per_s = 0.0;
        assert!(matches!(
            broken.validate(),
            Err(ProfileError::NotPositive { .. })
        ));
        assert!("tape".parse::<TierKind>().is_err());
    }

    #[test]
    fn figures_replace_only_what_they_give_and_refuse_nonsense() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let dram = TierProfile::representative(TierKind::Dram);
        let measured = ProfileFigures {
            read_bandwidth_bytes_per_s: Some(3.0e9),
            ..ProfileFigures::default()
        };
        let applied = measured.apply(&cxl).unwrap();
        assert_eq!(
            applied,
            TierProfile {
                read_bandwidth_bytes_per_s: 3.0e9,
                ..cxl.clone()
            }
        );
        // A measurement travels in whole units: 0.4 µs is 400 ns, bandwidths in bytes/s.
        let measurement = Measurement::of(&applied);
        assert_eq!(
            measurement,
            Measurement {
                read_latency_ns: 400,
                read_bandwidth_bytes_per_s: 3_000_000_000,
                write_bandwidth_bytes_per_s: Some(5_000_000_000),
            }
        );
        assert_eq!(
            measurement.figures(),
            ProfileFigures {
                read_latency_us: Some(0.4),
                read_bandwidth_bytes_per_s: Some(3.0e9),
                write_bandwidth_bytes_per_s: Some(5.0e9),
            }
        );
        // Applied to another tier's profile (DRAM: 0.1 µs, 11 GB/s both ways), every
        // measured figure replaces DRAM's and nothing else changes.
        let dram_measured = TierProfile {
            read_latency_us: 0.4,
            read_bandwidth_bytes_per_s: 3.0e9,
            write_bandwidth_bytes_per_s: 5.0e9,
            ..dram.clone()
        };
        assert_eq!(measurement.figures().apply(&dram).unwrap(), dram_measured);
        // Rounding to whole units: 1.2344 µs is 1234 ns; 2.5e9 + 0.4 bytes/s is 2.5e9.
        let odd = TierProfile {
            read_latency_us: 1.2344,
            read_bandwidth_bytes_per_s: 2.5e9 + 0.4,
            write_bandwidth_bytes_per_s: 7.0e9,
            ..dram.clone()
        };
        assert_eq!(
            Measurement::of(&odd),
            Measurement {
                read_latency_ns: 1234,
                read_bandwidth_bytes_per_s: 2_500_000_000,
                write_bandwidth_bytes_per_s: Some(7_000_000_000),
            }
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let figures = ProfileFigures {
                read_latency_us: Some(bad),
                ..ProfileFigures::default()
            };
            assert!(figures.apply(&cxl).is_err(), "{bad}");
        }
        let text = r#"{"read_latency_us": 0.3, "write_bandwidth_bytes_per_s": 4e9}"#;
        let parsed: ProfileFigures = serde_json::from_str(text).unwrap();
        assert_eq!(
            parsed,
            ProfileFigures {
                read_latency_us: Some(0.3),
                read_bandwidth_bytes_per_s: None,
                write_bandwidth_bytes_per_s: Some(4e9),
            }
        );
        assert!(serde_json::from_str::<ProfileFigures>(r#"{"read_bandwith": 1}"#).is_err());
        assert_eq!(TierKind::of_medium(Medium::Cxl), TierKind::Cxl);
        // A probe that could not write keeps the base's write figure: DRAM's 11 GB/s.
        let unwritable = Measurement {
            write_bandwidth_bytes_per_s: None,
            ..measurement
        };
        assert_eq!(
            unwritable.figures().apply(&dram).unwrap(),
            TierProfile {
                write_bandwidth_bytes_per_s: 11.0e9,
                ..dram_measured
            }
        );
        let zero = Measurement {
            read_bandwidth_bytes_per_s: 0,
            ..measurement
        };
        assert_eq!(
            zero.figures().apply(&cxl),
            Err(ProfileError::NotPositive {
                kind: TierKind::Cxl,
                field: "read_bandwidth_bytes_per_s"
            })
        );
    }
}
