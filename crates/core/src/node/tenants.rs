//! Who a local client is and what it may use. The node reads each connecting engine's
//! peer credentials from its Unix socket (`SO_PEERCRED`: uid, gid, pid) and matches them
//! against the operator's tenant rules (`[[tenants]]` in `cluster.toml`). The first rule
//! naming the peer's uid admits it as that tenant; failing that, the first rule naming any
//! of its groups (its effective gid and its supplementary groups, `SO_PEERGROUPS`), so a
//! user who switches its effective group (`newgrp`, `sg`) cannot pick another tenant; with
//! no rule at all only the node process's own uid is admitted. A tenant may register only the namespaces (models) its
//! rule lists, and its salt is mixed into every namespace it registers, so tenants with
//! different salts never share objects nor learn through a probe what the other cached.
//! Sans-I/O: the rules come parsed, the credentials come read.

use crate::model::{NamespaceDescriptor, NamespaceId, NAMESPACE_TEXT_BYTES_MAX};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

/// Tenant rules one node accepts: matching is a scan per connection, so the list is short.
pub const TENANT_RULES_MAX: usize = 256;
/// Uids, gids or models one rule may list.
pub const RULE_ENTRIES_MAX: usize = 1024;
/// Supplementary groups of a peer the node reads; a peer in more is matched on these.
pub const PEER_GROUPS_MAX: usize = 1024;

/// The credentials of a connected peer, as the kernel reported them for the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    pub uid: u32,
    /// The peer process's effective group.
    pub gid: u32,
    /// Its supplementary groups (at most [`PEER_GROUPS_MAX`]; empty where the kernel does
    /// not report them).
    pub groups: Vec<u32>,
    /// The peer's process id, when the kernel reports it (logs only: pids are reused).
    pub pid: Option<i32>,
}

/// The namespaces a tenant may register, by the model of their descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelAccess {
    /// Any model (`"*"` in the rule).
    Any,
    /// Only these model names.
    Models(Vec<String>),
}

/// One tenant: who it is and what it may use, with names already resolved to ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// The rule's name (logs; never a metric label).
    pub name: String,
    /// Peers of these uids are this tenant.
    pub uids: Vec<u32>,
    /// Peers in these groups (effective or supplementary) are this tenant, unless a rule
    /// names their uid.
    pub gids: Vec<u32>,
    pub models: ModelAccess,
    /// Mixed into every namespace this tenant registers; `None` shares with unsalted tenants.
    pub salt: Option<String>,
}

impl Tenant {
    /// Whether this tenant may use `descriptor`'s namespace.
    pub fn permits(&self, descriptor: &NamespaceDescriptor) -> bool {
        match &self.models {
            ModelAccess::Any => true,
            ModelAccess::Models(models) => models.contains(&descriptor.model),
        }
    }

    /// The salt group of this tenant's objects, whose CPU partition its clients map.
    pub fn group(&self) -> crate::model::SaltGroup {
        crate::model::SaltGroup::of(self.salt.as_deref())
    }

    /// The descriptor the node registers for this tenant: its salt, never the client's.
    pub fn salted(&self, mut descriptor: NamespaceDescriptor) -> NamespaceDescriptor {
        descriptor.salt = self.salt.clone();
        descriptor
    }

    fn names_group_of(&self, peer: &PeerIdentity) -> bool {
        self.gids.contains(&peer.gid) || peer.groups.iter().any(|gid| self.gids.contains(gid))
    }
}

/// Why a peer or one of its registrations was refused by the tenant rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum TenantRefusal {
    /// No rule admits this peer (with no rule, only the node's own uid is admitted).
    #[error("no tenant rule admits uid {uid} gid {gid} on this node")]
    UnknownPeer { uid: u32, gid: u32 },
    /// The client's tenant may not use this model.
    #[error("tenant `{tenant}` may not use model `{model}`")]
    NamespaceDenied { tenant: String, model: String },
    /// A CXL pool this node maps does not list the client's tenant: the pool's domain is a
    /// trust domain of the tenants it lists, and this node serves no other.
    #[error("tenant `{tenant}` may not use CXL pool `{pool}`, which this node maps")]
    NotInCxlPool { tenant: String, pool: String },
    /// The node has no CPU partition for the tenant's salt: its rule came with a reload,
    /// and partitions are made when the node starts.
    #[error("tenant `{tenant}` has no memory on this node yet: restart the node to give its salt a CPU partition")]
    NoPartition { tenant: String },
    /// The tenant registered [`NAMESPACES_PER_TENANT_MAX`] namespaces on this node.
    #[error("tenant `{tenant}` registered {max} namespaces on this node, as many as it may")]
    TooManyNamespaces { tenant: String, max: usize },
}

