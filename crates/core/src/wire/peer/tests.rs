//! The transfer header and verdicts: round trips, and every malformed input a typed error.

use super::*;
use proptest::prelude::*;

fn sample() -> TransferHeader {
    TransferHeader {
        task: 7,
        target_replica: 0x0102_0304_0506_0708,
        token: 0x1122_3344_5566_7788,
        length_bytes: 4 << 20,
    }
}

#[test]
fn a_header_round_trips() {
    let header = sample();
    let bytes = header.encode();
    assert_eq!(bytes.len(), HEADER_BYTES);
    assert_eq!(&bytes[..4], b"KVTP");
    assert_eq!(TransferHeader::decode(&bytes), Ok(header));
}

#[test]
fn malformed_headers_are_typed_errors() {
    let good = sample().encode();
    let with = |at: usize, value: u8| {
        let mut bytes = good;
        bytes[at] = value;
        bytes
    };
    let cases: Vec<(Vec<u8>, HeaderError)> = vec![
        (Vec::new(), HeaderError::Truncated { bytes: 0 }),
        (good[..39].to_vec(), HeaderError::Truncated { bytes: 39 }),
        (
            with(0, b'X').to_vec(),
            HeaderError::BadMagic { magic: *b"XVTP" },
        ),
        (
            with(5, 1).to_vec(),
            HeaderError::UnsupportedVersion { version: 1 },
        ),
        (
            with(4, 1).to_vec(),
            HeaderError::UnsupportedVersion { version: 0x0102 },
        ),
        (
            with(7, 1).to_vec(),
            HeaderError::ReservedBits { reserved: 1 },
        ),
    ];
    for (bytes, expected) in cases {
        assert_eq!(TransferHeader::decode(&bytes), Err(expected), "{bytes:?}");
    }
}

#[test]
fn lengths_outside_the_bound_are_refused() {
    for length_bytes in [0, TRANSFER_BYTES_MAX + 1, u64::MAX] {
        let header = TransferHeader {
            length_bytes,
            ..sample()
        };
        assert_eq!(
            TransferHeader::decode(&header.encode()),
            Err(HeaderError::BadLength { length_bytes })
        );
    }
    let largest = TransferHeader {
        length_bytes: TRANSFER_BYTES_MAX,
        ..sample()
    };
    assert_eq!(TransferHeader::decode(&largest.encode()), Ok(largest));
}

#[test]
fn verdicts_round_trip_and_unknown_bytes_are_none() {
    let all = [
        Verdict::Accepted,
        Verdict::Committed,
        Verdict::Failed,
        Verdict::NotExpected,
        Verdict::Busy,
        Verdict::Full,
        Verdict::BadHeader,
        Verdict::Refused,
    ];
    for verdict in all {
        assert_eq!(Verdict::from_byte(verdict.to_byte()), Some(verdict));
    }
    let known: Vec<u8> = all.iter().map(|verdict| verdict.to_byte()).collect();
    for byte in 0..=u8::MAX {
        assert_eq!(Verdict::from_byte(byte).is_some(), known.contains(&byte));
    }
}

#[test]
fn the_transport_follows_the_datagram_size() {
    // Configurations build for every size an operator may set, including out of range.
    for datagram_bytes in [
        0,
        1200,
        DATAGRAM_BYTES_SAFE,
        9000,
        32_768,
        DATAGRAM_BYTES_MAX,
    ] {
        let _ = transport_config(datagram_bytes);
    }
}

proptest! {
    #[test]
    fn any_bytes_decode_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(header) = TransferHeader::decode(&bytes) {
            prop_assert_eq!(&header.encode()[..], &bytes[..HEADER_BYTES]);
        }
    }

    #[test]
    fn every_valid_header_round_trips(task in any::<u64>(), target_replica in any::<u64>(), token in any::<u64>(), length_bytes in 1..=TRANSFER_BYTES_MAX) {
        let header = TransferHeader { task, target_replica, token, length_bytes };
        prop_assert_eq!(TransferHeader::decode(&header.encode()), Ok(header));
    }
}
