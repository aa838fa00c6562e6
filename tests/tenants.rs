//! Tenants, as a second local user would try them: processes running as the system user
//! `kvtier-other` (created when absent) against nodes run by this (root) process. That
//! user cannot read a pool file nor reach a node that does not let it in; a peer no rule
//! admits is refused at the handshake with a typed error; admitted as tenant B, it cannot
//! see, probe, load or retire tenant A's objects, and the same key stored by both is two
//! objects, nor find A's bytes anywhere in the memory the node hands it (its tenant's CPU
//! partition: A's is never handed to it). Needs root (to create the user and run processes as it): skipped, saying so,
//! otherwise. What that user runs is linked or copied first into a fresh folder it can
//! reach, so the tests do not depend on where the clone lives (a clone in a private `0700`
//! folder keeps `target/` out of its reach).

use kvtier_core::client::{Client, ClientError};
use kvtier_core::directory::{AcquireMode, DirectoryError};
use kvtier_core::model::{ObjectId, ReplicaId};
use kvtier_core::node::{ClientRefusal, TenantRefusal};
use kvtier_core::protocol::messages::ProtocolError;
use kvtier_tools::ctl::objects::{ctl_namespace, key_digest};
use kvtier_tools::launch::{ClusterSpec, LocalCluster};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const OTHER: &str = "kvtier-other";
/// What tenant A stores: tenant B must find these bytes nowhere in the memory it is handed.
const A_PROMPT: &[u8] = b"tenant A's prompt";
/// Where the tenant-B helper finds tenant A's object and replica (JSON).
const HELPER_INPUT: &str = "KVTIER_TENANT_A_OBJECT";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

/// What the other user runs, `kvtier` and this test binary (tenant B's helper), in a fresh
/// folder (`0755`) under the system's temporary folder, removed when dropped.
struct Reachable {
    _folder: tempfile::TempDir,
    kvtier: PathBuf,
    tests: PathBuf,
}

/// Links (or copies, across file systems) `kvtier` and this test binary into a fresh
/// folder the other user can reach, and checks that it can run them there; `None`, with
/// the reason printed, when it cannot (a temporary folder itself out of its reach).
fn reachable_programs(other: (u32, u32)) -> Option<Reachable> {
    use std::os::unix::fs::PermissionsExt;
    let folder = tempfile::Builder::new()
        .prefix("kvtier-tenants-bin-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(folder.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let place = |source: &Path, name: &str| {
        let target = folder.path().join(name);
        if std::fs::hard_link(source, &target).is_err() {
            std::fs::copy(source, &target).unwrap();
        }
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        target
    };
    let kvtier = place(exe(), "kvtier");
    let tests = place(&std::env::current_exe().unwrap(), "tenants");
    let runs = Command::new(&kvtier)
        .arg("--version")
        .uid(other.0)
        .gid(other.1)
        .output();
    match runs {
        Ok(output) if output.status.success() => Some(Reachable {
            _folder: folder,
            kvtier,
            tests,
        }),
        outcome => {
            eprintln!(
                "skipped: {OTHER} cannot run {} ({outcome:?}): the temporary folder {} is out of its reach",
                kvtier.display(),
                std::env::temp_dir().display()
            );
            None
        }
    }
}

/// The uid and gid of `kvtier-other`, created if absent; `None` (with the reason printed)
/// when this process is not root. The tests of this file run as threads of one process: the
/// first to ask creates the user and the others wait until `useradd` has finished (on a
/// fresh machine, one test was refused the node's socket as that user while the other test
/// was creating it; the rerun passed).
fn other_user() -> Option<(u32, u32)> {
    static OTHER_USER: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *OTHER_USER.get_or_init(find_or_create_other_user)
}

fn find_or_create_other_user() -> Option<(u32, u32)> {
    if std::fs::metadata("/proc/self").map(|meta| meta.uid()).ok() != Some(0) {
        eprintln!("skipped: tests as a second local user need root");
        return None;
    }
    let find = || {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.first() == Some(&OTHER)).then(|| {
                (
                    fields[2].parse::<u32>().unwrap(),
                    fields[3].parse::<u32>().unwrap(),
                )
            })
        })
    };
    if find().is_none() {
        let status = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group", OTHER])
            .status()
            .expect("useradd runs");
        assert!(status.success(), "useradd {OTHER}: {status}");
    }
    find()
}

fn small_cluster(socket_group: Option<&str>, extra_toml: &str) -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        metrics: false,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        socket_group: socket_group.map(str::to_string),
        extra_toml: extra_toml.into(),
        ..ClusterSpec::default()
    };
    LocalCluster::start(exe(), &spec).unwrap()
}

