//! Bounded fuzzing in `cargo test`: every decoder of the wire boundary (frames, each message
//! type) gets at least 10^5 generated inputs — arbitrary bytes and mutations of valid
//! encodings — and must answer each with a value or a typed error, never a panic; the
//! configuration parser gets arbitrary and mutated `cluster.toml` text. The long runs use
//! the same checks through `cargo fuzz` (`fuzz/`). The SSD store's recovery scan gets
//! arbitrary and mutated region files (forged headers among them). Also: a frame header never makes the
//! reader allocate its claimed length up front.

use kvtier_core::model::{Medium, PoolSpec, Scope};
#[path = "../fuzz/checks.rs"]
mod checks;

use checks::{check_config, check_frames, check_message, check_region_scan};
use kvtier_core::protocol::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, Hello, ProtocolError,
};
use kvtier_core::wire::codec;
use kvtier_core::wire::frame::{FrameHeader, PROTOCOL_VERSION};
use kvtier_core::wire::{read_raw_frame, WireError, FRAME_PAYLOAD_BYTES_MAX};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Inputs per decoder.
const INPUTS: u32 = 100_000;

/// Counts the largest single allocation made on a thread while it watches.
struct LargestAllocation;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = WATCHING.try_with(|watching| {
        if watching.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        System.dealloc(pointer, layout)
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        note(size);
        System.realloc(pointer, layout, size)
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Valid encodings of representative messages: mutation starting points.
fn seeds() -> Vec<Vec<u8>> {
    let spec = PoolSpec {
        name: "node-a-cpu".into(),
        medium: Medium::Cpu,
        scope: Scope::Domain(kvtier_core::model::DomainId(1)),
        capacity_bytes: 1 << 30,
        page_bytes: 64 << 10,
        extent_bytes: Some(64 << 20),
        tenancy: kvtier_core::model::PoolTenancy::Shared,
    };
    vec![
        codec::encode(&Hello::ours()).unwrap(),
        codec::encode(&DirectoryRequest::Hello(Hello::ours())).unwrap(),
        codec::encode(&DirectoryRequest::RegisterPool(spec)).unwrap(),
        codec::encode(&DirectoryRequest::PollTasks { max: 64 }).unwrap(),
        codec::encode(&DirectoryRequest::Release { leases: vec![] }).unwrap(),
        codec::encode(&DirectoryReply::Closed).unwrap(),
        codec::encode(&DirectoryReply::Error(ProtocolError::Busy)).unwrap(),
        codec::encode(&ClientRequest::Describe).unwrap(),
        codec::encode(&ClientRequest::CommitStore { ticket: 7 }).unwrap(),
        codec::encode(&ClientReply::Aborted).unwrap(),
        codec::encode(&ClientReply::Error(ProtocolError::Node("x".into()))).unwrap(),
    ]
}

/// Arbitrary bytes, or a valid encoding with a few bytes replaced, inserted or cut.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..4),
    )
        .prop_map(|(mut bytes, edits)| {
            for (at, byte, kind) in edits {
                let index = at.index(bytes.len() + 1);
                match kind {
                    0 if index < bytes.len() => bytes[index] = byte,
                    1 => bytes.insert(index, byte),
                    _ => bytes.truncate(index),
                }
            }
            bytes
        });
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..96), mutated]
}

/// Runs `check` on [`INPUTS`] generated inputs; fails on the first refused outcome.
fn run(seeds: Vec<Vec<u8>>, check: fn(&[u8]) -> Result<(), String>) {
    let config = Config {
        cases: INPUTS,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&inputs(seeds), |bytes| {
            check(&bytes).map_err(|reason| TestCaseError::fail(format!("{bytes:?}: {reason}")))
        })
        .unwrap();
}

#[test]
fn hello_decoder_gives_values_or_typed_errors() {
    run(seeds(), check_message::<Hello>);
}

#[test]
fn directory_request_decoder_gives_values_or_typed_errors() {
    run(seeds(), check_message::<DirectoryRequest>);
}

