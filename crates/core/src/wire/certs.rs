//! The cluster's certificates: creating the CA, issuing node certificates, and retiring them.
//!
//! Layout of a certificates folder (`kvtier certs init --dir certs`):
//!
//! * `ca.pem`: the cluster CA certificate, which every process trusts;
//! * `NAME.pem` + `NAME.key` (0600): one certificate per process name;
//! * `retired`: fingerprints of certificates the directory refuses ([`retire_certificate`]);
//! * `ca/ca.key` (folder 0700, key 0600): the CA's private key. It lives in its own folder so
//!   that an operator ships `certs/` to hosts without it: a host needs `ca.pem`, its own pair
//!   and nothing else. Only `certs issue` reads it.
//!
//! Node certificates are valid for [`LEAF_VALIDITY_DAYS_DEFAULT`] days unless told otherwise,
//! the CA for [`CA_VALIDITY_DAYS`].

use std::collections::HashSet;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::CertificateDer;

use super::tls::{leaf_params, load_certificates, validate_name, TlsError};

/// Most names one call issues certificates for: bounds the work and the files one command
/// can create.
pub const CLUSTER_NAMES_MAX: usize = 1024;

/// Days a node or directory certificate is valid when nothing else is asked for.
pub const LEAF_VALIDITY_DAYS_DEFAULT: u32 = 365;

/// Longest validity a certificate may be issued for (about ten years).
pub const LEAF_VALIDITY_DAYS_MAX: u32 = 3650;

/// Days the cluster CA is valid: it outlives every certificate it may issue.
pub const CA_VALIDITY_DAYS: u32 = 3660;

/// Most fingerprints the `retired` list holds; a longer list is refused as corrupt, so a
/// directory reading it on every connection does bounded work.
pub const RETIRED_ENTRIES_MAX: usize = 65_536;

/// Bytes of one `retired` line: 64 hex digits, a space, a name of up to 63 bytes, a newline.
const RETIRED_LINE_BYTES_MAX: usize = 64 + 1 + 63 + 1;

/// The folder under a certificates folder that holds the CA's private key.
pub fn ca_key_directory(directory: &Path) -> PathBuf {
    directory.join("ca")
}

/// The file listing retired certificates.
pub fn retired_path(directory: &Path) -> PathBuf {
    directory.join("retired")
}

/// Creates the cluster CA and one certificate per name, valid for
/// [`LEAF_VALIDITY_DAYS_DEFAULT`] days (see [`create_ca`] and [`issue_certificates`]).
pub fn init_cluster_certs(directory: &Path, names: &[String], force: bool) -> Result<(), TlsError> {
    validate_names(names)?;
    create_ca(directory, force)?;
    issue_certificates(directory, names, LEAF_VALIDITY_DAYS_DEFAULT)
}

/// Creates the cluster CA in `directory` (created if missing): `ca.pem`, and `ca/ca.key`
/// in a folder of mode 0700.
///
/// Refuses with [`TlsError::CaExists`] when `ca.pem` exists and `force` is false; with
/// `force`, replaces the CA, which invalidates every certificate it signed before.
pub fn create_ca(directory: &Path, force: bool) -> Result<(), TlsError> {
    let ca_path = directory.join("ca.pem");
    if !force && ca_path.exists() {
        return Err(TlsError::CaExists { path: ca_path });
    }
    let key_directory = ca_key_directory(directory);
    for folder in [directory, key_directory.as_path()] {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .map_err(|source| io_error(folder, source))?;
    }
    // An existing folder keeps its bits unless reset: the key's folder is the owner's only.
    fs::set_permissions(&key_directory, fs::Permissions::from_mode(0o700))
        .map_err(|source| io_error(&key_directory, source))?;
    let key = KeyPair::generate()?;
    let certificate = ca_params(CA_VALIDITY_DAYS)?.self_signed(&key)?;
    write_file(&key_directory.join("ca.key"), &key.serialize_pem(), true)?;
    write_file(&ca_path, &certificate.pem(), false)
}

/// Issues `NAME.pem` and `NAME.key` for each name, signed by the CA of `directory` and valid
/// for `days` days from now (1 to [`LEAF_VALIDITY_DAYS_MAX`]). Each leaf has CN = NAME, SANs
/// DNS NAME, DNS localhost, IP 127.0.0.1 and IP ::1, and may act as TLS server and client.
/// Replaces an existing pair of the same name (a renewal); retire the old one to refuse it.
/// Names are validated before anything is written.
pub fn issue_certificates(directory: &Path, names: &[String], days: u32) -> Result<(), TlsError> {
    validate_names(names)?;
    if days == 0 || days > LEAF_VALIDITY_DAYS_MAX {
        return Err(TlsError::InvalidValidity { days });
    }
    let key_path = ca_key_directory(directory).join("ca.key");
    let pem = fs::read_to_string(&key_path).map_err(|source| io_error(&key_path, source))?;
    let ca_key = KeyPair::from_pem(&pem)?;
    // The issuer is rebuilt from the CA's name and key: a leaf's signature and authority
    // key identifier depend on nothing else, so it verifies against the `ca.pem` on disk.
    let issuer = ca_params(CA_VALIDITY_DAYS)?.self_signed(&ca_key)?;
    for name in names {
        let key = KeyPair::generate()?;
        let mut params = leaf_params(name)?;
        (params.not_before, params.not_after) = validity(days);
        let certificate = params.signed_by(&key, &issuer, &ca_key)?;
        write_file(
            &directory.join(format!("{name}.key")),
            &key.serialize_pem(),
            true,
        )?;
        write_file(
            &directory.join(format!("{name}.pem")),
            &certificate.pem(),
            false,
        )?;
    }
    Ok(())
}