/// Distinct namespaces one tenant may register on one node (every model, revision and
/// layout it serves): no tenant, varying a revision or a layer count, fills the node's
/// table or the directory's for the others.
pub const NAMESPACES_PER_TENANT_MAX: usize = 128;

/// The namespaces each tenant registered on this node, at most
/// [`NAMESPACES_PER_TENANT_MAX`] each (tenants are at most [`TENANT_RULES_MAX`] and the
/// node's owner). Kept for the node's life: a tenant's bound does not come back when its
/// clients leave, so reconnecting buys nothing.
#[derive(Debug, Default)]
pub struct TenantNamespaces {
    by_tenant: std::collections::HashMap<String, std::collections::HashSet<NamespaceId>>,
}

impl TenantNamespaces {
    /// Whether `tenant` may register `id`: it already did, or it has room for one more.
    pub fn admits(&self, tenant: &Tenant, id: NamespaceId) -> Result<(), TenantRefusal> {
        let held = self.by_tenant.get(&tenant.name);
        if held.is_some_and(|held| held.len() >= NAMESPACES_PER_TENANT_MAX && !held.contains(&id)) {
            return Err(TenantRefusal::TooManyNamespaces {
                tenant: tenant.name.clone(),
                max: NAMESPACES_PER_TENANT_MAX,
            });
        }
        Ok(())
    }

    /// Records that `tenant` registers `id` (after [`TenantNamespaces::admits`]).
    pub fn record(&mut self, tenant: &Tenant, id: NamespaceId) {
        let held = self.by_tenant.entry(tenant.name.clone()).or_default();
        if held.len() < NAMESPACES_PER_TENANT_MAX {
            held.insert(id);
        }
    }
}

/// A tenant rule set that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TenantConfigError {
    #[error("more than {TENANT_RULES_MAX} tenant rules")]
    TooManyRules,
    #[error("tenant `{0}` is defined twice")]
    Duplicate(String),
    #[error("tenant `{0}` matches no uid or gid")]
    MatchesNobody(String),
    #[error("tenant `{0}` lists more than {RULE_ENTRIES_MAX} uids, gids or models")]
    TooLarge(String),
    #[error("tenant `{0}` allows no namespace (list models, or \"*\")")]
    NoNamespace(String),
    #[error("tenant `{0}`: the salt must be 1 to {NAMESPACE_TEXT_BYTES_MAX} bytes")]
    InvalidSalt(String),
}

/// The node's tenant rules. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenants {
    owner_uid: u32,
    rules: Vec<Arc<Tenant>>,
    /// Tenants this node refuses, each with the CXL pool it maps that does not list them.
    shut_out: HashMap<String, String>,
}

impl Tenants {
    /// Rules checked for bounds and sense; `owner_uid` is the node process's uid, admitted
    /// alone when `rules` is empty.
    pub fn new(owner_uid: u32, rules: Vec<Tenant>) -> Result<Tenants, TenantConfigError> {
        if rules.len() > TENANT_RULES_MAX {
            return Err(TenantConfigError::TooManyRules);
        }
        let mut names = std::collections::HashSet::new();
        for rule in &rules {
            let name = || rule.name.clone();
            if !names.insert(rule.name.as_str()) {
                return Err(TenantConfigError::Duplicate(name()));
            }
            if rule.uids.is_empty() && rule.gids.is_empty() {
                return Err(TenantConfigError::MatchesNobody(name()));
            }
            let models = match &rule.models {
                ModelAccess::Any => 0,
                ModelAccess::Models(models) if models.is_empty() => {
                    return Err(TenantConfigError::NoNamespace(name()))
                }
                ModelAccess::Models(models) => models.len(),
            };
            if rule.uids.len().max(rule.gids.len()).max(models) > RULE_ENTRIES_MAX {
                return Err(TenantConfigError::TooLarge(name()));
            }
            if rule
                .salt
                .as_ref()
                .is_some_and(|salt| salt.is_empty() || salt.len() > NAMESPACE_TEXT_BYTES_MAX)
            {
                return Err(TenantConfigError::InvalidSalt(name()));
            }
        }
        Ok(Tenants {
            owner_uid,
            rules: rules.into_iter().map(Arc::new).collect(),
            shut_out: HashMap::new(),
        })
    }