#[test]
fn directory_reply_decoder_gives_values_or_typed_errors() {
    run(seeds(), check_message::<DirectoryReply>);
}

#[test]
fn client_request_decoder_gives_values_or_typed_errors() {
    run(seeds(), check_message::<ClientRequest>);
}

#[test]
fn client_reply_decoder_gives_values_or_typed_errors() {
    run(seeds(), check_message::<ClientReply>);
}

#[test]
fn frame_reader_gives_frames_or_typed_errors() {
    let frames = seeds()
        .iter()
        .enumerate()
        .map(|(index, payload)| {
            let header = FrameHeader {
                version: PROTOCOL_VERSION + (index % 2) as u16,
                request_id: index as u64,
                payload_bytes: payload.len() as u32,
            };
            let mut frame = header.encode().to_vec();
            frame.extend_from_slice(payload);
            frame
        })
        .collect();
    run(frames, check_frames);
}

/// A sound region image (its header, then two objects of one block of this fill) behind the
/// mode byte `mode` of `check_region_scan`.
fn region_seed(mode: u8) -> Vec<u8> {
    use kvtier_core::backends::ssd::layout::{ObjectHeader, RegionHeader, BLOCK_BYTES};
    use kvtier_core::model::{NamespaceId, ObjectId, PrefixDigest};
    let block = BLOCK_BYTES as usize;
    let mut image = vec![0u8; 6 * block];
    let (sequence, nonce) = (3, 0x00c0_ffee_d00d_f00d);
    RegionHeader {
        region_bytes: image.len() as u64,
        index: 0,
        sequence,
        nonce,
    }
    .encode(&mut image[..block]);
    for (slot, tag) in [(1usize, 1u8), (3, 2)] {
        let data = vec![tag; block];
        let object = ObjectId {
            namespace: NamespaceId([tag; 16]),
            prefix: PrefixDigest([tag; 16]),
            shard: 0,
            part: 0,
        };
        ObjectHeader {
            object,
            length_bytes: BLOCK_BYTES,
            generation: sequence,
            nonce,
            data_crc: kvtier_core::backends::checksum::crc32c(&data),
        }
        .encode(&mut image[slot * block..(slot + 1) * block]);
        image[(slot + 1) * block..(slot + 2) * block].copy_from_slice(&data);
    }
    image.insert(0, mode);
    image
}

#[test]
fn the_ssd_recovery_scan_adopts_only_sound_objects() {
    let config = Config {
        cases: INPUTS / 5,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&inputs(vec![region_seed(1), region_seed(0)]), |bytes| {
            check_region_scan(&bytes).map_err(TestCaseError::fail)
        })
        .unwrap();
    assert_eq!(check_region_scan(&region_seed(0)), Ok(()));
    assert_eq!(check_region_scan(&region_seed(1)), Ok(()));
}

#[test]
fn config_parser_never_panics() {
    let example = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/cluster.toml")).unwrap();
    let config = Config {
        cases: INPUTS,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&inputs(vec![example]), |bytes| {
            check_config(&bytes).map_err(TestCaseError::fail)
        })
        .unwrap();
}

#[test]
fn a_header_claiming_the_maximum_allocates_only_what_arrived() {
    // The header claims a 4 MiB payload; 10 bytes follow, then the end of the stream.
    let header = FrameHeader {
        version: PROTOCOL_VERSION,
        request_id: 1,
        payload_bytes: FRAME_PAYLOAD_BYTES_MAX as u32,
    };
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(&[0u8; 10]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    WATCHING.with(|watching| watching.set(true));
    let result = runtime.block_on(async {
        let mut reader = bytes.as_slice();
        read_raw_frame(&mut reader).await
    });
    WATCHING.with(|watching| watching.set(false));
    assert!(matches!(result, Err(WireError::Truncated)), "{result:?}");
    let largest = LARGEST.with(Cell::get);
    assert!(
        largest < 64 << 10,
        "the reader allocated {largest} bytes for 10 that arrived"
    );
}