/// Adds the certificate `NAME.pem` of `directory` to the `retired` list, so the directory
/// refuses every connection that presents it with [`CERTIFICATE_RETIRED`]. A certificate
/// issued later for the same name (after `issue`) is not affected. Returns whether the
/// certificate was newly retired (false when it already was).
pub fn retire_certificate(directory: &Path, name: &str) -> Result<bool, TlsError> {
    validate_name(name)?;
    let certificates = load_certificates(&directory.join(format!("{name}.pem")))?;
    let Some(leaf) = certificates.first() else {
        return Err(TlsError::MissingPem {
            path: directory.join(format!("{name}.pem")),
            what: "certificate",
        });
    };
    let fingerprint = fingerprint(leaf);
    let mut retired = RetiredCertificates::load(directory)?;
    if !retired.fingerprints.insert(fingerprint.clone()) {
        return Ok(false);
    }
    if retired.fingerprints.len() > RETIRED_ENTRIES_MAX {
        return Err(TlsError::RetiredListFull);
    }
    let path = retired_path(directory);
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|source| io_error(&path, source))?;
    file.write_all(format!("{fingerprint} {name}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(&path, source))?;
    Ok(true)
}

/// The reason a directory closes a connection whose certificate is retired.
pub const CERTIFICATE_RETIRED: &str = "certificate_retired";

/// The set of retired certificate fingerprints of a certificates folder.
#[derive(Debug, Default)]
pub struct RetiredCertificates {
    fingerprints: HashSet<String>,
}

impl RetiredCertificates {
    /// Reads the `retired` list of `directory`; no file means nothing is retired. A list
    /// longer than [`RETIRED_ENTRIES_MAX`] or with a malformed line is refused, never
    /// half-read: the caller refuses connections it cannot judge.
    pub fn load(directory: &Path) -> Result<Self, TlsError> {
        let path = retired_path(directory);
        let file = match fs::File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default())
            }
            Err(source) => return Err(io_error(&path, source)),
        };
        let limit = (RETIRED_ENTRIES_MAX * RETIRED_LINE_BYTES_MAX) as u64;
        let mut text = String::new();
        file.take(limit + 1)
            .read_to_string(&mut text)
            .map_err(|source| io_error(&path, source))?;
        if text.len() as u64 > limit {
            return Err(TlsError::RetiredListFull);
        }
        let mut fingerprints = HashSet::new();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let fingerprint = line.split_whitespace().next().unwrap_or_default();
            if fingerprint.len() != 64 || !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(TlsError::MalformedRetiredList { path });
            }
            fingerprints.insert(fingerprint.to_ascii_lowercase());
        }
        Ok(Self { fingerprints })
    }

    /// Whether `certificate` (a peer's leaf) is retired.
    pub fn contains(&self, certificate: &CertificateDer<'_>) -> bool {
        self.fingerprints.contains(&fingerprint(certificate))
    }

    /// Whether the leaf certificate `connection`'s peer presented is retired.
    pub fn refuses(&self, connection: &quinn::Connection) -> bool {
        let Some(identity) = connection.peer_identity() else {
            return false;
        };
        identity
            .downcast_ref::<Vec<CertificateDer<'static>>>()
            .and_then(|chain| chain.first())
            .is_some_and(|leaf| self.contains(leaf))
    }
}

/// A certificate's fingerprint: BLAKE3 of its DER encoding, in hex.
pub fn fingerprint(certificate: &CertificateDer<'_>) -> String {
    blake3::hash(certificate.as_ref()).to_hex().to_string()
}

fn validate_names(names: &[String]) -> Result<(), TlsError> {
    if names.len() > CLUSTER_NAMES_MAX {
        return Err(TlsError::InvalidName {
            name: format!("{} names", names.len()),
            reason: "more names than CLUSTER_NAMES_MAX",
        });
    }
    names.iter().try_for_each(|name| validate_name(name))
}

fn ca_params(days: u32) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "kvtier cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = validity(days);
    Ok(params)
}

/// From an hour ago (clocks of a cluster disagree a little) to `days` days from now.
fn validity(days: u32) -> (time::OffsetDateTime, time::OffsetDateTime) {
    let now = time::OffsetDateTime::now_utc();
    (
        now - time::Duration::hours(1),
        now + time::Duration::days(i64::from(days)),
    )
}