    /// The tenant `peer` is admitted as: the first rule naming its uid, else the first
    /// naming one of its groups (whichever group is its effective one), or, with no rule at
    /// all, the node's owner (any model, no salt) for the node's own uid.
    pub fn admit(&self, peer: &PeerIdentity) -> Result<Arc<Tenant>, TenantRefusal> {
        let refused = TenantRefusal::UnknownPeer {
            uid: peer.uid,
            gid: peer.gid,
        };
        if self.rules.is_empty() {
            return if peer.uid == self.owner_uid {
                Ok(Arc::new(Tenant {
                    name: "owner".into(),
                    uids: vec![self.owner_uid],
                    gids: Vec::new(),
                    models: ModelAccess::Any,
                    salt: None,
                }))
            } else {
                Err(refused)
            };
        }
        let tenant = self
            .rules
            .iter()
            .find(|rule| rule.uids.contains(&peer.uid))
            .or_else(|| self.rules.iter().find(|rule| rule.names_group_of(peer)))
            .ok_or(refused)?;
        if let Some(pool) = self.shut_out.get(&tenant.name) {
            return Err(TenantRefusal::NotInCxlPool {
                tenant: tenant.name.clone(),
                pool: pool.clone(),
            });
        }
        Ok(tenant.clone())
    }

    /// Refuses `tenant` on this node from now on: `pool`, a CXL pool the node maps, does
    /// not list it.
    pub fn shut_out(&mut self, tenant: &str, pool: &str) {
        self.shut_out
            .entry(tenant.to_string())
            .or_insert_with(|| pool.to_string());
    }

    /// The names of the tenant rules.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|rule| rule.name.as_str())
    }
}

/// The uid of `name` in an `/etc/passwd`-format text.
pub fn uid_of(passwd: &str, name: &str) -> Option<u32> {
    id_of(passwd, name)
}

/// The gid of `name` in an `/etc/group`-format text.
pub fn gid_of(group: &str, name: &str) -> Option<u32> {
    id_of(group, name)
}

