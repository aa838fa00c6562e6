use super::*;
use kvtier_core::directory::NodeStatus;
use kvtier_core::model::{DomainId, Epoch, Medium, NodeId, PoolId, PoolSpec, PoolUsage};
use kvtier_core::policy::profiles::Measurement;
use kvtier_core::protocol::messages::PoolUsageReport;

/// A node's `/metrics` body with `hits`, `misses`, `commits`, `load_bytes` and its
/// request durations: `fast` acquires of 40 µs and `slow` of 3 ms, plus admin requests
/// that must not count.
fn node_text(
    hits: u64,
    misses: u64,
    commits: u64,
    load_bytes: u64,
    fast: u64,
    slow: u64,
) -> String {
    let total = fast + slow;
    format!(
        "# TYPE kvtier_lookups_total counter\n\
         kvtier_lookups_total{{result=\"hit\"}} {hits}\n\
         kvtier_lookups_total{{result=\"miss\"}} {misses}\n\
         kvtier_requests_total{{op=\"commit\"}} {commits}\n\
         kvtier_requests_total{{op=\"admin\"}} 9\n\
         kvtier_bytes_moved_total{{direction=\"load\"}} {load_bytes}\n\
         kvtier_bytes_moved_total{{direction=\"store\"}} 0\n\
         kvtier_request_duration_seconds_bucket{{op=\"acquire\",le=\"0.00005\"}} {fast}\n\
         kvtier_request_duration_seconds_bucket{{op=\"acquire\",le=\"0.005\"}} {total}\n\
         kvtier_request_duration_seconds_bucket{{op=\"acquire\",le=\"+Inf\"}} {total}\n\
         kvtier_request_duration_seconds_bucket{{op=\"admin\",le=\"0.00005\"}} 0\n\
         kvtier_request_duration_seconds_bucket{{op=\"admin\",le=\"0.005\"}} 0\n\
         kvtier_request_duration_seconds_bucket{{op=\"admin\",le=\"+Inf\"}} 1000\n"
    )
}

fn status() -> ClusterStatus {
    let node = |name: &str, id: u32, state: &str| NodeStatus {
        name: name.into(),
        node: NodeId(id),
        epoch: Epoch(2),
        session: None,
        state: state.into(),
        drain: None,
        peer_address: None,
    };
    let pool =
        |id: u32, name: &str, medium: Medium, scope: Scope, allocated: u64| PoolUsageReport {
            pool: PoolId(id),
            spec: PoolSpec {
                name: name.into(),
                medium,
                scope,
                capacity_bytes: 1000,
                page_bytes: 10,
                extent_bytes: None,
                tenancy: kvtier_core::model::PoolTenancy::Shared,
            },
            usage: PoolUsage {
                capacity_bytes: 1000,
                reserved_bytes: 10,
                allocated_bytes: allocated,
                ready_bytes: allocated,
                pinned_bytes: allocated / 2,
                ..PoolUsage::default()
            },
            profile: Measurement {
                read_latency_ns: 100,
                read_bandwidth_bytes_per_s: 1,
                write_bandwidth_bytes_per_s: None,
            },
        };
    ClusterStatus {
        nodes: vec![node("node-a", 0, "live"), node("node-b", 1, "suspect")],
        pools: vec![
            pool(0, "node-a-cpu", Medium::Cpu, Scope::Host(NodeId(0)), 300),
            pool(1, "node-b-cpu", Medium::Cpu, Scope::Host(NodeId(1)), 100),
            pool(2, "cxl0", Medium::Cxl, Scope::Domain(DomainId(0)), 500),
        ],
    }
}

fn snapshot(seconds: u64, a: String, b: Result<String, String>, directory: String) -> Snapshot {
    let mut metrics = BTreeMap::new();
    metrics.insert("node-a".into(), Ok(ProcessMetrics::from_text(&a)));
    metrics.insert(
        "node-b".into(),
        b.map(|text| ProcessMetrics::from_text(&text)),
    );
    metrics.insert(
        "directory".into(),
        Ok(ProcessMetrics::from_text(&directory)),
    );
    Snapshot {
        taken: Duration::from_secs(seconds),
        status: status(),
        metrics,
    }
}