fn io_error(path: &Path, source: std::io::Error) -> TlsError {
    TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| io_error(path, source))?;
    // `mode` only applies to new files; an existing file keeps its bits unless reset here.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents.as_bytes()))
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(path, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tls::tests::temp_directory;
    use crate::wire::tls::{client_config, common_name, server_config};

    #[test]
    fn init_keeps_the_ca_key_apart_with_private_modes() {
        let directory = temp_directory("init-files");
        init_cluster_certs(&directory, &["directory".into(), "node-a".into()], false).unwrap();
        let mode = |path: PathBuf| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        for name in ["directory", "node-a"] {
            assert_eq!(mode(directory.join(format!("{name}.key"))), 0o600, "{name}");
            assert!(directory.join(format!("{name}.pem")).is_file());
        }
        assert!(!directory.join("ca.key").exists(), "the CA key sits apart");
        assert_eq!(mode(ca_key_directory(&directory)), 0o700);
        assert_eq!(mode(ca_key_directory(&directory).join("ca.key")), 0o600);
        let leaf = load_certificates(&directory.join("node-a.pem")).unwrap();
        assert_eq!(common_name(leaf[0].as_ref()).as_deref(), Some("node-a"));
        server_config(&directory, "directory").unwrap();
        client_config(&directory, "node-a").unwrap();
        fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn issue_writes_private_keys_and_public_certificates() {
        let directory = temp_directory("issue-files");
        init_cluster_certs(&directory, &["directory".into()], false).unwrap();
        // A renewal over a key left readable resets it to 0600.
        let stale = directory.join("node-c.key");
        fs::write(&stale, "old").unwrap();
        fs::set_permissions(&stale, fs::Permissions::from_mode(0o644)).unwrap();
        issue_certificates(&directory, &["node-c".into(), "node-d".into()], 30).unwrap();
        let mode = |path: PathBuf| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        for name in ["node-c", "node-d"] {
            assert_eq!(mode(directory.join(format!("{name}.key"))), 0o600, "{name}");
            assert_eq!(mode(directory.join(format!("{name}.pem"))), 0o644, "{name}");
        }
        assert_eq!(mode(directory.join("ca.pem")), 0o644);
        assert_ne!(fs::read_to_string(&stale).unwrap(), "old");
        fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn existing_ca_is_kept_unless_forced() {
        let directory = temp_directory("init-force");
        init_cluster_certs(&directory, &["directory".into()], false).unwrap();
        let before = fs::read(directory.join("ca.pem")).unwrap();
        let refused = init_cluster_certs(&directory, &["directory".into()], false);
        assert!(
            matches!(refused, Err(TlsError::CaExists { .. })),
            "{refused:?}"
        );
        assert_eq!(fs::read(directory.join("ca.pem")).unwrap(), before);
        init_cluster_certs(&directory, &["directory".into()], true).unwrap();
        assert_ne!(fs::read(directory.join("ca.pem")).unwrap(), before);
        fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn unsafe_names_and_validities_are_refused_before_writing() {
        let directory = temp_directory("init-names");
        for name in ["", "../x", "Node", "a.b", "-a", "ca", &"a".repeat(64)] {
            let result = init_cluster_certs(&directory, &[name.to_string()], false);
            assert!(
                matches!(result, Err(TlsError::InvalidName { .. })),
                "{name:?}"
            );
        }
        assert_eq!(fs::read_dir(&directory).unwrap().count(), 0);
        create_ca(&directory, false).unwrap();
        for days in [0, LEAF_VALIDITY_DAYS_MAX + 1] {
            let result = issue_certificates(&directory, &["node-a".into()], days);
            assert!(
                matches!(result, Err(TlsError::InvalidValidity { .. })),
                "{days}"
            );
        }
        assert!(!directory.join("node-a.pem").exists());
        fs::remove_dir_all(&directory).unwrap();
    }

    #[test]
    fn retiring_lists_only_that_certificate() {
        let directory = temp_directory("retire");
        init_cluster_certs(&directory, &["node-a".into(), "node-b".into()], false).unwrap();
        let leaf = |name: &str| {
            load_certificates(&directory.join(format!("{name}.pem"))).unwrap()[0].clone()
        };
        let (old_a, b) = (leaf("node-a"), leaf("node-b"));
        assert!(!RetiredCertificates::load(&directory)
            .unwrap()
            .contains(&old_a));
        assert!(retire_certificate(&directory, "node-a").unwrap());
        assert!(!retire_certificate(&directory, "node-a").unwrap(), "once");
        issue_certificates(&directory, &["node-a".into()], 30).unwrap();
        let retired = RetiredCertificates::load(&directory).unwrap();
        assert!(retired.contains(&old_a));
        assert!(!retired.contains(&b));
        assert!(
            !retired.contains(&leaf("node-a")),
            "the renewal is accepted"
        );
        // The renewal is signed by the same CA as the rest.
        client_config(&directory, "node-a").unwrap();
        fs::write(retired_path(&directory), "not a fingerprint\n").unwrap();
        assert!(matches!(
            RetiredCertificates::load(&directory),
            Err(TlsError::MalformedRetiredList { .. })
        ));
        fs::remove_dir_all(&directory).unwrap();
    }
}