/// The third field of the line whose first field is `name` (`name:x:id:...`).
fn id_of(database: &str, name: &str) -> Option<u32> {
    database.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo_namespace;

    fn peer(uid: u32, gid: u32) -> PeerIdentity {
        PeerIdentity {
            uid,
            gid,
            groups: vec![gid],
            pid: Some(1),
        }
    }

    fn rule(name: &str, uids: &[u32], gids: &[u32], salt: Option<&str>) -> Tenant {
        Tenant {
            name: name.into(),
            uids: uids.to_vec(),
            gids: gids.to_vec(),
            models: ModelAccess::Any,
            salt: salt.map(str::to_string),
        }
    }

    #[test]
    fn without_rules_only_the_owner_is_admitted() {
        let tenants = Tenants::new(1000, Vec::new()).unwrap();
        assert_eq!(tenants.admit(&peer(1000, 5)).unwrap().salt, None);
        assert_eq!(
            tenants.admit(&peer(0, 0)),
            Err(TenantRefusal::UnknownPeer { uid: 0, gid: 0 })
        );
    }

    #[test]
    fn rules_match_by_uid_or_gid_first_rule_wins_and_others_are_refused() {
        let tenants = Tenants::new(
            0,
            vec![
                rule("a", &[1001], &[], Some("a-salt")),
                rule("b", &[], &[2000], Some("b-salt")),
                rule("c", &[1001], &[], None),
            ],
        )
        .unwrap();
        assert_eq!(tenants.admit(&peer(1001, 7)).unwrap().name, "a");
        assert_eq!(tenants.admit(&peer(1002, 2000)).unwrap().name, "b");
        // With rules, the owner is only admitted by a rule.
        assert!(tenants.admit(&peer(0, 0)).is_err());
        assert!(tenants.admit(&peer(1003, 3)).is_err());
    }

    /// A user in the groups of two tenants is the same tenant whichever group is its
    /// effective one; a rule naming its uid comes before any naming its groups.
    #[test]
    fn switching_the_effective_group_does_not_switch_the_tenant() {
        let tenants = Tenants::new(
            0,
            vec![
                rule("a", &[], &[2000], Some("a-salt")),
                rule("b", &[], &[3000], Some("b-salt")),
                rule("mine", &[1005], &[], None),
            ],
        )
        .unwrap();
        for effective in [2000, 3000, 1001] {
            let member = PeerIdentity {
                uid: 1001,
                gid: effective,
                groups: vec![1001, 3000, 2000],
                pid: None,
            };
            assert_eq!(
                tenants.admit(&member).unwrap().name,
                "a",
                "as gid {effective}"
            );
        }
        let named = PeerIdentity {
            uid: 1005,
            gid: 3000,
            groups: vec![3000],
            pid: None,
        };
        assert_eq!(tenants.admit(&named).unwrap().name, "mine");
    }

    #[test]
    fn salts_give_distinct_namespaces_and_equal_salts_share() {
        let a = rule("a", &[1], &[], Some("one"));
        let b = rule("b", &[2], &[], Some("two"));
        let a_too = rule("a2", &[3], &[], Some("one"));
        let open = rule("open", &[4], &[], None);
        let id = |tenant: &Tenant| tenant.salted(demo_namespace()).id().unwrap();
        assert_ne!(id(&a), id(&b));
        assert_eq!(id(&a), id(&a_too));
        assert_eq!(id(&open), demo_namespace().id().unwrap());
        // A salt the client sent is replaced by its tenant's.
        let forged = NamespaceDescriptor {
            salt: Some("two".into()),
            ..demo_namespace()
        };
        assert_eq!(a.salted(forged).id().unwrap(), id(&a));
    }

    #[test]
    fn models_are_restricted_per_tenant() {
        let only = Tenant {
            models: ModelAccess::Models(vec!["other".into()]),
            ..rule("x", &[1], &[], None)
        };
        assert!(!only.permits(&demo_namespace()));
        assert!(rule("y", &[1], &[], None).permits(&demo_namespace()));
    }

    #[test]
    fn senseless_rules_are_refused() {
        let nobody = rule("n", &[], &[], None);
        assert_eq!(
            Tenants::new(0, vec![nobody]).unwrap_err(),
            TenantConfigError::MatchesNobody("n".into())
        );
        let twice = vec![rule("t", &[1], &[], None), rule("t", &[2], &[], None)];
        assert!(matches!(
            Tenants::new(0, twice),
            Err(TenantConfigError::Duplicate(_))
        ));
        assert!(matches!(
            Tenants::new(0, vec![rule("s", &[1], &[], Some(""))]),
            Err(TenantConfigError::InvalidSalt(_))
        ));
        let many = (0..=TENANT_RULES_MAX)
            .map(|index| rule(&index.to_string(), &[1], &[], None))
            .collect();
        assert_eq!(
            Tenants::new(0, many).unwrap_err(),
            TenantConfigError::TooManyRules
        );
    }

    #[test]
    fn names_resolve_from_the_user_databases() {
        let passwd =
            "root:x:0:0:root:/root:/bin/bash\nkvtier-other:x:998:998::/:/usr/sbin/nologin\n";
        assert_eq!(uid_of(passwd, "kvtier-other"), Some(998));
        assert_eq!(uid_of(passwd, "kvtier"), None);
        assert_eq!(gid_of("engines:x:1500:alice,bob\n", "engines"), Some(1500));
    }
}
