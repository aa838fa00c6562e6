//! Mutual TLS for QUIC: the cluster CA, per-process certificates, and the quinn configurations
//! that present them and demand them from the peer.
//!
//! One directory holds the cluster's credentials ([`super::certs`] writes it): `ca.pem` (the
//! cluster CA) and `NAME.pem` + `NAME.key` per process name (`directory`, `node-a`, ...). Every
//! connection is mutually authenticated against that CA only, with the ring provider passed
//! explicitly (the process-wide default provider is never read or installed), TLS 1.3 only
//! (QUIC requires it) and ALPN [`ALPN_PROTOCOL`].

use std::fs;
use std::io::BufReader;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quinn::crypto::rustls::{NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose, SanType};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// The ALPN protocol both sides offer and require; a peer without it fails the handshake.
/// Its suffix follows [`super::frame::PROTOCOL_VERSION`]'s major line.
pub const ALPN_PROTOCOL: &[u8] = b"kvtier/1";

/// Longest process name in bytes: one DNS label.
pub const NAME_BYTES_MAX: usize = 63;

/// Failures while creating or loading credentials and building TLS configurations.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// `ca.pem` already exists and overwriting was not requested. The caller keeps the existing
    /// CA (its certificates stay valid) or passes `force` to replace it and every certificate.
    #[error("cluster CA {path} already exists (pass force to replace it)")]
    CaExists {
        /// The existing CA certificate.
        path: PathBuf,
    },
    /// A process name is not a lowercase DNS label (`[a-z0-9-]`, 1 to 63 bytes, no leading or
    /// trailing `-`), is `ca`, or too many names were given. The caller fixes its input.
    #[error("invalid process name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What rule it breaks.
        reason: &'static str,
    },
    /// A credential file could not be read or written. The caller checks the path and rights.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A credential file holds no certificate or no private key. The caller regenerates it.
    #[error("{path} holds no {what}")]
    MissingPem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
    },
    /// A certificate validity outside 1 to [`super::certs::LEAF_VALIDITY_DAYS_MAX`] days.
    #[error("invalid certificate validity of {days} days")]
    InvalidValidity {
        /// The days asked for.
        days: u32,
    },
    /// The `retired` list would exceed [`super::certs::RETIRED_ENTRIES_MAX`] entries (or its
    /// file is larger than such a list can be). The operator replaces the CA instead.
    #[error("the retired certificate list is full")]
    RetiredListFull,
    /// A line of the `retired` list is not a fingerprint. The operator repairs the file.
    #[error("{path}: a line is not a certificate fingerprint")]
    MalformedRetiredList {
        /// The list.
        path: PathBuf,
    },
    /// Key or certificate generation failed. Should not happen with valid names.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused a certificate, key or protocol setting (e.g. a key that does not match
    /// its certificate). The caller regenerates the credentials.
    #[error("TLS configuration refused: {0}")]
    Rustls(#[from] rustls::Error),
    /// The CA could not be turned into a client-certificate verifier (e.g. no usable root).
    #[error("client verifier refused the CA: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The crypto provider lacks the cipher suite QUIC's initial packets need. A build bug.
    #[error("QUIC cannot use this TLS configuration: {0}")]
    Quic(#[from] NoInitialCipherSuite),
}

/// Builds the QUIC server configuration for process `name` from `directory`.
///
/// The server presents `NAME.pem`/`NAME.key` and requires every client to present a
/// certificate chaining to `ca.pem`; clients without one, or with one from another CA, fail
/// the handshake. ALPN [`ALPN_PROTOCOL`], transport limits from
/// [`super::quic::transport_config`]. Reads the files once; safe to call repeatedly.
pub fn server_config(directory: &Path, name: &str) -> Result<quinn::ServerConfig, TlsError> {
    let tls = rustls_server_config(directory, name)?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    config.transport_config(Arc::new(super::quic::transport_config()));
    Ok(config)
}

/// Builds the QUIC client configuration for process `name` from `directory`.
///
/// The client presents `NAME.pem`/`NAME.key` and trusts only `ca.pem` (no system roots); the
/// server name given at connect time must be among the server certificate's SANs. ALPN
/// [`ALPN_PROTOCOL`]. Reads the files once; safe to call repeatedly.
pub fn client_config(directory: &Path, name: &str) -> Result<quinn::ClientConfig, TlsError> {
    quic_client_config(rustls_client_config(directory, name)?)
}

/// The rustls server side of [`server_config`], for any transport (QUIC wraps it; the
/// transfer benchmark's TLS-over-TCP baseline uses it as is): `NAME.pem`/`NAME.key`, a
/// client certificate from `ca.pem` required, TLS 1.3, ALPN [`ALPN_PROTOCOL`].
pub fn rustls_server_config(
    directory: &Path,
    name: &str,
) -> Result<rustls::ServerConfig, TlsError> {
    validate_name(name)?;
    let provider = provider();
    let roots = Arc::new(load_roots(&directory.join("ca.pem"))?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone()).build()?;
    let (certificates, key) = load_identity(directory, name)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates, key)?;
    tls.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];
    Ok(tls)
}

/// The rustls client side of [`client_config`], for any transport: presents
/// `NAME.pem`/`NAME.key`, trusts only `ca.pem`, TLS 1.3, ALPN [`ALPN_PROTOCOL`].
pub fn rustls_client_config(
    directory: &Path,
    name: &str,
) -> Result<rustls::ClientConfig, TlsError> {
    validate_name(name)?;
    let roots = load_roots(&directory.join("ca.pem"))?;
    let (certificates, key) = load_identity(directory, name)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_client_auth_cert(certificates, key)?;
    tls.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];
    Ok(tls)
}