/// Runs `kvtier ctl ARGS --socket SOCKET --json` as `(uid, gid)` (the standard library
/// drops root's supplementary groups) and returns its output and its one JSON line.
fn ctl_as(
    programs: &Reachable,
    identity: (u32, u32),
    socket: &Path,
    args: &[&str],
) -> (Output, serde_json::Value) {
    let output = Command::new(&programs.kvtier)
        .arg("ctl")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .arg("--json")
        .uid(identity.0)
        .gid(identity.1)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!(
            "ctl {args:?} printed no JSON ({error}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, report)
}

fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("kvtier-tenants-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    // Readable by the other user, who runs `ctl put` on it.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    path
}

const ROOT: (u32, u32) = (0, 0);

#[test]
fn a_node_without_rules_serves_only_its_owner() {
    let Some(other) = other_user() else { return };
    let Some(programs) = reachable_programs(other) else {
        return;
    };
    let cluster = small_cluster(None, "");
    let socket = cluster.socket(0).unwrap();
    let file = scratch_file("private", b"the owner's prompt");
    let (output, report) = ctl_as(
        &programs,
        ROOT,
        &socket,
        &["put", file.to_str().unwrap(), "--key", "k"],
    );
    assert!(output.status.success(), "{report}");
    assert_eq!(report["outcome"], "stored");

    // The other user cannot reach the socket (and the pool has no path to open).
    let (output, report) = ctl_as(&programs, other, &socket, &["probe", "--key", "k"]);
    assert!(!output.status.success());
    assert_eq!(report["error"], "unreachable", "{report}");

    // In the socket's group, it reaches the node and is refused at the handshake.
    let (output, report) = ctl_as(&programs, (other.0, 0), &socket, &["probe", "--key", "k"]);
    assert!(!output.status.success());
    assert_eq!(report["error"], "unknown_peer", "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(message.contains(&format!("uid {}", other.0)), "{message}");
    std::fs::remove_file(file).unwrap();
}

/// Tenant A is root, tenant B the other user; each with its own salt. B may use only the
/// ctl namespace.
fn tenant_rules() -> String {
    format!(
        "\n[[tenants]]\nname = \"a\"\nuids = [0]\nnamespaces = [\"*\"]\nsalt = \"tenant-a\"\n\n[[tenants]]\nname = \"b\"\nusers = [\"{OTHER}\"]\nnamespaces = [\"kvtier-ctl\"]\nsalt = \"tenant-b\"\n"
    )
}

#[test]
fn tenants_neither_share_nor_touch_each_others_objects() {
    let Some(other) = other_user() else { return };
    let Some(programs) = reachable_programs(other) else {
        return;
    };
    let cluster = small_cluster(Some(OTHER), &tenant_rules());
    let socket = cluster.socket(0).unwrap();
    let a_file = scratch_file("a", A_PROMPT);
    let b_file = scratch_file("b", b"tenant B's different prompt");
    let (output, a_put) = ctl_as(
        &programs,
        ROOT,
        &socket,
        &["put", a_file.to_str().unwrap(), "--key", "k"],
    );
    assert!(output.status.success(), "{a_put}");

    // B does not see A's object under the same key, and storing it makes another object.
    let (_, probed) = ctl_as(&programs, other, &socket, &["probe", "--key", "k"]);
    assert_eq!(probed["outcome"], "miss", "{probed}");
    let (output, b_put) = ctl_as(
        &programs,
        other,
        &socket,
        &["put", b_file.to_str().unwrap(), "--key", "k"],
    );
    assert!(output.status.success(), "{b_put}");
    assert_eq!(b_put["outcome"], "stored", "{b_put}");
    assert_ne!(
        a_put["object"], b_put["object"],
        "distinct digests per tenant"
    );
    let out = std::env::temp_dir().join(format!("kvtier-tenants-{}-out", std::process::id()));
    for (identity, expected) in [(ROOT, &a_file), (other, &b_file)] {
        let _ = std::fs::remove_file(&out);
        let (output, got) = ctl_as(
            &programs,
            identity,
            &socket,
            &["get", "--key", "k", "--out", out.to_str().unwrap()],
        );
        assert!(output.status.success(), "{got}");
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(expected).unwrap()
        );
    }

    // B names A's object and replica directly: every request is refused.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A finds its bytes in the memory the node hands it: B's search below can succeed.
    let (files, found) = runtime.block_on(search_handed_memory(&socket, A_PROMPT));
    assert!(
        files >= 1 && found,
        "A's bytes are not in A's own partition"
    );
    let (a_object, a_replica) = runtime.block_on(async {
        let client = Client::connect(&socket).await.unwrap();
        let namespace = client.register_namespace(ctl_namespace()).await.unwrap();
        let object = ObjectId {
            namespace,
            prefix: key_digest("k"),
            shard: 0,
            part: 0,
        };
        let views = client.load(&[object], AcquireMode::Each).await.unwrap();
        let replica = views[0]
            .as_ref()
            .expect("A's object is cached")
            .lease()
            .replica;
        (object, replica)
    });
    let helper = Command::new(&programs.tests)
        .args(["--ignored", "--exact", "tenant_b_helper", "--nocapture"])
        .env(
            HELPER_INPUT,
            serde_json::to_string(&(a_object, a_replica, &socket)).unwrap(),
        )
        .uid(other.0)
        .gid(other.1)
        .output()
        .unwrap();
    assert!(
        helper.status.success() && String::from_utf8_lossy(&helper.stdout).contains("1 passed"),
        "tenant B's helper failed:\n{}\n{}",
        String::from_utf8_lossy(&helper.stdout),
        String::from_utf8_lossy(&helper.stderr)
    );
    // A's object is still there, whole.
    let (_, probed) = ctl_as(&programs, ROOT, &socket, &["probe", "--key", "k"]);
    assert_eq!(probed["outcome"], "hit", "{probed}");
    for path in [a_file, b_file, out] {
        let _ = std::fs::remove_file(path);
    }
}

/// Run by `tenants_neither_share_nor_touch_each_others_objects` as tenant B, with tenant
/// A's object and replica: B can neither name A's namespace nor another model's.
#[test]
#[ignore = "run as tenant B by tenants_neither_share_nor_touch_each_others_objects"]
fn tenant_b_helper() {
    let input = std::env::var(HELPER_INPUT).expect("started by the tenant test");
    let (a_object, a_replica, socket): (ObjectId, ReplicaId, PathBuf) =
        serde_json::from_str(&input).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::connect(&socket).await.unwrap();
        // B is handed one memory file, its own partition, and A's bytes are nowhere in it.
        let (files, found) = search_handed_memory(&socket, A_PROMPT).await;
        assert_eq!(files, 1, "B was handed more than its own partition");
        assert!(
            !found,
            "B can read tenant A's bytes in the memory it is handed"
        );
        let own = client.register_namespace(ctl_namespace()).await.unwrap();
        assert_ne!(
            own, a_object.namespace,
            "B's salt gives B its own namespace"
        );
        let not_registered = |result: Result<_, ClientError>| match result {
            Err(ClientError::Refused(ProtocolError::Client(
                ClientRefusal::NamespaceNotRegistered(namespace),
            ))) => assert_eq!(namespace, a_object.namespace),
            Err(other) => panic!("refused otherwise: {other}"),
            Ok(_) => panic!("tenant B reached tenant A's object"),
        };
        not_registered(client.probe(&[a_object]).await.map(drop));
        not_registered(client.load(&[a_object], AcquireMode::Each).await.map(drop));
        not_registered(client.retire(a_object, a_replica).await.map(drop));
        not_registered(client.store(a_object, b"overwrite").await.map(drop));
        // Its own object's name with A's replica: the directory refuses the pairing.
        let own_object = ObjectId {
            namespace: own,
            ..a_object
        };
        match client.retire(own_object, a_replica).await {
            Err(ClientError::Refused(ProtocolError::Directory(
                DirectoryError::UnknownReplica(replica),
            ))) => assert_eq!(replica, a_replica),
            other => panic!("retired another tenant's replica: {other:?}"),
        }
        // A model its rule does not list.
        match client
            .register_namespace(kvtier_core::model::demo_namespace())
            .await
        {
            Err(ClientError::Refused(ProtocolError::Tenant(TenantRefusal::NamespaceDenied {
                tenant,
                ..
            }))) => assert_eq!(tenant, "b"),
            other => panic!("registered a denied model: {other:?}"),
        }
    });
}

/// Connects to `socket` as a bare client, takes the memory files the node hands it, and
/// reads each whole looking for `needle`: how many files it was handed, and whether any
/// holds the bytes.
async fn search_handed_memory(socket: &Path, needle: &[u8]) -> (usize, bool) {
    use std::os::unix::fs::FileExt;
    let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
    let files = kvtier_core::wire::handoff::receive(&stream, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let count = files.len();
    let found = files.into_iter().any(|file| {
        let file = std::fs::File::from(file);
        let length = file.metadata().unwrap().len();
        let mut chunk = vec![0u8; 1 << 20];
        let mut offset = 0;
        while offset < length {
            // Chunks overlap by the needle's length, so bytes across a boundary are seen.
            let read = file.read_at(&mut chunk, offset).unwrap();
            if read == 0 {
                break;
            }
            if chunk[..read]
                .windows(needle.len())
                .any(|window| window == needle)
            {
                return true;
            }
            offset += (read.saturating_sub(needle.len()).max(1)) as u64;
        }
        false
    });
    (count, found)
}