#[test]
fn process_metrics_read_the_families_and_leave_admin_out_of_latency() {
    let metrics = ProcessMetrics::from_text(&node_text(3, 1, 7, 4096, 5, 5));
    assert_eq!((metrics.hits, metrics.misses), (3.0, 1.0));
    assert_eq!(metrics.requests["commit"], 7.0);
    assert_eq!(metrics.bytes_moved["load"], 4096.0);
    assert_eq!(
        metrics.duration_buckets,
        vec![(0.00005, 5.0), (0.005, 10.0), (f64::INFINITY, 10.0)]
    );
}

#[test]
fn quantiles_interpolate_within_buckets() {
    let buckets = [(0.001, 50.0), (0.01, 90.0), (f64::INFINITY, 100.0)];
    let cases = [
        (0.5, Some(0.001)),
        (0.25, Some(0.0005)),
        (0.7, Some(0.001 + 0.009 * 0.5)),
        // Beyond the last finite bound: that bound.
        (0.99, Some(0.01)),
    ];
    for (q, expected) in cases {
        let got = quantile(&buckets, q);
        assert!(
            got.zip(expected)
                .is_some_and(|(got, expected)| (got - expected).abs() < 1e-12),
            "q={q}: {got:?} != {expected:?}"
        );
    }
    assert_eq!(quantile(&[], 0.5), None);
    assert_eq!(quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
}

#[test]
fn a_report_rates_the_interval_and_sums_the_pools() {
    let directory = |evictions: u64| {
        format!("kvtier_evictions_total {evictions}\nkvtier_expirations_total 0\n")
    };
    let first = snapshot(
        10,
        node_text(10, 10, 5, 1000, 10, 0),
        Ok(node_text(0, 0, 0, 0, 0, 0)),
        directory(1),
    );
    // Two seconds later node-a had 30 more hits and 10 more misses, all slow.
    let second = snapshot(
        12,
        node_text(40, 20, 9, 5000, 10, 40),
        Err("connection refused".into()),
        directory(5),
    );
    let report = Report::compute(Some(&first), &second);
    assert_eq!(report.interval_seconds, 2.0);
    let a = &report.nodes[0];
    assert_eq!(a.name, "node-a");
    assert_eq!(a.rates.hit_ratio, Some(0.75));
    assert_eq!(a.rates.hit_ratio_total, Some(40.0 / 60.0));
    assert_eq!(a.rates.loads_per_second, 20.0);
    assert_eq!(a.rates.stores_per_second, 2.0);
    assert_eq!(a.rates.bytes_per_second["load"], 2000.0);
    // Every request of the interval took between 50 µs and 5 ms.
    let p50 = a.rates.latency_p50_seconds.unwrap();
    assert!(p50 > 0.00005 && p50 < 0.005, "{p50}");
    let b = &report.nodes[1];
    assert_eq!(b.state, "suspect");
    assert_eq!(b.metrics_error.as_deref(), Some("connection refused"));
    assert_eq!(report.unreachable, vec!["node-b: connection refused"]);
    // The cluster: node-a's rates (node-b unreadable), the directory's evictions.
    assert_eq!(report.cluster.rates.loads_per_second, 20.0);
    assert_eq!(report.cluster.rates.evictions_per_second, 2.0);
    assert_eq!(report.cluster.nodes, 2);
    assert_eq!(report.cluster.nodes_live, 1);
    assert_eq!(report.cluster.usage.capacity_bytes, 3000);
    assert_eq!(report.cluster.usage.allocated_bytes, 900);
    assert_eq!(report.cluster.usage.reserved_bytes, 30);
    assert_eq!(report.cluster.usage.pinned_bytes, 450);
    let scopes: Vec<&str> = report
        .pools
        .iter()
        .map(|pool| pool.scope.as_str())
        .collect();
    assert_eq!(scopes, ["node-a", "node-b", "domain 0"]);
    assert_eq!(report.pools[2].free_bytes, 490);
}

#[test]
fn a_first_report_has_no_rates_but_ratios_since_start() {
    let only = snapshot(
        3,
        node_text(9, 1, 5, 1000, 10, 0),
        Ok(node_text(1, 1, 0, 0, 0, 0)),
        String::new(),
    );
    let report = Report::compute(None, &only);
    assert_eq!(report.interval_seconds, 0.0);
    assert_eq!(report.nodes[0].rates.loads_per_second, 0.0);
    assert_eq!(report.nodes[0].rates.hit_ratio_total, Some(0.9));
    assert_eq!(report.cluster.rates.hit_ratio_total, Some(10.0 / 12.0));
    assert!(report.cluster.rates.latency_p99_seconds.is_some());
}