/// The authenticated name of the peer: the common name of its leaf certificate.
///
/// Returns `None` when the peer presented no certificate (impossible on connections built
/// from this module's configurations, which require one) or when the certificate has no
/// readable CN. The certificate was verified against the cluster CA during the handshake,
/// so the name is as trustworthy as the CA's key: a directory compares it with the node name
/// a session claims.
pub fn peer_name(connection: &quinn::Connection) -> Option<String> {
    let identity = connection.peer_identity()?;
    let certificates = identity.downcast_ref::<Vec<CertificateDer<'static>>>()?;
    common_name(certificates.first()?.as_ref())
}

/// Wraps a rustls client configuration for QUIC with ALPN and the transport limits.
pub(crate) fn quic_client_config(
    mut tls: rustls::ClientConfig,
) -> Result<quinn::ClientConfig, TlsError> {
    tls.alpn_protocols = vec![ALPN_PROTOCOL.to_vec()];
    let mut config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    config.transport_config(Arc::new(super::quic::transport_config()));
    Ok(config)
}

/// The only crypto provider this crate uses.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn leaf_params(name: &str) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(vec![name.to_string(), "localhost".to_string()])?;
    params.subject_alt_names.extend([
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ]);
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// A process name must be a safe file name and a valid DNS label.
pub(super) fn validate_name(name: &str) -> Result<(), TlsError> {
    let refuse = |reason| {
        Err(TlsError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return refuse("must be 1 to 63 bytes");
    }
    if !name
        .bytes()
        .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
    {
        return refuse("only a-z, 0-9 and - are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return refuse("must not start or end with -");
    }
    if name == "ca" {
        return refuse("reserved for the cluster CA");
    }
    Ok(())
}

fn open(path: &Path) -> Result<BufReader<fs::File>, TlsError> {
    fs::File::open(path)
        .map(BufReader::new)
        .map_err(|source| TlsError::Io {
            path: path.to_path_buf(),
            source,
        })
}

pub(crate) fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = rustls_pemfile::certs(&mut open(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if certificates.is_empty() {
        return Err(TlsError::MissingPem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certificates)
}

pub(crate) fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    rustls_pemfile::private_key(&mut open(path)?)
        .map_err(|source| TlsError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| TlsError::MissingPem {
            path: path.to_path_buf(),
            what: "private key",
        })
}

pub(crate) fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(path)? {
        roots.add(certificate)?;
    }
    Ok(roots)
}

fn load_identity(
    directory: &Path,
    name: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let certificates = load_certificates(&directory.join(format!("{name}.pem")))?;
    let key = load_private_key(&directory.join(format!("{name}.key")))?;
    Ok((certificates, key))
}

/// DER tags this module reads.
const DER_SEQUENCE: u8 = 0x30;
const DER_SET: u8 = 0x31;
const DER_OID: u8 = 0x06;
const DER_VERSION_TAG: u8 = 0xa0;
/// Encoded OID 2.5.4.3 (id-at-commonName).
const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// Splits one DER element off `input`: `(tag, contents, rest)`. `None` on any malformation;
/// never reads out of bounds. Only single-byte tags and lengths up to 4 bytes are accepted.
fn der_split(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 {
            return None;
        }
        let (bytes, rest) = rest.split_at_checked(count)?;
        let length = bytes
            .iter()
            .fold(0usize, |length, &byte| (length << 8) | usize::from(byte));
        (length, rest)
    };
    let (contents, rest) = rest.split_at_checked(length)?;
    Some((tag, contents, rest))
}

/// Splits one element with the expected tag off `input`: `(contents, rest)`.
fn der_expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    der_split(input).and_then(|(found, contents, rest)| (found == tag).then_some((contents, rest)))
}

/// The subject common name of a DER X.509 certificate, if it has one as a string.
///
/// Loops are bounded by the input: every step consumes at least two bytes.
pub(super) fn common_name(certificate: &[u8]) -> Option<String> {
    let (certificate, _) = der_expect(certificate, DER_SEQUENCE)?;
    let (tbs, _) = der_expect(certificate, DER_SEQUENCE)?;
    let mut rest = tbs;
    if let Some((DER_VERSION_TAG, _, after_version)) = der_split(rest) {
        rest = after_version;
    }
    // serialNumber, signature algorithm, issuer, validity.
    for _ in 0..4 {
        rest = der_split(rest)?.2;
    }
    let (mut names, _) = der_expect(rest, DER_SEQUENCE)?;
    while !names.is_empty() {
        let (mut attributes, next_names) = der_expect(names, DER_SET)?;
        names = next_names;
        while !attributes.is_empty() {
            let (attribute, next_attributes) = der_expect(attributes, DER_SEQUENCE)?;
            attributes = next_attributes;
            let (oid, value) = der_expect(attribute, DER_OID)?;
            if oid == OID_COMMON_NAME {
                return common_name_value(value);
            }
        }
    }
    None
}

/// Decodes a name attribute value: UTF8String, PrintableString or IA5String.
fn common_name_value(value: &[u8]) -> Option<String> {
    const UTF8_STRING: u8 = 0x0c;
    const PRINTABLE_STRING: u8 = 0x13;
    const IA5_STRING: u8 = 0x16;
    let (tag, contents, _) = der_split(value)?;
    if !matches!(tag, UTF8_STRING | PRINTABLE_STRING | IA5_STRING) {
        return None;
    }
    std::str::from_utf8(contents).ok().map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fresh, empty directory unique to this test and process.
    pub(crate) fn temp_directory(test: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("kvtier-wire-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&directory);
        fs::create_dir_all(&directory).unwrap();
        directory
    }

    proptest! {
        #[test]
        fn common_name_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = common_name(&bytes);
        }
    }
}
