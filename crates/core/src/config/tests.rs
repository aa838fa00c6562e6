//! Tests of the cluster configuration: loading, validation and the derived grants.

use super::*;

#[test]
fn the_example_configuration_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cluster.toml");
    let config = ClusterConfig::load(&path).unwrap();
    assert_eq!(config.nodes.len(), 2);
    assert_eq!(
        config.node("node-a").unwrap().write_order,
        vec![Medium::Cpu, Medium::Cxl]
    );
    assert_eq!(
        config.directory.limits.suspect_after,
        Duration::from_secs(3)
    );
    assert!(config.node("node-c").is_err());
    let ttl = config.directory.limits.ttl[&Medium::Cpu];
    assert!(ttl.spill_on_expiry && ttl.resident_ttl_ms == 1_800_000);
    let cxl = config.directory.limits.baseline_profile(Medium::Cxl);
    assert_eq!(cxl.read_latency_us, 0.6);
    assert_eq!(
        config
            .directory
            .limits
            .prefill_us_per_token_of("meta-llama/Llama-3.1-8B-Instruct"),
        60.0
    );
}

#[test]
fn tenant_rules_resolve_names_and_admit_by_credentials() {
    let text = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\nsocket_group = \"engines\"\n[nodes.cpu_pool]\ncapacity_bytes = 131072\n[[tenants]]\nname = \"chat\"\nusers = [\"vllm\"]\ngroups = [\"engines\"]\nnamespaces = [\"m\"]\nsalt = \"s1\"\n[[tenants]]\nname = \"any\"\nuids = [7]\nnamespaces = [\"*\"]\n";
    let directory =
        std::env::temp_dir().join(format!("kvtier-config-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    let config = ClusterConfig::load(&path).unwrap();
    std::fs::remove_dir_all(directory).unwrap();
    let (passwd, group) = ("vllm:x:1001:1001::/:/bin/false\n", "engines:x:2001:\n");
    assert_eq!(config.nodes[0].socket_gid(group).unwrap(), Some(2001));
    let tenants = config.tenants(&config.nodes[0], 0, passwd, group).unwrap();
    let peer = |uid, gid| crate::node::PeerIdentity {
        uid,
        gid,
        groups: vec![gid],
        pid: None,
    };
    let chat = tenants.admit(&peer(1001, 5)).unwrap();
    assert_eq!(
        (chat.name.as_str(), chat.salt.as_deref()),
        ("chat", Some("s1"))
    );
    assert_eq!(tenants.admit(&peer(3, 2001)).unwrap().name, "chat");
    assert_eq!(tenants.admit(&peer(7, 7)).unwrap().name, "any");
    assert!(
        tenants.admit(&peer(0, 0)).is_err(),
        "rules replace the owner default"
    );
    let error = config.tenants(&config.nodes[0], 0, "", group).unwrap_err();
    assert!(error.to_string().contains("no user `vllm`"), "{error}");
}

#[test]
fn a_cxl_pool_listing_its_tenants_shuts_the_others_out_of_its_nodes() {
    let text = |listed: &str| {
        format!(
            "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[cxl_pools]]\nname = \"cxl0\"\ndomain = 0\npath = \"/dev/shm/x\"\ncapacity_bytes = 67108864\nuuid = \"000000000000000000000000000000aa\"\ntenants = [{listed}]\n[[nodes]]\nname = \"in-domain\"\nsocket = \"s\"\ndomains = [0]\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n[[nodes]]\nname = \"outside\"\nsocket = \"t\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n[[tenants]]\nname = \"a\"\nuids = [7]\nnamespaces = [\"*\"]\n[[tenants]]\nname = \"b\"\nuids = [8]\nnamespaces = [\"*\"]\n"
        )
    };
    let config = ClusterConfig::parse(&text("\"a\""), Path::new("/")).unwrap();
    let peer = |uid| crate::node::PeerIdentity {
        uid,
        gid: uid,
        groups: Vec::new(),
        pid: None,
    };
    let in_domain = config.tenants(&config.nodes[0], 0, "", "").unwrap();
    assert_eq!(in_domain.admit(&peer(7)).unwrap().name, "a");
    assert_eq!(
        in_domain.admit(&peer(8)).unwrap_err(),
        crate::node::TenantRefusal::NotInCxlPool {
            tenant: "b".into(),
            pool: "cxl0".into()
        }
    );
    // A node that does not map the pool serves both.
    let outside = config.tenants(&config.nodes[1], 0, "", "").unwrap();
    assert_eq!(outside.admit(&peer(8)).unwrap().name, "b");
    // A name that is no tenant is refused when the file is read.
    let error = ClusterConfig::parse(&text("\"a\", \"c\""), Path::new("/")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("tenant `c` is not a [[tenants]] name"),
        "{error}"
    );
}

#[test]
fn the_peer_endpoint_is_optional_and_its_datagram_size_bounded() {
    let node = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    let base = Path::new("/");
    let plain = ClusterConfig::parse(node, base).unwrap();
    assert_eq!(plain.nodes[0].peer_reachable_at(), None);
    assert_eq!(plain.nodes[0].peer_datagram_bytes, 1452);
    let listen = node.replace(
        "socket = \"s\"\n",
        "socket = \"s\"\npeer_listen = \"0.0.0.0:7500\"\npeer_address = \"10.0.0.1:7500\"\n",
    );
    let served = ClusterConfig::parse(&listen, base).unwrap();
    assert_eq!(
        served.nodes[0].peer_reachable_at(),
        Some("10.0.0.1:7500".parse().unwrap())
    );
    let tiny = node.replace(
        "socket = \"s\"\n",
        "socket = \"s\"\npeer_datagram_bytes = 1000\n",
    );
    let error = ClusterConfig::parse(&tiny, base).unwrap_err();
    assert!(
        format!("{error:#}").contains("peer_datagram_bytes"),
        "{error:#}"
    );
}

#[test]
fn busy_poll_defaults_to_200_us_and_is_bounded() {
    let node = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    let base = Path::new("/");
    assert_eq!(
        ClusterConfig::parse(node, base).unwrap().nodes[0].busy_poll_us,
        200
    );
    for (micros, valid) in [(0, true), (10_000, true), (10_001, false)] {
        let text = node.replace(
            "socket = \"s\"\n",
            &format!("socket = \"s\"\nbusy_poll_us = {micros}\n"),
        );
        match ClusterConfig::parse(&text, base) {
            Ok(config) => {
                assert!(valid, "{micros} accepted");
                assert_eq!(config.nodes[0].busy_poll_us, micros);
            }
            Err(error) => {
                assert!(!valid, "{micros} refused: {error:#}");
                assert!(format!("{error:#}").contains("busy_poll_us"), "{error:#}");
            }
        }
    }
}

#[test]
fn copy_threads_default_to_two_and_are_bounded() {
    let node = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    let base = Path::new("/");
    assert_eq!(
        ClusterConfig::parse(node, base).unwrap().nodes[0].copy_threads,
        2
    );
    for (threads, valid) in [(0, false), (1, true), (16, true), (17, false)] {
        let text = node.replace(
            "socket = \"s\"\n",
            &format!("socket = \"s\"\ncopy_threads = {threads}\n"),
        );
        match ClusterConfig::parse(&text, base) {
            Ok(config) => {
                assert!(valid, "{threads} accepted");
                assert_eq!(config.nodes[0].copy_threads, threads);
            }
            Err(error) => {
                assert!(!valid, "{threads} refused: {error:#}");
                assert!(format!("{error:#}").contains("copy_threads"), "{error:#}");
            }
        }
    }
}

#[test]
fn unknown_keys_and_missing_fields_are_refused_with_their_line() {
    let node = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    let base = Path::new("/");
    let typo = node.replace("socket = \"s\"", "socket = \"s\"\nwrite_ordr = [\"cpu\"]");
    let error = format!("{:#}", ClusterConfig::parse(&typo, base).unwrap_err());
    assert!(
        error.contains(
            "line 7: unknown key `write_ordr` in [nodes]; the nearest known key is `write_order`"
        ),
        "{error}"
    );
    let missing = node.replace("socket = \"s\"\n", "");
    let error = format!("{:#}", ClusterConfig::parse(&missing, base).unwrap_err());
    assert!(error.contains("line 4: missing field `socket`"), "{error}");
}

#[test]
fn duplicate_names_are_refused() {
    let text = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n[[nodes]]\nname = \"a\"\nsocket = \"t\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    let directory = std::env::temp_dir().join(format!("kvtier-config-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    let error = ClusterConfig::load(&path).unwrap_err();
    assert!(error.to_string().contains("used twice"), "{error}");
    std::fs::remove_dir_all(directory).unwrap();
}
