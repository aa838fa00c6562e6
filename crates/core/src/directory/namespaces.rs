//! The namespace table: what each namespace is (its descriptor and salt group), who may
//! use it, and how many replicas name it. The table is bounded (`namespaces_max`, and
//! `namespaces_per_salt_max` per salt group); a namespace no replica names is only a cache
//! of a descriptor, so when a registration finds its bound reached, the least recently
//! registered such namespace is forgotten to make room. A node that hears
//! `UnknownNamespace` for a namespace its engine registered registers it again (the
//! engine's lookups are misses, its stores skipped, meanwhile), so forgetting is safe.

use super::sessions::Session;
use super::{Directory, DirectoryError, NamespaceAccess, Table};
use crate::model::{NamespaceDescriptor, NamespaceId, ObjectId, PoolId, SaltGroup, SessionId};

/// A namespace the directory knows.
pub(super) struct RegisteredNamespace {
    pub descriptor: NamespaceDescriptor,
    /// The salt group of its objects (the CPU partitions and quotas they fall under).
    pub group: SaltGroup,
    /// Replicas of its objects, in any state: it is forgotten only at zero.
    pub replicas: u64,
    /// When it was last registered, on the table's own counter: the least recent
    /// unreferenced namespace is forgotten first.
    pub registered: u64,
}

impl Directory {
    /// The salt group of `namespace`'s objects (`None`: not registered).
    pub(super) fn group_of(&self, namespace: &NamespaceId) -> Option<SaltGroup> {
        self.namespaces.get(namespace).map(|known| known.group)
    }

    /// Registers a namespace (idempotent) after validating its descriptor. At the table's
    /// bound (or its salt group's), the least recently registered namespace no replica
    /// names is forgotten first; `Full` when every one is in use.
    pub fn register_namespace(
        &mut self,
        session: SessionId,
        descriptor: NamespaceDescriptor,
    ) -> Result<NamespaceId, DirectoryError> {
        let record = self.open_session(session)?;
        let id = descriptor.id().map_err(DirectoryError::InvalidNamespace)?;
        if !permits(&record.namespaces, &descriptor) {
            return Err(DirectoryError::NamespaceDenied);
        }
        self.namespace_clock += 1;
        let now = self.namespace_clock;
        if let Some(known) = self.namespaces.get_mut(&id) {
            known.registered = now;
            return Ok(id);
        }
        let group = SaltGroup::of(descriptor.salt.as_deref());
        if self.namespaces.len() >= self.config.namespaces_max as usize
            && !self.forget_unreferenced(None)
        {
            return Err(DirectoryError::Full(Table::Namespaces));
        }
        // A scan of at most `namespaces_max` entries, only for a namespace not seen yet.
        let of_salt = self
            .namespaces
            .values()
            .filter(|known| known.group == group)
            .count();
        if of_salt >= self.config.namespaces_per_salt_max as usize
            && !self.forget_unreferenced(Some(group))
        {
            return Err(DirectoryError::Full(Table::NamespacesOfSalt));
        }
        self.namespaces.insert(
            id,
            RegisteredNamespace {
                descriptor,
                group,
                replicas: 0,
                registered: now,
            },
        );
        Ok(id)
    }

    /// Forgets the least recently registered namespace (of `group`, when given) that no
    /// replica names; whether there was one.
    fn forget_unreferenced(&mut self, group: Option<SaltGroup>) -> bool {
        let oldest = self
            .namespaces
            .iter()
            .filter(|(_, known)| known.replicas == 0)
            .filter(|(_, known)| group.is_none_or(|group| known.group == group))
            .min_by_key(|(_, known)| known.registered)
            .map(|(id, _)| *id);
        oldest.is_some_and(|id| self.namespaces.remove(&id).is_some())
    }

    /// A replica of `object` of `bytes` entered `pool` (reserved or adopted): one more
    /// replica of its namespace, and `bytes` more of its salt group in the pool (for
    /// quotas). One lookup of the namespace.
    pub(super) fn replica_added(&mut self, pool: PoolId, object: &ObjectId, bytes: u64) {
        let Some(known) = self.namespaces.get_mut(&object.namespace) else {
            return;
        };
        known.replicas += 1;
        let group = known.group;
        if let Some(record) = self.pools.get_mut(pool.0 as usize) {
            record.charge(group, bytes);
        }
    }

    /// A replica of `object` left `pool`: one fewer of its namespace, and, when it was
    /// `live` (reserved or READY, not retiring), `bytes` fewer of its group there.
    pub(super) fn replica_removed(
        &mut self,
        pool: PoolId,
        object: &ObjectId,
        bytes: u64,
        live: bool,
    ) {
        let Some(known) = self.namespaces.get_mut(&object.namespace) else {
            return;
        };
        known.replicas = known.replicas.saturating_sub(1);
        let group = known.group;
        if let (true, Some(record)) = (live, self.pools.get_mut(pool.0 as usize)) {
            record.refund(group, bytes);
        }
    }

    pub(super) fn check_namespace(
        &self,
        session: &Session,
        namespace: NamespaceId,
    ) -> Result<(), DirectoryError> {
        match self.namespaces.get(&namespace) {
            None => Err(DirectoryError::UnknownNamespace),
            Some(known) if !permits(&session.namespaces, &known.descriptor) => {
                Err(DirectoryError::NamespaceDenied)
            }
            Some(_) => Ok(()),
        }
    }

    /// Checks every item's namespace, looking up each distinct namespace once in a run.
    pub(super) fn check_namespaces(
        &self,
        session: &Session,
        objects: impl Iterator<Item = NamespaceId>,
    ) -> Result<(), DirectoryError> {
        let mut last_checked = None;
        for namespace in objects {
            if last_checked != Some(namespace) {
                self.check_namespace(session, namespace)?;
                last_checked = Some(namespace);
            }
        }
        Ok(())
    }
}

/// Whether `access` lets a node use `descriptor`'s namespace.
fn permits(access: &NamespaceAccess, descriptor: &NamespaceDescriptor) -> bool {
    match access {
        NamespaceAccess::Any => true,
        NamespaceAccess::Models(models) => models.contains(&descriptor.model),
    }
}
