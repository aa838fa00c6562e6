use super::*;

/// Metrics with a value in every family the exporter tests look for.
pub(crate) fn populated() -> Metrics {
    let metrics = Metrics::new().unwrap();
    metrics.set_pool_capacity(PoolId(1), Medium::Cpu, 1 << 30);
    metrics.set_pool_bytes(PoolId(1), PoolByteState::Ready, 4096);
    metrics.observe_request(Operation::Acquire, Duration::from_micros(30), None);
    metrics.observe_request(Operation::Reserve, Duration::from_millis(2), Some("full"));
    metrics.set_leases(3);
    metrics.set_sessions(SessionState::Live, 2);
    metrics.add_bytes_moved(Direction::Store, 1 << 20);
    metrics.refuse_client("unknown_peer");
    metrics
}

/// A line of each family `populated` fills, as rendered.
pub(crate) const FAMILIES: [&str; 9] = [
    "kvtier_pool_capacity_bytes{medium=\"cpu\",pool=\"1\"} 1073741824",
    "kvtier_pool_bytes{pool=\"1\",state=\"ready\"} 4096",
    "kvtier_requests_total{op=\"acquire\"} 1",
    "kvtier_request_errors_total{error=\"full\",op=\"reserve\"} 1",
    "kvtier_request_duration_seconds_bucket{op=\"acquire\",le=\"0.00005\"} 1",
    "kvtier_leases 3",
    "kvtier_sessions{state=\"live\"} 2",
    "kvtier_bytes_moved_total{direction=\"store\"} 1048576",
    "kvtier_client_refusals_total{reason=\"unknown_peer\"} 1",
];

#[test]
fn render_shows_every_family_and_predeclared_labels() {
    let text = populated().render();
    for line in FAMILIES {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    // Pre-declared at zero.
    assert!(text.contains("kvtier_requests_total{op=\"poll_tasks\"} 0"));
    assert!(text.contains("kvtier_pool_bytes{pool=\"1\",state=\"quarantined\"} 0"));
    assert!(text.contains("kvtier_bytes_moved_total{direction=\"restore\"} 0"));
    assert!(text.contains("kvtier_lookups_total{result=\"miss\"} 0"));
}

#[test]
fn pool_labels_are_bounded_and_removable() {
    let metrics = Metrics::new().unwrap();
    for pool in 0..POOL_LABELS_MAX as u32 + 5 {
        metrics.set_pool_capacity(PoolId(pool), Medium::Cxl, 4096);
    }
    metrics.set_pool_bytes(PoolId(u32::MAX), PoolByteState::Pinned, 1);
    assert_eq!(metrics.label_drops_total.get(), 6);
    metrics.remove_pool(PoolId(0));
    metrics.set_pool_capacity(PoolId(u32::MAX), Medium::Ssd, 8192);
    let text = metrics.render();
    assert!(!text.contains("pool=\"0\""));
    assert!(text.contains("kvtier_pool_capacity_bytes{medium=\"ssd\",pool=\"4294967295\"} 8192"));
}
